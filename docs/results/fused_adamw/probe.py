"""torch's AdamW update alone, the per-tensor loop against the fused kernel, at a 135M model's size.

    OMP_NUM_THREADS=1 python docs/results/fused_adamw/probe.py loop|fused

One fp32 parameter of SmolLM2-135M's size (134,515,008 elements, as DeepSpeed's flat master holds
it), a gradient, AdamW (weight decay 0.01); the first update allocates the moments, then three
more are timed. Prints the process's peak resident size after the first update and after the
three, the seconds per update, and a checksum of five elements (the same on both: one update).
Each kind runs in a process of its own so that its peak is its own.
"""

import resource
import sys
import time

import torch

torch.manual_seed(0)
impl = sys.argv[1]
n = 134_515_008
p = torch.nn.Parameter(torch.randn(n) * 0.02)
p.grad = torch.randn(n) * 1e-3
kw = {"fused": True} if impl == "fused" else {"foreach": False}
opt = torch.optim.AdamW([p], lr=1e-5, weight_decay=0.01, **kw)
opt.step()  # the moments are allocated
first = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
t = time.time()
for _ in range(3):
    opt.step()
dt = (time.time() - t) / 3
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
print(
    f"{impl}: peak {first:.2f} GB after the first update, {peak:.2f} GB after 3 more, {dt:.3f} s per update, "
    f"checksum {float(p.detach()[:5].sum()):.9f}"
)
