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

from pipeline.tools.feedback_selection import load_candidates, markdown_table, run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", required=True, help="a registered privy env (envs/__init__.py)")
    p.add_argument("--env-options", default="{}", help="env.options as JSON")
    p.add_argument("--split", default="train")
    p.add_argument("--candidates", required=True, help="JSON/YAML file {criterion: [feedback strings]}")
    p.add_argument(
        "--tasks", dest="n_tasks", metavar="N", type=int, default=16, help="task seeds 0..N-1, one episode each"
    )
    p.add_argument("--model", default="smollm2_135m", help="smollm2_135m | tiny | tiny_bytes | HF directory")
    p.add_argument("--out", dest="out_dir", metavar="DIR", required=True)
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
    # Each option is the argument of run() of its name (dest); two of them arrive as text.
    a = vars(p.parse_args(argv))
    a["candidates"], a["env_options"] = load_candidates(a["candidates"]), json.loads(a["env_options"])
    outcomes = run(**a)
    out = Path(a["out_dir"])
    print(markdown_table(outcomes, a["n_tasks"]), end="")
    print(f"wrote {out / 'adopted.json'} and {out / 'feedback_selection.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
