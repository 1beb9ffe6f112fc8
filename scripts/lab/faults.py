"""Fault injection into a live run, for the fault tests and the benchmarks: find an actor's process
among a driver's descendants, and throttle it (stop it most of the time, as a swapping or
oversubscribed node would be) without touching the code it runs."""

from __future__ import annotations

import os
import signal
import threading


def actor_pid(driver_pid: int, cls: str) -> int | None:
    """The live process of the Ray actor of class ``cls`` among the descendants of ``driver_pid``
    (a driver that started its own Ray, or a node's raylet); Ray titles an actor's process
    ``ray::<Class>`` or ``ray::<Class>.<method>``."""
    import psutil

    try:
        children = psutil.Process(driver_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for p in children:
        try:
            title = " ".join(p.cmdline())
            if title.startswith(f"ray::{cls}") and p.status() != psutil.STATUS_ZOMBIE:
                return p.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


class Throttle(threading.Thread):
    """Keep the process that ``find_pid`` returns stopped (SIGSTOP) for ``stopped`` of every
    ``period`` seconds, until ``done`` is set or the process exits. A stopped fraction f makes it
    1 / (1 - f) times slower; it is always left running."""

    def __init__(self, find_pid, stopped: float = 0.9, period: float = 0.5):
        super().__init__(daemon=True, name="throttle")
        if not 0.0 <= stopped < 1.0:
            raise ValueError(f"Throttle: stopped={stopped} must be in [0, 1)")
        self.find_pid, self.stopped, self.period = find_pid, stopped, period
        self.done, self.cycles = threading.Event(), 0

    def run(self) -> None:
        pid = None
        while not self.done.is_set():
            pid = pid or self.find_pid()
            if pid is None:
                self.done.wait(0.1)
                continue
            try:
                os.kill(pid, signal.SIGSTOP)
                self.done.wait(self.stopped * self.period)
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                return
            self.cycles += 1
            self.done.wait((1 - self.stopped) * self.period)

    def stop(self) -> None:
        self.done.set()
        self.join()
