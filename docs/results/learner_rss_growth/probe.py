# Does the learner's resident size grow step after step outside Ray? The real LearnerWorker with
# its DeepSpeed engine and make train's learner config, in this process (no Ray, no weight
# packets), STEPS steps of synthetic Search-QA-sized batches (4 groups x 4 rows: a 250-token group
# prefix, 50-1100 tokens more, 30-90 response tokens, random ids; a new batch each step). After each
# step: the private resident size (RssAnon) now, the largest resident size during the step, and the
# tensors the engine holds. Two threads.
# Run as: python probe.py STEPS MODE  (MODE: default | trim: glibc malloc_trim(0) after each step)
import ctypes
import os
import random
import sys
import threading
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from actors.learner_actor import LearnerActor
from actors.learner_memory import memory_breakdown
from actors.learner_memory import status_gb as status
from lab.synthetic import search_qa_batch
from pipeline.tools.cli import compose

steps, mode = int(sys.argv[1]), sys.argv[2]
libc = ctypes.CDLL("libc.so.6")
M = os.path.expanduser("~/.cache/privy-rl/warm_start/smollm2_135m-search_qa-208e805ff909")
state = {"max": 0.0}


def sampler():
    while True:
        state["max"] = max(state["max"], status("VmRSS"))
        time.sleep(0.05)


threading.Thread(target=sampler, daemon=True).start()
cfg = compose(["+experiment=search_qa_warm_start"]).learner
actor = LearnerActor(
    cfg, M, temperature=1.0, total_steps=steps, rank=0, world_size=1, seed=0, master_addr="127.0.0.1", threads=2
)
w = actor.worker
print(f"setup: anon {status('RssAnon'):.2f} GB, resident {status('VmRSS'):.2f} GB", flush=True)
rng = random.Random(0)
for s in range(steps):
    b = search_qa_batch(rng)
    state["max"] = status("VmRSS")
    t0 = time.time()
    m = w.train_step([b])
    if mode == "trim":
        libc.malloc_trim(0)
    held = sum(
        v for k, v in memory_breakdown(w.engine).items() if k in ("parameters", "gradients", "optimizer", "deepspeed")
    )
    print(
        f"step {s + 1}: {time.time() - t0:.0f} s, {m['learner/forwarded_tokens'][0]:.0f} tokens; anon now "
        f"{status('RssAnon'):.2f} GB, resident peak during the step {state['max']:.2f} GB, tensors held {held:.2f} GB",
        flush=True,
    )
