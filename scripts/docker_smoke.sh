#!/usr/bin/env bash
# `make docker-smoke`: the compose stack for real, on this machine.
#
#   scripts/docker_smoke.sh            # engine, image, three runs, teardown; exit 0 when all passed
#
# Here only what the phases need around them: OUT (runs/docker-smoke) made afresh with meta.json
# (the commit, read now: the tree may change while this runs), and a Docker engine, found or
# started (root: installs docker.io + iptables + debootstrap with apt when missing, then runs
# dockerd by hand, as on machines without systemd); none: exit 3, saying why (the caller decides
# whether that is a skip). Then scripts/docker_smoke.py runs the phases (its docstring: the image
# built cold and warm, two compose runs, the worker container killed mid-run, the table, the
# teardown) and stops a dockerd started here. Exit 0 when all passed, 1 on a failure, 3 when this
# machine cannot run it (no engine, a package index out of reach).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=runs/docker-smoke  # the compose file mounts runs/ at /runs
export PRIVY_CACHE=${PRIVY_CACHE:-$PWD/.cache/privy-rl}
export PRIVY_IMAGE=privy-rl:cpu
rm -rf "$OUT" && mkdir -p "$OUT"
started=$(date +%s)
.venv/bin/python scripts/docker_smoke.py meta
say() { echo "docker-smoke: $*" >&2; }

DOCKER=docker
dockerd_pid=""
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
  dockerd_pid=$!
  for _ in $(seq 60); do engine_up && break; sleep 0.5; done
  engine_up || { say "SKIPPED: dockerd did not start (see $OUT/dockerd.log)"; exit 3; }
fi
# The client that talks to this engine (a newer client without buildx is fine for everything but
# the build, which scripts/docker_build.sh picks its own client for).
if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; fi
export DOCKER

exec .venv/bin/python scripts/docker_smoke.py run --started "$started" ${dockerd_pid:+--dockerd-pid "$dockerd_pid"}
