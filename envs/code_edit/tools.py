"""The agent's tools: Qwen-style JSON tool calls against a working copy of the repository.

A turn holds one call in Qwen2.5/Qwen3's format; text before it (thinking) is allowed::

    I should look at the helper first.
    <tool_call>
    {"name": "view_file", "arguments": {"path": "calc.py"}}
    </tool_call>

Only the first ``<tool_call>`` block is executed (a note in the observation says so when there
were more). Tools: ``list_files()``, ``view_file(path)``, ``search(pattern)`` (literal, case-
sensitive, like ``grep -rnF``), ``replace_in_file(path, old, new)`` (``old`` must occur exactly
once), ``create_file(path, content)`` (creates or overwrites), ``run_tests()`` and
``finish(message)``.

Anything wrong with a call is a *tool error*: the observation is ``"Error: ..."`` saying what to
change, the action is invalid (``action_valid=False``), nothing is modified, and no exception
escapes: malformed JSON, an unterminated block, an unknown tool, missing, unexpected or non-string
arguments, an ``old`` string found 0 or 2+ times, and any path that is absolute, starts with ``~``,
contains ``..``, passes through a symlink or resolves outside the repository. The last group is
recorded as an *escape attempt* (the ``stays_in_repo`` criterion).

Rendering: the system message lists the tools as JSON inside ``<tools></tools>``; an executed call
is replayed in the history as its canonical block (``format_tool_call``), and tool results are
observations that ``CodeEditEnv.build_messages`` renders as ``role: "tool"`` messages or, by
default, as user messages wrapped in ``<tool_response>...</tool_response>``. Qwen2.5's chat
template does exactly that wrapping for ``role: "tool"`` (a user turn holding
``\\n<tool_response>\\n...\\n</tool_response>``); SmolLM2's template has no tool handling and
would print a raw ``<|im_start|>tool`` turn, a role it never saw in training, hence the default.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
MAX_FILE_CHARS = 64_000  # largest file create_file / replace_in_file may produce
MAX_SEARCH_HITS = 30

_STR = {"type": "string"}
TOOL_SPECS: tuple[dict, ...] = (
    {"name": "list_files", "description": "List every file in the repository.", "parameters": {}},
    {
        "name": "view_file",
        "description": "Show the content of a file.",
        "parameters": {"path": dict(_STR, description="file path relative to the repository root")},
    },
    {
        "name": "search",
        "description": "Find the lines that contain a literal string, in every file.",
        "parameters": {"pattern": dict(_STR, description="the exact text to look for (case-sensitive)")},
    },
    {
        "name": "replace_in_file",
        "description": "Replace a piece of text in a file. `old` must appear exactly once "
        "in the file, character for character (indentation included).",
        "parameters": {
            "path": dict(_STR, description="file path relative to the repository root"),
            "old": dict(_STR, description="the exact text to replace"),
            "new": dict(_STR, description="the replacement text"),
        },
    },
    {
        "name": "create_file",
        "description": "Create a file, or overwrite it, with the given content.",
        "parameters": {
            "path": dict(_STR, description="file path relative to the repository root"),
            "content": dict(_STR, description="the whole content of the file"),
        },
    },
    {"name": "run_tests", "description": "Run the repository's tests and show the failures.", "parameters": {}},
    {
        "name": "finish",
        "description": "End the task. Call it once the tests pass.",
        "parameters": {"message": dict(_STR, description="summary of your changes, as a Markdown table")},
    },
)
TOOLS = {t["name"]: t for t in TOOL_SPECS}
ESCAPING_TOOLS = ("view_file", "replace_in_file", "create_file")  # the tools that take a path


def tool_schema(spec: dict) -> dict:
    """One tool in the OpenAI/Qwen function format (what goes inside ``<tools></tools>``)."""
    params = spec["parameters"]
    return {
        "type": "function",
        "function": {
            "name": spec["name"],
            "description": spec["description"],
            "parameters": {"type": "object", "properties": params, "required": list(params)},
        },
    }


def system_prompt() -> str:
    tools = "\n".join(json.dumps(tool_schema(t), ensure_ascii=False) for t in TOOL_SPECS)
    return (
        "You are a careful software engineer working in a small Python repository. You act only "
        "through tools, one tool call per turn, and you see each tool's result before your next turn. "
        "All paths are relative to the repository root.\n\n"
        "# Tools\n\n"
        "The available functions are described inside <tools></tools> XML tags:\n"
        f"<tools>\n{tools}\n</tools>\n\n"
        "To call a function, write a JSON object with its name and arguments inside "
        "<tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def format_tool_call(name: str, arguments: dict) -> str:
    """The canonical block of one call (Qwen's layout: JSON on its own line between the tags)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


# ----- parsing -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict

    @property
    def canonical(self) -> str:
        return format_tool_call(self.name, self.arguments)


@dataclass(frozen=True, slots=True)
class ParsedResponse:
    call: ToolCall | None  # None when the response holds no well-formed call
    error: str = ""  # why not ("" when call is set)
    n_blocks: int = 0  # how many <tool_call> openings the response holds


_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


def parse_tool_call(text: str) -> ParsedResponse:
    """The first ``<tool_call>`` block of a raw response, checked against ``TOOLS``; never raises."""
    if not isinstance(text, str):
        return ParsedResponse(None, "the response is not text")
    n = text.count(TOOL_CALL_OPEN)
    start = text.find(TOOL_CALL_OPEN)
    if start < 0:
        return ParsedResponse(
            None,
            "no tool call found. Call exactly one tool per turn, as "
            '<tool_call>\n{"name": "list_files", "arguments": {}}\n</tool_call>',
            0,
        )
    end = text.find(TOOL_CALL_CLOSE, start)
    if end < 0:
        return ParsedResponse(None, "the <tool_call> block is never closed with </tool_call>.", n)
    body = _FENCE.sub("", text[start + len(TOOL_CALL_OPEN) : end].strip())
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ParsedResponse(
            None,
            f"the tool call is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}). "
            "Write one JSON object with double-quoted keys and strings.",
            n,
        )
    if not isinstance(obj, dict):
        return ParsedResponse(None, 'the tool call must be a JSON object {"name": ..., "arguments": {...}}.', n)
    extra = sorted(set(obj) - {"name", "arguments"})
    if extra:
        return ParsedResponse(None, f'the tool call has unexpected key(s) {extra}; use only "name" and "arguments".', n)
    name, args = obj.get("name"), obj.get("arguments", {})
    if not isinstance(name, str) or not name:
        return ParsedResponse(None, 'the tool call needs a "name" string.', n)
    if name not in TOOLS:
        return ParsedResponse(None, f"unknown tool {name!r}; the tools are {list(TOOLS)}.", n)
    if not isinstance(args, dict):
        return ParsedResponse(None, f'"arguments" must be a JSON object, got {type(args).__name__}.', n)
    expected = list(TOOLS[name]["parameters"])
    missing = [a for a in expected if a not in args]
    unexpected = sorted(set(args) - set(expected))
    if missing or unexpected:
        parts = ([f"is missing argument(s) {missing}"] if missing else []) + (
            [f"got unexpected argument(s) {unexpected}"] if unexpected else []
        )
        return ParsedResponse(None, f"{name} {' and '.join(parts)}; its arguments are {expected}.", n)
    wrong = [a for a in expected if not isinstance(args[a], str)]
    if wrong:
        return ParsedResponse(None, f"{name}: argument(s) {wrong} must be strings.", n)
    return ParsedResponse(ToolCall(name, dict(args)), "", n)


# ----- the working copy ----------------------------------------------------------------------------
class ToolError(Exception):
    """A call that cannot be carried out; the message is shown to the agent."""

    def __init__(self, message: str, escape: bool = False):
        super().__init__(message)
        self.escape = escape


class Workspace:
    """A repository on disk that the tools read and write, refusing any path outside it."""

    def __init__(self, root: Path, tests_dir: str = "tests"):
        self.root = Path(root)
        self.real_root = os.path.realpath(self.root)
        self.tests_dir = tests_dir

    def write_files(self, files: dict[str, str]) -> None:
        for rel, content in files.items():
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")

    def files(self) -> list[str]:
        out = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in filenames:
                rel = os.path.relpath(os.path.join(dirpath, name), self.root)
                out.append(PurePosixPath(*Path(rel).parts).as_posix())
        return sorted(out)

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text(encoding="utf-8")

    def is_test_path(self, rel: str) -> bool:
        return PurePosixPath(rel).parts[:1] == (self.tests_dir,)

    def resolve(self, path: str, *, must_exist: bool) -> tuple[Path, str]:
        """(absolute path, normalised relative path) of ``path``; ToolError if it is not a file inside."""
        if not path.strip():
            raise ToolError("the path is empty.")
        if "\x00" in path:
            raise ToolError("the path contains a NUL character.")
        pure = PurePosixPath(path.strip())
        if pure.is_absolute() or path.strip().startswith("~"):
            raise ToolError(
                f"{path!r} is not a relative path. Paths must stay inside the repository, "
                "relative to its root (e.g. 'tests/test_x.py').",
                escape=True,
            )
        if ".." in pure.parts:
            raise ToolError(f"{path!r} contains '..'. Paths must stay inside the repository.", escape=True)
        parts = [p for p in pure.parts if p != "."]
        if not parts:
            raise ToolError(f"{path!r} names the repository itself, not a file.")
        current = self.root
        for part in parts:
            current = current / part
            if current.is_symlink():
                raise ToolError(f"{path!r} goes through a symbolic link; links are not followed.", escape=True)
        real = os.path.realpath(current)
        if not real.startswith(self.real_root + os.sep):
            raise ToolError(f"{path!r} resolves outside the repository.", escape=True)
        rel = PurePosixPath(*parts).as_posix()
        if must_exist and not current.is_file():
            hint = " (it is a directory)" if current.is_dir() else ""
            raise ToolError(f"no file {rel!r}{hint}. Call list_files to see the files.")
        if not must_exist and current.is_dir():
            raise ToolError(f"{rel!r} is a directory.")
        return current, rel


@dataclass(slots=True)
class ToolOutcome:
    observation: str
    valid: bool = True
    escape: bool = False  # the call tried to reach outside the repository
    written: str = ""  # relative path of the file it changed ("" if none)
    finished: bool = False
    message: str = ""  # finish's message
    tests: object | None = None  # the SandboxResult of run_tests
    info: dict = field(default_factory=dict)


def execute(call: ToolCall, ws: Workspace, run_tests: Callable[[], object], max_chars: int = 3000) -> ToolOutcome:
    """Carry out one parsed call; a ToolError becomes an ``Error: ...`` observation."""
    try:
        outcome = _dispatch(call, ws, run_tests)
    except ToolError as e:
        return ToolOutcome(observation=f"Error: {e}", valid=False, escape=e.escape)
    except (OSError, UnicodeError) as e:  # an unreadable or unwritable file: still the agent's problem
        return ToolOutcome(observation=f"Error: {type(e).__name__}: {e}", valid=False)
    outcome.observation = clip(outcome.observation, max_chars)
    return outcome


def clip(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    return f"{text[:head]}\n... [{len(text) - max_chars} characters cut] ...\n{text[-(max_chars - head) :]}"


def _dispatch(call: ToolCall, ws: Workspace, run_tests: Callable[[], object]) -> ToolOutcome:
    a = call.arguments
    if call.name == "list_files":
        return ToolOutcome(observation="Files in the repository:\n" + "\n".join(ws.files()))
    if call.name == "view_file":
        path, rel = ws.resolve(a["path"], must_exist=True)
        text = path.read_text(encoding="utf-8")
        return ToolOutcome(observation=f"File {rel}:\n{text}" if text else f"File {rel} is empty.")
    if call.name == "search":
        if not a["pattern"]:
            raise ToolError("the search pattern is empty.")
        hits = []
        for rel in ws.files():
            try:
                lines = ws.read(rel).splitlines()
            except (UnicodeError, OSError):
                continue
            hits += [f"{rel}:{i}: {line.strip()}" for i, line in enumerate(lines, 1) if a["pattern"] in line]
        if not hits:
            return ToolOutcome(observation=f"No line contains {a['pattern']!r}.")
        more = f"\n... and {len(hits) - MAX_SEARCH_HITS} more" if len(hits) > MAX_SEARCH_HITS else ""
        return ToolOutcome(observation="\n".join(hits[:MAX_SEARCH_HITS]) + more)
    if call.name == "replace_in_file":
        path, rel = ws.resolve(a["path"], must_exist=True)
        text = path.read_text(encoding="utf-8")
        old, new = a["old"], a["new"]
        if not old:
            raise ToolError("`old` is empty; copy the exact text to replace from view_file.")
        count = text.count(old)
        if count == 0:
            raise ToolError(f"`old` was not found in {rel}. Copy it exactly from view_file, indentation included.")
        if count > 1:
            raise ToolError(f"`old` occurs {count} times in {rel}; include more surrounding text so it occurs once.")
        updated = text.replace(old, new, 1)
        if len(updated) > MAX_FILE_CHARS:
            raise ToolError(f"the file would exceed {MAX_FILE_CHARS} characters.")
        path.write_text(updated, encoding="utf-8")
        return ToolOutcome(
            observation=f"Replaced 1 occurrence in {rel} ({old.count(chr(10)) + 1} line(s) -> "
            f"{new.count(chr(10)) + 1} line(s)).",
            written=rel if updated != text else "",
        )
    if call.name == "create_file":
        path, rel = ws.resolve(a["path"], must_exist=False)
        if len(a["content"]) > MAX_FILE_CHARS:
            raise ToolError(f"the content exceeds {MAX_FILE_CHARS} characters.")
        existed = path.is_file()
        before = path.read_text(encoding="utf-8", errors="replace") if existed else None
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(a["content"], encoding="utf-8")
        verb = "Overwrote" if existed else "Created"
        return ToolOutcome(
            observation=f"{verb} {rel} ({len(a['content'].splitlines())} lines).",
            written=rel if before != a["content"] else "",
        )
    if call.name == "run_tests":
        result = run_tests()
        return ToolOutcome(observation=render_test_result(result), tests=result)
    if call.name == "finish":
        return ToolOutcome(observation="Episode finished.", finished=True, message=a["message"])
    raise ToolError(f"unknown tool {call.name!r}")  # pragma: no cover - parse_tool_call checks names


def render_test_result(result) -> str:
    """What ``run_tests`` shows: the summary, then the runner's failure lines."""
    head = f"Test results: {result.summary()}"
    body = result.output_tail.strip()
    if result.completed:
        body = body.rsplit("\n", 1)[0].strip() if "\n" in body else ""  # the summary is already in the head
    return f"{head}\n{body}" if body else head
