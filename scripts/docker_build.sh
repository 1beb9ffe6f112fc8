#!/usr/bin/env bash
# Build the CPU image (privy-rl:cpu) on this machine, registries reachable or not.
#
#   scripts/docker_build.sh [extra docker build args]     # `make docker-build`
#
# - base: scripts/docker_base.sh (python:3.11-slim, or a debootstrap'ed Debian where it cannot be pulled);
# - torch: the torch 2.13.0 CPU wheel the host's pip resolves goes into docker/wheels/ (the build
#   context); where the host has none, the Dockerfile takes it from the PyTorch CPU index;
# - CAs: where the host trusts extra CAs (a proxy that re-signs HTTPS: /usr/local/share/ca-certificates/
#   has certificates, or PIP_CERT is set), the host's bundle is passed as the BuildKit secret
#   `pip_cert`, used by pip during the build and stored in no layer. PRIVY_DOCKER_CA=none turns it off,
#   PRIVY_DOCKER_CA=FILE names the bundle.
# Needs BuildKit: `docker buildx`, or a client older than 23 with DOCKER_BUILDKIT=1 (Debian's 20.10).
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${PRIVY_IMAGE:-privy-rl:cpu}

# A client that builds with BuildKit. Newer clients need the buildx plugin for it; older ones
# (Debian's docker.io 20.10) have it built in behind DOCKER_BUILDKIT=1.
build=()
for c in ${DOCKER:-} docker /usr/bin/docker; do
  command -v "$c" >/dev/null || continue
  if "$c" buildx version >/dev/null 2>&1; then build=("$c" buildx build --load); break; fi
  major=$("$c" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1 || true)
  if [[ "$major" =~ ^[0-9]+$ ]] && ((major < 23)); then build=(env DOCKER_BUILDKIT=1 "$c" build); DOCKER=$c; break; fi
done
((${#build[@]})) || { echo "docker_build: no Docker client with BuildKit (install the buildx plugin)" >&2; exit 1; }
export DOCKER=${DOCKER:-docker}

base=$(scripts/docker_base.sh)

# torch: exactly the CPU build, or nothing (an unpinned local version would pull a CUDA build).
find docker/wheels -name 'torch-*.whl' -delete
if pip=$(command -v .venv/bin/pip || command -v pip3); then
  "$pip" download -q --no-deps --only-binary=:all: -d docker/wheels 'torch==2.13.0+cpu' 2>/dev/null \
    || echo "docker_build: no torch 2.13.0+cpu wheel on this host; the image takes it from the PyTorch CPU index" >&2
fi

secret=()
ca=${PRIVY_DOCKER_CA:-}
if [ -z "$ca" ]; then
  if [ -n "${PIP_CERT:-}" ]; then ca=$PIP_CERT
  elif compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then ca=/etc/ssl/certs/ca-certificates.crt; fi
fi
if [ -n "$ca" ] && [ "$ca" != none ]; then
  echo "docker_build: pip in the build trusts $ca (BuildKit secret, in no layer)" >&2
  secret=(--secret "id=pip_cert,src=$ca")
fi

t0=$(date +%s)
"${build[@]}" -f docker/Dockerfile.cpu --build-arg "BASE=$base" "${secret[@]}" -t "$TAG" "$@" .
echo "docker_build: $TAG built on $base in $(($(date +%s) - t0)) s" >&2
