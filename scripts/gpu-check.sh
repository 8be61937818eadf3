#!/usr/bin/env bash
# The GPU check, as one prepared command for a lent GPU machine (README "Developing / the GPU
# check"). It runs with that machine's own python3 and torch: no package index, no wheels, no
# embedded model (the check builds a random-weight model of SmolLM2-135M's shape in memory), and
# only packages the machine has (FACTS.md, "The GPU machine"). Without CUDA it is a dry run on
# the CPU at a reduced size. Arguments go to scripts/gpu_check.py; results go to $OUT (or /tmp).
#
#   scripts/gpu-check.sh                       # the machine's python3
#   PYTHON=/tmp/venv/bin/python scripts/gpu-check.sh --skip-tests
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
out="${OUT:-/tmp}"
mkdir -p "$out"
# The source trees, not an install: what runs is this working tree. `.` for benchmarks and
# tests.runtime.capture_helpers.
export PYTHONPATH="packages/core/src:packages/runtime/src:packages/api/src:.${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
fi
# Say up front which of the packages the check needs are missing, instead of a traceback later.
"$python" - <<'PY'
import importlib.util, sys
need = ("torch", "pytest", "hypothesis", "numpy", "safetensors", "tokenizers", "jinja2", "tqdm",
        "transformers")
missing = [name for name in need if importlib.util.find_spec(name) is None]
if missing:
    sys.exit(f"gpu-check: {sys.executable} lacks {', '.join(missing)}")
PY
exec "$python" scripts/gpu_check.py --out "$out" "$@"
