#!/usr/bin/env bash
# The CPU image's base, where no image registry can be reached.
#
#   scripts/docker_base.sh            # prints the base to build on: python:3.11-slim, or a local one
#
# Where `docker pull python:3.11-slim` works, that is the base (what the Dockerfile names). Where it
# does not (an air-gapped or proxied machine), a Debian bookworm root is made with debootstrap from
# the Debian mirror (plain http, so no proxy CA is needed) with Debian's Python 3.11, venv and the
# CA store, and imported as privy-rl-base:bookworm; the image is the same otherwise (the Dockerfile
# makes its own venv on either). Made once: a later call finds it.
set -euo pipefail

OFFICIAL=python:3.11-slim
LOCAL=privy-rl-base:bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DOCKER=${DOCKER:-docker}

have() { $DOCKER image inspect "$1" >/dev/null 2>&1; }

if have "$OFFICIAL"; then echo "$OFFICIAL"; exit 0; fi
if have "$LOCAL"; then echo "$LOCAL"; exit 0; fi
if timeout 60 $DOCKER pull -q "$OFFICIAL" >/dev/null 2>&1; then echo "$OFFICIAL"; exit 0; fi

echo "docker_base: $OFFICIAL cannot be pulled; making $LOCAL with debootstrap from $MIRROR" >&2
command -v debootstrap >/dev/null || { echo "docker_base: needs debootstrap (apt-get install -y debootstrap)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "docker_base: debootstrap needs root" >&2; exit 1; }
root=$(mktemp -d /tmp/privy-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
# minbase: apt and dpkg only; python3-venv brings ensurepip (the Dockerfile's venv), python3-dev the
# headers DeepSpeed's shm_comm op is compiled against (python:3.11-slim has them), ca-certificates
# the public CAs pip needs where HTTPS is not intercepted.
debootstrap --variant=minbase --include=ca-certificates,python3,python3-venv,python3-dev bookworm "$root" "$MIRROR" >&2
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
# The Dockerfile's `apt-get update` needs the same sources as the official image (main, updates, security).
cat >"$root/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb ${MIRROR%/debian}/debian-security bookworm-security main
EOF
tar -C "$root" -c . | $DOCKER import -c 'CMD ["bash"]' -c 'ENV LANG=C.UTF-8' - "$LOCAL" >/dev/null
echo "$LOCAL"
