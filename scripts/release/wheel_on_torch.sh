#!/usr/bin/env bash
# The CI matrix's job (.github/workflows/ci.yml, job `test`): the ONE wheel that `bash .ci/run` built
# (dist/keel-*.whl, never rebuilt) installed into this Python with torch==$TORCH: the op tests and a greedy
# generation smoke test. Tool versions come from requirements-test.txt only (-c as constraints).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${TORCH:?set TORCH to the torch version to test the wheel against}"
PY="${PYTHON:-python}"
"$PY" -m pip install -c requirements-test.txt "torch==${TORCH}" pytest ./audit ./dev
"$PY" -m pip install dist/keel-*.whl
sha256sum dist/keel-*.whl
"$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '${TORCH}')"
# op tests against the installed wheel (keel and the vendored libraries); `pytest`, not `python -m pytest`:
# the repository root stays off sys.path, so the installed wheel is what the tests import
pytest -q -p no:cacheprovider tests/ops tests/test_native.py tests/test_wheel_libraries.py tests/vendored
# generation smoke test: the default model, greedy, the hashes of the libraries mapped
keel models fetch-demo
root="$PWD" out="$(mktemp -d)"
(cd "$out" && HF_HUB_OFFLINE=1 "$PY" "$root/scripts/release/demo_generate.py" out.json --max-tokens 16)
