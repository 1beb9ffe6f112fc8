"""Run a repository's tests in a contained subprocess and report a structured result.

``run_tests(repo, ["tests/test_shop.py"])`` copies ``repo`` into a fresh temporary directory,
runs every ``test_*`` function of the given test files there with a tiny runner (no pytest), and
removes the directory afterwards. A run takes about 50-150 ms here, namespaces included (pytest
alone would be about 270 ms). What the process gets:

* **Limits** (``SandboxLimits``, applied by util-linux ``prlimit`` before anything runs, so no
  ``preexec_fn`` is needed and threaded callers such as Ray actors are safe; ``resource`` in a
  ``preexec_fn`` only where ``prlimit`` is missing): ``RLIMIT_AS`` (address space, default
  1 GiB), ``RLIMIT_CPU`` (``ceil(timeout) + 1`` s), ``RLIMIT_NPROC`` (``max_procs``),
  ``RLIMIT_FSIZE`` (largest file it may write), ``RLIMIT_NOFILE`` 256, ``RLIMIT_CORE`` 0.
* **Time:** a wall-clock timeout (waited on with a pidfd, no polling); then the whole process
  group is SIGKILLed (the child starts its own session, ``setsid``), then any process that left
  the group: by uid (root), by an environment tag (fallback) or through the PID namespace.
* **Output:** stdout and stderr go through a pipe drained by a thread that keeps only the last
  64 kB, so a test that prints forever costs neither memory nor disk; sandbox paths are replaced
  by repo-relative ones so observations are stable across runs.
* **Environment:** ``PATH=/usr/bin:/bin``, ``LANG``, ``HOME`` and ``TMPDIR`` = the repo copy and
  a run tag, nothing else; the interpreter runs with ``-I -S -B`` (no ``PYTHON*`` variables, no
  site packages, no bytecode files); cwd = the repo copy.
* **Namespaces** (``unshare`` from util-linux; as root directly, otherwise inside a user
  namespace): a network namespace (no interface is up, so every ``connect`` fails with
  ``ENETUNREACH``, loopback included), a PID namespace with its own ``/proc`` (the runner is
  PID 1: when it exits or is killed, every process it left behind dies with it, even one that
  called ``setsid``) and a mount namespace in which every mount is remounted read-only except a
  bind mount of the repo copy (``/proc``, ``/sys``, ``/dev`` and ``/dev/pts`` are left alone;
  ``/dev/shm`` and ``/dev/mqueue`` are made read-only).
* **Identity** (root only): right after the mounts the runner drops to a fresh uid/gid (random in
  ``[3_000_000, 4_000_000)``, no supplementary groups, ``no_new_privs``), so ``RLIMIT_NPROC``
  applies (root ignores it), concurrent sandboxes do not share a process budget, files outside the
  copy are protected by permissions as well, and stray processes can be found by uid. The
  interpreter must be usable by that uid: the probe tries ``sys.executable``, its real path, then
  ``/usr/bin/python3`` (here the venv's interpreter lives under ``/root``, mode 0700, so the
  system ``python3`` runs the tests: they must not need third-party packages).

Fallbacks are probed once per process (``isolation="auto"``) and recorded in
``SandboxResult.isolation`` with a ``reason``: not root gives no private uid (``RLIMIT_NPROC`` is
then our own process count + ``max_procs``); no usable ``unshare`` gives no network, mount or PID
isolation (``network=False, filesystem=False``), and stray processes are then found by the run
tag in ``/proc/<pid>/environ``, which a process that re-executes with a clean environment
escapes. ``isolation="namespaces"`` raises instead of falling back; ``isolation="none"`` skips
them on purpose.

The runner reports ``"<nonce> N passed, M failed"`` on its last line, with a random nonce it reads
from stdin before importing any test, so code under test that prints a fake summary is not
believed (code that walks the runner's frames could still forge it: an in-process runner cannot
defend against that). A run whose summary is missing never counts as passed.

Not enforced: reads (a test can read any world-readable file, e.g. the trainer's source);
resident memory (``RLIMIT_AS`` is per process, so a tree may reach ``max_procs x memory_mb``;
no cgroup); the CPU time of a fork bomb, bounded only by the wall-clock timeout; system calls
(no seccomp filter).

Example (a generated ``fix_bug`` task, ``generate_task(4)``, before the fix)::

    >>> r = run_tests(repo, ["tests/test_weather.py"], limits=SandboxLimits(timeout_s=2))
    >>> r.passed, r.failed, r.timed_out, r.killed, r.isolation.network, r.isolation.filesystem
    (10, 2, False, False, True, True)
    >>> print(r.output_tail)
    FAILED tests/test_weather.py::test_median_1: AssertionError
      at tests/test_weather.py:24: assert median([3, 1, 2]) == 2
    FAILED tests/test_weather.py::test_median_2: AssertionError
      at tests/test_weather.py:28: assert median([4, 1, 3, 2]) == 2.5

    10 passed, 2 failed
"""

from __future__ import annotations

import math
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SETUP_FAILED_EXIT = 97  # the runner could not build its sandbox (mounts, uid drop)
UID_RANGE = (3_000_000, 4_000_000)  # fresh uid per run when running as root
_TAIL_BYTES = 64_000

# The runner: read the nonce, remount read-only (in namespaces), drop the uid (as root), run the tests.
# Arguments: repo, uid (-1 = keep), remount (0/1), probe (0/1), then label/path pairs.
RUNNER = r"""
import os, sys

def _setup(repo, uid, remount):
    if remount:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        RDONLY, REMOUNT, BIND = 1, 32, 4096
        def mount(src, target, flags):
            if libc.mount(src, target.encode(), None, flags, None) != 0:
                raise OSError(ctypes.get_errno(), "mount " + target)
        KEEP = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21,
                "strictatime": 1 << 24}
        def keep(opts):
            return sum(KEEP.get(o, 0) for o in set(opts))
        seen = {}
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                target = parts[1].replace("\\040", " ")
                seen[target] = parts[3].split(",")
        skipped = []
        for target, opts in seen.items():
            if target in ("/dev", "/dev/pts") or target.startswith(("/proc", "/sys")) or "ro" in opts:
                continue
            try:
                mount(None, target, REMOUNT | BIND | RDONLY | keep(opts))
            except OSError:
                if target == "/":
                    raise
                skipped.append(target)
        mount(repo.encode(), repo, BIND)
        with open("/proc/self/mounts") as f:
            repo_opts = [line.split()[3].split(",") for line in f if line.split()[1] == repo][-1:]
        mount(None, repo, REMOUNT | BIND | keep(repo_opts[0] if repo_opts else []))
        if skipped:
            print("privy-sandbox-warning: mounts left writable: " + " ".join(skipped), file=sys.stderr)
    if uid >= 0:
        import ctypes
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS

def _main():
    nonce = sys.stdin.readline().strip()
    sys.stdin.close()
    sys.stdin = open(os.devnull)
    repo, uid, remount, probe = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
    try:
        _setup(repo, uid, remount)
    except BaseException as e:
        print("privy-sandbox-setup-failed: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        sys.stderr.flush()
        os._exit(97)
    os.chdir(repo)
    sys.path.insert(0, repo)
    import importlib.util, traceback
    if probe:
        import json, pathlib, socket, math, collections, re
    pairs = sys.argv[5:]
    passed = failed = 0

    def where(exc):
        frames = traceback.extract_tb(exc.__traceback__)
        for fr in reversed(frames):
            name = fr.filename
            if name in labels or name.startswith(repo + os.sep):
                shown = labels.get(name) or os.path.relpath(name, repo)
                return "\n  at %s:%s: %s" % (shown, fr.lineno, (fr.line or "").strip())
        return ""

    def report(kind, name, exc):
        msg = str(exc).strip().replace("\n", " ")
        if len(msg) > 300:
            msg = msg[:300] + "..."
        print("%s %s: %s%s%s" % (kind, name, type(exc).__name__, ": " + msg if msg else "", where(exc)))

    labels = {os.path.abspath(pairs[i + 1]): pairs[i] for i in range(0, len(pairs), 2)}
    for i in range(0, len(pairs), 2):
        label, path = pairs[i], pairs[i + 1]
        modname = "privy_test_module_%d" % (i // 2)
        try:
            spec = importlib.util.spec_from_file_location(modname, os.path.abspath(path))
            module = importlib.util.module_from_spec(spec)
            sys.modules[modname] = module
            spec.loader.exec_module(module)
        except BaseException as e:
            failed += 1
            report("ERROR", label, e)
            continue
        tests = [(k, v) for k, v in list(vars(module).items())
                 if k.startswith("test") and callable(v) and getattr(v, "__module__", None) == modname]
        for name, fn in tests:
            try:
                fn()
            except BaseException as e:
                failed += 1
                report("FAILED", "%s::%s" % (label, name), e)
            else:
                passed += 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os.write(1, ("\n%s %d passed, %d failed\n" % (nonce, passed, failed)).encode())
    os._exit(0)

_main()
"""


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Resource limits of one test run."""

    timeout_s: float = 5.0  # wall clock, > 0; the process group is killed after it
    memory_mb: int = 1024  # RLIMIT_AS per process, >= 64
    max_procs: int = 32  # RLIMIT_NPROC for the sandbox uid, >= 1 (1 = no fork at all)
    max_file_mb: int = 8  # RLIMIT_FSIZE: largest file the tests may write, >= 1

    def validate(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"sandbox timeout_s must be > 0, got {self.timeout_s}")
        if self.memory_mb < 64:
            raise ValueError(f"sandbox memory_mb must be >= 64 (the interpreter needs ~30 MB), got {self.memory_mb}")
        if self.max_procs < 1:
            raise ValueError(f"sandbox max_procs must be >= 1, got {self.max_procs}")
        if self.max_file_mb < 1:
            raise ValueError(f"sandbox max_file_mb must be >= 1, got {self.max_file_mb}")

    @property
    def cpu_s(self) -> int:
        return math.ceil(self.timeout_s) + 1


@dataclass(frozen=True, slots=True)
class Isolation:
    """Which containment layers a run actually had."""

    network: bool  # own network namespace: no connection can be made, loopback included
    filesystem: bool  # every mount read-only except the repo copy
    pid_namespace: bool  # stray processes die with the runner
    uid: int | None  # uid the tests ran as (None = the caller's own)
    python: str  # interpreter that ran the tests
    reason: str = ""  # why a layer is missing ("" = all present)


@dataclass(frozen=True, slots=True)
class SandboxResult:
    passed: int  # test functions that returned
    failed: int  # test functions that raised, plus test files that failed to import
    timed_out: bool  # killed by the wall-clock timeout
    killed: bool  # ended by a signal (timeout SIGKILL, SIGXCPU from RLIMIT_CPU, SIGXFSZ, a crash)
    signal: int | None  # that signal's number
    returncode: int
    completed: bool  # the runner printed its nonce-tagged summary
    setup_failed: bool  # the sandbox itself could not be built (see output_tail)
    output_tail: str  # last characters of stdout+stderr, nonce removed
    duration_s: float
    isolation: Isolation

    @property
    def all_passed(self) -> bool:
        return self.completed and not self.timed_out and self.failed == 0 and self.passed > 0

    def summary(self) -> str:
        if self.setup_failed:
            return "the test sandbox could not start"
        if self.timed_out:
            return f"timed out after {self.duration_s:.1f} s ({self.passed} passed, {self.failed} failed before that)"
        if not self.completed:
            how = f"killed by signal {self.signal}" if self.killed else f"exit code {self.returncode}"
            return f"the test run crashed ({how}) before reporting"
        return f"{self.passed} passed, {self.failed} failed"


# ----- how to run: probed once per process ---------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Plan:
    namespaces: bool  # net + mount + pid namespaces via unshare
    userns: bool  # ... inside a user namespace (not root: we are "root" only in there)
    drop_uid: bool  # run the tests as a fresh uid (root only)
    python: str
    reason: str = ""


_PLANS: dict[str, _Plan] = {}
_PLAN_LOCK = threading.Lock()


def _python_candidates() -> list[str]:
    out = []
    for p in (
        sys.executable,
        os.path.realpath(sys.executable),
        getattr(sys, "_base_executable", ""),
        "/usr/bin/python3",
        "/usr/local/bin/python3",
        "/bin/python3",
    ):
        if p and os.path.isfile(p) and p not in out:
            out.append(p)
    return out


def _plan(mode: str) -> _Plan:
    """The strongest working way to run, for ``mode`` in auto | namespaces | none."""
    with _PLAN_LOCK:
        if mode not in _PLANS:
            _PLANS[mode] = _probe(mode)
        return _PLANS[mode]


def _probe(mode: str) -> _Plan:
    is_root = os.geteuid() == 0
    missing: list[str] = []  # layers we cannot have, whatever the interpreter
    options: list[tuple[bool, bool, bool]] = []  # (namespaces, userns, drop_uid), strongest first
    if mode in ("auto", "namespaces"):
        if shutil.which("unshare") is None:
            missing.append("no unshare binary: no namespaces")
        else:
            options.append((True, not is_root, is_root))
    if mode in ("auto", "none"):
        if is_root:
            options.append((False, False, True))
        options.append((False, False, False))
    if not is_root:
        missing.append("not root: no private uid (RLIMIT_NPROC counts all our processes)")
    failures: list[str] = []
    for namespaces, userns, drop in options:
        for python in _python_candidates():
            plan = _Plan(namespaces, userns, drop, python)
            with tempfile.TemporaryDirectory(prefix="privy-probe-") as tmp:
                (Path(tmp) / "repo").mkdir()
                r = _execute(plan, Path(tmp) / "repo", [], {}, SandboxLimits(timeout_s=10), probe=True)
            if r.completed:
                if failures and (namespaces, userns, drop) != options[0]:
                    missing.append(f"stronger isolation failed its probe ({failures[-1]})")
                return _Plan(namespaces, userns, drop, python, "; ".join(missing))
            tail = r.output_tail.strip().splitlines()
            failures.append(
                f"namespaces={namespaces}, userns={userns}, drop_uid={drop}, {python}: "
                f"{tail[-1] if tail else r.summary()}"
            )
        if mode == "namespaces":
            break
    raise RuntimeError(f"the test sandbox (isolation={mode!r}) cannot run here: " + "; ".join(missing + failures))


# ----- running ------------------------------------------------------------------------------------
def run_tests(
    repo: Path | str,
    test_files: Sequence[str],
    *,
    extra_tests: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
    limits: SandboxLimits = SandboxLimits(),
    isolation: str = "auto",
) -> SandboxResult:
    """Run ``test_files`` (paths relative to ``repo``) and ``extra_tests`` ({label: source}, e.g. hidden
    tests kept outside the repo) on a temporary copy of ``repo``; ``overrides`` ({path: content})
    are written into the copy first (e.g. the original tests, to judge against them).

    ``isolation``: ``auto`` (strongest available, recorded in the result), ``namespaces`` (raise
    if namespaces are unavailable) or ``none`` (limits, session, uid drop only).
    """
    if isolation not in ("auto", "namespaces", "none"):
        raise ValueError(f"sandbox isolation must be auto | namespaces | none, got {isolation!r}")
    limits.validate()
    return _execute(
        _plan(isolation), Path(repo), list(test_files), dict(extra_tests or {}), limits, overrides=dict(overrides or {})
    )


def _execute(
    plan: _Plan,
    repo: Path,
    test_files: list[str],
    extra_tests: dict[str, str],
    limits: SandboxLimits,
    probe: bool = False,
    overrides: dict[str, str] | None = None,
) -> SandboxResult:
    t0 = time.monotonic()
    uid = secrets.SystemRandom().randrange(*UID_RANGE) if plan.drop_uid else None
    root = Path(tempfile.mkdtemp(prefix="privy-sbx-"))
    try:
        os.chmod(root, 0o711)
        work = root / "repo"
        shutil.copytree(repo, work, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        for rel, content in (overrides or {}).items():
            target = work / rel
            if target.is_symlink():
                target.unlink()
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
        pairs: list[str] = []
        for rel in test_files:
            pairs += [rel, str(work / rel)]
        if extra_tests:
            hidden = root / "hidden"
            hidden.mkdir(mode=0o755)
            for i, (label, source) in enumerate(extra_tests.items()):
                path = hidden / f"hidden_{i}.py"
                path.write_text(source, encoding="utf-8")
                path.chmod(0o644)
                pairs += [label, str(path)]
        if uid is not None:
            for dirpath, dirnames, filenames in os.walk(work):
                os.lchown(dirpath, uid, uid)
                for name in dirnames + filenames:
                    os.lchown(os.path.join(dirpath, name), uid, uid)
        rc, timed_out, nonce, raw = _spawn(plan, work, uid, pairs, limits, probe)
        raw = raw.replace(str(work) + os.sep, "").replace(str(root), "<sandbox>")  # stable across runs
        return _result(raw, nonce, rc, timed_out, time.monotonic() - t0, plan, uid)
    finally:
        if uid is not None:
            _kill_uid(uid)
        shutil.rmtree(root, ignore_errors=True)


def _spawn(
    plan: _Plan, work: Path, uid: int | None, pairs: list[str], limits: SandboxLimits, probe: bool
) -> tuple[int, bool, str, str]:
    """Start the runner, feed it the nonce, wait, kill the group; (rc, timed_out, nonce, output tail)."""
    nonce = secrets.token_hex(16)
    runner = [
        plan.python,
        "-I",
        "-S",
        "-B",
        "-c",
        RUNNER,
        str(work),
        str(uid if uid is not None else -1),
        "1" if plan.namespaces else "0",
        "1" if probe else "0",
        *pairs,
    ]
    cmd = runner
    if plan.namespaces:
        cmd = [
            "unshare",
            *(["--user", "--map-root-user"] if plan.userns else []),
            "--net",
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--propagation",
            "private",
            "--",
            *runner,
        ]
    nproc = limits.max_procs if uid is not None else _own_process_count() + limits.max_procs
    rlimits = {
        "as": limits.memory_mb * 2**20,
        "cpu": limits.cpu_s,
        "nproc": nproc,
        "fsize": limits.max_file_mb * 2**20,
        "nofile": 256,
        "core": 0,
    }
    preexec = None
    prlimit = shutil.which("prlimit")
    if prlimit:
        cmd = [prlimit, *(f"--{k}={v}" for k, v in rlimits.items()), "--", *cmd]
    else:  # pragma: no cover - util-linux always ships prlimit where it ships unshare
        preexec = _rlimit_setter(rlimits)
    tag = secrets.token_hex(8)  # marks the run's processes in /proc/<pid>/environ (cleanup without a private uid)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(work), "TMPDIR": str(work), "PRIVY_SANDBOX_RUN": tag}
    proc = subprocess.Popen(
        cmd,
        cwd=work,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=preexec,
        close_fds=True,
    )
    tail = _TailReader(proc.stdout)
    timed_out = False
    try:
        try:
            proc.stdin.write((nonce + "\n").encode())
            proc.stdin.close()
        except OSError:
            pass  # the child died before reading: its exit code says why
        _wait(proc, limits.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_group(proc.pid)
        proc.wait()
        if uid is not None:
            _kill_uid(uid)  # anything that left the group (setsid) outside a PID namespace
        elif not plan.namespaces:
            _kill_tagged(f"PRIVY_SANDBOX_RUN={tag}".encode())
    return proc.returncode, timed_out, nonce, tail.text()


class _TailReader(threading.Thread):
    """Drain a pipe in the background, keeping only its last ``_TAIL_BYTES`` (a flood costs no memory)."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream = stream
        self.buf = bytearray()
        self.start()

    def run(self) -> None:
        fd = self.stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.buf += chunk
            if len(self.buf) > 2 * _TAIL_BYTES:
                del self.buf[:-_TAIL_BYTES]

    def text(self) -> str:
        self.join(timeout=2.0)  # EOF once every writer is gone
        self.stream.close()
        return bytes(self.buf[-_TAIL_BYTES:]).decode("utf-8", errors="replace")


def _wait(proc: subprocess.Popen, timeout: float) -> None:
    """``proc.wait(timeout)`` without its polling sleeps (a pidfd wakes us the moment it exits)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # pragma: no cover - kernels before 5.3
        proc.wait(timeout=timeout)
        return
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    if not ready:
        raise subprocess.TimeoutExpired(proc.args, timeout)
    proc.wait()


def _rlimit_setter(rlimits: dict[str, int]):  # pragma: no cover - fallback without prlimit
    import resource

    names = {
        "as": resource.RLIMIT_AS,
        "cpu": resource.RLIMIT_CPU,
        "nproc": resource.RLIMIT_NPROC,
        "fsize": resource.RLIMIT_FSIZE,
        "nofile": resource.RLIMIT_NOFILE,
        "core": resource.RLIMIT_CORE,
    }

    def apply() -> None:
        for key, value in rlimits.items():
            resource.setrlimit(names[key], (value, value))

    return apply


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _uid_pids(uid: int, zombies: bool = False) -> list[int]:
    """Processes owned by ``uid`` (zombies only when asked: RLIMIT_NPROC counts them)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid != uid:
                    continue
                with open(f"/proc/{entry}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if zombies or state not in (b"Z", b"X"):
                pids.append(int(entry))
    return pids


def _kill_until_gone(find: Callable[[], list[int]], deadline_s: float) -> None:
    """SIGKILL what ``find()`` lists, again until it lists nothing or ``deadline_s`` has passed: a
    process can fork between one look and the kill."""
    end = time.monotonic() + deadline_s
    while True:
        pids = find()
        if not pids or time.monotonic() > end:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


def _kill_uid(uid: int, deadline_s: float = 2.0) -> None:
    """SIGKILL every process still running as the run's private uid (escaped the group or the ns)."""
    _kill_until_gone(lambda: _uid_pids(uid), deadline_s)


def _kill_tagged(marker: bytes, deadline_s: float = 2.0) -> None:
    """SIGKILL our own processes whose initial environment carries ``marker`` (best effort: a process
    that re-executes itself with a clean environment is not found)."""
    me = os.getuid()

    def tagged() -> list[int]:
        found = []
        for pid in _uid_pids(me):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if marker in f.read().split(b"\0"):
                        found.append(pid)
            except OSError:
                continue
        return found

    _kill_until_gone(tagged, deadline_s)


def _own_process_count() -> int:
    try:
        return len(_uid_pids(os.getuid(), zombies=True))
    except OSError:  # pragma: no cover
        return 0


_SUMMARY = re.compile(r"^(?P<nonce>[0-9a-f]{32}) (?P<passed>\d+) passed, (?P<failed>\d+) failed$", re.MULTILINE)


def _result(
    raw: str, nonce: str, rc: int, timed_out: bool, duration: float, plan: _Plan, uid: int | None
) -> SandboxResult:
    passed = failed = 0
    completed = False
    for m in _SUMMARY.finditer(raw):
        if m.group("nonce") == nonce:
            passed, failed, completed = int(m.group("passed")), int(m.group("failed")), True
    if not completed:  # count what the runner reported before it died
        failed = len(re.findall(r"^(?:FAILED|ERROR) ", raw, re.MULTILINE))
    text = raw.replace(nonce + " ", "") if nonce else raw
    text = re.sub(r"\n{3,}", "\n\n", text).strip("\n")
    warn = re.findall(r"privy-sandbox-warning: (.*)", text)
    isolation = Isolation(
        network=plan.namespaces,
        filesystem=plan.namespaces and not warn,
        pid_namespace=plan.namespaces,
        uid=uid,
        python=plan.python,
        reason="; ".join([plan.reason] * bool(plan.reason) + warn),
    )
    sig = -rc if rc < 0 else None
    return SandboxResult(
        passed=passed,
        failed=failed,
        timed_out=timed_out,
        killed=sig is not None,
        signal=sig,
        returncode=rc,
        completed=completed and not timed_out,
        setup_failed=rc == SETUP_FAILED_EXIT and "privy-sandbox-setup-failed" in text,
        output_tail=text[-4000:],
        duration_s=duration,
        isolation=isolation,
    )
