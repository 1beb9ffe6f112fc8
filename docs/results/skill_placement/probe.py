"""The Search-QA clone's first reply with the retrieved skills at each placement (issue 42).

For the first ``--tasks`` questions of ``valid``: the student's first prompt as the rollout
builds it (``StudentPrompts.build`` with a ``SkillsView``: keyword retrieval, 6 skills, the
search_qa bank, the prompt budget of ``conf/rollout/hf.yaml``), and without skills; the clone's
greedy reply (bf16, at most 96 new tokens as in ``make train``'s recipe), classified by its first
action tag. Writes ``probe.json`` and ``meta.json`` beside this file.

    python docs/results/skill_placement/probe.py --model ~/.cache/privy-rl/warm_start/<clone> --tasks 16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from envs import make_env  # noqa: E402
from lab.checkout import git_commit  # noqa: E402
from lab.results import write_meta  # noqa: E402
from pipeline.context.skills import SkillsView  # noqa: E402
from pipeline.context.student_prompts import StudentPrompts  # noqa: E402
from pipeline.models import load_tokenizer  # noqa: E402

PLACEMENTS = [None, "raw_prefix", "system", "user", "user_front"]  # None: no skills (the clone's own prompts)


def first_action(text: str) -> str:
    """The first action tag the reply opens (``search`` or ``answer``), else ``none``."""
    found = {tag: text.find(f"<{tag}>") for tag in ("search", "answer")}
    found = {k: v for k, v in found.items() if v >= 0}
    return min(found, key=found.get) if found else "none"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the clone's HF directory (make train's warm start cache)")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    git = git_commit(ROOT)  # the code probed: read before it runs (the tree may move meanwhile)
    torch.set_num_threads(args.threads)
    tok = load_tokenizer(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).eval()
    prompts = StudentPrompts(tok, max_prompt_tokens=1536, history_length=4)
    env = make_env("search_qa", {}, "valid")
    rows, t0 = [], time.time()
    for seed in range(args.tasks):
        obs = env.reset(seed)
        for placement in PLACEMENTS:
            view = None if placement is None else SkillsView("search_qa", "keyword", 6, placement, seed=0)
            _, ids, _, _ = prompts.build(env, [], obs, 0, view)
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), max_new_tokens=96, do_sample=False)
            reply = tok.decode(out[0, len(ids) :], skip_special_tokens=True)
            rows.append(
                {
                    "task": env.task_id,
                    "placement": placement or "none",
                    "prompt_tokens": len(ids),
                    "action": first_action(reply),
                    "reply": reply,
                }
            )
    counts = {}
    for r in rows:
        counts.setdefault(r["placement"], {"search": 0, "answer": 0, "none": 0})[r["action"]] += 1
    report = {"tasks": args.tasks, "seconds": round(time.time() - t0, 1), "first_action": counts, "rows": rows}
    (HERE / "probe.json").write_text(json.dumps(report, indent=1) + "\n")
    write_meta(
        HERE,
        ROOT,
        git,
        kind="probe",
        command=f"python docs/results/skill_placement/probe.py --model <clone> --tasks {args.tasks}",
        model=Path(args.model).name,
    )
    print(json.dumps(counts, indent=1))


if __name__ == "__main__":
    main()
