#!/usr/bin/env bash
# The one decisive GPU check, for a lent device machine (no network there; a CUDA torch, nvcc optional).
#   bash scripts/device/check.sh --prepare                          (here, with PyPI: the wheel and .devpkgs/)
#   bash scripts/device/check.sh --dry-run --wheel dist/keel-*.whl  (here, no GPU: every step that needs none)
#   bash scripts/device/check.sh --wheel 'dist/keel-*.whl' [--budget S] [--out DIR] [--devpkgs DIR]   (the GPU)
# --prepare builds the wheel here (KEEL_CUDA=on, KEEL_CUDA_ARCHS=90: the H200 only) into dist/, audits it here
# (keel-audit --strict --target-torch 2.10; the audit needs no GPU, so it never runs on the device), and fills
# .devpkgs/wheels with keel's runtime requirements for the device's Python (3.12). Without --wheel the device
# builds the wheel itself (KEEL_CUDA_ARCHS=90, minutes of device time: avoid).
#
# On the device: the machine's facts -> carried wheels unpacked only where the machine lacks the distribution
# and none of its modules (its torch 2.11, pytest, numpy are never shadowed) -> the wheel unpacked into an
# isolated prefix, imported with the checkout off sys.path (all three CUDA twins must load) -> one pytest
# process per area (keel ops, deep_gemm, flash_attn, engine, server), each with its own limit, a per-test
# timeout, results per test as they finish (area_plugin.py), junit per process; a sticky CUDA fault or a hung
# test ends only its process and the area resumes in a fresh one -> the CUDA benchmarks, each capped well
# inside its step and writing its JSON after every case -> compute-sanitizer, time-boxed, with
# PYTORCH_NO_CUDA_MEMORY_CACHING=1: memcheck on the small op tests, racecheck on the reductions -> the summary:
# every CUDA path (scripts/device/paths.py) passed / failed / not run, the failing test ids, the figures.
# Exit 1 on any failure, a CUDA path that ran no test, or the budget running out.
#
# $OUT holds at most 7 files: summary.md, summary.json, junit.xml (merged), bench_gemm.json,
# bench_attention.json, bench_ops.json, logs.tar.gz (every log, steps.tsv, env.json, import.json, per-test
# results). The dry run (no GPU) runs the same steps with every CUDA test skipping, the benchmarks' CUDA code on
# CPU tensors at toy sizes, and no sanitizer; tests/test_cuda_device_check.py runs it in the suite.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/scripts/device"
PY="${PY:-python3}"
OUT="${OUT:-/tmp/keel-device}"
WHEEL=""
DEVPKGS="$ROOT/.devpkgs"
MODE=gpu
BUDGET=""
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) WHEEL="$2"; shift 2 ;;
    --devpkgs) DEVPKGS="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --budget) BUDGET="$2"; shift 2 ;;
    --dry-run) MODE=dry; shift ;;
    --prepare) MODE=prepare; shift ;;
    -h|--help) sed -n 2,25p "$0"; exit 0 ;;
    *) echo "check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# the dry run spends no device time: its limits only catch a hang (x4, for a loaded machine)
SCALE=1
[ "$MODE" = dry ] && SCALE=4
[ -z "$BUDGET" ] && BUDGET=$((300 * SCALE))

if [ "$MODE" = prepare ]; then
  # here, with PyPI and the build requirements: the sm_90 wheel (audited by setup.py's release gate and again
  # below against torch 2.10), and the wheels the device may lack, for its Python (DEVPKGS_PYTHON, 3.12):
  # keel's runtime requirements and the server tests' client. pytest and numpy are the image's own (never carried).
  set -e
  cd "$ROOT"
  rm -rf dist && mkdir -p dist "$DEVPKGS/wheels"
  KEEL_CUDA=on KEEL_CUDA_ARCHS=90 "$PY" -m pip wheel . --no-build-isolation --no-deps -w dist
  "$PY" -m keel_audit dist/keel-*.whl --strict --target-torch 2.10
  DPY="${DEVPKGS_PYTHON:-3.12}"
  "$PY" -m pip download -q --only-binary=:all: --python-version "$DPY" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform linux_x86_64 --platform any -d "$DEVPKGS/wheels" \
    "safetensors>=0.4" "tokenizers>=0.19" "huggingface_hub>=0.23" "jinja2>=3.1" tqdm \
    "fastapi>=0.115" "uvicorn>=0.30" openai packaging
  rm -f "$DEVPKGS"/wheels/numpy-*.whl "$DEVPKGS"/wheels/pytest-*.whl "$DEVPKGS"/wheels/torch-*.whl
  du -sh dist "$DEVPKGS"
  exit 0
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/keel-devcheck.XXXXXX")"
PREFIX="$WORK/prefix"
SITE="$WORK/site"  # area_plugin.py and keel_dev (dev/keel_dev): on PYTHONPATH, the checkout is not
mkdir -p "$OUT" "$WORK/logs" "$PREFIX" "$SITE"
rm -f "$OUT"/junit.xml "$OUT"/bench_*.json "$OUT"/summary.* "$OUT"/logs.tar.gz
: > "$WORK/steps.tsv"
cp "$HERE/area_plugin.py" "$SITE/"
[ -d "$ROOT/dev/keel_dev" ] && cp -r "$ROOT/dev/keel_dev" "$SITE/"
START=$SECONDS
FAILED=0

# step NAME LIMIT_S COMMAND...: runs COMMAND (log: logs/NAME.log) under the smaller of LIMIT_S and what is
# left of the budget; records exit status and seconds in steps.tsv.
step() {
  local name="$1" limit="$(($2 * SCALE))"; shift 2
  local left=$((BUDGET - (SECONDS - START) - 10))  # 10 s kept for the summary and the archive
  local t0=$SECONDS rc note=""
  if [ "$left" -lt 5 ]; then
    rc=124; note="skipped: the ${BUDGET} s budget is spent"
  else
    [ "$limit" -gt "$left" ] && limit=$left
    timeout --kill-after=5 "$limit" "$@" > "$WORK/logs/$name.log" 2>&1
    rc=$?
    [ "$rc" -eq 124 ] && note="timed out after ${limit} s"
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$note" >> "$WORK/steps.tsv"
  echo "== $name: exit $rc ($((SECONDS - t0)) s) $note"
  [ "$rc" -ne 0 ] && { FAILED=1; tail -n 8 "$WORK/logs/$name.log"; }
  return "$rc"
}

note() {  # note NAME TEXT: a step that did not run, and why (not a failure)
  printf '%s\t0\t0\t%s\n' "$1" "$2" >> "$WORK/steps.tsv"
  echo "== $1: $2"
}

finish() {
  trap - TERM INT
  PYTHONPATH= PYTHONSAFEPATH= "$PY" "$HERE/check.py" summary "$WORK" "$OUT" --mode "$MODE" > "$WORK/logs/summary.log" 2>&1
  local rc=$?
  cat "$WORK/logs/summary.log"
  cp "$WORK/steps.tsv" "$WORK/logs/"
  tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs results junit env.json import.json 2>/dev/null
  rm -rf "$WORK"
  { [ "$rc" -ne 0 ] || [ "$FAILED" -ne 0 ]; } && exit 1
  exit 0
}
trap 'printf "signal\t143\t0\tthe check was ended by a signal\n" >> "$WORK/steps.tsv"; FAILED=1; finish' TERM INT

cd "$ROOT"
export HF_HUB_OFFLINE=1 PYTHONDONTWRITEBYTECODE=1
step env 30 "$PY" "$HERE/check.py" env "$WORK/env.json"
if [ "$MODE" = gpu ] && ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  printf 'gpu\t1\t0\tno CUDA device visible to torch (use --dry-run without a GPU)\n' >> "$WORK/steps.tsv"
  FAILED=1; finish
fi

# carried wheels, unpacked only where the machine lacks them (never shadowing its own packages)
DEPS="$WORK/deps"
mkdir -p "$DEPS"
if compgen -G "$DEVPKGS/wheels/*.whl" > /dev/null; then
  step deps 60 "$PY" "$HERE/check.py" install "$DEPS" "$DEVPKGS"/wheels/*.whl --only-missing
fi

if [ -z "$WHEEL" ]; then
  if [ "$MODE" = dry ]; then
    printf 'wheel\t2\t0\tthe dry run builds nothing: pass --wheel\n' >> "$WORK/steps.tsv"
    FAILED=1; finish
  fi
  # the fallback (prefer --prepare here): built on the device for sm_90 only
  BUILD=("$PY" -m pip wheel . --no-build-isolation --no-deps -w "$WORK/dist")
  "$PY" -m pip --version > /dev/null 2>&1 || BUILD=("$PY" setup.py -q bdist_wheel -d "$WORK/dist")
  step build 240 env KEEL_CUDA=on KEEL_CUDA_ARCHS=90 MAX_JOBS="$(nproc)" PYTHONPATH="$ROOT/audit:$DEPS" \
    "${BUILD[@]}" || finish
  WHEEL="$(ls "$WORK"/dist/keel-*.whl)"
fi
# shellcheck disable=SC2086
WHEEL="$(ls $WHEEL | head -n1)"
if [ "$MODE" = dry ]; then  # the audit needs no GPU: here only (--prepare audits the device's wheel)
  step audit 60 env PYTHONPATH="$ROOT/audit/src:$DEPS" "$PY" -m keel_audit "$WHEEL" --strict --target-torch 2.10 || finish
fi
step install 30 "$PY" "$HERE/check.py" install "$PREFIX" "$WHEEL" || finish
cp -r "$ROOT/dev/keel_dev" "$ROOT/dev/keel_fuzz" "$PREFIX/"  # keel-dev: the test helpers the CUDA tests import (pure Python)

# The checkout stays off sys.path: PYTHONSAFEPATH (no cwd / script folder for -c and -m), the prefix first,
# then the unpacked missing wheels, then the plugin (nothing there shadows the machine's packages).
export PYTHONPATH="$PREFIX:$DEPS:$SITE" PYTHONSAFEPATH=1
NEED_CUDA=""
[ "$MODE" = gpu ] && NEED_CUDA=--need-cuda
# run as `python -c` from the repository root, exactly as pytest is run below: the sys.path the tests see
RUN_PY="import runpy, sys; sys.argv[0] = 'check.py'; runpy.run_path('$HERE/check.py', run_name='__main__')"
step import 30 "$PY" -c "$RUN_PY" import "$PREFIX" "$WORK/import.json" $NEED_CUDA || finish

# area NAME LIMIT_S PER_TEST_S PYTEST_ARGS...: one pytest process per area (check.py area)
area() {
  local name="$1" limit="$2" per_test="$3"; shift 3
  local inner=$((limit * SCALE)) left=$((BUDGET - (SECONDS - START) - 10))
  [ "$inner" -gt "$left" ] && inner=$left
  [ "$inner" -lt 8 ] && inner=8  # step() records the spent budget
  step "tests_$name" "$limit" "$PY" -c "$RUN_PY" area "$name" "$WORK" "$((inner - 3))" "$per_test" -- -m cuda "$@"
}
area ops 50 20 tests/ops
area deep_gemm 35 20 tests/vendored/deep_gemm
area flash_attn 50 30 tests/vendored/flash_attn
area engine 40 30 tests/engine/test_cuda_engine.py
area server 40 30 tests/entrypoints/test_cuda_serve.py

# benchmarks: each capped at 2/3 of its step, its JSON written after every case (benchmarks/cuda_cases.py)
BENCH=(--device cuda --time-cap 14 --json)
[ "$MODE" = dry ] && BENCH=(--device cuda --dry-run --time-cap 14 --json)
for b in gemm attention ops; do
  PYTHONSAFEPATH= step "bench_$b" 22 "$PY" "benchmarks/$b.py" "${BENCH[@]}" "$OUT/bench_$b.json"
done

# compute-sanitizer, time-boxed (a timeout is a note; an error it reports is a failure)
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2> /dev/null || true)"
if [ "$MODE" = dry ]; then
  note memcheck "not in the dry run (needs a GPU)"
elif [ -z "$SAN" ]; then
  note memcheck "compute-sanitizer is absent on this machine"
else
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1
  SMALL=(tests/ops/test_cuda_nonfinite.py tests/vendored/deep_gemm/test_cuda_nonfinite.py
    tests/vendored/flash_attn/test_cuda_nonfinite.py -k "nonfinite and not past_the_grid")
  step memcheck 40 "$SAN" --tool memcheck --error-exitcode 9 --print-limit 20 \
    "$PY" -m pytest -q -x -p no:cacheprovider -m cuda "${SMALL[@]}"
  step racecheck 30 "$SAN" --tool racecheck --error-exitcode 9 --print-limit 20 \
    "$PY" -m pytest -q -x -p no:cacheprovider -m cuda tests/ops/test_cuda_nonfinite.py \
    tests/vendored/deep_gemm/test_cuda_nonfinite.py -k "rms_norm_nonfinite or casts_nonfinite or gemm_nonfinite"
  unset PYTORCH_NO_CUDA_MEMORY_CACHING
fi
finish
