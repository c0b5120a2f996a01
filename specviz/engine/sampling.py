"""Sampling settings and the processed distribution both models are sampled from.

The drafter's q and the target's p go through the very same function, so the repetition
penalty, temperature, top-k and top-p are applied identically to both (a fault seen in public
implementations is q from raw logits while the draft was sampled from filtered ones). The
filters are transformers' own logits processors, applied in the order ``generate`` applies
them: the repetition penalty first, then temperature, top-k, top-p.

The repetition penalty depends on the context, so each position is processed with its own:
the prompt, the tokens emitted so far and the drafts before it in the round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, asdict

import torch
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)

from specviz.engine.top_p import CandidateTopP
from specviz.limits import MIN_TEMPERATURE  # the smallest temperature above 0, one constant with the page


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen from a model's logits.

    Attributes:
        temperature: 0 means greedy (the distribution is one-hot at the argmax); otherwise the
            logits are divided by it. Range [0, inf); the demo offers 0-2.
        top_k: keep the k most likely tokens; 0 keeps all.
        top_p: keep the smallest set of most likely tokens whose mass reaches top_p (nucleus);
            1.0 keeps all. Range (0, 1].
        repetition_penalty: transformers' ``repetition_penalty`` (Keskar et al. 2019): the
            logit of every token already in the context is divided by it (multiplied when
            negative); 1.0 is off, above 1 discourages repeats. Range (0, inf).

    Raises:
        ValueError: on construction, for a negative or non-finite temperature, a negative
            top_k, top_p outside (0, 1], or a repetition penalty that is not a finite number > 0.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if (
            not isinstance(self.temperature, (int, float))
            or not math.isfinite(self.temperature)
            or self.temperature < 0
        ):
            raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {self.temperature!r}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            # logits / temperature would overflow float32 and every distribution become NaN
            raise ValueError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be a whole number >= 0 (0 keeps every token), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] (1 keeps every token), got {self.top_p!r}")
        rp = self.repetition_penalty
        if not isinstance(rp, (int, float)) or isinstance(rp, bool) or not math.isfinite(rp) or rp <= 0:
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1 is off), got {rp!r}")

    @property
    def needs_context(self) -> bool:
        """Whether ``probs`` needs each row's context (a repetition penalty is set)."""
        return self.repetition_penalty != 1.0

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
            warpers.append(CandidateTopP(float(self.top_p)))  # transformers' top-p rule without a full sort
        return warpers

    def probs(
        self, logits: torch.Tensor, warpers: LogitsProcessorList | None = None, context: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The processed distribution over the vocabulary.

        Args:
            logits: shape (rows, vocab), any float dtype; each row is one position.
            warpers: ``self.warpers()`` built once by the caller to keep it out of a hot loop.
            context: (rows, length) token ids, each row the context of its position, padded
                with ids >= vocab (see ``contexts``); needed when ``needs_context``.

        Returns:
            float32 probabilities of shape (rows, vocab), each row summing to 1. Greedy gives a
            one-hot row at the argmax (first index on ties, as ``torch.argmax`` and transformers'
            greedy search choose).

        A row of NaN or all -inf logits gives a NaN row, which the engine refuses.

        Raises:
            ValueError: a repetition penalty is set and no context was given.
        """
        logits = logits.float()
        if self.needs_context:
            if context is None:
                raise ValueError("the repetition penalty needs each position's context")
            # transformers' processor maps ids >= vocab to a slot it drops: padding is ignored.
            logits = RepetitionPenaltyLogitsProcessor(float(self.repetition_penalty))(context, logits)
        if self.greedy:
            top = logits.max(dim=-1, keepdim=True)  # first index on ties, like argmax
            out = torch.zeros_like(logits).scatter_(-1, top.indices, 1.0)
            # A row with no finite maximum (NaN or all -inf) becomes NaN, so the engine's
            # finiteness check refuses it instead of emitting an arbitrary token.
            return out.masked_fill_(~torch.isfinite(top.values), float("nan"))
        if warpers is None:
            warpers = self.warpers()
        # Each warper called in turn, as LogitsProcessorList does, without its per-call signature inspection of every
        # processor (most of a tiny model's sampling time); these three take (input_ids, scores) only.
        processed = logits
        for warper in warpers:
            processed = warper(None, processed)
        return torch.softmax(processed, dim=-1)


def contexts(seq: torch.Tensor, ends: list[int] | range, pad: int) -> torch.Tensor:
    """Each position's context for ``Sampling.probs``: row j is ``seq[:ends[j]]``, right-padded with ``pad``.

    Args:
        seq: 1-D LongTensor, the whole sequence so far (prompt, output, this round's drafts).
        ends: the context length of each row (a position's context ends just before it).
        pad: an id outside the vocabulary (the logits' width), which the penalty ignores.

    Returns:
        LongTensor of shape (len(ends), max(ends)) on seq's device.
    """
    ends_t = torch.as_tensor(list(ends), device=seq.device)
    width = int(ends_t.max())
    cols = torch.arange(width, device=seq.device)
    return torch.where(cols[None, :] < ends_t[:, None], seq[None, :width], torch.full_like(cols, pad)[None, :])


# The settings the web page opens with and ``python -m specviz generate`` and ``record`` default to:
# natural-looking text from small models (greedy decoding of the embedded pair falls into loops).
# ``bench`` defaults to greedy instead, the setting its tables compare.
# The page's and generate's defaults: SmolLM2-135M-Instruct loops under greedy decoding on some prompts and reads
# well at temperature 0.7 with top-p 0.9.
DEFAULT_SAMPLING = Sampling(temperature=0.7, top_k=40, top_p=0.9)


def row_contexts(ends: list[tuple[torch.Tensor, int]], pad: int) -> torch.Tensor:
    """One position's context per row of a batch: (seq, end) pairs -> (rows, longest), row i being
    ``seqs[i][:end]`` right-padded with ``pad``, as ``contexts`` gives one row."""
    parts = [contexts(seq, [end], pad)[0] for seq, end in ends]
    return torch.nn.utils.rnn.pad_sequence(parts, batch_first=True, padding_value=pad)
