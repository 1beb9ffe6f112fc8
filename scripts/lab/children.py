"""Child processes that a stop signal to their parent reaches once, and waits for.

``scripts/bench/learning.py`` runs each point as a ``scripts/train.py`` child; side by side
(``--parallel``) they all join a Ray cluster the parent started. SIGTERM or Ctrl-C to the parent
used to end that cluster at once, so its points lost every step since their last checkpoint. Here
the parent forwards the signal to each live child (each child saves a checkpoint within its
``trainer.stop_grace_s`` and exits), starts no new one, and waits for them before anything
shuts down. Children run in sessions of their own, so that a terminal's Ctrl-C reaches them only
through the parent, once (a second signal would hurry their save).
"""

from __future__ import annotations

import signal
import subprocess
import threading


class Children:
    """``run(cmd)`` starts a child and waits for it; ``install()`` makes SIGTERM and SIGINT to
    this process go to every live child and stop new starts (``stopped``: the signal's number)."""

    def __init__(self) -> None:
        self._live: set[subprocess.Popen] = set()
        self._lock = threading.RLock()  # the handler runs in the main thread, which may hold it
        self.stopped: int | None = None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.forward)

    def forward(self, signum: int, _frame=None) -> None:
        with self._lock:
            first = self.stopped is None
            self.stopped = signum
            live = list(self._live)
        for p in live:
            if p.poll() is None:
                p.send_signal(signum)
        if first:
            print(
                f"learning: {signal.Signals(signum).name}: passed to {len(live)} running point(s), which save a "
                "checkpoint and stop; no new point starts",
                flush=True,
            )

    def run(self, cmd: list[str], **popen) -> int | None:
        """The child's exit code, or None when a stop came before it could start."""
        with self._lock:
            if self.stopped is not None:
                return None
            p = subprocess.Popen(cmd, start_new_session=True, **popen)
            self._live.add(p)
        try:
            return p.wait()
        finally:
            with self._lock:
                self._live.discard(p)
