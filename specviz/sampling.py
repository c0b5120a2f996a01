"""Sampling settings and the processed distribution both models are sampled from.

The drafter's q and the target's p go through the very same function, so temperature,
top-k and top-p are applied identically to both (a fault seen in public implementations is
q from raw logits while the draft was sampled from filtered ones). The filters are
transformers' own logits warpers, applied in the order ``generate`` applies them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, asdict

import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen from a model's logits.

    Attributes:
        temperature: 0 means greedy (the distribution is one-hot at the argmax); otherwise the
            logits are divided by it. Range [0, inf); the demo offers 0-2.
        top_k: keep the k most likely tokens; 0 keeps all.
        top_p: keep the smallest set of most likely tokens whose mass reaches top_p (nucleus);
            1.0 keeps all. Range (0, 1].

    Raises:
        ValueError: on construction, for a negative or non-finite temperature, a negative
            top_k, or top_p outside (0, 1].
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be a whole number >= 0 (0 keeps every token), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] (1 keeps every token), got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict:
        return asdict(self)

    def warpers(self) -> LogitsProcessorList:
        """transformers' warpers for these settings, in ``generate``'s order: temperature, top-k, top-p."""
        warpers = LogitsProcessorList()
        if not self.greedy and self.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(float(self.temperature)))
        if self.top_k > 0:
            warpers.append(TopKLogitsWarper(self.top_k))
        if self.top_p < 1.0:
            warpers.append(TopPLogitsWarper(float(self.top_p)))
        return warpers

    def probs(self, logits: torch.Tensor, warpers: LogitsProcessorList | None = None) -> torch.Tensor:
        """The processed distribution over the vocabulary.

        Args:
            logits: shape (rows, vocab), any float dtype; each row is one position.
            warpers: ``self.warpers()`` built once by the caller to keep it out of a hot loop.

        Returns:
            float32 probabilities of shape (rows, vocab), each row summing to 1. Greedy gives a
            one-hot row at the argmax (first index on ties, as ``torch.argmax`` and transformers'
            greedy search choose).

        A row of NaN or all -inf logits gives a NaN row, which the engine refuses.
        """
        logits = logits.float()
        if self.greedy:
            top = logits.max(dim=-1, keepdim=True)  # first index on ties, like argmax
            out = torch.zeros_like(logits).scatter_(-1, top.indices, 1.0)
            # A row with no finite maximum (NaN or all -inf) becomes NaN, so the engine's
            # finiteness check refuses it instead of emitting an arbitrary token.
            return torch.where(torch.isfinite(top.values), out, torch.full_like(out, float("nan")))
        if warpers is None:
            warpers = self.warpers()
        # The warpers ignore input_ids for these three filters.
        processed = warpers(None, logits) if len(warpers) else logits
        return torch.softmax(processed, dim=-1)


# The settings the web page opens with and ``python -m specviz generate`` and ``record`` default to:
# natural-looking text from small models (greedy decoding of the embedded pair falls into loops).
# ``bench`` defaults to greedy instead, the setting its tables compare.
DEFAULT_SAMPLING = Sampling(temperature=0.7, top_k=40, top_p=0.95)
