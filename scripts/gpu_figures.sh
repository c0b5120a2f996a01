#!/usr/bin/env bash
# One lent GPU's measurement of the page's GPU engine: every figure the GPU engine is judged by, in one command,
# the most important first, each step bounded so what finishes comes back.
#
#   scripts/gpu_figures.sh prepare          # here, with a package index: the bundle in .carry/1 .. .carry/PARTS,
#                                           # the bulky tracked files moved into .hidden/ so each call carries little
#   scripts/gpu_figures.sh stage K          # on the GPU machine, carrying .carry/K, K = 1 .. PARTS-1, back to back
#   scripts/gpu_figures.sh run              # on the GPU machine, carrying .carry/$PARTS; results to $OUT
#   ONLY="sampled fused" scripts/gpu_figures.sh run   # a later call on the same warm machine, carrying nothing:
#                                           # the steps named (greedy records tests sampled fused), set up again
#   scripts/gpu_figures.sh then CMD...      # a later call: set up again, then any command (a test, a bench)
#   scripts/gpu_common.sh unhide            # here, after the last call: the moved files back in place
#
# What `run` measures (the English pair in bf16, held-out English prompts, 128 tokens, ratios within one run):
#   1. bench greedy, gamma 4, --cache auto (graphs): our plain decoding, speculative, transformers' compiled
#      static-cache generate (its compile run left out of the median, its compile time in warm_up_s), its eager
#      dynamic-cache generate and assisted generation, the step's distance from the bandwidth limit;
#   2. the page's path: `specviz record --device cuda` with the page's defaults on PROMPTS held-out prompts (each
#      recording's speculative and baseline tokens/s);
#   3. the CUDA exactness tests (tests marked cuda);
#   4. bench T 0.7 top-p 0.9, gamma 3, --drafts compare: sampled drafts and argmax drafts in one rotation;
#   5. bench greedy again with --fuse (graphs captured from inductor-compiled passes), if the budget still holds it
#      (BUDGET_S leaves it out unless the steps before ran fast; a second call `run` with ONLY=fused runs it alone).
# Files in $OUT: bench-greedy.json, bench-sampled.json, record-K.json, bench-fused.json, cuda-tests.txt, run.log.
#
# Every setting is here or in scripts/gpu_common.sh; an environment variable of the same name overrides it.
set -euo pipefail

BUDGET_S=${BUDGET_S:-500}           # the whole run; a step is started only with its own limit left
PROMPTS=${PROMPTS:-3}               # recordings of the page's path
BENCH_PROMPTS=${BENCH_PROMPTS:-2}   # bench prompts (3 x 2 repeats outran 240 s on an H200: the slow baselines)
REPEATS=${REPEATS:-2}               # bench repeats per prompt and method
TOKENS=${TOKENS:-128}
DEVICE=${DEVICE:-cuda}              # cpu with SETUP=0: a dry run of `run` on any machine, with small settings
SETUP=${SETUP:-1}                   # 0: the wheels and the target are installed already (a dry run)

# shellcheck source=scripts/gpu_common.sh
. "$(dirname "$(readlink -f "$0")")/gpu_common.sh"  # PARTS, WHEELS, STAGE, PY, SITE; prepare, stage, setup_device

START=$(date +%s)

step() {  # step NAME LIMIT_S COMMAND...: run it under its limit if the budget still holds it
    local name=$1 limit=$2 left
    shift 2
    left=$((BUDGET_S - ($(date +%s) - START)))
    if [ "$left" -lt "$limit" ]; then
        echo "== $name: skipped ($left s left, it may take $limit s)"
        return 0
    fi
    echo "== $name (at most $limit s; $left s left)"
    # a new bash runs it, so the limit reaches this script's functions too (exported below)
    timeout "$limit" bash -c '"$@"' "$name" "$@" || echo "== $name: exit $?"
}

bench() {  # bench NAME ARGS...: the English pair on CUDA, its JSON report to $OUT/NAME.json, its table to the log
    local name=$1
    shift
    "$PY" -m specviz bench --pair english --prompt-set english --device "$DEVICE" --max-new-tokens "$TOKENS" \
        --prompts "$BENCH_PROMPTS" --repeats "$REPEATS" --json "$@" > "${OUT:-.}/$name.json"
    "$PY" - "${OUT:-.}/$name.json" <<'EOF'
import json, sys
from specviz.measure.bench import format_report
print(format_report(json.load(open(sys.argv[1]))))
EOF
}

record() {  # the page's defaults (T 0.7, top-k 40, top-p 0.9, gamma 4) on held-out prompt K
    local k=$1 prompt
    prompt=$("$PY" -c "import json; print(json.load(open('assets/prompts_en.json'))[$k]['prompt'])")
    "$PY" -m specviz record --pair english --device "$DEVICE" --prompt "$prompt" --max-new-tokens "$TOKENS" \
        --out "${OUT:-.}/record-$k.json"
    "$PY" - "${OUT:-.}/record-$k.json" <<'EOF'
import json, sys
rec = json.load(open(sys.argv[1]))
spec, base = rec["speculative"], rec["baseline"]
rate = lambda t: len(t["output_ids"]) / (t["total_ms"] / 1000.0)
print(f"record: speculative {rate(spec):.1f} tokens/s, baseline {rate(base):.1f}, ratio {rate(spec) / rate(base):.2f}x, "
      f"engine {spec['settings'].get('engine')} ({spec['settings'].get('engine_note', '')})")
EOF
}

export -f bench record
export PY OUT DEVICE TOKENS PROMPTS BENCH_PROMPTS REPEATS

STEPS=${ONLY:-"greedy records tests sampled fused"}  # the steps `run` takes, in this order

run() {
    if [ "$SETUP" = 1 ]; then setup_device; fi
    "$PY" -c "import torch, transformers, specviz.measure.bench, specviz.recording; print('torch', torch.__version__, \
'transformers', transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
    local s k
    for s in $STEPS; do
        case $s in
            greedy) step "bench greedy" 270 bench bench-greedy --gamma 4 ;;
            records) for k in $(seq 0 $((PROMPTS - 1))); do step "record $k" 40 record "$k"; done ;;
            tests) step "cuda tests" 150 "$PY" -m pytest -q -n 0 -p no:cacheprovider -m cuda tests/test_graphs.py \
                       tests/test_cuda.py > "${OUT:-.}/cuda-tests.txt" 2>&1
                   tail -3 "${OUT:-.}/cuda-tests.txt" || true ;;
            sampled) step "bench sampled" 200 bench bench-sampled --gamma 3 --temperature 0.7 --top-p 0.9 \
                         --drafts compare ;;
            fused) step "bench greedy, fused graphs" 270 bench bench-fused --gamma 4 --fuse ;;
            *) echo "== $s: no such step (greedy records tests sampled fused)" ;;
        esac
    done
}

case "${1:-}" in
    prepare) prepare ;;
    stage) stage "${2:?stage K}" ;;
    then) shift; setup_device; "$@" ;;
    run) if [ -n "${OUT:-}" ]; then run 2>&1 | tr '\r' '\n' | grep --line-buffered -v 'it/s]\|run/s]\|n/s]' | tee "$OUT/run.log"; else run; fi ;;
    *) sed -n '2,21p' "$0"; exit 2 ;;
esac
