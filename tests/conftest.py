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


class ConstantLM(GPT2LMHeadModel):
    """A GPT-2 whose logits are the same vector at every position, whatever the context.

    Its cache and positions work as a real model's; only the output is fixed, so a drafter and
    a target of this kind give the same beta = sum_x min(p(x), q(x)) at every position and
    every draft is accepted independently with that probability.
    """

    fixed: torch.Tensor = torch.zeros(1)

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = self.fixed.to(out.logits.dtype).expand_as(out.logits).clone()
        return out


def constant_lm(logits: list[float], seed: int = 0):
    """A ConstantLM over a vocabulary of len(logits) tokens emitting ``logits`` at every position."""
    base = tiny_lm(vocab=len(logits), seed=seed, n_positions=1024)
    model = ConstantLM(base.config).eval()
    model.load_state_dict(base.state_dict())
    model.fixed = torch.tensor(logits, dtype=torch.float32)
    return model


# fp32 logits of one position differ in the last bits with the pass's shape (one token, a
# verify pass over several, a whole re-fed sequence), by CPU and thread count: a few 1e-6
# relative. Two candidates closer than this are a near-tie, where greedy may pick either.
NEAR_TIE = 1e-4


def assert_same_greedy(target, prompt: list[int], got: list[int], want: list[int], vocab: int | None = None) -> None:
    """``got`` equals the greedy decoding ``want``, or the first divergence is an fp32 near-tie.

    At the first position where they differ, the target's own cache-free logits (cut to
    ``vocab`` columns) must rank the two chosen tokens first and second, less than NEAR_TIE
    apart (relative to the larger logit, at least 1): a tie broken differently by another pass
    shape, not a bug. Anything else fails, with the logits in the message.
    """
    if got == want:
        return
    i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    assert i < min(len(got), len(want)), f"one output is a prefix of the other: {got} vs {want}"
    with torch.inference_mode():
        logits = target(torch.tensor([list(prompt) + list(want[:i])])).logits[0, -1].float()
    if vocab is not None:
        logits = logits[:vocab]
    top = logits.topk(2)
    gap = float(top.values[0] - top.values[1])
    scale = max(1.0, abs(float(top.values[0])))
    assert {got[i], want[i]} == set(top.indices.tolist()) and gap < NEAR_TIE * scale, (
        f"greedy outputs diverge at token {i}: {got[i]} vs {want[i]}, top-2 {top.indices.tolist()} "
        f"with logits {top.values.tolist()} (gap {gap:.3g}): not a near-tie"
    )
    print(f"greedy outputs diverge at token {i} on an fp32 near-tie (logit gap {gap:.2g}); equal before it")
