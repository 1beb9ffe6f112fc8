#!/usr/bin/env bash
# Wheels for scripts/gpu_check.sh on a GPU machine that has CUDA torch but reaches no registry.
#
#   scripts/gpu_wheels.sh [PYVER]      # into ./.whl/ (about 19 MB), PYVER the GPU machine's, default 3.12
#
# The GPU tests and scripts/bench/gpu.py import DeepSpeed, omegaconf and this project's pinned
# transformers; the CUDA image had torch, tokenizers, safetensors, numpy, msgpack, ninja,
# py-cpuinfo and einops already (read there on 2026-12-04), so only the rest travels. DeepSpeed and
# antlr4 are sdists on PyPI: they are built here (pure-Python wheels, no ops compiled).
# Ray (79 MB) does not fit a 64 MB transfer, so Ray actors are not part of the GPU check.
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER="${1:-3.12}"
PIP="${PIP:-.venv/bin/pip}"
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
"$PIP" download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl transformers==5.24.0 omegaconf==2.3.0 pydantic==2.14.4 pydantic-core==2.50.5 hjson==3.1.0 \
  annotated-types==0.8.0 typing-inspection==0.4.5 regex
"$PIP" wheel -q --no-deps -w .whl deepspeed==0.19.8 antlr4-python3-runtime==4.9.3
ls -la .whl
