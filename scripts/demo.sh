#!/usr/bin/env bash
# keel's main job, end to end on a fresh machine:
#   build (torch 2.13.0) -> audit gate -> install -> ops + generate (torch 2.13.0)
#                                       \-> torch 2.14.1, same wheel, no rebuild -> ops + generate
#   and checks: op tests pass on 2.14.1, same library bytes, same tokens, the answer names Paris.
source "$(dirname "$0")/env.sh"
A="$KEEL_ROOT/.venv"          # torch 2.13.0 (CPU build): builds and first runs
B="$KEEL_ROOT/.venv-214"      # torch 2.14.1 (CUDA 13.0 build): the upgrade, no rebuild
OUT="$KEEL_ROOT/.cache/demo"
mkdir -p "$OUT"
cd "$KEEL_ROOT"

echo "### 1. build the wheel against torch 2.13.0 (audited: fails on any unstable symbol)"
bash scripts/build_wheel.sh "$A"
WHEEL="$(ls dist/keel-*.whl)"

echo "### 2. install it next to torch 2.13.0 and run"
"$A/bin/python" -m pip install -q --force-reinstall "$WHEEL" "torch==2.13.0"
(cd "$OUT" && "$A/bin/python" "$KEEL_ROOT/scripts/demo_ops.py")
"$A/bin/keel" models fetch-demo
(cd "$OUT" && "$A/bin/python" "$KEEL_ROOT/scripts/demo_generate.py" "$OUT/torch-2.13.json")

echo "### 3. upgrade torch to 2.14.1 (a separate environment), install the SAME wheel, no rebuild"
keel_venv "$B" 2.14.1
"$B/bin/python" -m pip install -q --force-reinstall "$WHEEL" "torch==2.14.1"
(cd "$OUT" && "$B/bin/python" "$KEEL_ROOT/scripts/demo_ops.py")
echo "### 3b. the op test suite against the same wheel on torch 2.14.1"
"$B/bin/python" -m pip install -q pytest
"$B/bin/pytest" -q -p no:cacheprovider tests/ops tests/test_native.py tests/test_wheel_libraries.py | tail -n 1
(cd "$OUT" && "$B/bin/python" "$KEEL_ROOT/scripts/demo_generate.py" "$OUT/torch-2.14.json")

echo "### 4. compare"
"$A/bin/python" - "$OUT/torch-2.13.json" "$OUT/torch-2.14.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
same_libs = a["libraries"]["_C"] == b["libraries"]["_C"]
print(f"_C.abi3.so sha256 torch {a['torch']}: {a['libraries']['_C'][:16]}  torch {b['torch']}: {b['libraries']['_C'][:16]}  same: {same_libs}")
print(f"tokens identical across torch versions: {a['token_ids'] == b['token_ids']} ({sum(map(len, a['token_ids']))} tokens)")
print(f"answer mentions Paris: {'Paris' in a['text']}")
ok = same_libs and a["token_ids"] == b["token_ids"] and "Paris" in a["text"]
print("DEMO PASSED" if ok else "DEMO FAILED")
sys.exit(0 if ok else 1)
PY
