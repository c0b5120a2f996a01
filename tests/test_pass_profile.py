"""The verify pass's profile: every product and module kind accounted for, the sums consistent, the hooks gone after.

No timing is asserted (times differ by machine and load); only what the profile is made of."""

from __future__ import annotations

import pytest

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

