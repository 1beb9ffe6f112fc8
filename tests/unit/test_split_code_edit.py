"""code_edit's splits: train, valid and test never share a (family, target spec) pair, the unit that
fixes a task's reference edit (``tasks.SPLIT_PAIRS``, docs/envs_code_edit.md "Splits")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envs import make_env
from envs.code_edit import rubric, sandbox
from envs.code_edit.tasks import (
    FAMILIES,
    KINDS,
    MIN_HELD_OUT,
    SPEC_BY_KEY,
    SPLIT_PAIRS,
    SPLITS,
    Task,
    eligible_specs,
    generate_task,
    split_of,
)

N_PER_SPLIT = 2400  # generated tasks per split (600 per family); generate_task is pure, about 0.5 ms a task
HELD_OUT = ("valid", "test")
# The specs added with the split (the first 15 came before it): the sandbox test runs these targets.
NEW_SPECS = (
    "count_vowels",
    "slugify",
    "reverse_words",
    "mask",
    "gcd",
    "variance",
    "safe_divide",
    "digit_sum",
    "rotate",
    "differences",
    "frequencies",
    "last_index",
)
LIMITS = sandbox.SandboxLimits(timeout_s=5.0)


def target_key(task: Task) -> str:
    return task.task_id.rsplit("-", 1)[1]


def answer(task: Task) -> tuple:
    """The reference edits, the repository's module names replaced by their role (a helper module's
    name and the front end's are drawn per task; the project name never enters an edit)."""
    mod, front = task.target_module[: -len(".py")], task.notes["frontend"][: -len(".py")]
    roles = {f"{mod}.py": "<module>.py", f"{front}.py": "<frontend>.py"}
    return tuple(
        (
            roles[e.path],
            e.old.replace(f"from {mod} import ", "from <module> import "),
            e.new.replace(f"from {mod} import ", "from <module> import "),
        )
        for e in task.reference_edits
    )


def summarise(split: str, n: int = N_PER_SPLIT) -> dict[str, set]:
    """What ``n`` tasks of ``split`` carry, as sets: (family, target key) pairs, answers, instructions."""
    pairs, answers, instructions = set(), set(), set()
    for seed in range(n):
        task = generate_task(seed, split)
        pairs.add((task.family, target_key(task)))
        answers.add(answer(task))
        instructions.add(task.instruction)
    return {"pairs": pairs, "answers": answers, "instructions": instructions}


@pytest.fixture(scope="module")
def generated() -> dict[str, dict[str, set]]:
    return {split: summarise(split) for split in SPLITS}


def test_no_pair_answer_or_instruction_of_valid_or_test_occurs_in_train(generated):
    train = generated["train"]
    for split in HELD_OUT:
        held = generated[split]
        assert not held["pairs"] & train["pairs"], (split, sorted(held["pairs"] & train["pairs"]))
        assert not held["answers"] & train["answers"], split
        assert not held["instructions"] & train["instructions"], split


def test_valid_and_test_are_disjoint_and_differ(generated):
    valid, test = generated["valid"], generated["test"]
    assert valid["pairs"] and test["pairs"] and valid["pairs"] != test["pairs"]
    assert not valid["pairs"] & test["pairs"], sorted(valid["pairs"] & test["pairs"])
    assert not valid["answers"] & test["answers"]


def test_every_family_has_at_least_three_pairs_in_valid_and_in_test(generated):
    for split in SPLITS:
        by_family = {f: {k for fam, k in generated[split]["pairs"] if fam == f} for f in FAMILIES}
        # the stream reaches every assigned pair, and nothing else
        assert by_family == {f: set(SPLIT_PAIRS[split][f]) for f in FAMILIES}, split
        if split in HELD_OUT:
            assert all(len(keys) >= MIN_HELD_OUT >= 3 for keys in by_family.values()), (split, by_family)


def test_the_assignment_puts_every_pair_in_exactly_one_split_and_is_pinned():
    for family in FAMILIES:
        eligible = [s.key for s in eligible_specs(family)]
        assigned = [k for split in SPLITS for k in SPLIT_PAIRS[split][family]]
        assert sorted(assigned) == sorted(eligible), family  # a partition: each pair once
        assert all(split_of(family, k) in SPLITS for k in eligible)
        n = len(SPLIT_PAIRS["valid"][family])
        assert len(SPLIT_PAIRS["test"][family]) == n and n == max(MIN_HELD_OUT, round(0.15 * len(eligible)))
        for split in HELD_OUT:  # dealt round-robin over the kinds: every kind is held out
            assert {SPEC_BY_KEY[k].kind for k in SPLIT_PAIRS[split][family]} == set(KINDS), (split, family)
    assert len(eligible_specs("fix_bug")) == 27 and len(eligible_specs("add_param")) == 21
    # Pinned (in SPECS order): a change to the specs or the hashing that moves held-out pairs must be deliberate.
    assert SPLIT_PAIRS["valid"] == {
        "fix_bug": ("median", "chunk", "mask", "rotate"),
        "add_param": ("is_palindrome", "percent", "dedupe"),
        "rename": ("count_words", "top_n", "digit_sum", "last_index"),
        "implement": ("is_palindrome", "mean", "chunk", "frequencies"),
    }
    assert SPLIT_PAIRS["test"] == {
        "fix_bug": ("title_case", "flatten", "reverse_words", "safe_divide"),
        "add_param": ("initials", "scale", "differences"),
        "rename": ("clamp", "mean", "chunk", "slugify"),
        "implement": ("count_vowels", "reverse_words", "safe_divide", "differences"),
    }


def test_an_unknown_split_is_refused_with_the_allowed_ones():
    for split in ("valid_seen", "eval", ""):
        with pytest.raises(ValueError, match=r"unknown split .*\['train', 'valid', 'test'\]"):
            generate_task(0, split)
        with pytest.raises(ValueError, match=r"unknown split .*\['train', 'valid', 'test'\]"):
            make_env("code_edit", {}, split)


def test_generation_stays_deterministic_by_split_and_seed():
    for split in SPLITS:
        for seed in (0, 7, 123):
            assert generate_task(seed, split) == generate_task(seed, split)
    assert len({json.dumps(generate_task(5, split).files, sort_keys=True) for split in SPLITS}) == 3


def _write(root: Path, files: dict[str, str]) -> Path:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def _first_task(split: str, family: str) -> Task:
    """The first task of ``split`` in ``family`` whose target is a new spec, if the split has one there
    (valid's add_param pairs are all older specs: then its first task)."""
    wanted = set(NEW_SPECS) & set(SPLIT_PAIRS[split][family]) or set(SPLIT_PAIRS[split][family])
    return next(t for seed in range(200) if target_key(t := generate_task(seed, split, (family,))) in wanted)


@pytest.mark.parametrize("split", SPLITS)
def test_the_reference_solves_new_spec_tasks_of_every_family_in_the_sandbox(split, tmp_path):
    for family in FAMILIES:
        task = _first_task(split, family)
        initial = _write(tmp_path / f"{family}-initial", task.files)
        visible = sandbox.run_tests(initial, task.test_files, limits=LIMITS)
        assert visible.completed, visible.output_tail
        if family == "add_param":  # the visible tests pin the old behaviour; the hidden ones need the parameter
            assert visible.failed == 0 and visible.passed > 0, visible.output_tail
            hidden = sandbox.run_tests(initial, [], extra_tests={"hidden_tests.py": task.hidden_tests}, limits=LIMITS)
            assert hidden.completed and hidden.failed >= 2, hidden.output_tail
        else:  # a bug, a stub or the old name: the visible tests fail
            assert visible.failed > 0, (task.task_id, visible.output_tail)
        solved = dict(task.files)
        for e in task.reference_edits:
            assert solved[e.path].count(e.old) == 1, (task.task_id, e)
            solved[e.path] = solved[e.path].replace(e.old, e.new)
        final = sandbox.run_tests(
            _write(tmp_path / f"{family}-solved", solved),
            task.test_files,
            extra_tests={"hidden_tests.py": task.hidden_tests},
            limits=LIMITS,
        )
        assert final.all_passed and final.failed == 0 and final.passed > 0, (task.task_id, final.output_tail)
        if task.param is not None:
            p = task.param
            assert rubric.check_param(solved[p.module], p.function, p.name, p.default)[0], task.task_id
