# Peak memory of the learner's forward paths on a Search-QA-like group of 8 rows (issue 41 diagnosis).
# Run as: python probe.py MODE  (MODE: shared | each | each_gc | each_ck | shared_ck)
# "gc": HF's gradient checkpointing; "ck": the shared-prefix forward's own, layer by layer
import random
import resource
import sys
import time
from functools import partial

import torch
from transformers import AutoModelForCausalLM

from pipeline.algorithm.logprobs import forward_response
from pipeline.algorithm.shared_prefix import forward_shared as _fs

mode = sys.argv[1]
forward_shared = partial(_fs, checkpoint="ck" in mode)
torch.set_num_threads(1)
M = "/root/.cache/privy-rl/warm_start/smollm2_135m-search_qa-eddeaa72f951"


def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


model = AutoModelForCausalLM.from_pretrained(
    M, dtype=torch.bfloat16, attn_implementation="eager" if "eager" in mode else "sdpa"
)
model.config.use_cache = False
if "gc" in mode:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
model.train()
rng = random.Random(0)
prefix = [rng.randint(0, 49000) for _ in range(300)]
rows = [prefix + [rng.randint(0, 49000) for _ in range(rng.randint(700, 1200))] for _ in range(8)]
T = max(map(len, rows))
ids = torch.zeros(len(rows), T, dtype=torch.long)
att = torch.zeros_like(ids)
resp = torch.zeros_like(ids)
for i, r in enumerate(rows):
    ids[i, : len(r)] = torch.tensor(r)
    att[i, : len(r)] = 1
    resp[i, len(r) - 40 : len(r)] = 1
base = peak()
print(mode, "tokens", sum(map(len, rows)), "after load", round(base, 3), flush=True)
for it in range(2):
    t0 = time.time()
    if "shared" in mode:
        out = forward_shared(model, ids, att, resp, with_entropy=False)
        out.logprobs.sum().backward()
    else:
        for i in range(len(rows)):
            n = len(rows[i])
            out = (forward_shared if "ck" in mode else forward_response)(
                model, ids[i : i + 1, :n], att[i : i + 1, :n], resp[i : i + 1, :n], with_entropy=False
            )
            out.logprobs.sum().backward()
    print(
        mode,
        it,
        "peak",
        round(peak(), 3),
        "over load",
        round(peak() - base, 3),
        "s",
        round(time.time() - t0, 1),
        flush=True,
    )
