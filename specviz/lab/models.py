"""Tiny causal LMs built from a config in a second: the lab's and the test suite's drafters and targets."""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def tiny_lm(
    vocab: int = 16,
    layers: int = 1,
    seed: int = 0,
    n_positions: int = 64,
    width: int = 16,
    init: float = 0.02,
    eos: int = 0,
):
    """A randomly initialised GPT-2 in eval mode; ``init`` scales the weights (larger: peakier distributions)."""
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=n_positions,
        n_embd=width,
        n_layer=layers,
        n_head=2,
        initializer_range=init,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    return GPT2LMHeadModel(config).eval()


class MaskedLM(GPT2LMHeadModel):
    """A GPT-2 whose logits are -inf at ``banned`` tokens: its distribution has exact zeros there."""

    banned: list[int] = []

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits[..., self.banned] = float("-inf")
        return out


def masked_lm(banned: list[int], **kwargs):
    base = tiny_lm(**kwargs)
    model = MaskedLM(base.config).eval()
    model.load_state_dict(base.state_dict())
    model.banned = list(banned)
    return model


def noisy_copy(model, scale: float, seed: int = 0):
    """A drafter that resembles ``model``: the same weights plus Gaussian noise of std ``scale``."""
    torch.manual_seed(seed)
    copy = type(model)(model.config).eval()
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(torch.randn_like(p) * scale)
    return copy


# The lab's pairs: (description, builder); vocabulary 8, target 2 layers.
KINDS = {
    "similar": "a drafter close to the target (its weights plus noise): acceptance about 0.9",
    "different": "a smaller drafter of its own: acceptance about 0.6",
    "unlike": "a drafter unlike the target: acceptance under 0.5",
    "identical": "the target drafting for itself: every draft accepted",
    "drafter_zeros": "a drafter that never proposes two tokens the target likes",
    "target_zeros": "a target that gives two of the drafter's tokens probability 0",
}


def models(kind: str, init: float = 0.1, vocab: int = 8, dtype: torch.dtype = torch.float32):
    """(drafter, target) of one of KINDS, both cast to ``dtype`` (the form a pair runs in on this
    machine, ``specviz.pair.precision``); ``init`` scales the target's weights (0.1: spread-out distributions).

    Raises:
        KeyError: an unknown kind.
    """
    drafter, target = _models(kind, init, vocab)
    if dtype != torch.float32:
        drafter, target = drafter.to(dtype), target.to(dtype)  # the same object twice for "identical"
    return drafter, target


def _models(kind: str, init: float, vocab: int):
    target = tiny_lm(vocab=vocab, layers=2, seed=3, init=init, n_positions=32)
    if kind == "similar":
        return noisy_copy(target, 0.03, seed=4), target
    if kind == "unlike":
        return tiny_lm(vocab=vocab, layers=1, seed=6, init=1.0, n_positions=32), target
    if kind == "different":
        return tiny_lm(vocab=vocab, layers=1, seed=5, init=0.5, n_positions=32), target
    if kind == "identical":
        return target, target
    if kind == "drafter_zeros":
        return masked_lm([2, 5], vocab=vocab, layers=1, seed=5, init=0.3, n_positions=32), target
    if kind == "target_zeros":
        target = masked_lm([1, 6], vocab=vocab, layers=2, seed=3, init=init, n_positions=32)
        return tiny_lm(vocab=vocab, layers=1, seed=5, init=0.3, n_positions=32), target
    raise KeyError(kind)
