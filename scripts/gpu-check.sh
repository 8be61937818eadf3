#!/usr/bin/env bash
# The GPU check, as one prepared command for a lent H200 (see README "Developing").
# That machine has torch (CUDA), transformers, safetensors and tokenizers but no package
# registry, so the pure wheels nanoserve.runtime needs travel in .whl/ (fetch them here with
# `scripts/gpu-check.sh --fetch`, then carry `.whl`). The embedded model is too large to send:
# the gpu tests build tiny random-weight models on the GPU side.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--fetch" ]]; then
  grep -qx '/.whl/' .git/info/exclude || echo '/.whl/' >> .git/info/exclude
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl -c constraints.txt gguf hypothesis sortedcontainers
  exit 0
fi
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:packages/core/src:packages/runtime/src:packages/api/src
export PYTHONUNBUFFERED=1
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt"
python3 -m pytest -m gpu tests/runtime/test_cuda_graphs.py -q -p no:cacheprovider 2>&1 | tee "$out/gpu-tests.txt"
