"""Shared key/value heads in masked CPU passes (specviz.pair.gqa): the same logits as transformers' SDPA
for every masked pass the engines make, through the shared-head kernel, and only where it is meant to run."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from specviz.pair.gqa import NAME, use_shared_kv_heads


def _pair_of_models(kv_heads: int = 2):
    torch.manual_seed(0)
    def cfg():  # one each: switching a model's attention writes to its config
        return LlamaConfig(
            vocab_size=300,
            hidden_size=96,
            intermediate_size=192,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=kv_heads,
            max_position_embeddings=256,
            attn_implementation="sdpa",
        )

    plain = LlamaForCausalLM(cfg()).eval()
    shared = LlamaForCausalLM(cfg()).eval()
    shared.load_state_dict(plain.state_dict())
    return plain, shared


def _masked_passes(model, ids):
    """A verify pass after a cached prefix, a token tree's pass under its own mask, a padded batch."""
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :30], past_key_values=cache, use_cache=True)
        chain = model(input_ids=ids[:, 30:39], past_key_values=cache, use_cache=True).logits
        tree_mask = torch.ones(1, 1, 5, 44, dtype=torch.bool).tril(39)
        tree_mask[0, 0, 3, 40:42] = False  # a node that sees only its own branch
        tree = model(
            input_ids=ids[:, 35:40],
            past_key_values=cache,
            attention_mask=tree_mask,
            position_ids=torch.arange(39, 44)[None],
        ).logits
        pad = torch.ones(2, 20, dtype=torch.long)
        pad[1, :6] = 0
        batch = model(input_ids=torch.cat([ids[:, :20], ids[:, 10:30]]), attention_mask=pad).logits
    return chain, tree, batch


def test_masked_passes_match_transformers_sdpa_through_the_shared_head_kernel(monkeypatch):
    plain, shared = _pair_of_models()
    assert use_shared_kv_heads(shared) and shared.config._attn_implementation == NAME
    assert plain.config._attn_implementation == "sdpa"
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(bool(kwargs.get("enable_gqa")) and kwargs.get("attn_mask") is not None)
        return sdpa(*args, **kwargs)

    ids = torch.randint(0, 300, (1, 44), generator=torch.Generator().manual_seed(1))
    expected = _masked_passes(plain, ids)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    got = _masked_passes(shared, ids)
    assert sum(calls) >= 3 * 2, calls  # every masked pass, in both layers, took the shared-head kernel
    for name, e, g in zip(("chain", "tree", "batch"), expected, got):
        # The same products over the same heads; 1e-5 allows for a CPU kernel that blocks them differently.
        torch.testing.assert_close(g, e, rtol=0, atol=1e-5, msg=name)
        assert torch.equal(g.argmax(-1), e.argmax(-1)), name


@pytest.mark.parametrize("kv_heads", [6])
def test_only_grouped_heads_on_a_cpu_are_switched(kv_heads):
    _, model = _pair_of_models(kv_heads)
    assert not use_shared_kv_heads(model)  # one key/value head per query head: nothing is copied
    assert model.config._attn_implementation == "sdpa"
    _, eager = _pair_of_models()
    eager.set_attn_implementation("eager")
    assert not use_shared_kv_heads(eager)  # another attention chosen on purpose is left alone
