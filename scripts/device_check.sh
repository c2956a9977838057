#!/usr/bin/env bash
# GPU check for a lent device machine (no network there): installs the wheel built HERE
# (carry dist/) next to the machine's own torch, runs the op tests on CUDA and the op
# benchmark, and writes the tables under $OUT. Usage, from the repository root there:
#   bash scripts/device_check.sh            (run tool: carry ["dist"], timeout ~480 s)
set -uo pipefail
OUT="${OUT:-/tmp/keel-device}"
mkdir -p "$OUT"
PY="${PY:-python3}"
WHEEL="$(ls dist/keel-*.whl | head -n1)"
{
  echo "## device"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c "import torch, sys; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda)"
} | tee "$OUT/device.txt"

# The wheel is cp310-abi3: install it without dependencies into a private folder.
rm -rf .devpkgs && "$PY" -m pip install -q --no-deps --target .devpkgs "$WHEEL" || exit 1
export PYTHONPATH="$PWD/.devpkgs"
"$PY" -c "import keel; print('loaded', sorted(keel._native.loaded_libraries()))" | tee -a "$OUT/device.txt"

if "$PY" -c "import pytest" 2>/dev/null; then
  "$PY" -m pytest -q -p no:cacheprovider tests/ops tests/test_native.py tests/vendored -k "cuda or compile or native" \
    2>&1 | tail -n 30 | tee "$OUT/pytest_cuda.txt"
else
  echo "pytest is not on this machine: skipped the test suite" | tee "$OUT/pytest_cuda.txt"
fi
"$PY" scripts/bench_ops.py --device cuda 2>&1 | tee "$OUT/bench_ops_cuda.md"
