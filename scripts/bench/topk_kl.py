"""The top-k reverse KL (estimator ``topk_rkl``) against the exact one (``full_kl``) on the same rows.

    python scripts/bench/topk_kl.py [--model smollm2_135m] [--env keyword] [--method hint_distill_topk]
                                    [--groups 8] [--group-size 4] [--k 1 4 16 64 256] [--out DIR]

Real rows: a rollout worker of a real run (HF engine, fp32) plays ``--groups`` groups on the env's
train split; the method's context provider builds each row's privileged prompt (for the hint
methods: the env's hint in the system message), exactly as the scorer does. On every response
token, with the same fp32 weights for student (plain prompt) and teacher (privileged prompt):

- ``full``: KL(p || q) over the whole vocabulary (what ``full_kl`` trains);
- per k: the sum cut to the student's top-k tokens S_t (what ``topk_rkl`` trains), its bias
  ``topk - full`` (mean per token, and relative to the mean full KL), the student's mass on S_t,
  and the cosine between the two terms' gradients with respect to the student's logits (over
  all tokens of all rows: 1 = the same direction).

Prints one JSON object; ``--out DIR`` stores a result folder. It measures numerics, not speed.
"""

from __future__ import annotations

import argparse
import json

from lab.bench import Bench, add_out


def rows_and_prompts(args):
    """(student prompt, teacher prompt, response) of every row the method's teacher scores."""
    import dataclasses

    from actors.rollout import RolloutWorker
    from pipeline.context.prompts import TeacherPrompts
    from pipeline.methods import build_method
    from pipeline.models import resolve_model
    from pipeline.tools.cli import compose

    cfg = compose([f"model={args.model}", f"env={args.env}", f"method={args.method}", "rollout.precision=fp32"])
    rcfg = dataclasses.replace(cfg.rollout, group_size=args.group_size, max_new_tokens=args.max_new_tokens)
    path = str(resolve_model(cfg.model.name))
    worker = RolloutWorker(rcfg, cfg.env, path, chat_template=cfg.model.chat_template)
    method = build_method(cfg.method, invalid_action_penalty=0.0, env_name=cfg.env.name)
    prompts = TeacherPrompts(worker.tokenizer, 8192)
    method.attach(prompts)
    spec = method.teacher_spec()
    out = []
    try:
        for seed in range(args.groups):
            g = worker.run_group(
                task_seed=seed, split=cfg.env.train_split, group_size=args.group_size, temperature=1.0, sample_seed=seed
            )
            for ep in g.episodes:
                for row in ep.turns:
                    ids = spec.provider.teacher_prompt(prompts, ep, row) if spec.selects(ep, row) else None
                    if ids is not None:
                        out.append((row.prompt_ids, ids, row.response_ids))
    finally:
        worker.close()
    return path, out


def measure(path: str, rows, ks: list[int]) -> dict:
    import torch

    from pipeline.algorithm.logprobs import forward_response
    from pipeline.models import load_model

    model = load_model(path, torch.float32, "cpu").eval()

    def logits(prompt, response):
        x = torch.tensor([prompt + response])
        mask = torch.zeros_like(x, dtype=torch.float32)
        mask[0, len(prompt) :] = 1
        with torch.no_grad():
            return forward_response(model, x, torch.ones_like(x), mask, with_entropy=False, with_logits=True).logits

    s_all, t_all = [], []
    for plain, priv, resp in rows:
        s_all.append(logits(plain, resp))
        t_all.append(logits(priv, resp))
    s = torch.cat(s_all).double().requires_grad_(True)  # [N, V] student logits, all response tokens
    log_q = torch.log_softmax(torch.cat(t_all).double(), -1)
    log_p = torch.log_softmax(s, -1)
    full_tok = (log_p.exp() * (log_p - log_q)).sum(-1)  # [N]
    (g_full,) = torch.autograd.grad(full_tok.sum(), s)
    full_mean = float(full_tok.mean())
    out = {"rows": len(rows), "tokens": int(s.shape[0]), "vocab": int(s.shape[1]), "full_kl_mean": full_mean, "k": {}}
    for k in ks:
        ids = torch.topk(s.detach(), k, dim=-1).indices
        lp = torch.log_softmax(s, -1).gather(-1, ids)
        cut_tok = (lp.exp() * (lp - log_q.gather(-1, ids))).sum(-1)
        (g_cut,) = torch.autograd.grad(cut_tok.sum(), s)
        bias = (cut_tok - full_tok).detach()
        out["k"][str(k)] = {
            "topk_kl_mean": float(cut_tok.mean()),
            "bias_mean": float(bias.mean()),
            "bias_relative": float(bias.mean()) / full_mean if full_mean else float("nan"),
            "abs_error_p90": float(bias.abs().quantile(0.9)),
            "support_mass_mean": float(lp.exp().sum(-1).mean()),
            "gradient_cosine": float(torch.nn.functional.cosine_similarity(g_cut.flatten(), g_full.flatten(), dim=0)),
        }
    return out


def table(report: dict) -> list[dict]:
    m = report["measured"]
    return [
        {
            "k": k,
            "top-k KL, mean per token": f"{r['topk_kl_mean']:.4f}",
            "full KL, mean per token": f"{m['full_kl_mean']:.4f}",
            "bias (top-k - full)": f"{r['bias_mean']:+.4f}",
            "bias / full": f"{r['bias_relative']:+.1%}",
            "|error| p90": f"{r['abs_error_p90']:.4f}",
            "student mass on S_t": f"{r['support_mass_mean']:.3f}",
            "gradient cosine to full_kl": f"{r['gradient_cosine']:.3f}",
        }
        for k, r in m["k"].items()
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2_135m")
    ap.add_argument("--env", default="keyword")
    ap.add_argument("--method", default="hint_distill_topk")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--k", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    add_out(ap)
    args = ap.parse_args()
    bench = Bench.start(args.out)  # the code measured, read before it runs
    from pipeline.core.runtime_env import set_process_env

    set_process_env()
    path, rows = rows_and_prompts(args)
    report = {"command": bench.command, "model": args.model, "env": args.env, "method": args.method}
    report["measured"] = measure(path, rows, args.k)
    print(json.dumps(report, indent=1))
    workload = [f"model={args.model}", f"env={args.env}", f"method={args.method}", f"groups={args.groups}"]
    bench.store(report, table(report), workload)


if __name__ == "__main__":
    main()
