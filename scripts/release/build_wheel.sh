#!/usr/bin/env bash
# Builds keel's abi3 wheel into dist/ with the torch of the given environment
# (default .venv, torch 2.13.0), then audits the wheel as a release gate.
#   scripts/release/build_wheel.sh [VENV_DIR]
# Options (environment): KEEL_CUDA=on|off|auto, KEEL_CUDA_ARCHS="80;90", KEEL_TORCH_TARGET=2.10
source "$(dirname "$0")/../env.sh"
VENV="${1:-$KEEL_ROOT/.venv}"
keel_venv "$VENV" "${KEEL_BUILD_TORCH:-2.13.0}"
# The real path: pip writes the interpreter path it was run with into console scripts (keel-audit's
# shebang), and a path through a symlink (a checkout copy that links .venv in) dies with that copy.
VENV="$(cd "$VENV" && pwd -P)"
PY="$VENV/bin/python"
"$PY" -m pip install -q -r "$KEEL_ROOT/requirements-build.txt"
# keel-audit (audit/, pure Python) gates the build: setup.py imports it, and it audits the wheel below.
# A stale audit/build/ would ship modules that were moved or deleted since (setuptools keeps them).
rm -rf "$KEEL_ROOT/audit/build"
"$PY" -m pip install -q --no-build-isolation "$KEEL_ROOT/audit[fast]"  # [fast]: ISA-L inflation

cd "$KEEL_ROOT"
rm -rf build/lib* dist/keel-*.whl
# No build isolation: the wheel is built against the torch installed in $VENV.
# setup.py audits the freshly built libraries and writes the audited torch floor into the wheel.
"$PY" -m pip wheel . --no-build-isolation --no-deps -w dist
WHEEL="$(ls dist/keel-*.whl)"
echo "== built $WHEEL"
# Gate the artifact itself (read straight from the zip) with keel's own strict policy.
"$VENV/bin/keel-audit" "$WHEEL" --target-torch "${KEEL_TORCH_TARGET:-2.10}" --strict
