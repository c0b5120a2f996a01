"""The run's vocabulary: every model's logits cut or padded to the columns the run uses (the target's
and tokenizer's width, ``specviz.engine.rounds.set_up``)."""

from __future__ import annotations

import torch


def widen(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """``logits`` (..., columns) cut or padded to (..., vocab): columns past a narrow output layer
    (a drafter head that scores fewer tokens than the target's vocabulary) get the dtype's lowest
    value, so after softmax their q is exactly 0 (FR-Spec's reading, Zhao et al. 2025)."""
    cols = logits.shape[-1]
    if cols >= vocab:
        return logits[..., :vocab]
    pad = logits.new_full((*logits.shape[:-1], vocab - cols), torch.finfo(logits.dtype).min)
    return torch.cat([logits, pad], dim=-1)
