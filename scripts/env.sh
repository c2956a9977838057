# Sourced by keel's scripts: makes (or reuses) a virtual environment with a given torch.
#   keel_venv DIR TORCH_VERSION   -> creates DIR if needed, installs torch==TORCH_VERSION there
# PYTHON picks the interpreter (default python3.11: torch 2.13.0 / 2.14.1 come from local disk for it).
set -euo pipefail

KEEL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3.11}"

keel_venv() {
  local dir="$1" torch_version="$2"
  # a folder without a working pip (a creation cut short) is made again
  if [ ! -x "$dir/bin/python" ] || ! "$dir/bin/python" -m pip --version >/dev/null 2>&1; then
    echo "== creating $dir ($("$PYTHON" --version))"
    "$PYTHON" -m venv --clear "$dir"
    "$dir/bin/python" -m pip install -q --upgrade pip
  fi
  if ! "$dir/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
    echo "== installing torch==$torch_version into $dir"
    "$dir/bin/python" -m pip install -q "torch==$torch_version"
  fi
}
