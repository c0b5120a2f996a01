#!/usr/bin/env bash
# The prepared recordings in assets/recordings/, recorded again by this build on this machine: each names the
# machine, the build and the engine's version (made_by), which the suite checks against the engine's
# (tests/test_recording_provenance.py). Record on the best machine at hand (a GPU where speculation wins there, else
# a CPU with bf16 instructions, else an AVX2 one), quiet: every recording holds measured times.
#
#   scripts/record_examples.sh                # all of them (about 10 minutes on a 2-core CPU)
#   scripts/record_examples.sh english-page-defaults    # the ones named
#
# Settings of each: below, one line each; DEVICE (default: the record command's own choice) and PY override.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
PY=${PY:-python}
OUT=assets/recordings

rec() {  # rec NAME TITLE PROMPT ARGS...
    local name=$1 title=$2 prompt=$3
    shift 3
    if [ "${#WANTED[@]}" -gt 0 ] && [[ ! " ${WANTED[*]} " =~ " $name " ]]; then return 0; fi
    echo "== $name"
    "$PY" -m specviz record --max-new-tokens 128 --seed 0 ${DEVICE:+--device "$DEVICE"} --title "$title" \
        --prompt "$prompt" --out "$OUT/$name.json" "$@"
}

WANTED=("$@")

rec english-greedy-gamma3-sweep "English pair, greedy, gamma 3, with a gamma sweep: the target's own greedy answer; the drafter's guesses stand on function words and set phrases and fall on content words" \
    "What causes the seasons on Earth?" --pair english --gamma 3 --temperature 0 --top-k 0 --top-p 1 --sweep
rec english-page-defaults "English pair at the page's defaults on a CPU (temperature 0.7, top-k 40, top-p 0.9; up to gamma 4 drafts, each round ending once the path's confidence falls below 0.3); corrections sampled from the residual norm(max(0, p - q))" \
    "Why is the sky blue?" --pair english --gamma 4 --gamma-schedule path --temperature 0.7 --top-k 40 --top-p 0.9
rec english-quantized-gamma4 "Quantized drafter (the target itself with int8 weights), greedy, gamma 4: it agrees with the target far more often than the small drafter, but each draft costs about half a target step (see c): a slowdown on purpose" \
    "Write a Python function that reverses a string." --pair english --drafter-kind quantized --gamma 4 --temperature 0 --top-k 0 --top-p 1
rec greedy-gamma4-sweep "Greedy, gamma 4, with a gamma sweep: the output is the target greedy text; compare alpha with the draft acceptance rate (a slowdown on purpose: the embedded pair is so small that on a CPU a round's fixed costs outweigh what it saves; it shows the mechanics)" \
    "def is_prime(n):" --pair embedded --gamma 4 --temperature 0 --top-k 0 --top-p 1 --sweep
rec sampled-gamma4-sweep "Sampled (temperature 0.7, top-k 40, top-p 0.95), gamma 4, with a gamma sweep: Eq. (1) from alpha against the measured tokens per round (a slowdown on purpose: the embedded pair is so small that on a CPU a round's fixed costs outweigh what it saves; it shows the mechanics)" \
    "$(printf 'class Stack:\n    def __init__(self):')" --pair embedded --gamma 4 --temperature 0.7 --top-k 40 --top-p 0.95 --sweep
rec sampled-gamma8 "Temperature 1, gamma 8: long rounds, many discarded drafts; beta per draft in the replay (a slowdown on purpose: the embedded pair is so small that on a CPU a round's fixed costs outweigh what it saves; it shows the mechanics)" \
    "$(printf 'import os\n\n\ndef read_lines(path):')" --pair embedded --gamma 8 --temperature 1 --top-k 0 --top-p 1
