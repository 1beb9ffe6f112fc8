# The learner's resident size phase by phase (the real LearnerWorker with its DeepSpeed engine, make
# train's learner config, outside Ray): setup, each micro-batch's forward + backward, the optimizer
# step; two steps of a synthetic Search-QA-sized batch (4 groups x 4 rows, a 250-token group prefix,
# 50-1100 tokens more, 30-90 response tokens; random ids). One thread.
# Run as: python phases.py MODE  (MODE: default | ck | ck_trim; ck: learner.gradient_checkpointing,
# trim: glibc malloc_trim(0) after setup and after each optimizer step)
import ctypes
import os
import random
import sys
import threading
import time
from dataclasses import replace

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from actors.learner_actor import LearnerActor
from lab.synthetic import search_qa_batch
from pipeline.tools.cli import compose

mode = sys.argv[1]
libc = ctypes.CDLL("libc.so.6")
M = "/root/.cache/privy-rl/warm_start/smollm2_135m-search_qa-eddeaa72f951"
state = {"max": 0.0}


def trim():
    if "trim" in mode:
        libc.malloc_trim(0)


def cur():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 1e9


def sampler():
    while True:
        state["max"] = max(state["max"], cur())
        time.sleep(0.05)


def mark(what):
    print(f"{what:<28} now {cur():.2f}  max since last {state['max']:.2f}", flush=True)
    state["max"] = cur()


threading.Thread(target=sampler, daemon=True).start()
cfg = compose(["+experiment=search_qa_warm_start"]).learner
if "ck" in mode:
    cfg = replace(cfg, gradient_checkpointing=True)
mark("start")
actor = LearnerActor(
    cfg, M, temperature=1.0, total_steps=10, rank=0, world_size=1, seed=0, master_addr="127.0.0.1", threads=1
)
w = actor.worker
mark("setup")
if "trim" in mode:
    trim()
    mark("trimmed")
eng = w.engine
orig_backward, orig_step = eng.backward, w._optimizer_step
n = {"mb": 0}


def backward(loss, **kw):
    out = orig_backward(loss, **kw)
    n["mb"] += 1
    mark(f"  micro-batch {n['mb']} fwd+bwd")
    return out


def step(pre):
    mark("  before optimizer step")
    out = orig_step(pre)
    mark("  optimizer step")
    if "trim" in mode:
        trim()
        mark("  trimmed")
    return out


eng.backward, w._optimizer_step = backward, step
rng = random.Random(0)
for s in range(2):
    b = search_qa_batch(rng)
    n["mb"] = 0
    t0 = time.time()
    m = w.train_step([b])
    mark(f"step {s + 1} done ({time.time() - t0:.0f} s, {m['learner/forwarded_tokens'][0]:.0f} tokens)")
