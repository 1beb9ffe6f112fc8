"""scripts/lab/children.py with real child processes: a stop signal to the parent reaches each
running child once, the parent waits for their own clean exit, and nothing new starts after it."""

from __future__ import annotations

import signal
import sys
import threading
import time

from lab.children import Children

# a child that, on SIGTERM, takes a moment (its "checkpoint") and writes how many signals it saw
CHILD = """
import signal, sys, time
seen = []
def stop(signum, frame):
    seen.append(signum)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[1] + ".started", "w").close()
while not seen:
    time.sleep(0.02)
time.sleep(0.5)
open(sys.argv[1], "w").write(str(len(seen)))
sys.exit(3)
"""


def test_a_stop_reaches_every_running_child_once_and_waits_for_them(tmp_path):
    kids = Children()
    codes: dict[int, int | None] = {}

    def start(i: int) -> None:
        codes[i] = kids.run([sys.executable, "-c", CHILD, str(tmp_path / f"c{i}")])

    threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    deadline = time.time() + 30
    while not all((tmp_path / f"c{i}.started").exists() for i in range(2)) and time.time() < deadline:
        time.sleep(0.02)
    kids.forward(signal.SIGTERM)
    for t in threads:
        t.join(timeout=30)
    assert codes == {0: 3, 1: 3}  # each child's own exit, after its save
    assert [(tmp_path / f"c{i}").read_text() for i in range(2)] == ["1", "1"]
    assert kids.stopped == signal.SIGTERM
    assert kids.run([sys.executable, "-c", "raise SystemExit(0)"]) is None  # nothing starts after a stop
