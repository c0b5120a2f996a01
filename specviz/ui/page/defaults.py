"""The page's defaults and its words: the controls' starting values, the menus' choices, the example prompts for
each kind of pair, the introduction and the limits line under the controls.

The caps the controls show and the server enforces are ``specviz.ui.guard.limits``.
"""

from __future__ import annotations

import json

from specviz.drafters import KINDS as DRAFTER_KINDS, LABELS as DRAFTER_LABELS
from specviz.engine.sampling import DEFAULT_SAMPLING
from specviz.engine.schedules import LABELS as SCHEDULE_LABELS, SCHEDULES
from specviz.limits import GAMMA_RANGE
from specviz.pair import ASSETS, CROSS, EMBEDDED, ENGLISH, default_pair
from specviz.pair.memory import default_device
from specviz.ui.guard.limits import (
    CONCURRENCY,
    MAX_NEW_TOKENS_RANGE,
    PROMPT_CHARS_MAX,
    PROMPT_TOKENS_MAX,
    RUN_SECONDS_MAX,
    SWEEP_SECONDS_MAX,
)

# The page's gamma schedule: on a CPU, up to gamma drafts while the path's confidence holds (``PathConfidence``): with
# the English pair in bf16 on a 2-core CPU it ran 1.41-1.54x greedy and 1.30-1.43x at T 0.7 against 1.28-1.36x for a
# constant gamma 4 and 1.25-1.30x for gamma 3 (docs/drafters.md); on an AVX2-only CPU in fp32, level with them
# within that machine's spread (1.25x and 1.28x against 1.33x and 1.35x, docs/benchmarks.md). On a GPU the constant
# gamma: its CUDA graphs draft a round without reading the device between drafts, which a confidence stop must do
# after each, and no GPU has measured the trade.
DEFAULT_SCHEDULE = "path" if default_device().type == "cpu" else "constant"
DEFAULTS = dict(
    gamma=4,
    temperature=DEFAULT_SAMPLING.temperature,
    top_k=DEFAULT_SAMPLING.top_k,
    top_p=DEFAULT_SAMPLING.top_p,
    max_new_tokens=128,
    seed=0,
    drafter_kind="model",
    gamma_schedule=DEFAULT_SCHEDULE,
    repetition_penalty=DEFAULT_SAMPLING.repetition_penalty,
)
# Every kind; a drafter with its own tokenizer needs a pair that brings one (the presets marked own_tokenizer),
# and picking such a pair picks that kind (specviz.ui.page.layout.kind_for_pair).
DRAFTER_CHOICES = [(DRAFTER_LABELS[k], k) for k in DRAFTER_KINDS]
SCHEDULE_CHOICES = [(SCHEDULE_LABELS[k], k) for k in SCHEDULES]
RECORDINGS = ASSETS / "recordings"
# The pair the page starts on: the English pair where it loads offline, else the embedded pair.
DEFAULT_PAIR = default_pair()


def _english_prompts() -> list[str]:
    """The English pair's held-out chat prompts (assets/prompts_en.json; none if it is missing)."""
    try:
        return [p["prompt"] for p in json.loads((ASSETS / "prompts_en.json").read_text())]
    except (OSError, ValueError, KeyError, TypeError):
        return []


ENGLISH_EXAMPLES = _english_prompts()
# Prompts end at a colon, not a newline: the tokenizer merges a newline with the indentation
# that follows, so the models continue best from there.
CODE_EXAMPLES = [
    "def is_prime(n):",
    "class Stack:\n    def __init__(self):",
    "import os\n\n\ndef read_lines(path):",
    "    def __repr__(self):",
    "def parse_args(argv=None):\n    parser = argparse.ArgumentParser(",
]
# The examples shown first, and the first one in the prompt box: the default pair's kind of prompt.
EXAMPLES = ENGLISH_EXAMPLES[:10] if DEFAULT_PAIR == ENGLISH and ENGLISH_EXAMPLES else CODE_EXAMPLES
BATCH_EXAMPLES = EXAMPLES[:5]


def example_kind(pair_name: str | None) -> str:
    """Which example prompts fit a pair: "code" for the embedded pair and the pair whose drafter is its
    code model (``cross``; trained on the Python standard library), "english" for every other preset
    (English chat models), or "code" where no English prompt ships with this copy."""
    return "code" if pair_name in (EMBEDDED, CROSS) or not ENGLISH_EXAMPLES else "english"


GREEDY_NOTE = (
    "0 = greedy. A lesson worth trying: greedy decoding makes SmolLM2-135M-Instruct loop on some prompts "
    "(\"Give me three tips for learning to cook.\" gives \"1. **1011111111...\"); sampling at 0.7 with top-p 0.9 reads "
    "well."
)

INTRO = """\
# specviz — speculative decoding, round by round
A small **drafter** proposes `gamma` tokens; the large **target** scores them all in one forward pass. Each draft x is
accepted when u < min(1, p(x)/q(x)); the first rejected one is replaced by a **correction** sampled from
norm(max(0, p − q)); when every draft is accepted a **bonus** token comes from p. The output is distributed exactly as
the target's own (Leviathan et al. 2023; Chen et al. 2023). Temperature 0 is greedy: the output is the target's greedy
text. The English pair's target is SmolLM2-135M-Instruct; its drafter is a small model distilled from it. The quantized
drafter is the target itself with 8-bit weights: it agrees often but costs most of a target step (compare its c with its
alpha).
"""


def caps(max_queue: int) -> str:
    """The limits line under the controls."""
    return (
        f"<small>Limits here: prompt up to {PROMPT_TOKENS_MAX} tokens ({PROMPT_CHARS_MAX} characters) · gamma "
        f"{GAMMA_RANGE[0]}–{GAMMA_RANGE[1]} · "
        f"up to {MAX_NEW_TOKENS_RANGE[1]} new tokens · {RUN_SECONDS_MAX:.0f} s per run (and as long again for the "
        "baseline) · "
        f"{SWEEP_SECONDS_MAX:.0f} s per sweep · {CONCURRENCY} run{'s' if CONCURRENCY != 1 else ''} at a time "
        "(taking turns on the device), "
        f"up to {max_queue} waiting.</small>"
    )
