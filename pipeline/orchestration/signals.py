"""The run's answer to SIGINT and SIGTERM, from its first line to its last.

**Before the controller runs** (the checks, the warm start, Ray and the actors starting, a
resume's load) no step of this start is trained, so a signal stops the start-up where it is: the
handler raises ``RunStopped``, which unwinds through the cleanups of whatever was being built (the
warm start's staging dir and its cloning process, a model cache's build, the actors), and the
run ends with one line and the shell's status for the signal (128 + its number). A short write
that must not be cut (the run dir's files) holds a signal until it is done (``deferred``).

**While the controller runs** a signal is a stop request, handed to the event loop:

1. SIGINT finishes the step in progress, SIGTERM keeps to ``trainer.stop_grace_s``
   (``stopping.py``); either then checkpoints the last trained step.
2. Hurry: a step whose update has not begun is given up now, one that has begun is finished, a
   save in progress is let finish; the last trained step is saved.
3. Abort at once: the last line says which trained steps that loses.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunStopped(KeyboardInterrupt):
    """The run stopped early on request (Ctrl-C, SIGTERM); the message says what is saved and how
    to go on. ``signum``: the signal that asked (the process exits with 128 + it)."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.signum = int(signum)


def _say(line: str) -> None:
    print(f"privy-rl: {line}", file=sys.stderr, flush=True)


class StopSignals:
    """Installed for a run's whole length (a context manager; only the main thread may install
    signal handlers, so elsewhere, e.g. a test's thread, it does nothing)."""

    def __init__(self):
        self.received: list[int] = []
        self.stage = "the checks"  # what the start-up is doing, for the line a signal ends it with
        self._old: dict[int, object] = {}
        self._loop = None  # while the controller runs: its event loop ...
        self._on_stop = None  # ... and what a signal asks of it
        self._held = 0
        self._pending: list[int] = []

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._old[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, old in self._old.items():
            signal.signal(signum, old)

    @property
    def first(self) -> int:
        """The first signal received (it sets the exit status); SIGINT when none was."""
        return self.received[0] if self.received else int(signal.SIGINT)

    def during(self, stage: str) -> None:
        self.stage = stage

    @contextlib.contextmanager
    def deferred(self):
        """A signal that comes inside is acted on when the block is done (a file written whole)."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
        if not self._held and self._pending:
            signum, self._pending = self._pending[0], []
            self._stop_start_up(signum)

    @contextlib.contextmanager
    def ray_starting(self):
        """``ray.init`` puts in its own SIGTERM handler (``sys.exit(15)``): a SIGTERM while Ray
        starts is that exit, said as ours; ours is put back after."""
        try:
            yield
        except SystemExit as e:
            if e.code != signal.SIGTERM:
                raise
            self.received.append(signal.SIGTERM)
            self._stop_start_up(signal.SIGTERM)
        finally:
            if signal.SIGTERM in self._old:
                signal.signal(signal.SIGTERM, self._handle)

    @contextlib.contextmanager
    def controller(self, loop, on_stop):
        """While the controller runs, signal number n is ``on_stop(signum, n)`` on ``loop``'s
        thread (never inside whatever the loop was running when it came)."""
        self._loop, self._on_stop = loop, on_stop
        try:
            yield
        finally:
            self._loop = self._on_stop = None
            self.stage = None  # the run is ending: a later signal has nothing left to stop

    def _handle(self, signum: int, frame) -> None:
        self.received.append(signum)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._on_stop, signum, len(self.received))
        elif self.stage is None:
            _say(f"{signal.Signals(signum).name}: the run is ending already")
        elif self._held:
            self._pending.append(signum)
        else:
            self._stop_start_up(signum)

    def _stop_start_up(self, signum: int) -> None:
        name = signal.Signals(signum).name
        raise RunStopped(
            f"{name} during {self.stage}: stopped before any step of this start was trained (nothing is "
            "lost): start the run again to go on",
            signum=signum,
        )


def ask_to_stop(controller, grace_s: float, signum: int, n: int) -> None:
    """The controller's answer to signal number ``n`` (see the module's docstring)."""
    name, step = signal.Signals(signum).name, controller.state.step
    if n == 1 and signum == signal.SIGTERM:  # a cluster's stop: SIGKILL follows after its grace
        _say(
            f"SIGTERM: finishing step {step + 1} if it can be checkpointed within trainer.stop_grace_s="
            f"{grace_s:g}, else keeping step {step}; validations put off to the resumed run (a second signal hurries)"
        )
        controller.request_stop(deadline=time.monotonic() + grace_s)
    elif n == 1:
        _say(f"Ctrl-C: finishing step {step + 1}, then saving a checkpoint (a second Ctrl-C hurries)")
        controller.request_stop()
    elif n == 2:
        _say(
            f"second stop request ({name}): giving up step {step + 1} unless its update began, letting a "
            f"save in progress finish and saving the last trained step (a third signal aborts without it)"
        )
        controller.saver.stop.set(time.monotonic())
    elif not controller.aborted:
        _say(f"third stop request ({name}): aborting now")
        controller.request_stop()


def abort_line(controller, run_dir, total_steps: int) -> str:
    """What an abort (the third signal) loses, and where the run goes on from."""
    step, saved, saving = controller.state.step, controller.saver.saved_step, controller.saver.saving
    last = saved or 0
    if step <= last:
        lost = "no trained step is lost"
    elif step == last + 1:
        lost = f"step {step} was trained but is not saved"
    else:
        lost = f"steps {last + 1}-{step} were trained but are not saved"
    where = f"step {saved} is saved: continue with trainer.resume={run_dir}" if saved else "no step is saved"
    during = f"while saving step {saving}" if saving is not None else f"during step {step + 1} of {total_steps}"
    return f"aborted {during}: {lost}; {where}"
