"""Every drafter kind and gamma schedule is exact: chi-square against the target's enumerated law
with planted-fault controls, and greedy output equal to the target's own greedy decoding.

Significance as in test_exactness: each case at ALPHA = 1e-4 with fixed seeds. Prompt lookup needs
a context that repeats itself to have anything to copy: the statistical cases use the prompt
1 2 3 1 2, whose last bigram recurs, so the first round drafts "3 1 ..." (one-hot q); the
schedules start at gamma 1, so the second token often comes from a second round whose gamma the
schedule chose from the first.
"""

from __future__ import annotations

import pytest
import torch

from specviz import Sampling, speculative_generate
from specviz.drafters import (
    EarlyExitDrafter,
    ModelDrafter,
    PromptLookupDrafter,
    QuantizedDrafter,
    early_exit_model,
    find_continuation,
    make_drafter,
    quantize_target,
)
from specviz.lab import ALPHA, chi_square, models
from specviz.engine.schedules import SCHEDULES, Confidence, Heuristic, Optimal, PathConfidence, make_schedule
from tests.conftest import assert_same_greedy

REPEATING = [1, 2, 3, 1, 2]


# ---- prompt lookup: the search --------------------------------------------------------------

def test_lookup_takes_the_most_recent_match_of_the_longest_ngram():
    #            0  1  2  3  4  5  6  7  8
    history = [5, 6, 7, 1, 5, 6, 9, 2, 5, 6]
    # "5 6" occurs at 0, 4 and 8 (the tail); the latest earlier one is at 4, followed by 9 2 5.
    assert find_continuation(history, 2, 1, 3) == (6, [9, 2, 5])
    # A trigram "2 5 6" has no earlier occurrence; the bigram is used.
    assert find_continuation(history, 3, 1, 3) == (6, [9, 2, 5])
    assert find_continuation([1, 2, 3, 4], 3, 1, 2) is None
    # The continuation may be shorter than gamma near the end.
    assert find_continuation([4, 4], 1, 1, 5) == (1, [4])


def test_lookup_skips_the_ids_it_is_told_never_to_draft():
    """A chat's markers recur every turn, so the lookup copied them as drafts (a struck-through <|im_start|> on the
    page):
    a continuation stops before a skipped id, and a match whose continuation starts with one gives way to an older
    one."""
    #                       0  1  2  3  4  5  6   7  8  9
    assert find_continuation([1, 2, 7, 8, 1, 2, 99, 4, 1, 2], 2, 1, 3, frozenset({99})) == (2, [7, 8, 1])
    assert find_continuation([1, 2, 7, 8, 1, 2, 99, 4, 1, 2], 2, 1, 3) == (6, [99, 4, 1])  # the control: copied
    assert find_continuation([1, 2, 7, 99, 8, 1, 2], 2, 1, 4, frozenset({99})) == (2, [7])  # cut before the marker
    assert find_continuation([1, 2, 99, 3, 1, 2], 2, 1, 3, frozenset({99})) is None  # nothing but the marker to copy
    assert PromptLookupDrafter(skip_ids=[99]).describe()["skipped_special_tokens"] == 1
    assert "skipped_special_tokens" not in PromptLookupDrafter().describe()


def test_lookup_never_drafts_a_special_token_and_greedy_output_stays_the_targets(embedded):
    from specviz.drafters.prompt_lookup import special_ids

    special = special_ids(embedded.tokenizer)
    assert embedded.tokenizer.convert_tokens_to_ids("<|endoftext|>") in special
    # The marker follows every "x = 1" of the prompt: the lookup's first match would copy it.
    ids = embedded.tokenizer("x = 1<|endoftext|>y = 2\nx = 1<|endoftext|>y = 2\nx = 1", add_special_tokens=False)[
        "input_ids"
    ]
    assert any(t in special for t in ids)
    common = dict(
        gamma=4,
        sampling=Sampling(0.0),
        max_new_tokens=24,
        eos_token_id=embedded.eos_token_id,
        tokenizer=embedded.tokenizer,
    )
    plain = speculative_generate(ids, PromptLookupDrafter(), embedded.target, **common)
    # the control: without skipping, it is drafted
    assert any(d.token_id in special for r in plain.rounds for d in r.drafts)
    skipping = speculative_generate(ids, PromptLookupDrafter(tokenizer=embedded.tokenizer), embedded.target, **common)
    assert not any(d.token_id in special for r in skipping.rounds for d in r.drafts)
    ref = embedded.target.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        do_sample=False,
        max_new_tokens=24,
        eos_token_id=embedded.eos_token_id,
        pad_token_id=embedded.eos_token_id,
    )
    assert_same_greedy(
        embedded.target, ids, skipping.output_ids, ref[0, len(ids) :].tolist(), vocab=embedded.vocab_size
    )
    # A frequent ordinary token skipped too: far fewer drafts, the same greedy output.
    newline = embedded.tokenizer("\n", add_special_tokens=False)["input_ids"]
    code = embedded.tokenizer("x = 1\ny = 2\nx = 1\ny = 2\nx = 1\ny =", add_special_tokens=False)["input_ids"]
    both = speculative_generate(
        code, PromptLookupDrafter(skip_ids=newline, tokenizer=embedded.tokenizer), embedded.target, **common
    )
    assert not any(d.token_id in set(newline) | special for r in both.rounds for d in r.drafts)
    ref = embedded.target.generate(
        torch.tensor([code]),
        attention_mask=torch.ones(1, len(code), dtype=torch.long),
        do_sample=False,
        max_new_tokens=24,
        eos_token_id=embedded.eos_token_id,
        pad_token_id=embedded.eos_token_id,
    )
    assert_same_greedy(embedded.target, code, both.output_ids, ref[0, len(code) :].tolist(), vocab=embedded.vocab_size)


def test_a_lookup_tree_never_holds_a_skipped_token():
    from specviz.engine.tree.spec import TreeSpec
    from specviz.engine.tree.loop import tree_generate

    _, target = models("similar")
    history = [1, 2, 3, 1, 2, 5, 1, 2, 3, 1, 2]  # "1 2" is followed by 3 and by 5: two branches

    def nodes(drafter):
        trace = tree_generate(
            history, drafter, target, TreeSpec.static((2, 1, 1)), sampling=Sampling(1.0), max_new_tokens=8, seed=0
        )
        return [n.token_id for r in trace.rounds if r.tree is not None for n in r.tree.nodes]

    assert 3 in nodes(PromptLookupDrafter(2))  # the control: the lookup's tree copies it
    kept = nodes(PromptLookupDrafter(2, skip_ids=[3]))
    assert kept and 3 not in kept


def test_lookup_drafts_are_copies_with_one_hot_q():
    drafter, target = models("similar")
    trace = speculative_generate(
        REPEATING * 2,
        PromptLookupDrafter(max_ngram=2),
        target,
        gamma=4,
        sampling=Sampling(1.0),
        max_new_tokens=16,
        seed=0,
    )
    context = REPEATING * 2 + trace.output_ids
    copied = [d for r in trace.rounds for d in r.drafts]
    assert copied, "a repeating prompt gives prompt lookup something to copy"
    for d in copied:
        assert context[d.source] == d.token_id and d.q == 1.0
        assert d.accept_prob == pytest.approx(min(1.0, d.p))
    assert trace.settings["drafter"] == {"kind": "ngram", "max_ngram": 2, "min_ngram": 1}


def test_lookup_without_a_match_verifies_no_drafts():
    _, target = models("similar")
    trace = speculative_generate(
        [1, 2, 3], PromptLookupDrafter(), target, gamma=4, sampling=Sampling(1.0), max_new_tokens=1, seed=0
    )
    (r,) = trace.rounds
    assert r.drafts == [] and r.final_kind == "target" and len(r.emitted_ids) == 1 and r.gamma == 1


# ---- early exit: a view of the target --------------------------------------------------------


def test_early_exit_shares_the_targets_weights_and_computes_its_first_layers():
    target = models("similar")[1]
    short = early_exit_model(target, 1)
    assert short.transformer.h[0].attn.c_attn.weight.data_ptr() == target.transformer.h[0].attn.c_attn.weight.data_ptr()
    assert len(short.transformer.h) == 1 and len(target.transformer.h) == 2  # the target is left whole
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        hidden = target(ids, output_hidden_states=True).hidden_states[1]
        want = target.lm_head(target.transformer.ln_f(hidden))
        got = short(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # the same fp32 operations in one order
    with pytest.raises(ValueError, match="exit_layer"):
        early_exit_model(target, 2)


def test_make_drafter_kinds():
    drafter, target = models("similar")
    assert isinstance(make_drafter("model", drafter_model=drafter), ModelDrafter)
    assert isinstance(make_drafter("ngram", ngram_max=2), PromptLookupDrafter)
    assert make_drafter("early-exit", target=target).describe() == {"kind": "early-exit", "exit_layer": 1, "layers": 2}
    assert isinstance(make_drafter("quantized", target=target), QuantizedDrafter)
    with pytest.raises(ValueError, match="drafter kind"):
        make_drafter("medusa")
    with pytest.raises(ValueError, match="gamma schedule"):
        make_schedule("fastest", 4)


# ---- the quantized drafter and the small-head drafter: tiny models of their own ------------------------


def outlier_llama(vocab: int = 8, seed: int = 3, outlier: float = 150.0):
    """A tiny Llama (every projection an ``nn.Linear``, as in SmolLM2) whose weight matrices each hold
    one entry ``outlier`` times the largest: per-tensor int8 steps are then coarse, so its int8 copy
    drafts visibly unlike it (beta about 0.82 at 150, 0.97 at 20) and rejections exercise the residual."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        initializer_range=0.15,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight[0, 0] = outlier * module.weight.abs().max()
    return model


def small_head_lm(vocab: int = 8, head: tuple[int, ...] = (0, 1, 3, 4, 6), seed: int = 5):
    """A tiny SmallHeadLM scoring only ``head``: its q is exactly 0 at the other tokens."""
    from specviz.pair.small_head import SmallHeadConfig, SmallHeadLM

    torch.manual_seed(seed)
    config = SmallHeadConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        embedding_size=4,
        head_size=len(head),
        max_position_embeddings=32,
        initializer_range=0.5,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    model = SmallHeadLM(config).eval()
    model.head_ids.copy_(torch.tensor(head))
    return model


def test_quantized_drafter_is_an_int8_copy_sharing_the_targets_other_weights():
    target = outlier_llama()
    short = quantize_target(target)
    assert quantize_target(target) is short  # built once per target
    layer, twin = target.model.layers[0].self_attn.q_proj, short.model.layers[0].self_attn.q_proj
    assert type(layer) is torch.nn.Linear and twin.weight().dtype == torch.qint8  # the target is left fp32
    assert short.model.embed_tokens.weight.data_ptr() == target.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        p, q = (torch.softmax(m(ids).logits[0, -1], -1) for m in (target, short))
    beta = float(torch.minimum(p, q).sum())
    assert 0.7 < beta < 0.95  # close, not equal: the rounding shows
    assert QuantizedDrafter(target).describe()["bits"] == 8


def test_a_bf16_target_is_quantized_from_an_fp32_copy():
    """torch's int8 Linear takes fp32 activations: a bf16 target (the CPU form of specviz.pair.precision)
    gets an fp32 copy with int8 linears, and stays bf16 itself."""
    target = outlier_llama().to(torch.bfloat16)
    short = quantize_target(target)
    assert short.model.layers[0].self_attn.q_proj.weight().dtype == torch.qint8
    assert (
        short.model.embed_tokens.weight.dtype == torch.float32
        and target.model.embed_tokens.weight.dtype == torch.bfloat16
    )
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        p, q = (torch.softmax(m(ids).logits[0, -1].float(), -1) for m in (target, short))
    assert 0.6 < float(torch.minimum(p, q).sum()) < 1.0


def test_the_quantized_kind_is_offered_for_a_cpu_target_in_any_form():
    from specviz.drafters import KINDS, usable_kinds

    target = models("similar")[1]
    # no EAGLE head is trained for the lab's tiny target; a drafter with its own tokenizer drafts as "cross-tokenizer",
    # never as "model" (its ids are not the target's)
    others = tuple(k for k in KINDS if k not in ("eagle", "cross-tokenizer"))
    assert usable_kinds(target) == others and "quantized" in KINDS
    assert usable_kinds(target, cross_tokenizer=True) == (
        *(k for k in others if k not in ("model", "argmax")),
        "cross-tokenizer",
    )
    assert usable_kinds(models("similar")[1].to(torch.bfloat16)) == others


def test_small_head_drafter_never_drafts_outside_its_head():
    target = models("different")[1]
    drafted, emitted = set(), set()
    for seed in range(4):
        trace = speculative_generate(
            [1, 2, 3], small_head_lm(), target, gamma=4, sampling=Sampling(1.0), max_new_tokens=24, seed=seed
        )
        drafted |= {d.token_id for r in trace.rounds for d in r.drafts}
        emitted |= set(trace.output_ids)
    assert drafted and drafted <= {0, 1, 3, 4, 6}
    assert emitted - {0, 1, 3, 4, 6}  # the target's tokens outside the head come from corrections and bonus tokens


SELF_CASES = [
    # (drafter, sampling, gamma): the drafter against its own target, through the same harness
    ("quantized", Sampling(temperature=1.0), 3),
    ("small-head", Sampling(temperature=0.8, top_k=6, top_p=0.9), 2),
]


def _self_pair(name: str):
    if name == "quantized":
        target = outlier_llama()
        return QuantizedDrafter(target), target
    return small_head_lm(), models("different")[1]


@pytest.mark.slow
@pytest.mark.parametrize("name, sampling, gamma", SELF_CASES, ids=[c[0] for c in SELF_CASES])
def test_quantized_and_small_head_drafters_keep_the_targets_law(name, sampling, gamma):
    drafter, target = _self_pair(name)
    stat, pvalue, acceptance = chi_square(drafter, target, sampling, gamma)  # runs_to_catch of the law (was 2,000)
    print(f"\n{name} {sampling} gamma={gamma}: chi2={stat:.1f} p={pvalue:.3g} draft acceptance rate={acceptance}")
    assert acceptance is not None and 0.0 < acceptance < 1.0
    assert pvalue > ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("name, fault", [("quantized", "residual_is_p"), ("small-head", "residual_is_p")])
def test_planted_faults_are_caught_with_the_quantized_and_small_head_drafters(name, fault):
    """Control: the correction drawn from p instead of the residual, planted: rejected. For the small
    head, the residual is where every token outside its head comes from."""
    drafter, target = _self_pair(name)
    # At 2000 runs p was 4e-15 (quantized) and 3e-141 (small head): the small head's fault needs fewer.
    stat, pvalue, _ = chi_square(
        drafter, target, Sampling(temperature=1.0), 3, runs=2000 if name == "quantized" else 500, fault=fault
    )
    print(f"\nplanted {fault} with {name}: chi2={stat:.1f} p={pvalue:.3g}")
    assert pvalue < ALPHA


# ---- schedules ---------------------------------------------------------------------------------


def test_heuristic_schedule_follows_transformers_rule():
    s = Heuristic(4)
    s.observe(4, 4, 4, 1.0, 1.0)
    assert s.next_gamma() == 6
    s.observe(6, 2, 3, 1.0, 1.0)
    assert s.next_gamma() == 5
    for _ in range(10):
        s.observe(s.gamma, 0, 1, 1.0, 1.0)
    assert s.next_gamma() == 1


def test_optimal_schedule_picks_the_predicted_best_gamma():
    s = Optimal(4)
    for _ in range(50):  # alpha about 0.9, a drafter at 5 % of a verify pass
        s.observe(4, 4, 4, 0.2, 1.0)
        s.observe(4, 2, 3, 0.2, 1.0)
    from specviz.theory import optimal_gamma

    assert s.next_gamma() == optimal_gamma((300 + 1) / (350 + 2), 0.05)


def test_confidence_schedule_stops_after_an_unsure_draft():
    drafter, target = models("unlike")
    trace = speculative_generate(
        [1, 2, 3],
        drafter,
        target,
        gamma=8,
        sampling=Sampling(1.0),
        max_new_tokens=24,
        seed=0,
        schedule=Confidence(8, 0.99),
    )
    # A round drafts while the drafted token's q is at least 0.99 and stops after the first draft
    # below it; the unlike drafter is seldom that sure, so most rounds draft one token.
    for r in trace.rounds:
        assert all(d.q >= 0.99 for d in r.drafts[:-1]) and (
            r.drafts[-1].q < 0.99 or len(r.drafts) == 8 or r is trace.rounds[-1]
        )
    assert sum(len(r.drafts) == 1 for r in trace.rounds) >= 0.8 * len(trace.rounds)
    assert trace.settings["gamma_schedule"] == {"name": "confidence", "gamma": 8, "threshold": 0.99}


def test_path_schedule_stops_once_the_product_of_max_q_falls_below_its_threshold():
    s = PathConfidence(8, 0.5)
    q = lambda top: torch.tensor([[top, 1.0 - top]])  # noqa: E731
    assert s.next_gamma() == 8
    assert s.keep_drafting(q(0.9)) and s.keep_drafting(q(0.8))  # path 0.9, then 0.72
    assert not s.keep_drafting(q(0.6))  # 0.432: the draft that crossed is the round's last
    assert s.next_gamma() == 8 and s.keep_drafting(q(0.6))  # a new round's path starts at 1
    # a per-draft threshold would have kept drafting at every one of those
    assert all(Confidence(8, 0.5).keep_drafting(q(x)) for x in (0.9, 0.8, 0.6))
    drafter, target = models("unlike")
    trace = speculative_generate(
        [1, 2, 3], drafter, target, gamma=8, sampling=Sampling(1.0), max_new_tokens=24, seed=0,
        schedule=PathConfidence(8, 0.5),
    )
    lengths = {len(r.drafts) for r in trace.rounds[:-1]}
    assert min(lengths) < 8 and max(lengths) >= 2
    assert trace.settings["gamma_schedule"] == {"name": "path", "gamma": 8, "threshold": 0.5}


def test_thresholds_default_by_schedule_and_are_checked():
    assert make_schedule("path", 4).threshold == 0.3 and make_schedule("confidence", 4).threshold == 0.4
    assert make_schedule("path", 4, 0.25).threshold == 0.25
    with pytest.raises(ValueError, match="confidence threshold"):
        make_schedule("path", 4, 1.0)


# ---- exactness: every kind and schedule --------------------------------------------------------


def _drafter(kind: str, drafter, target):
    return {"model": drafter, "ngram": PromptLookupDrafter(max_ngram=2), "early-exit": EarlyExitDrafter(target, 1)}[
        kind
    ]


CASES = [
    # (kind, schedule, sampling, gamma)
    ("ngram", "constant", Sampling(temperature=1.0), 2),
    ("ngram", "heuristic", Sampling(temperature=0.8, top_k=5, top_p=0.9), 1),
    ("early-exit", "constant", Sampling(temperature=1.0, top_k=5), 3),
    ("early-exit", "confidence", Sampling(temperature=1.0), 3),
    ("model", "heuristic", Sampling(temperature=1.0), 1),
    ("model", "optimal", Sampling(temperature=0.7, top_p=0.9), 1),
    ("model", "confidence", Sampling(temperature=1.0, top_k=6), 3),
    ("model", "path", Sampling(temperature=0.8, top_p=0.9), 4),
]


def _schedule(name: str):
    if name == "path":  # a threshold the models' q often crosses within a round, so rounds of every length occur
        return lambda: PathConfidence(4, 0.3)
    return (lambda: Confidence(3, 0.3)) if name == "confidence" else name


@pytest.mark.slow
@pytest.mark.parametrize("kind, schedule, sampling, gamma", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_every_drafter_and_schedule_keeps_the_targets_law(kind, schedule, sampling, gamma):
    drafter, target = models("different")
    # runs_to_catch (was 2,000)
    stat, pvalue, acceptance = chi_square(
        _drafter(kind, drafter, target), target, sampling, gamma, prompt=REPEATING, schedule=_schedule(schedule)
    )
    print(
        f"\n{kind} {schedule} {sampling} gamma={gamma}: chi2={stat:.1f} p={pvalue:.3g} draft acceptance "
        f"rate={acceptance}"
    )
    assert acceptance is not None and 0.0 < acceptance < 1.0  # drafts were made, and some were rejected
    assert pvalue > ALPHA


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, schedule, fault",
    [
        ("ngram", "constant", "residual_is_p"),
        ("early-exit", "heuristic", "residual_is_p"),
        ("ngram", "heuristic", "drafter_only_filters"),
    ],
)
def test_planted_faults_are_caught_for_every_kind(kind, schedule, fault):
    """Control: the same harness with a known fault planted must reject."""
    drafter, target = models("different")
    sampling = Sampling(temperature=1.0, top_k=3) if fault == "drafter_only_filters" else Sampling(temperature=1.0)
    # 4,000 runs: at 2,000 the early-exit control's power depended on the seed (p 0.003 with one stream)
    stat, pvalue, _ = chi_square(
        _drafter(kind, drafter, target),
        target,
        sampling,
        2,
        runs=4000,
        prompt=REPEATING,
        schedule=schedule,
        fault=fault,
    )
    print(f"\nplanted {fault} with {kind}/{schedule}: chi2={stat:.1f} p={pvalue:.3g}")
    assert pvalue < ALPHA


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("kind", ["model", "ngram", "early-exit", "quantized"])
def test_greedy_equals_the_targets_greedy_for_every_kind_and_schedule(embedded, kind, schedule):
    prompt = (
        "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
        "    def scale(self, k):\n        return Point(self.x * k, self.y * k)\n\n    def shift(self, dx, dy):\n"
    )
    ids = embedded.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    drafter = make_drafter(kind, drafter_model=embedded.drafter, target=embedded.target)
    own = {"confidence": Confidence(6, 0.5), "path": PathConfidence(6, 0.3)}
    sched = own.get(schedule) or make_schedule(schedule, 4)
    trace = speculative_generate(
        ids,
        drafter,
        embedded.target,
        gamma=4,
        sampling=Sampling(0.0),
        max_new_tokens=40,
        eos_token_id=embedded.eos_token_id,
        tokenizer=embedded.tokenizer,
        schedule=sched,
    )
    ref = embedded.target.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        do_sample=False,
        max_new_tokens=40,
        eos_token_id=embedded.eos_token_id,
        pad_token_id=embedded.eos_token_id,
    )
    assert_same_greedy(embedded.target, ids, trace.output_ids, ref[0, len(ids) :].tolist(), vocab=embedded.vocab_size)
    assert trace.drafted > 0
    assert all(r.gamma is not None and len(r.drafts) <= r.gamma for r in trace.rounds)


def test_a_trace_with_every_new_field_round_trips(embedded):
    from specviz.trace import Trace

    ids = embedded.tokenizer("x = 1\ny = 2\nx = 1\ny =", add_special_tokens=False)["input_ids"]
    trace = speculative_generate(
        ids,
        PromptLookupDrafter(),
        embedded.target,
        gamma=4,
        sampling=Sampling(0.0),
        max_new_tokens=16,
        tokenizer=embedded.tokenizer,
        schedule="heuristic",
    )
    back = Trace.from_dict(trace.to_dict())
    assert back == trace
    bad = trace.to_dict()
    r = next(r for r in bad["rounds"] if r["drafts"])
    r["drafts"][0]["source"] = 10_000
    with pytest.raises(ValueError, match="source"):
        Trace.from_dict(bad)


# ---- drafter passes: what c divides by ------------------------------------------------------


def test_drafter_passes_count_forward_passes_not_drafted_tokens():
    from specviz import autoregressive_generate, theory

    drafter, target = models("similar")
    common = dict(gamma=4, sampling=Sampling(1.0), max_new_tokens=16, seed=0)
    lookup = speculative_generate(REPEATING * 2, PromptLookupDrafter(max_ngram=2), target, **common)
    assert lookup.drafted > 0 and lookup.drafter_forward_passes == 0  # copies: no model, no pass
    assert lookup.to_dict()["drafter_forward_passes"] == 0
    assert theory.drafter_step_ms(lookup) is None
    assert (
        theory.cost_coefficient(
            lookup, autoregressive_generate(REPEATING * 2, target, sampling=Sampling(1.0), max_new_tokens=16)
        )
        is None
    )
    model = ModelDrafter(drafter)
    trace = speculative_generate(REPEATING, model, target, **common)
    assert trace.drafter_forward_passes == trace.drafted  # one pass per draft
    # The model drafter's runner counts the passes: the prefill, then one per draft.
    assert model.passes == 1 + trace.drafted
