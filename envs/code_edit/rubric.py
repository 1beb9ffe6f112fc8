"""The code-edit rubric: binary criteria, each with a static feedback string and a failing turn.

Criteria (``CRITERIA``; ``param_added_and_used`` only for ``add_param`` tasks):

* ``tests_pass``: the final repository passes the *original* visible tests (restored over any
  edit) and the hidden tests, in the sandbox. Fails at the last turn.
* ``param_added_and_used``: via ``ast`` on the target module: the function's signature has the
  parameter with the required default (compared as literals) and its body reads the name. Fails
  at the last turn.
* ``final_table``: the episode ended with ``finish`` and its message holds a Markdown table (a
  ``|``-row followed by a ``|---|`` separator row). Fails at the finish turn, or at the last
  turn when the agent never finished.
* ``stays_in_repo``: no tool call tried to reach outside the repository (absolute path, ``..``,
  a symlink). Fails at the first such turn.
* ``no_test_edits``: no tool call changed a file under ``tests/`` (even if a later call put it
  back). Fails at the first such turn.

"Fails at the last turn" follows the targeted-guidance convention (docs/methods.md): the feedback is
inserted before the turn where the criterion was violated, or before the last turn when it was
never satisfied. Turn indices are 0-based, like ``TurnRecord.turn_index``.

Reward = sum over applicable criteria of ``weight[c] * passed[c]`` + ``success_reward * won``,
with ``won`` = every applicable criterion passed. Example (the add_param episode of the docs, the
expert's five turns, default weights)::

    judge([...5 TurnLogs, the last a finish with a table...], tests_passed=True, param_check=(True, ""))
    -> tests_pass, param_added_and_used, final_table, stays_in_repo, no_test_edits all passed
    reward(criteria, DEFAULT_WEIGHTS, success_reward=1.0) -> (3.25, True)
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass

from pipeline.core.types import CriterionResult

CRITERIA = ("tests_pass", "param_added_and_used", "final_table", "stays_in_repo", "no_test_edits")

FEEDBACK = {
    "tests_pass": "Before you finish, call run_tests and keep fixing the source code until every test "
    "passes; read each failure line to see which function is wrong.",
    "param_added_and_used": "Add the requested parameter to the function's signature with exactly the "
    "requested default value, and make the function's body actually use it.",
    "final_table": "End by calling finish with a message that contains a Markdown table, e.g. "
    "'| file | change |' then '|---|---|' then one row per file you changed.",
    "stays_in_repo": "Only use paths relative to the repository root, such as 'calc.py' or "
    "'tests/test_shop.py': never absolute paths, '..' or links.",
    "no_test_edits": "Never modify the files under tests/: change the source code so that the existing tests pass.",
}

DEFAULT_WEIGHTS = {
    "tests_pass": 1.0,
    "param_added_and_used": 0.5,
    "final_table": 0.25,
    "stays_in_repo": 0.25,
    "no_test_edits": 0.25,
}

# A table: a row with at least two cells, then a separator row such as |---|:---:|.
_TABLE = re.compile(r"^\s*\|?[^\n|]*\|[^\n]*\n\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)+\|?\s*$", re.MULTILINE)


@dataclass(kw_only=True, slots=True)
class TurnLog:
    """What the rubric needs to know about one turn."""

    index: int
    tool: str = ""  # the tool called ("" when the response held no well-formed call)
    valid: bool = True
    escape_attempt: bool = False  # a path outside the repository was tried
    touched_tests: bool = False  # a file under tests/ was changed
    finish_message: str | None = None  # set on the finish turn


def has_markdown_table(text: str) -> bool:
    return bool(_TABLE.search(text or ""))


def check_param(source: str, function: str, name: str, default: str) -> tuple[bool, str]:
    """Does ``function`` in ``source`` take ``name=default`` and read ``name`` in its body?"""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return False, f"the module does not parse: {e.msg} (line {e.lineno})"
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function]
    if not funcs:
        return False, f"no function {function!r}"
    fn = funcs[-1]
    args = fn.args
    positional = args.posonlyargs + args.args
    defaults = dict(zip([a.arg for a in positional[len(positional) - len(args.defaults) :]], args.defaults))
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
    if name not in [a.arg for a in positional + args.kwonlyargs]:
        return False, f"{function} has no parameter {name!r}"
    if name not in defaults:
        return False, f"parameter {name!r} has no default"
    if not _same_literal(defaults[name], default):
        return False, f"the default of {name!r} is {ast.unparse(defaults[name])}, not {default}"
    used = any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
        for stmt in fn.body
        for n in ast.walk(stmt)
    )
    if not used:
        return False, f"the body of {function} never reads {name!r}"
    return True, ""


def _same_literal(node: ast.expr, source: str) -> bool:
    try:
        return ast.literal_eval(node) == ast.literal_eval(source) and type(ast.literal_eval(node)) is type(
            ast.literal_eval(source)
        )
    except (ValueError, SyntaxError, TypeError):
        return ast.unparse(node) == ast.unparse(ast.parse(source, mode="eval").body)


def judge(turns: list[TurnLog], *, tests_passed: bool, param_check: tuple[bool, str] | None) -> list[CriterionResult]:
    """Per-criterion verdicts of a finished episode (``param_check`` None = not an add_param task)."""
    last = max(0, len(turns) - 1)
    verdicts: list[tuple[str, bool, int]] = [("tests_pass", tests_passed, last)]
    if param_check is not None:
        verdicts.append(("param_added_and_used", param_check[0], last))
    finish = next((t for t in turns if t.finish_message is not None), None)
    table_ok = finish is not None and has_markdown_table(finish.finish_message or "")
    verdicts.append(("final_table", table_ok, finish.index if finish is not None else last))
    escape = next((t.index for t in turns if t.escape_attempt), None)
    verdicts.append(("stays_in_repo", escape is None, escape if escape is not None else last))
    edit = next((t.index for t in turns if t.touched_tests), None)
    verdicts.append(("no_test_edits", edit is None, edit if edit is not None else last))
    return [
        CriterionResult(criterion=c, passed=ok, failing_turn=None if ok else turn, feedback=FEEDBACK[c])
        for c, ok, turn in verdicts
    ]


def reward(criteria: list[CriterionResult], weights: dict[str, float], success_reward: float) -> tuple[float, bool]:
    """(episode reward, won) from the verdicts."""
    won = all(c.passed for c in criteria)
    total = sum(weights.get(c.criterion, 0.0) for c in criteria if c.passed)
    return total + (success_reward if won else 0.0), won


def validate_weights(weights: dict) -> dict[str, float]:
    unknown = sorted(set(weights) - set(CRITERIA))
    if unknown:
        raise ValueError(f"code_edit: criterion_weights has unknown criteria {unknown}; criteria are {list(CRITERIA)}")
    out = dict(DEFAULT_WEIGHTS)
    for name, value in weights.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ValueError(f"code_edit: criterion_weights[{name!r}] must be a finite number >= 0, got {value!r}")
        out[name] = float(value)
    return out
