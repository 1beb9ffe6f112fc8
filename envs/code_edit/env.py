"""``code_edit``: multi-turn repository editing with JSON tool calls, a sandboxed test runner and a rubric.

``reset(seed)`` generates the task of (split, seed) (``tasks.generate_task``; families take turns
by ``seed % len(task_families)``) and writes its repository into a fresh temporary directory.
Each ``step(response)`` parses the response's first ``<tool_call>`` (``tools.parse_tool_call``;
thinking before it is allowed) and carries it out; the observation is the tool's result, or
``Error: ...`` for a malformed or refused call (``action_valid=False``, nothing changes, the turn
still counts). The episode ends at ``finish`` or after ``max_turns`` turns; the last step runs the
final judgment (original visible tests + hidden tests in the sandbox, the ``ast`` check) and
returns the rubric's ``CriterionResult``s in ``criteria`` with the episode reward
(``rubric.reward``); earlier steps have reward 0. ``close()`` deletes the temporary repository.

Prompt (``build_messages``): a system message with the tools as JSON inside ``<tools></tools>``,
a user message with the task and the file list (plus a note when older turns are hidden), then
the last ``history_length`` turns as (assistant tool call, tool result) pairs; the newest tool
result is the current observation. Tool results are user messages wrapped in
``<tool_response>...</tool_response>`` (``tool_role="user"``, the default: Qwen's own rendering,
correct under any ChatML template, SmolLM2's included) or ``role: "tool"`` messages
(``tool_role="tool"``, for templates that wrap them themselves, e.g. Qwen2.5/Qwen3).

A real episode (``split="train"``, seed 5; the scripted expert of ``tasks.expert_responses`` with
one slip inserted: an edit whose ``old`` text lost its indentation)::

    user: Task: Add a parameter `char` with the default value `"*"` to the function `mask` in
          `wordtools.py`, and use it: `char` replaces '*' as the masking character. Calls that do
          not pass `char` must behave exactly as before. Do not modify the files under `tests/`.
          ... a Markdown table with the columns `file` and `change`.

          Repository files:
          frontend.py
          itemutil.py
          tests/test_travel.py
          wordtools.py
    assistant: I will read the file first.
          <tool_call>
          {"name": "view_file", "arguments": {"path": "wordtools.py"}}
          </tool_call>
    tool: File wordtools.py:  (the module: initials, count_vowels, mask)
    assistant: <tool_call> {"name": "replace_in_file", "arguments": {"path": "wordtools.py",
          "old": "def mask(text, keep):\n\"\"\"Return `text` ...\nhidden = ...", "new": ...}} </tool_call>
    tool: Error: `old` was not found in wordtools.py. Copy it exactly from view_file, indentation
          included.                                                   (action_valid=False)
    assistant: <tool_call> {"name": "replace_in_file", "arguments": {"path": "wordtools.py",
          "old": "def mask(text, keep):\n    \"\"\"Return ...", "new": "def mask(text, keep, char=\"*\"):\n ...
          return char * hidden + text[hidden:]\n"}} </tool_call>
    tool: Replaced 1 occurrence in wordtools.py (5 line(s) -> 5 line(s)).
    assistant: <tool_call> {"name": "run_tests", "arguments": {}} </tool_call>
    tool: Test results: 14 passed, 0 failed
    assistant: <tool_call> {"name": "finish", "arguments": {"message": "Done.\n\n| file | change |\n
          |---|---|\n| wordtools.py | added `char` to `mask` |"}} </tool_call>
    tool: Episode finished.
    -> reward 3.25 (1.0 + 0.5 + 3 x 0.25 + success 1.0), won True, final judgment 18 passed
       (14 visible + 4 hidden); all five criteria passed.

Rendered with SmolLM2's chat template at turn 4 (``history_length=2``) the prompt is 1,159 tokens,
about 700 of them the system message: give ``rollout.max_prompt_tokens`` at least 2048.
``docs/envs_code_edit.md`` has the full transcript.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import envs.code_edit.rubric as rubric
import envs.code_edit.sandbox as sandbox
import envs.code_edit.tools as tools
from envs.base import Observation, StepResult, TextEnv, register_env
from envs.code_edit.tasks import FAMILIES, SPLITS, Task, edit_call, finish_call, generate_task, view_call
from envs.code_edit.tools import format_tool_call
from envs.options import known_options
from pipeline.core.types import Message

TOOL_ROLES = ("user", "tool")
ISOLATION = ("auto", "namespaces", "none")


@dataclass(frozen=True)
class CodeEditOptions:
    """``env.options`` for ``code_edit``."""

    task_families: tuple[str, ...] = FAMILIES  # non-empty subset of fix_bug, add_param, rename, implement
    max_turns: int = 8  # turns per episode, >= 2 (at least one edit and a finish)
    n_tasks: int = 0  # tasks per split (seed % n_tasks); 0 = every seed its own task
    hint_location: bool = True  # fix_bug names the buggy function and file
    test_timeout_s: float = 5.0  # wall clock per test run, > 0 (normal runs take ~0.05-0.1 s)
    memory_limit_mb: int = 1024  # RLIMIT_AS of the test process, >= 64
    max_procs: int = 32  # RLIMIT_NPROC of the sandbox uid, >= 1
    max_file_mb: int = 8  # RLIMIT_FSIZE of the test process, >= 1
    isolation: str = "auto"  # auto | namespaces (refuse to run without them) | none (limits only)
    tool_role: str = "user"  # user: <tool_response> inside a user turn | tool: role "tool" messages
    max_observation_chars: int = 3000  # longer tool results are cut in the middle, >= 200
    criterion_weights: dict = field(default_factory=dict)  # overrides of rubric.DEFAULT_WEIGHTS

    @classmethod
    def from_dict(cls, options: dict | None) -> "CodeEditOptions":
        options = known_options(options, cls, "code_edit", tuples=("task_families",))
        if "criterion_weights" in options:
            options["criterion_weights"] = dict(options["criterion_weights"] or {})
        opts = cls(**options)
        opts.validate()
        return opts

    def validate(self) -> None:
        fams = self.task_families
        if not fams:
            raise ValueError(f"code_edit: task_families must name at least one of {list(FAMILIES)}")
        bad = [f for f in fams if f not in FAMILIES]
        if bad:
            raise ValueError(f"code_edit: unknown task_families {bad}; choose from {list(FAMILIES)}")
        if len(set(fams)) != len(fams):
            raise ValueError(f"code_edit: task_families lists a family twice: {list(fams)}")
        if not isinstance(self.max_turns, int) or self.max_turns < 2:
            raise ValueError(
                f"code_edit: max_turns must be an integer >= 2 (an edit and a finish), got {self.max_turns!r}"
            )
        if not isinstance(self.n_tasks, int) or self.n_tasks < 0:
            raise ValueError(f"code_edit: n_tasks must be an integer >= 0 (0 = unlimited), got {self.n_tasks!r}")
        if self.isolation not in ISOLATION:
            raise ValueError(f"code_edit: isolation must be one of {list(ISOLATION)}, got {self.isolation!r}")
        if self.tool_role not in TOOL_ROLES:
            raise ValueError(f"code_edit: tool_role must be one of {list(TOOL_ROLES)}, got {self.tool_role!r}")
        if self.max_observation_chars < 200:
            raise ValueError(f"code_edit: max_observation_chars must be >= 200, got {self.max_observation_chars}")
        try:
            self.limits.validate()
        except ValueError as e:
            raise ValueError(
                f"code_edit: {e} (options test_timeout_s, memory_limit_mb, max_procs, max_file_mb)"
            ) from None
        rubric.validate_weights(self.criterion_weights)

    @property
    def limits(self) -> sandbox.SandboxLimits:
        return sandbox.SandboxLimits(
            timeout_s=self.test_timeout_s,
            memory_mb=self.memory_limit_mb,
            max_procs=self.max_procs,
            max_file_mb=self.max_file_mb,
        )

    @property
    def weights(self) -> dict[str, float]:
        return rubric.validate_weights(self.criterion_weights)


@register_env("code_edit")
class CodeEditEnv(TextEnv):
    thread_safe = True  # its work is a sandboxed subprocess in its own temp repo
    max_turns = 8
    invalid_action_penalty = 0.05  # per malformed or refused tool call (the pipeline subtracts it)
    success_reward = 1.0  # added when every criterion passes

    def __init__(self, opts: CodeEditOptions, split: str):
        if split not in SPLITS:  # at construction, so a launch's split check catches it (tasks.SPLIT_PAIRS)
            raise ValueError(f"code_edit: unknown split {split!r}; choose one of {list(SPLITS)}")
        self.opts = opts
        self.split = split
        self.max_turns = opts.max_turns
        self._weights = opts.weights
        self._task: Task | None = None
        self._ws: tools.Workspace | None = None
        self._cleanup: weakref.finalize | None = None
        self._turns: list[rubric.TurnLog] = []
        self._done = False
        self._initial_obs = ""
        self._hint: str | None = None

    @classmethod
    def from_options(cls, options: dict, split: str) -> "CodeEditEnv":
        return cls(CodeEditOptions.from_dict(options), split)

    @classmethod
    def validate_options(cls, options: dict) -> None:
        CodeEditOptions.from_dict(options)

    # ----- episode ---------------------------------------------------------------------------------
    def reset(self, seed: int) -> Observation:
        self.close()
        effective = seed % self.opts.n_tasks if self.opts.n_tasks else seed
        self._task = generate_task(effective, self.split, self.opts.task_families, self.opts.hint_location)
        self.task_text, self.task_type, self.task_id = self._task.instruction, self._task.family, self._task.task_id
        root = Path(tempfile.mkdtemp(prefix="privy-code-edit-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(root), True)
        self._ws = tools.Workspace(root)
        self._ws.write_files(self._task.files)
        self._turns = []
        self._done = False
        self._hint = None
        self._initial_obs = f"{self._task.instruction}\n\nRepository files:\n" + "\n".join(self._ws.files())
        return Observation(text=self._initial_obs)

    def step(self, response: str) -> StepResult:
        if self._task is None or self._ws is None:
            raise RuntimeError("code_edit: call reset() before step()")
        if self._done:
            raise RuntimeError("code_edit: the episode is over; envs are single-use")
        log = rubric.TurnLog(index=len(self._turns))
        parsed = tools.parse_tool_call(response)
        info: dict = {"turn": log.index}
        action = ""
        if parsed.call is None:
            obs, valid, finished = f"Error: {parsed.error}", False, False
        else:
            call = parsed.call
            log.tool = info["tool"] = call.name
            outcome = tools.execute(call, self._ws, self._run_visible_tests, self.opts.max_observation_chars)
            obs, valid, finished = outcome.observation, outcome.valid, outcome.finished
            log.escape_attempt = outcome.escape
            log.touched_tests = bool(outcome.written) and self._ws.is_test_path(outcome.written)
            if outcome.finished:
                log.finish_message = outcome.message
            if outcome.tests is not None:
                info["tests"] = outcome.tests.summary()
            if parsed.n_blocks > 1 and valid:
                obs += "\n(Only the first tool call of a turn is executed.)"
            action = call.canonical
        log.valid = valid
        self._turns.append(log)
        done = finished or len(self._turns) >= self.max_turns
        if not done:
            return StepResult(
                observation=Observation(text=obs), reward=0.0, done=False, action_valid=valid, action=action, info=info
            )
        self._done = True
        criteria, final = self._judge()
        total, won = rubric.reward(criteria, self._weights, self.success_reward)
        info["max_turns_reached"] = not finished
        info["final_tests"] = final.summary()
        info["isolation"] = final.isolation
        return StepResult(
            observation=Observation(text=obs),
            reward=total,
            done=True,
            won=won,
            action_valid=valid,
            action=action,
            criteria=criteria,
            info=info,
        )

    # ----- expert and privileged state --------------------------------------------------------------
    def expert_response(self) -> str | None:
        """The reference solution's next tool call, read off the working copy (not a fixed script):
        view the target file once, apply each reference edit whose ``old`` text is still there
        (exactly once), run the tests after the last edit, then finish with the change table. When
        the turns left do not cover the edits and the finish, it skips the view and the test run.
        An episode whose earlier turns spoiled an edit's ``old`` text ends unsolved, and the warm
        start leaves unwon episodes out."""
        if self._task is None or self._ws is None or self._done:
            return None
        task, turns = self._task, self._turns
        left = self.max_turns - len(turns)
        pending = [e for e in task.reference_edits if self._occurs_once(e.path, e.old)]
        if pending:
            viewed = any(t.tool == "view_file" and t.valid for t in turns)
            return edit_call(pending[0]) if viewed or left <= len(pending) + 1 else view_call(task)
        last_edit = max(
            (t.index for t in turns if t.tool in ("replace_in_file", "create_file") and t.valid), default=-1
        )
        tested = any(t.tool == "run_tests" and t.index > last_edit for t in turns)
        return format_tool_call("run_tests", {}) if not tested and left > 1 else finish_call(task)

    def _occurs_once(self, path: str, text: str) -> bool:
        assert self._ws is not None
        try:
            return self._ws.read(path).count(text) == 1
        except (OSError, UnicodeError):
            return False

    def privileged_hint(self) -> str | None:
        """The tests that fail on the task's initial repository, visible and hidden, with the
        runner's message and the failing line (``hints`` context: what the judge will check, which
        the student sees only through ``run_tests`` and never for the hidden tests), e.g.
        ``hidden_tests.py::test_dedupe_key_1: TypeError: dedupe() got an unexpected keyword
        argument 'key' at hidden_tests.py:9: assert dedupe(...) == [...]``. Run once per episode in
        the sandbox, on the initial files whatever the working copy holds by then."""
        if self._task is None or self._ws is None:
            return None
        if self._hint is None:
            task = self._task
            result = sandbox.run_tests(
                self._ws.root,
                task.test_files,
                extra_tests={"hidden_tests.py": task.hidden_tests},
                overrides=task.files,
                limits=self.opts.limits,
                isolation=self.opts.isolation,
            )
            self._hint = failing_tests_hint(result)
        return self._hint or None

    def _run_visible_tests(self) -> sandbox.SandboxResult:
        assert self._task is not None and self._ws is not None
        return sandbox.run_tests(
            self._ws.root, self._task.test_files, limits=self.opts.limits, isolation=self.opts.isolation
        )

    def _judge(self):
        task, ws = self._task, self._ws
        assert task is not None and ws is not None
        final = sandbox.run_tests(
            ws.root,
            task.test_files,
            extra_tests={"hidden_tests.py": task.hidden_tests},
            overrides=task.original_tests,
            limits=self.opts.limits,
            isolation=self.opts.isolation,
        )
        param_check = None
        if task.param is not None:
            p = task.param
            try:
                source = ws.read(p.module)
            except (OSError, UnicodeError) as e:
                param_check = (False, f"cannot read {p.module}: {e}")
            else:
                param_check = rubric.check_param(source, p.function, p.name, p.default)
        return rubric.judge(self._turns, tests_passed=final.all_passed, param_check=param_check), final

    # ----- prompt ----------------------------------------------------------------------------------
    @property
    def task(self) -> Task | None:
        return self._task

    @property
    def workspace(self) -> tools.Workspace | None:
        return self._ws

    def build_messages(
        self, history: list[tuple[str, str]], observation: Observation, history_length: int
    ) -> list[Message]:
        """System (tools), user (task + files), then the last ``history_length`` (call, result) turns.

        ``history[i]`` is (observation before turn i, action of turn i); the result of turn i is
        ``history[i + 1][0]``, or ``observation`` for the newest turn. With ``history_length`` 0
        only the newest result follows the task.
        """
        first = history[0][0] if history else observation.text
        n = len(history)
        shown = min(max(history_length, 0), n)
        task = first
        if n > shown:
            task += (
                f"\n\n(You have already taken {n} turns; the {n - shown} oldest are not shown"
                f"{', only the latest result is' if shown == 0 else ''}.)"
            )
        messages = [Message(role="system", content=tools.system_prompt()), Message(role="user", content=task)]
        for i in range(n - shown, n):
            messages.append(Message(role="assistant", content=history[i][1]))
            result = history[i + 1][0] if i + 1 < n else observation.text
            messages.append(self._tool_message(result))
        if n and shown == 0:
            messages.append(self._tool_message(observation.text))
        return messages

    def _tool_message(self, text: str) -> Message:
        if self.opts.tool_role == "tool":
            return Message(role="tool", content=text)
        return Message(role="user", content=f"<tool_response>\n{text}\n</tool_response>")

    def close(self) -> None:
        if self._cleanup is not None:
            self._cleanup()  # removes the temporary repository (idempotent)
            self._cleanup = None
        self._ws = None


MAX_HINT_FAILURES = 3  # a task's failures are 1-3 tests of one function; more would repeat them


def failing_tests_hint(result: sandbox.SandboxResult) -> str:
    """One line per failing test of a sandbox run (``FAILED``/``ERROR`` and its ``at`` line), at
    most ``MAX_HINT_FAILURES`` of them, or "" when none failed or the run did not report."""
    if not result.completed or result.failed == 0:
        return ""
    lines = result.output_tail.splitlines()
    failures = []
    for i, line in enumerate(lines):
        if line.startswith(("FAILED ", "ERROR ")):
            at = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].startswith("  at ") else ""
            failures.append(f"{line.split(' ', 1)[1]} {at}".strip())
    shown = failures[:MAX_HINT_FAILURES]
    more = f" ({len(failures) - len(shown)} more fail the same way.)" if len(failures) > len(shown) else ""
    return ("These tests fail on the initial code: " + "; ".join(shown) + "." + more) if shown else ""
