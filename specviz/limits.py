"""Bounds that the engine, the trace and the checks of files from outside share.

Kept apart from ``specviz.trace`` so that its validation (``specviz.trace.validation``) can read them
without importing the trace it validates (the trace imports the validation to load files).
"""

# The largest gamma specviz drafts with (the demo's range is 1..MAX_GAMMA; every gamma schedule
# is capped at it), so a round holds at most this many drafts.
MAX_GAMMA = 16

# The most nodes a token tree may have (a static shape's product sum, a dynamic tree's budget, a
# loaded tree's nodes): bounds a verify pass's width and the work of checking a file.
MAX_TREE_NODES = 128

# The sampling and drafting ranges of every entry point: the page and its API (``specviz.ui.guard.checks``)
# and the command line (``specviz.cli``) refuse the same values with the same words.
GAMMA_RANGE = (1, MAX_GAMMA)
# The smallest temperature above 0, for the engine and the page alike: far below it, logits /
# temperature overflows float32 for ordinary logits, and near it sampling is greedy in all but
# name (use 0 for greedy). ``specviz.engine.sampling`` reads it here.
MIN_TEMPERATURE = 0.01
TEMPERATURE_RANGE = (0.0, 2.0)  # 0 is greedy; otherwise at least MIN_TEMPERATURE
TOP_K_MAX = 1000  # 0 keeps every token
PENALTY_RANGE = (1.0, 2.0)  # transformers' repetition penalty; 1 is off


def sampling_problem(temperature: float, top_k: int, top_p: float, repetition_penalty: float = 1.0,
                     gamma: int | None = None) -> str | None:
    """What is out of range among these settings, in one sentence naming the field; None when all are in range."""
    if not (temperature == 0 or MIN_TEMPERATURE <= temperature <= TEMPERATURE_RANGE[1]):
        return f"temperature must be 0 (greedy) or from {MIN_TEMPERATURE} to {TEMPERATURE_RANGE[1]}."
    if not 0 <= top_k <= TOP_K_MAX:
        return f"top-k must be from 0 (off) to {TOP_K_MAX}."
    if not 0 < top_p <= 1:
        return "top-p must be above 0 and at most 1 (1 is off)."
    if not PENALTY_RANGE[0] <= repetition_penalty <= PENALTY_RANGE[1]:
        return f"repetition penalty must be from {PENALTY_RANGE[0]} (off) to {PENALTY_RANGE[1]}."
    if gamma is not None and not GAMMA_RANGE[0] <= gamma <= GAMMA_RANGE[1]:
        return f"gamma must be from {GAMMA_RANGE[0]} to {GAMMA_RANGE[1]}."
    return None
