"""code_edit env: tasks, tool calls, sandbox containment, rubric and the env contract."""

from __future__ import annotations

import glob
import json
import os
import socket
import tempfile
from pathlib import Path

import pytest

from envs import make_env
from envs.code_edit import rubric, sandbox, specs, tools
from envs.code_edit.env import CodeEditOptions
from envs.code_edit.rubric import TurnLog
from envs.code_edit.tasks import FAMILIES, SPECS, expert_responses, generate_task
from pipeline.context.skill_bank import load_bank

FAST = sandbox.SandboxLimits(timeout_s=0.6)


def play(env, responses):
    results = []
    for r in responses:
        res = env.step(r)
        results.append(res)
        if res.done:
            break
    return results


def new_env(seed: int, **options):
    env = make_env("code_edit", options, "train")
    env.reset(seed)
    return env


def by_name(criteria):
    return {c.criterion: c for c in criteria}


def call(name, **arguments):
    return tools.format_tool_call(name, arguments)


TABLE = "| file | change |\n|---|---|\n| x.py | y |"


# ----- tasks -------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_scripted_expert_wins_every_task_family(family):
    seed = FAMILIES.index(family) + 4 * 3  # families take turns by seed
    env = new_env(seed)
    try:
        assert env.task.family == family and env.task_type == family
        results = play(env, expert_responses(env.task))
        final = results[-1]
        assert final.done and final.won, [(c.criterion, c.passed) for c in final.criteria]
        assert all(r.action_valid for r in results)
        assert all(c.passed and c.failing_turn is None for c in final.criteria)
        names = {c.criterion for c in final.criteria}
        assert ("param_added_and_used" in names) == (family == "add_param")
        expected = sum(rubric.DEFAULT_WEIGHTS[c] for c in names) + env.success_reward
        assert final.reward == pytest.approx(expected)
        assert all(r.reward == 0.0 for r in results[:-1])
        assert "passed, 0 failed" in results[-2].observation.text  # run_tests before finish
    finally:
        env.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_finishing_at_once_fails_the_tests_criterion(family):
    env = new_env(FAMILIES.index(family))
    try:
        [final] = play(env, [call("finish", message=TABLE)])
        verdicts = by_name(final.criteria)
        assert not final.won and not verdicts["tests_pass"].passed
        assert verdicts["tests_pass"].failing_turn == 0
        assert verdicts["tests_pass"].feedback == rubric.FEEDBACK["tests_pass"]
        if family == "add_param":
            assert not verdicts["param_added_and_used"].passed
    finally:
        env.close()


def test_generation_is_deterministic_by_seed():
    for seed in range(8):
        assert generate_task(seed, "train") == generate_task(seed, "train")
    files = [json.dumps(generate_task(s, "train").files, sort_keys=True) for s in range(12)]
    assert len(set(files)) == 12
    assert generate_task(3, "train").files != generate_task(3, "valid").files
    assert [generate_task(s).family for s in range(8)] == list(FAMILIES) * 2


def test_task_families_option_restricts_the_stream():
    fams = ("rename", "implement")
    assert [generate_task(s, families=fams).family for s in range(4)] == ["rename", "implement"] * 2
    with pytest.raises(ValueError, match="unknown task families"):
        generate_task(0, families=("refactor",))


def test_every_bug_is_exposed_by_a_visible_case_and_every_parameter_matters():
    for spec in SPECS:
        good, bad = {}, {}
        exec(spec.source(), good)
        exec(spec.buggy(), bad)
        differs = []
        for case in spec.cases[:-1]:  # the last case is hidden in fix_bug tasks
            args = eval(f"(lambda *a: a)({case})", good)
            try:
                differs.append(bad[spec.name](*args) != good[spec.name](*args))
            except Exception:
                differs.append(True)
        assert any(differs), spec.key
        if spec.param is not None:
            new = {}
            exec(spec.with_param(), new)
            for case in spec.cases:  # the default keeps the old behaviour
                args = eval(f"(lambda *a: a)({case})", good)
                assert new[spec.name](*args) == good[spec.name](*args), spec.key
            # a parameter test must fail against the old function (it rejects the keyword)
            for case in spec.param.cases:
                with pytest.raises(TypeError):
                    eval(f"{spec.name}({case})", dict(good))


SPEC_ENTRY = """
- key: twice
  kind: math
  name: twice
  alt_name: double
  label: twice
  params: x
  doc: Return `x` times 2.
  body: |
    y = x * 2
    return y
  bug: ["x * 2", "x * 3"]
  cases: ["1", "-2"]
  param:
    name: factor
    default: "2"
    body: return x * factor
    cases: ["1, factor=3"]
    describe: "`x` is multiplied by `factor`"
"""


def test_the_spec_table_is_loaded_from_its_data_file_with_every_field_checked():
    (spec,) = specs.load_specs(SPEC_ENTRY)
    assert spec.body == "    y = x * 2\n    return y\n" and spec.bug == ("x * 2", "x * 3") and spec.cases == ("1", "-2")
    assert spec.param == specs.ParamSpec(
        "factor", "2", "    return x * factor\n", ("1, factor=3",), "`x` is multiplied by `factor`"
    )
    assert SPECS is specs.SPECS and len(SPECS) == 27  # the shipped specs.yaml
    bad = {
        "unknown field 'variants'": SPEC_ENTRY.replace("  label: twice\n", "  label: twice\n  variants: []\n"),
        "missing field 'doc'": SPEC_ENTRY.replace("  doc: Return `x` times 2.\n", ""),
        "missing field 'param.describe'": SPEC_ENTRY.replace('    describe: "`x` is multiplied by `factor`"\n', ""),
        "'param.default' must be a string, not int": SPEC_ENTRY.replace('default: "2"', "default: 2"),
        "'bug' must be a list of 2 strings": SPEC_ENTRY.replace('"x * 3"]', '"x * 3", "x"]'),
    }
    for message, text in bad.items():
        with pytest.raises(ValueError, match=f"spec 'twice': .*{message}"):
            specs.load_specs(text)
    with pytest.raises(ValueError, match="entry 0: missing field 'key'"):
        specs.load_specs(SPEC_ENTRY.replace("- key: twice\n  kind", "- kind"))
    with pytest.raises(ValueError, match=r"duplicate key \['twice'\]"):
        specs.load_specs(SPEC_ENTRY + SPEC_ENTRY)


def test_hidden_tests_never_enter_the_repository():
    for seed in range(8):
        task = generate_task(seed)
        assert "Hidden tests" in task.hidden_tests
        assert all("Hidden tests" not in text for text in task.files.values())
        env = new_env(seed)
        try:
            assert all("Hidden" not in env.workspace.read(p) for p in env.workspace.files())
        finally:
            env.close()


def test_skill_bank_covers_the_families_and_classifies_instructions():
    bank = load_bank("code_edit")
    bank.check_task_types(FAMILIES)
    for seed in range(8):
        task = generate_task(seed, "valid")
        assert bank.classify(task.instruction) == task.family


# ----- the expert and the privileged hint -----------------------------------------------------------
def play_expert(env):
    results = []
    while (response := env.expert_response()) is not None:
        results.append(env.step(response))
    return results


@pytest.mark.parametrize("family", FAMILIES)
def test_the_envs_expert_wins_every_family_and_stops_when_the_episode_ends(family):
    env = new_env(FAMILIES.index(family) + 8)
    try:
        results = play_expert(env)
        assert results[-1].done and results[-1].won and all(r.action_valid for r in results)
        tools_called = [r.info.get("tool") for r in results]
        assert tools_called[0] == "view_file" and tools_called[-1] == "finish"
        assert env.expert_response() is None
    finally:
        env.close()


def test_the_expert_reads_the_working_copy_after_the_policys_own_turns():
    env = new_env(FAMILIES.index("rename"))  # three reference edits
    try:
        first = env.task.reference_edits[0]
        assert not env.step("no call here").action_valid
        assert env.step(call("replace_in_file", path=first.path, old=first.old, new=first.new)).action_valid
        results = play_expert(env)
        tools_called = [r.info.get("tool") for r in results]
        assert tools_called.count("replace_in_file") == len(env.task.reference_edits) - 1  # not the done one
        assert results[-1].won
    finally:
        env.close()


def test_with_few_turns_left_the_expert_skips_the_view_and_the_test_run():
    env = new_env(FAMILIES.index("fix_bug"), max_turns=2)
    try:
        results = play_expert(env)
        assert [r.info.get("tool") for r in results] == ["replace_in_file", "finish"] and results[-1].won
    finally:
        env.close()


def test_the_privileged_hint_names_the_failing_hidden_tests_of_the_initial_code():
    env = make_env("code_edit", {}, "train")
    assert env.privileged_hint() is None  # before reset
    env.reset(FAMILIES.index("add_param"))
    try:
        p = env.task.param
        hint = env.privileged_hint()
        assert hint.startswith("These tests fail on the initial code: hidden_tests.py::")
        assert f"unexpected keyword argument '{p.name}'" in hint and "assert " in hint
        play_expert(env)  # the working copy now passes; the hint stays the initial code's
        assert env.privileged_hint() == hint
        env.reset(FAMILIES.index("fix_bug"))
        assert "tests/test_" in env.privileged_hint() and "AssertionError" in env.privileged_hint()
    finally:
        env.close()


def test_the_hint_shows_at_most_three_failures_and_nothing_when_all_pass(tmp_path):
    from envs.code_edit.env import failing_tests_hint

    (tmp_path / "test_x.py").write_text(
        "".join(f"def test_{i}():\n    assert {i} == -1\n" for i in range(5)) + "def test_ok():\n    pass\n"
    )
    hint = failing_tests_hint(sandbox.run_tests(tmp_path, ["test_x.py"], limits=FAST))
    assert hint.count("AssertionError at test_x.py:") == 3 and hint.endswith("(2 more fail the same way.)")
    assert "assert 0 == -1" in hint
    (tmp_path / "test_x.py").write_text("def test_ok():\n    pass\n")
    assert failing_tests_hint(sandbox.run_tests(tmp_path, ["test_x.py"], limits=FAST)) == ""


# ----- tool calls --------------------------------------------------------------------------------
MALFORMED = {
    "bad_json": '<tool_call>\n{"name": "view_file", "arguments": {"path": calc.py}}\n</tool_call>',
    "unknown_tool": call("delete_file", path="calc.py"),
    "missing_argument": call("replace_in_file", path="app.py", old="x"),
    "extra_argument": call("view_file", path="app.py", line=3),
    "non_string_argument": call("view_file", path=7),
    "no_tool_call": "I think the bug is in calc.py.",
    "unterminated": '<tool_call>{"name": "list_files", "arguments": {}}',
    "not_an_object": "<tool_call>[1, 2]</tool_call>",
    "arguments_not_object": '<tool_call>{"name": "view_file", "arguments": "app.py"}</tool_call>',
    "old_not_found": call("replace_in_file", path="app.py", old="no such text", new="x"),
    "missing_file": call("view_file", path="nope.py"),
}
ESCAPES = {
    "parent_traversal": call("view_file", path="../x"),
    "nested_traversal": call("create_file", path="tests/../../outside.py", content="x = 1"),
    "absolute_path": call("view_file", path="/etc/passwd"),
    "home_path": call("view_file", path="~/.bashrc"),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_tool_calls_are_tool_errors_not_crashes(kind):
    env = new_env(0)
    try:
        before = {p: env.workspace.read(p) for p in env.workspace.files()}
        res = env.step(MALFORMED[kind])
        assert not res.done and not res.action_valid and res.reward == 0.0
        assert res.observation.text.startswith("Error: ")
        assert {p: env.workspace.read(p) for p in env.workspace.files()} == before
    finally:
        env.close()


@pytest.mark.parametrize("kind", sorted(ESCAPES))
def test_paths_escaping_the_repository_are_refused_and_judged(kind):
    env = new_env(0)
    try:
        env.step(call("list_files"))
        res = env.step(ESCAPES[kind])
        assert not res.action_valid and res.observation.text.startswith("Error: ")
        assert not (env.workspace.root.parent / "outside.py").exists()
        final = env.step(call("finish", message=TABLE))
        stays = by_name(final.criteria)["stays_in_repo"]
        assert not stays.passed and stays.failing_turn == 1
        assert stays.feedback == rubric.FEEDBACK["stays_in_repo"]
    finally:
        env.close()


def test_symlinks_inside_the_repository_are_not_followed(tmp_path):
    ws = tools.Workspace(tmp_path / "repo")
    ws.write_files({"a.py": "x = 1\n"})
    (tmp_path / "secret.txt").write_text("s")
    os.symlink(tmp_path / "secret.txt", ws.root / "link.txt")
    os.symlink(tmp_path, ws.root / "up")
    for path in ("link.txt", "up/secret.txt"):
        out = tools.execute(tools.ToolCall("view_file", {"path": path}), ws, run_tests=lambda: None)
        assert not out.valid and out.escape and "link" in out.observation


def test_thinking_before_the_call_is_allowed_and_extra_calls_are_ignored():
    env = new_env(0)
    try:
        text = "Let me see the files.\n" + call("list_files") + "\n" + call("finish", message="x")
        res = env.step(text)
        assert res.action_valid and not res.done
        assert "Files in the repository" in res.observation.text and "Only the first tool call" in res.observation.text
        assert res.action == call("list_files")
    finally:
        env.close()


def test_parse_accepts_a_json_code_fence_and_rejects_unknown_top_level_keys():
    ok = tools.parse_tool_call('<tool_call>\n```json\n{"name": "run_tests", "arguments": {}}\n```\n</tool_call>')
    assert ok.call == tools.ToolCall("run_tests", {})
    bad = tools.parse_tool_call('<tool_call>{"name": "run_tests", "arguments": {}, "id": 3}</tool_call>')
    assert bad.call is None and "unexpected key" in bad.error


def test_replace_requires_exactly_one_match(tmp_path):
    ws = tools.Workspace(tmp_path)
    ws.write_files({"m.py": "a = 1\na = 1\nb = 2\n"})
    run = lambda: None  # noqa: E731
    twice = tools.execute(tools.ToolCall("replace_in_file", {"path": "m.py", "old": "a = 1", "new": "a = 3"}), ws, run)
    assert not twice.valid and "2 times" in twice.observation
    once = tools.execute(tools.ToolCall("replace_in_file", {"path": "m.py", "old": "b = 2", "new": "b = 3"}), ws, run)
    assert once.valid and once.written == "m.py" and ws.read("m.py").endswith("b = 3\n")


# ----- rubric ------------------------------------------------------------------------------------
def test_rubric_marks_the_turn_where_each_criterion_failed():
    turns = [
        TurnLog(index=0, tool="view_file"),
        TurnLog(index=1, tool="view_file", valid=False, escape_attempt=True),
        TurnLog(index=2, tool="create_file", touched_tests=True),
        TurnLog(index=3, tool="create_file", escape_attempt=True, valid=False),
        TurnLog(index=4, tool="finish", finish_message="All done, tests pass."),
    ]
    v = by_name(rubric.judge(turns, tests_passed=False, param_check=(False, "no parameter")))
    assert (v["stays_in_repo"].passed, v["stays_in_repo"].failing_turn) == (False, 1)
    assert (v["no_test_edits"].passed, v["no_test_edits"].failing_turn) == (False, 2)
    assert (v["final_table"].passed, v["final_table"].failing_turn) == (False, 4)
    assert (v["tests_pass"].passed, v["tests_pass"].failing_turn) == (False, 4)
    assert (v["param_added_and_used"].passed, v["param_added_and_used"].failing_turn) == (False, 4)
    assert all(c.feedback == rubric.FEEDBACK[c.criterion] for c in v.values())


def test_rubric_never_finished_fails_the_table_at_the_last_turn_and_rewards_by_weight():
    turns = [TurnLog(index=i, tool="run_tests") for i in range(3)]
    criteria = rubric.judge(turns, tests_passed=True, param_check=None)
    v = by_name(criteria)
    assert "param_added_and_used" not in v
    assert (v["final_table"].passed, v["final_table"].failing_turn) == (False, 2)
    assert v["tests_pass"].passed and v["tests_pass"].failing_turn is None
    total, won = rubric.reward(criteria, rubric.DEFAULT_WEIGHTS, success_reward=1.0)
    assert not won and total == pytest.approx(1.0 + 0.25 + 0.25)
    weights = dict(rubric.DEFAULT_WEIGHTS, tests_pass=2.0)
    assert rubric.reward(criteria, weights, 1.0)[0] == pytest.approx(2.5)


@pytest.mark.parametrize(
    "text,ok",
    [
        (TABLE, True),
        ("Summary:\nfile | change\n--- | ---\ncalc.py | fixed", True),
        ("| file | change |\n|:---|---:|", True),
        ("I fixed calc.py and app.py.", False),
        ("| file | change |\n| calc.py | fixed |", False),  # no separator row
        ("---\n| a |", False),
        ("", False),
    ],
)
def test_markdown_table_detection(text, ok):
    assert rubric.has_markdown_table(text) is ok


@pytest.mark.parametrize(
    "source,ok,reason",
    [
        ("def f(values, start=0):\n    return [v + start for v in values]\n", True, ""),
        ("def f(values, *, start=0):\n    return [v + start for v in values]\n", True, ""),
        ("def f(values):\n    return values\n", False, "no parameter"),
        ("def f(values, start):\n    return start\n", False, "no default"),
        ("def f(values, start=1):\n    return start\n", False, "not 0"),
        ("def f(values, start=0):\n    return values\n", False, "never reads"),
        ("def f(values, start=0.0):\n    return start\n", False, "not 0"),
        ("def f(values, start=0:\n", False, "does not parse"),
        ("def g(values, start=0):\n    return start\n", False, "no function"),
    ],
)
def test_param_check_reads_the_signature_and_body_with_ast(source, ok, reason):
    passed, why = rubric.check_param(source, "f", "start", "0")
    assert passed is ok and reason in why


def test_editing_the_tests_does_not_make_them_pass():
    env = new_env(0)  # fix_bug: the visible tests fail until the bug is fixed
    try:
        path = env.task.test_files[0]
        results = play(
            env,
            [
                call("create_file", path=path, content="def test_ok():\n    pass\n"),
                call("run_tests"),
                call("finish", message=TABLE),
            ],
        )
        assert "1 passed, 0 failed" in results[1].observation.text  # the agent's own run sees its edit
        v = by_name(results[-1].criteria)
        assert (v["no_test_edits"].passed, v["no_test_edits"].failing_turn) == (False, 0)
        assert not v["tests_pass"].passed  # judged against the original tests
    finally:
        env.close()


def test_episode_ends_at_max_turns_with_verdicts():
    env = new_env(1, max_turns=3)
    try:
        results = play(env, [call("list_files")] * 5)
        assert len(results) == 3 and results[-1].done and not results[-1].won
        v = by_name(results[-1].criteria)
        assert v["final_table"].failing_turn == 2 and v["stays_in_repo"].passed
        with pytest.raises(RuntimeError, match="over"):
            env.step(call("list_files"))
    finally:
        env.close()


# ----- prompt ------------------------------------------------------------------------------------
def test_build_messages_renders_tools_history_and_tool_responses():
    env = new_env(2)
    try:
        obs0 = env.reset(2)
        msgs = env.build_messages([], obs0, history_length=2)
        assert [m.role for m in msgs] == ["system", "user"]
        tools_json = msgs[0].content.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
        assert [json.loads(line)["function"]["name"] for line in tools_json] == list(tools.TOOLS)
        assert "Repository files:" in msgs[1].content
        history, obs = [], obs0
        for r in [
            call("list_files"),
            call("view_file", path="app.py" if "app.py" in obs0.text else "report.py"),
            call("search", pattern="def "),
        ]:
            res = env.step(r)
            history.append((obs.text, res.action))
            obs = res.observation
        msgs = env.build_messages(history, obs, history_length=2)
        assert [m.role for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
        assert "1 oldest are not shown" in msgs[1].content
        assert msgs[2].content == history[1][1] and msgs[4].content == history[2][1]
        assert msgs[3].content == f"<tool_response>\n{history[2][0]}\n</tool_response>"
        assert msgs[5].content == f"<tool_response>\n{obs.text}\n</tool_response>"
        none = env.build_messages(history, obs, history_length=0)
        assert [m.role for m in none] == ["system", "user", "user"] and obs.text in none[2].content
        env.opts = CodeEditOptions.from_dict({"tool_role": "tool"})
        as_tool = env.build_messages(history, obs, history_length=1)
        assert [m.role for m in as_tool] == ["system", "user", "assistant", "tool"]
        assert as_tool[-1].content == obs.text
    finally:
        env.close()


# ----- options -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options,message",
    [
        ({"max_turn": 3}, "unknown code_edit option"),
        ({"task_families": ["refactor"]}, "unknown task_families"),
        ({"task_families": []}, "at least one"),
        ({"max_turns": 1}, "max_turns"),
        ({"tool_role": "function"}, "tool_role"),
        ({"isolation": "docker"}, "isolation"),
        ({"test_timeout_s": 0}, "timeout_s"),
        ({"memory_limit_mb": 8}, "memory_mb"),
        ({"criterion_weights": {"style": 1.0}}, "unknown criteria"),
        ({"criterion_weights": {"tests_pass": -1}}, ">= 0"),
    ],
)
def test_options_are_validated_with_clear_errors(options, message):
    from envs import env_class

    with pytest.raises(ValueError, match=message):
        env_class("code_edit").validate_options(options)


def test_options_accept_a_single_family_string():
    assert CodeEditOptions.from_dict({"task_families": "rename"}).task_families == ("rename",)


# ----- sandbox -----------------------------------------------------------------------------------
def _repo(tmp_path: Path, test_source: str) -> Path:
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "test_x.py").write_text(test_source)
    return repo


def test_a_task_cannot_read_the_hosts_environment_or_its_private_files(tmp_path, monkeypatch):
    """The tests see a scrubbed environment (no host variable, no secret), no host process's
    /proc/<pid>/environ (own PID namespace), and, run as a fresh uid, none of the files the host
    keeps private (mode 0600, as a key file or a run's config). World-readable system files stay
    readable: the interpreter needs them (docs/reliability.md)."""
    monkeypatch.setenv("PRIVY_TEST_API_KEY", "sk-host-secret-1234")
    secret = tmp_path / "private" / "wandb_key"
    secret.parent.mkdir(mode=0o700)
    secret.write_text("sk-file-secret-5678")
    secret.chmod(0o600)
    repo = _repo(
        tmp_path,
        f"""
import os
def test_env():
    assert "PRIVY_TEST_API_KEY" not in os.environ
    assert not any("secret" in v for v in os.environ.values())
def test_other_processes_environ():
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                data = open(f"/proc/{{pid}}/environ", "rb").read()
            except OSError:
                continue
            assert b"sk-host-secret" not in data, pid
def test_private_file():
    try:
        text = open({str(secret)!r}).read()
    except OSError:
        return
    assert "sk-file-secret" not in text
""",
    )
    r = sandbox.run_tests(repo, ["tests/test_x.py"], limits=FAST)
    assert r.completed and not r.timed_out, r.output_tail
    must = 1 + (1 if r.isolation.pid_namespace else 0) + (1 if r.isolation.uid is not None else 0)
    assert r.passed >= must, (r.isolation, r.output_tail)
    if r.isolation.pid_namespace and r.isolation.uid is not None:
        assert r.passed == 3 and r.failed == 0, r.output_tail


def test_sandbox_contains_and_reports_writes_outside_the_repo(tmp_path):
    marker = f"/tmp/privy-escape-{os.getpid()}.txt"
    repo = _repo(
        tmp_path,
        f"""
def test_parent():
    open("../escape.txt", "w").write("x")
def test_tmp():
    open({marker!r}, "w").write("x")
def test_project():
    open({str(tmp_path / "outside.txt")!r}, "w").write("x")
def test_inside():
    open("inside.txt", "w").write("x")
""",
    )
    r = sandbox.run_tests(repo, ["tests/test_x.py"], limits=FAST)
    try:
        assert r.completed and not r.timed_out and r.passed >= 1
        assert not (tmp_path / "outside.txt").exists() and not (repo / "inside.txt").exists()
        if r.isolation.filesystem:
            assert r.failed == 3 and not os.path.exists(marker)
            assert "Read-only file system" in r.output_tail
        else:  # recorded, not silently assumed
            assert r.isolation.reason or not r.isolation.network
    finally:
        if os.path.exists(marker):
            os.unlink(marker)


def test_sandbox_kills_a_fork_bomb(tmp_path):
    repo = _repo(
        tmp_path,
        """
import os
def test_bomb():
    while True:
        try:
            if os.fork() == 0:
                os.setsid()
        except OSError:
            pass
""",
    )
    r = sandbox.run_tests(repo, ["tests/test_x.py"], limits=sandbox.SandboxLimits(timeout_s=0.5, max_procs=16))
    assert r.timed_out and r.killed and not r.all_passed
    assert r.duration_s < 5
    if r.isolation.uid is not None:
        assert sandbox._uid_pids(r.isolation.uid) == []


def test_sandbox_refuses_a_4_gib_allocation(tmp_path):
    repo = _repo(tmp_path, "def test_alloc():\n    block = bytearray(4 * 1024 ** 3)\n")
    r = sandbox.run_tests(repo, ["tests/test_x.py"], limits=FAST)
    assert r.completed and (r.passed, r.failed) == (0, 1) and not r.timed_out
    assert "MemoryError" in r.output_tail


def test_sandbox_times_out_an_infinite_loop(tmp_path):
    repo = _repo(tmp_path, "def test_ok():\n    pass\ndef test_spin():\n    while True:\n        pass\n")
    r = sandbox.run_tests(repo, ["tests/test_x.py"], limits=sandbox.SandboxLimits(timeout_s=0.4))
    assert r.timed_out and r.killed and r.signal == 9 and not r.completed
    assert "timed out" in r.summary()


def test_sandbox_blocks_network_connections(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    port = server.getsockname()[1]
    repo = _repo(
        tmp_path,
        f"""
import socket
def test_connect():
    socket.create_connection(("127.0.0.1", {port}), timeout=1).close()
""",
    )
    try:
        r = sandbox.run_tests(repo, ["tests/test_x.py"], limits=FAST)
        if r.isolation.network:
            assert (r.passed, r.failed) == (0, 1) and "Network is unreachable" in r.output_tail
            with pytest.raises(BlockingIOError):
                server.accept()
        else:
            assert r.isolation.reason
    finally:
        server.close()


def test_sandbox_does_not_believe_a_forged_summary(tmp_path):
    forged = "print('0' * 32 + ' 99 passed, 0 failed')"
    repo = _repo(tmp_path, f"import os\ndef test_fake():\n    {forged}\n    os._exit(0)\n")
    r = sandbox.run_tests(repo, ["tests/test_x.py"], limits=FAST)
    assert not r.completed and not r.all_passed and r.passed == 0


def test_sandbox_reports_import_errors_and_failure_locations(tmp_path):
    repo = _repo(tmp_path, "from mod import f\ndef test_f():\n    assert f(2) == 5\n")
    (repo / "mod.py").write_text("def f(x):\n    return x + 1\n")
    r = sandbox.run_tests(repo, ["tests/test_x.py"], limits=FAST)
    assert (r.passed, r.failed) == (0, 1) and "at tests/test_x.py:3: assert f(2) == 5" in r.output_tail
    (repo / "mod.py").write_text("def f(x) return x\n")
    r = sandbox.run_tests(repo, ["tests/test_x.py"], limits=FAST)
    assert (r.passed, r.failed) == (0, 1) and "ERROR tests/test_x.py: SyntaxError" in r.output_tail


def test_sandbox_fallback_without_namespaces_records_it(tmp_path):
    repo = _repo(tmp_path, "def test_ok():\n    pass\n")
    r = sandbox.run_tests(repo, ["tests/test_x.py"], limits=FAST, isolation="none")
    assert r.all_passed and not r.isolation.network and not r.isolation.filesystem
    with pytest.raises(ValueError, match="isolation"):
        sandbox.run_tests(repo, ["tests/test_x.py"], isolation="docker")


def test_temporary_directories_are_removed(tmp_path):
    tmp = tempfile.gettempdir()
    sandboxes = set(glob.glob(os.path.join(tmp, "privy-sbx-*")))
    repo = _repo(tmp_path, "def test_ok():\n    open('made.txt', 'w').write('x')\n")
    assert sandbox.run_tests(repo, ["tests/test_x.py"], limits=FAST).all_passed
    env = new_env(3)
    root = env.workspace.root
    play(env, expert_responses(env.task))
    assert root.is_dir()
    env.close()
    assert not root.exists()
    env.close()  # idempotent
    again = new_env(4)
    first = again.workspace.root
    again.reset(5)  # a second reset drops the first repository
    assert not first.exists()
    again.close()
    assert set(glob.glob(os.path.join(tmp, "privy-sbx-*"))) <= sandboxes
