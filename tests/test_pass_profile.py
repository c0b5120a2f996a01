"""The verify pass's profile: every product and module kind accounted for, the sums consistent, the hooks gone after.

No timing is asserted (times differ by machine and load); only what the profile is made of."""

from __future__ import annotations

import pytest
import torch

from specviz.lab import models
from specviz.measure.pass_profile import CORE, NORMS, REST, format_profile, profile_pass


def _product_names(model) -> set[str]:
    from specviz.measure.pass_profile import PRODUCTS

    return {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, PRODUCTS)}


@pytest.mark.parametrize("which", ["tiny llama", "embedded gpt-2"])
def test_a_profile_names_every_product_and_sums_to_its_calls(which, embedded):
    model = models("similar")[1] if which == "tiny llama" else embedded.target
    vocab = 8 if which == "tiny llama" else embedded.vocab_size
    p = profile_pass(model, vocab, rows=3, context=6, repeats=2)
    kinds = _product_names(model) | {CORE, NORMS, REST}
    assert set(p.one) == set(p.many) == kinds
    assert all(p.one[k] >= 0 and p.many[k] >= 0 for k in kinds - {REST})
    assert p.step_ms > 0 and p.pass_ms > 0 and p.v == pytest.approx(p.pass_ms / p.step_ms)
    rows = p.rows_table()
    assert [r[0] for r in rows] == list(p.one) and all(r[4] == pytest.approx(r[2] - r[1]) for r in rows)
    text = "\n".join(format_profile(p))
    assert "v(3)" in text and "all products" in text and CORE in text
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())  # hooks removed


def test_a_profile_refuses_a_one_row_pass_and_no_repeats():
    _, target = models("similar")
    with pytest.raises(ValueError, match="rows must be at least 2"):
        profile_pass(target, 8, rows=1)
    with pytest.raises(ValueError, match="repeats"):
        profile_pass(target, 8, rows=2, repeats=0)


class _Clock:
    """A clock that moves only when a toy module says it worked: each kind's time is then known exactly."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _toy_model(clock: _Clock, vocab: int = 8, width: int = 4):
    """A causal LM in the shape ``ModelRunner`` calls: a norm (1 ms a call), an attention module (3 ms of its own)
    holding q_proj (2 ms a row), an up_proj (1 ms a row), the model's own work 0.5 ms a call."""
    from types import SimpleNamespace

    class Timed(torch.nn.Linear):
        def __init__(self, ms_per_row: float):
            super().__init__(width, width, bias=False)
            self.ms_per_row = ms_per_row

        def forward(self, x):
            clock.now += self.ms_per_row * x.shape[-2] / 1000
            return super().forward(x)

    class ToyNorm(torch.nn.Module):
        def forward(self, x):
            clock.now += 0.001
            return x

    class ToyAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = Timed(2.0)

        def forward(self, x):
            clock.now += 0.003
            return self.q_proj(x)

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, width)
            self.norm, self.self_attn, self.up_proj = ToyNorm(), ToyAttention(), Timed(1.0)
            self.head = torch.nn.Linear(width, vocab, bias=False)  # not timed by the toy: its clock stays

        def forward(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep=0, **kwargs):
            clock.now += 0.0005
            h = self.up_proj(self.self_attn(self.norm(self.embed(input_ids))))
            return SimpleNamespace(logits=self.head(h))

    return Toy().eval()


def test_each_kind_gets_exactly_its_own_time_and_the_attention_core_excludes_its_products(monkeypatch):
    from specviz.measure import pass_profile

    clock = _Clock()
    monkeypatch.setattr(pass_profile.time, "perf_counter", clock)
    p = profile_pass(_toy_model(clock), 8, rows=3, context=4, repeats=2)
    assert p.one == pytest.approx({"q_proj": 2.0, "up_proj": 1.0, "head": 0.0, CORE: 3.0, NORMS: 1.0, REST: 0.5})
    assert p.many == pytest.approx({"q_proj": 6.0, "up_proj": 3.0, "head": 0.0, CORE: 3.0, NORMS: 1.0, REST: 0.5})
    assert (p.step_ms, p.pass_ms) == pytest.approx((7.5, 13.5))
