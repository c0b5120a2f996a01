"""Routed matrix products on a CPU (specviz.pair.kernels): the same products, chosen per machine, and exact.

The routes sum in different orders, so their products agree with ``torch.nn.functional.linear`` to fp32
rounding (relative 1e-5 here: a sum of 64-1,536 products), not bit for bit. Exactness of speculative
decoding through every route: the chi-square harness of test_exactness (tiny models, the exact two-token
law, ALPHA = 1e-4) with every linear layer forced onto one route, and a planted fault that must be rejected
at the same sample size; and greedy speculative output equal to the same routed target's own greedy decoding.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specviz import Sampling, autoregressive_generate, speculative_generate
from specviz.lab import ALPHA, chi_square, models
from specviz.pair import kernels, precision
from specviz.pair.kernels import ROUTES, choose, unroute


def _routes():
    return [r for r in ROUTES if r != "onednn" or kernels._onednn_available()]


def tiny_llama(seed: int = 0, vocab: int = 64, width: int = 64, layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval().requires_grad_(False)


@pytest.mark.parametrize("route", _routes())
@pytest.mark.parametrize("bias", [False, True])
def test_every_route_computes_the_same_product(route, bias):
    torch.manual_seed(0)
    layer = torch.nn.Linear(96, 200, bias=bias).requires_grad_(False)
    if route == "onednn":
        kernels._pack(layer)
    for rows in (1, 2, 3, 5, 9, 17, 40):
        x = torch.randn(rows, 96)
        got = kernels._run(route, x, layer.weight, getattr(layer, "specviz_packed", None), layer.bias)
        assert got.shape == (rows, 200) and got.is_contiguous()
        torch.testing.assert_close(got, torch.nn.functional.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_a_routed_model_gives_the_same_logits_and_keeps_its_tied_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE_DIR", str(tmp_path))
    model = tiny_llama()
    ids = torch.randint(0, 64, (1, 12))
    with torch.inference_mode():
        want = model(ids).logits
    for route in _routes():
        choose(model, force=route)
        assert model.lm_head.weight is model.model.embed_tokens.weight  # tying survives
        with torch.inference_mode():
            torch.testing.assert_close(model(ids).logits, want, rtol=1e-4, atol=1e-5)
        unroute(model)
    assert not any(hasattr(m, "specviz_choice") for m in model.modules())
    assert "specviz_packed" not in json.dumps(list(model.state_dict()))  # reordered copies are never saved


def test_the_choice_is_timed_once_per_machine_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE_DIR", str(tmp_path))
    calls = []
    real = kernels._time_routes
    monkeypatch.setattr(
        kernels, "_time_routes", lambda layers, routes, repeats: calls.append(len(layers)) or real(layers, routes, 1)
    )
    first = choose(tiny_llama())
    timed = len(calls)
    assert timed >= 1 and first is not None and "per row count" in first.summary
    assert set(first.ratio) == set(kernels.ROWS) and first.ratio[1] == 1.0
    second = choose(tiny_llama(seed=1))  # same shapes, a new process's view: read back, not timed
    assert len(calls) == timed and second.summary.split(":")[0] == first.summary.split(":")[0]
    for m in tiny_llama().modules():
        if isinstance(m, torch.nn.Linear):
            break
    assert json.loads((tmp_path / "cpu_kernels.json").read_text())


def test_a_one_row_product_keeps_transformers_own_unless_another_is_faster():
    n = len(kernels.ROWS)
    ms = {"linear": [1.0] * n, "w_xt": [0.97] * n, "onednn": [2.0] * n}
    assert kernels._pick(ms)[0] == "linear" and kernels._pick(ms)[1:] == ["w_xt"] * (n - 1)
    ms["onednn"] = [0.5] * n
    assert kernels._pick(ms) == ["onednn"] * n


def test_apply_form_routes_the_pairs_of_large_targets_only(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVIZ_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(precision.KERNELS_ENV, raising=False)
    small = precision.apply_form(tiny_llama(), precision.cpu_form(5_000_000))  # a pair whose target is overhead-bound
    assert getattr(small, "specviz_kernels", None) is None and "5.0 M parameters" in small.specviz_form.reason
    routed = precision.apply_form(tiny_llama(), precision.Form(torch.float32, "fp32: test"))  # a large target's pair
    assert routed.specviz_kernels is not None
    monkeypatch.setenv(precision.KERNELS_ENV, "off")
    assert (
        getattr(
            precision.apply_form(tiny_llama(), precision.Form(torch.float32, "fp32: test")), "specviz_kernels", None
        )
        is None
    )
    monkeypatch.setenv(precision.KERNELS_ENV, "on")
    routed = precision.apply_form(tiny_llama(), precision.cpu_form(5_000_000))
    assert routed.specviz_kernels is not None and "; matrix products chosen per row count" in routed.specviz_form.reason
    monkeypatch.setenv(precision.KERNELS_ENV, "bf16")
    with pytest.raises(ValueError, match=precision.KERNELS_ENV):
        precision.apply_form(tiny_llama(), precision.Form(torch.float32, "fp32: test"))


def test_bf16_instructions_torch_does_not_run_at_give_fp32(monkeypatch):
    """ATEN_CPU_CAPABILITY=avx2 on a CPU with AVX-512 BF16 imitates a CPU without bf16 instructions: the
    chooser reads the capability torch runs at, so it chooses what such a CPU would."""
    form = precision.choose_form(
        ["avx512_bf16"], {"fp32": {1: 2.0, 9: 5.0}, "bf16": {1: 1.0, 9: 1.1}}, capability="AVX2"
    )
    assert form.dtype == torch.float32 and "AVX2" in form.reason and "avx512_bf16" in form.reason
    assert (
        precision.choose_form(["avx512_bf16"], {"fp32": {1: 2.0, 9: 5.0}, "bf16": {1: 1.0, 9: 1.1}}, "AVX512").dtype
        == torch.bfloat16
    )
    assert precision.usable_bf16(["bf16"], "SVE256") == ["bf16"]  # Arm's flag stands as reported
    monkeypatch.setattr(precision, "cpu_flags", lambda cpuinfo=None: {"avx512_bf16"})
    monkeypatch.setattr(precision, "torch_capability", lambda: "AVX2")
    monkeypatch.delenv(precision.CPU_DTYPE_ENV, raising=False)
    monkeypatch.setattr(precision, "probe", lambda: pytest.fail("no timing is needed when torch cannot use bf16"))
    precision._auto_cpu_form.cache_clear()
    try:
        assert precision.cpu_form().dtype == torch.float32
    finally:
        precision._auto_cpu_form.cache_clear()


def _routed_pair(kind: str, route: str):
    drafter, target = models(kind)
    for m in {id(drafter): drafter, id(target): target}.values():
        choose(m, force=route)
    return drafter, target


@pytest.mark.slow
@pytest.mark.parametrize("route", _routes())
def test_output_distribution_is_the_targets_through_every_route(route):
    drafter, target = _routed_pair("similar", route)
    stat, pvalue, acceptance = chi_square(drafter, target, Sampling(temperature=1.0), 3)
    print(f"\nroute {route}: chi2={stat:.1f} p={pvalue:.3g} acceptance={acceptance:.3f}")
    assert pvalue > ALPHA


@pytest.mark.slow
def test_a_planted_fault_is_caught_through_a_routed_product():
    drafter, target = _routed_pair("unlike", _routes()[-1])
    stat, pvalue, _ = chi_square(drafter, target, Sampling(temperature=1.0), 1, fault="residual_is_p")
    print(f"\nrouted planted residual_is_p: chi2={stat:.1f} p={pvalue:.3g}")
    assert pvalue < ALPHA


@pytest.mark.parametrize("route", _routes())
def test_greedy_output_equals_the_routed_targets_own_greedy_decoding(route):
    """A Llama target with grouped heads and a tied head, every product on ``route`` (one row and many):
    speculative greedy output, gamma 1..5, equals the same target's own greedy decoding, token for token
    (random weights in fp32 leave no top-2 logits within the routes' rounding of each other here)."""
    target, drafter = tiny_llama(seed=0), tiny_llama(seed=1, layers=1)
    choose(target, force=route)
    choose(drafter, force=route)
    prompt = [3, 17, 5, 40, 22, 9]
    want = autoregressive_generate(
        prompt, target, sampling=Sampling(0.0), max_new_tokens=40, eos_token_id=None
    ).output_ids
    for gamma in range(1, 6):
        got = speculative_generate(
            prompt, drafter, target, gamma=gamma, sampling=Sampling(0.0), max_new_tokens=40, eos_token_id=None
        ).output_ids
        assert got == want, f"gamma {gamma}"
