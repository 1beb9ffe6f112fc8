# Peak resident size of one row's forward + backward against its length, plain or checkpointed.
# Run as: python scale.py LENGTH MODE  (MODE: plain | ck; ck = forward_shared(checkpoint=True))
import random
import resource
import sys
import time

import torch
from transformers import AutoModelForCausalLM

from pipeline.algorithm.logprobs import forward_response
from pipeline.algorithm.shared_prefix import forward_shared

L, mode = int(sys.argv[1]), sys.argv[2]
torch.set_num_threads(1)
M = "/root/.cache/privy-rl/warm_start/smollm2_135m-search_qa-eddeaa72f951"


def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


model = AutoModelForCausalLM.from_pretrained(M, dtype=torch.bfloat16, attn_implementation="sdpa")
model.config.use_cache = False
model.train()
rng = random.Random(0)
ids = torch.tensor([[rng.randint(0, 49000) for _ in range(L)]])
att = torch.ones_like(ids)
resp = torch.zeros_like(ids)
resp[0, L - 40 :] = 1
base = peak()
t0 = time.time()
if mode == "ck":
    out = forward_shared(model, ids, att, resp, with_entropy=False, checkpoint=True)
else:
    out = forward_response(model, ids, att, resp, with_entropy=False)
out.logprobs.sum().backward()
over = peak() - base
print(L, mode, "over_load_gb", round(over, 3), "mb_per_tok", round(over * 1e3 / L, 2), "s", round(time.time() - t0, 1))
