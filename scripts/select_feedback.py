"""Feedback selection for targeted guidance: adopt only feedback strings that help the base policy.

    python scripts/select_feedback.py --env keyword --candidates file.json --tasks 16 --model tiny --out DIR
    python scripts/select_feedback.py --env code_edit --env-options '{"max_turns": 4}' --max-prompt-tokens 2048 \
        --max-new-tokens 80 --candidates file.json --tasks 4 --out DIR   # code_edit's system prompt is ~700 tokens

Writes ``DIR/adopted.json``, ``DIR/feedback_selection.md`` and ``DIR/outcomes.json``; see
``pipeline/tools/feedback_selection.py`` for the rule.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.tools.feedback_selection import load_candidates, markdown_table, run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", required=True, help="a registered privy env (envs/__init__.py)")
    p.add_argument("--env-options", default="{}", help="env.options as JSON")
    p.add_argument("--split", default="train")
    p.add_argument("--candidates", required=True, help="JSON/YAML file {criterion: [feedback strings]}")
    p.add_argument("--tasks", type=int, default=16, help="task seeds 0..N-1, one episode each")
    p.add_argument("--model", default="smollm2_135m", help="smollm2_135m | tiny | tiny_bytes | HF directory")
    p.add_argument("--out", required=True)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=1536,
        help="rollout.max_prompt_tokens (code_edit needs 2048: a ~700-token system prompt)",
    )
    p.add_argument("--history-length", type=int, default=2)
    p.add_argument("--sample-seed", type=int, default=0)
    p.add_argument("--min-gain", type=float, default=0.0, help="required pass-rate gain (strictly more)")
    p.add_argument("--precision", default="auto", help="auto (bf16 where native) | fp32 | bf16")
    a = p.parse_args(argv)
    outcomes = run(
        env=a.env,
        candidates=load_candidates(a.candidates),
        n_tasks=a.tasks,
        model=a.model,
        out_dir=a.out,
        env_options=json.loads(a.env_options),
        split=a.split,
        temperature=a.temperature,
        max_new_tokens=a.max_new_tokens,
        history_length=a.history_length,
        sample_seed=a.sample_seed,
        min_gain=a.min_gain,
        precision=a.precision,
        max_prompt_tokens=a.max_prompt_tokens,
    )
    print(markdown_table(outcomes, a.tasks), end="")
    print(f"wrote {Path(a.out) / 'adopted.json'} and {Path(a.out) / 'feedback_selection.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
