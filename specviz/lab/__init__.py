"""The exactness lab: speculative decoding's output law measured against the target's, live.

Tiny causal LMs with a vocabulary of 8 (``models``), the exact law of the first two tokens
enumerated from the target's own forward passes and a chi-square test of seeded speculative
samples against it (``experiment``), and faults seen in public implementations, planted one at a
time (``faults``). The test suite's statistical tests use this same code.
"""

from specviz.lab.experiment import (
    ALPHA,
    MIN_EFFECT,
    POWER,
    PROMPT,
    VOCAB,
    Result,
    batch_results,
    chi_square,
    exact_two_token_distribution,
    outcome,
    runs_to_catch,
    stream,
)
from specviz.lab.models import masked_lm, models, noisy_copy, tiny_lm

__all__ = [
    "ALPHA",
    "MIN_EFFECT",
    "POWER",
    "runs_to_catch",
    "PROMPT",
    "VOCAB",
    "Result",
    "batch_results",
    "chi_square",
    "exact_two_token_distribution",
    "masked_lm",
    "models",
    "noisy_copy",
    "outcome",
    "stream",
    "tiny_lm",
]
