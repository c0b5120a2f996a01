"""Tiny causal LMs built from a config, and the embedded pair, for the tests."""

from __future__ import annotations

import socket

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.set_num_threads(1)  # tiny models: threads only add overhead


def tiny_lm(vocab: int = 16, layers: int = 1, seed: int = 0, n_positions: int = 64, width: int = 16, init: float = 0.02, eos: int = 0):
    """A randomly initialised GPT-2 in eval mode; ``init`` scales the weights (larger: peakier distributions)."""
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab, n_positions=n_positions, n_embd=width, n_layer=layers, n_head=2,
        initializer_range=init, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos,
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


@pytest.fixture(scope="session")
def embedded():
    """The embedded pair from assets/, loaded once on the CPU."""
    from specviz.pair import load_pair

    return load_pair("embedded", device="cpu")


def noisy_copy(model, scale: float, seed: int = 0):
    """A drafter that resembles ``model``: the same weights plus Gaussian noise of std ``scale``."""
    torch.manual_seed(seed)
    copy = type(model)(model.config).eval()
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(torch.randn_like(p) * scale)
    return copy


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
