#!/usr/bin/env bash
# The one decisive GPU check, for a lent device machine (no network there; nvcc, CMake, Ninja, a CUDA torch).
#   bash scripts/device_check.sh [--wheel PATH] [--devpkgs DIR] [--out DIR] [--budget SECONDS]
#   bash scripts/device_check.sh --dry-run --wheel dist/keel-*.whl    (here, no GPU: what needs none)
#   bash scripts/device_check.sh --prepare                             (here, with PyPI: fills .devpkgs/)
# Steps: the machine's facts -> the wheel (built here with KEEL_CUDA=on KEEL_CUDA_ARCHS=${KEEL_CUDA_ARCHS:-90},
# or --wheel) -> unpacked into an isolated prefix with the carried wheels the machine lacks (.devpkgs/wheels:
# pytest, keel's runtime requirements) -> imported from that prefix with the checkout off sys.path (all three
# CUDA twins must load) -> every CUDA test (`pytest -m cuda`, junit in $OUT/junit.xml) -> the CUDA benchmarks
# (bench_gemm / bench_attention / bench_ops --device cuda) -> $OUT/summary.md and summary.json: one row per
# CUDA path (scripts/device_check_paths.py), ran / passed / figure. Exit 1 on any failure, any CUDA path that
# ran no test, or the time budget (480 s) running out. Logs: $OUT/logs/.
#
# --dry-run runs every step that needs no GPU: the machine's facts, unpacking (into a fresh prefix) and
# importing the given wheel from there, collecting every CUDA test (all skip) with the junit report, each
# benchmark's CUDA code path on CPU tensors at toy sizes (--dry-run), and the summary, which checks that every
# CUDA path has tests. It builds nothing (pass --wheel). tests/test_cuda_device_check.py runs it in the suite.
#
# On the device machine, with the `run` tool (see README "Device check"): build the wheel and the carried
# folder here first, then
#   run(command="bash scripts/device_check.sh --wheel dist/keel-*.whl", carry=["dist", ".devpkgs"], timeout_s=560)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PY:-python3}"
OUT="${OUT:-/tmp/keel-device}"
WHEEL=""
DEVPKGS="$ROOT/.devpkgs"
MODE=gpu
BUDGET=480
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) WHEEL="$2"; shift 2 ;;
    --devpkgs) DEVPKGS="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --budget) BUDGET="$2"; shift 2 ;;
    --dry-run) MODE=dry; shift ;;
    --prepare) MODE=prepare; shift ;;
    -h|--help) sed -n 2,24p "$0"; exit 0 ;;
    *) echo "device_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [ "$MODE" = prepare ]; then
  # Wheels the device machine may lack, for its Python (DEVPKGS_PYTHON, default 3.12): pytest, and keel's
  # runtime requirements with their dependencies (the engine and server tests need them; openai: the server
  # tests' client). Pure-Python or manylinux; unpacked there only when missing (device_check.py install).
  set -e
  DPY="${DEVPKGS_PYTHON:-3.12}"
  mkdir -p "$DEVPKGS/wheels"
  "$PY" -m pip download -q --only-binary=:all: --python-version "$DPY" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform linux_x86_64 --platform any -d "$DEVPKGS/wheels" \
    pytest numpy "safetensors>=0.4" "tokenizers>=0.19" "huggingface_hub>=0.23" "jinja2>=3.1" tqdm \
    "fastapi>=0.115" "uvicorn>=0.30" openai "setuptools>=77" "pyelftools>=0.31" packaging
  du -sh "$DEVPKGS"
  exit 0
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/keel-devcheck.XXXXXX")"
PREFIX="$WORK/prefix"
mkdir -p "$OUT/logs" "$PREFIX"
: > "$OUT/steps.tsv"
rm -f "$OUT"/junit.xml "$OUT"/bench_*.json "$OUT"/summary.*
START=$SECONDS
FAILED=0

# step NAME LIMIT_S COMMAND...: runs COMMAND (log: $OUT/logs/NAME.log) under the smaller of LIMIT_S and
# what is left of the budget; records exit status and seconds in steps.tsv.
step() {
  local name="$1" limit="$2"; shift 2
  local left=$((BUDGET - (SECONDS - START) - 15))  # 15 s kept for the summary
  local t0=$SECONDS rc note=""
  if [ "$left" -lt 10 ]; then
    rc=124; note="skipped: the ${BUDGET} s budget is spent"
  else
    [ "$limit" -gt "$left" ] && limit=$left
    timeout --kill-after=10 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
    rc=$?
    [ "$rc" -eq 124 ] && note="timed out after ${limit} s"
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$note" >> "$OUT/steps.tsv"
  echo "== $name: exit $rc ($((SECONDS - t0)) s) $note"
  [ "$rc" -ne 0 ] && { FAILED=1; tail -n 20 "$OUT/logs/$name.log"; }
  return "$rc"
}

finish() {
  "$PY" "$ROOT/scripts/device_check.py" summary "$OUT" --mode "$MODE" > "$OUT/logs/summary.log" 2>&1
  local rc=$?
  cat "$OUT/logs/summary.log"
  rm -rf "$WORK"
  [ "$rc" -ne 0 ] || [ "$FAILED" -ne 0 ] && exit 1
  exit 0
}

cd "$ROOT"
export HF_HUB_OFFLINE=1 PYTHONDONTWRITEBYTECODE=1
step env 60 "$PY" scripts/device_check.py env "$OUT/env.json"
if [ "$MODE" = gpu ] && ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  printf 'gpu\t1\t0\tno CUDA device visible to torch (use --dry-run without a GPU)\n' >> "$OUT/steps.tsv"
  FAILED=1; finish
fi

# carried wheels the machine lacks, and audit/ (keel-audit, pure Python) for the build's release gate
DEPS="$WORK/deps"
mkdir -p "$DEPS"
if compgen -G "$DEVPKGS/wheels/*.whl" > /dev/null; then
  step deps 120 "$PY" scripts/device_check.py install "$DEPS" "$DEVPKGS"/wheels/*.whl --only-missing
fi

if [ -z "$WHEEL" ]; then
  if [ "$MODE" = dry ]; then
    printf 'wheel\t2\t0\tthe dry run builds nothing: pass --wheel\n' >> "$OUT/steps.tsv"
    FAILED=1; finish
  fi
  # built here against the machine's torch, CUDA for sm_90 only (minutes on 16 cores); setup.py's own
  # audit gate needs keel_audit (audit/) and pyelftools; without pip, setuptools builds the wheel itself
  BUILD=("$PY" -m pip wheel . --no-build-isolation --no-deps -w "$WORK/dist")
  "$PY" -m pip --version > /dev/null 2>&1 || BUILD=("$PY" setup.py -q bdist_wheel -d "$WORK/dist")
  step build 330 env KEEL_CUDA=on KEEL_CUDA_ARCHS="${KEEL_CUDA_ARCHS:-90}" PYTHONPATH="$ROOT/audit:$DEPS" \
    "${BUILD[@]}" || finish
  WHEEL="$(ls "$WORK"/dist/keel-*.whl)"
fi
# shellcheck disable=SC2086
WHEEL="$(ls $WHEEL | head -n1)"
step audit 60 env PYTHONPATH="$ROOT/audit:$DEPS" "$PY" -m keel_audit "$WHEEL" --strict --target-torch 2.10 || finish
step install 60 "$PY" scripts/device_check.py install "$PREFIX" "$WHEEL" || finish

# The checkout stays off sys.path: PYTHONSAFEPATH (no cwd / script folder for -c and -m), the prefix first.
export PYTHONPATH="$PREFIX:$DEPS" PYTHONSAFEPATH=1
NEED_CUDA=""
[ "$MODE" = gpu ] && NEED_CUDA=--need-cuda
# run as `python -c` from the repository root, exactly as pytest is run below (-c and -m put the cwd first
# on sys.path unless PYTHONSAFEPATH is set): the check sees the sys.path the tests will see
RUN_PY="import runpy, sys; sys.argv[0] = 'device_check.py'; runpy.run_path('$ROOT/scripts/device_check.py', run_name='__main__')"
step import 60 "$PY" -c "$RUN_PY" import "$PREFIX" "$OUT/import.json" $NEED_CUDA || finish

TESTS=(tests/ops tests/vendored/deep_gemm/test_cuda.py tests/vendored/flash_attn/test_cuda.py
  tests/engine/test_cuda_engine.py tests/entrypoints/test_cuda_serve.py)
step tests 300 "$PY" -m pytest -q -p no:cacheprovider -m cuda -rfEs --junitxml="$OUT/junit.xml" "${TESTS[@]}"

BENCH=(--device cuda --json)
[ "$MODE" = dry ] && BENCH=(--device cuda --dry-run --json)
PYTHONSAFEPATH= step bench_gemm 60 "$PY" scripts/bench_gemm.py "${BENCH[@]}" "$OUT/bench_gemm.json"
PYTHONSAFEPATH= step bench_attention 60 "$PY" scripts/bench_attention.py "${BENCH[@]}" "$OUT/bench_attention.json"
PYTHONSAFEPATH= step bench_ops 60 "$PY" scripts/bench_ops.py "${BENCH[@]}" "$OUT/bench_ops.json"
finish
