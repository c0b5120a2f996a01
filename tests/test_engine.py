"""Behaviour of the decoding loops on tiny models built from a config (CPU, fp32)."""

from __future__ import annotations

import json

import pytest
import torch

from specviz import Sampling, autoregressive_generate, speculative_generate, speculative_stream
from specviz.trace import Trace
from tests.conftest import assert_same_greedy, noisy_copy, tiny_lm

PROMPTS = [[3], [5, 7, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
GREEDY = Sampling(temperature=0.0)
SAMPLED = Sampling(temperature=0.8, top_k=8, top_p=0.95)


@pytest.fixture(scope="module")
def pair():
    # A drafter that agrees with the target often but not always: every verdict kind occurs.
    target = tiny_lm(vocab=32, layers=2, seed=2, init=0.3)
    return noisy_copy(target, 0.02, seed=1), target


def hf_greedy(model, prompt, n, eos=None):
    out = model.generate(
        torch.tensor([prompt]), do_sample=False, max_new_tokens=n,
        eos_token_id=eos, pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
    )
    return out[0, len(prompt):].tolist()


def without_timings(d: dict) -> dict:
    d = json.loads(json.dumps(d))
    for key in ("prefill_ms", "total_ms", "tokens_per_second"):
        d.pop(key)
    for r in d["rounds"]:
        for key in ("draft_ms", "verify_ms", "end_ms"):
            r.pop(key)
    return d


@pytest.mark.parametrize("gamma", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_target_greedy(pair, prompt, gamma):
    drafter, target = pair
    trace = speculative_generate(prompt, drafter, target, gamma=gamma, sampling=GREEDY, max_new_tokens=30)
    want = hf_greedy(target, prompt, 30)
    assert_same_greedy(target, prompt, trace.output_ids, want)
    assert_same_greedy(
        target, prompt, autoregressive_generate(prompt, target, sampling=GREEDY, max_new_tokens=30).output_ids, want
    )


def test_every_verdict_kind_occurs(pair):
    drafter, target = pair
    trace = speculative_generate([5, 7, 9], drafter, target, gamma=4, sampling=SAMPLED, max_new_tokens=50, seed=0)
    verdicts = {d.verdict for r in trace.rounds for d in r.drafts}
    kinds = {r.final_kind for r in trace.rounds}
    assert verdicts == {"accepted", "rejected", "discarded"}
    assert {"correction", "bonus"} <= kinds


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_cache_rollback_matches_cache_free_reference(pair, sampling, gamma):
    """With the KV cache and without it (whole sequence re-fed every pass): the same trace.

    The passes differ in shape, so q and p agree to fp32 rounding (compared with a tolerance);
    the verdicts and sampled tokens agree exactly unless a uniform lands within that rounding of
    a decision boundary, about 1e-6 per draw, which these fixed seeds do not meet on any CPU
    seen so far. A divergence would show as a differing u-versus-min(1, p/q) margin below 1e-5.
    """
    drafter, target = pair
    kw = dict(gamma=gamma, sampling=sampling, max_new_tokens=40, seed=7)
    cached = without_timings(speculative_generate([5, 7, 9], drafter, target, **kw).to_dict())
    fresh = without_timings(speculative_generate([5, 7, 9], drafter, target, cached="re-fed", **kw).to_dict())
    assert cached["output_ids"] == fresh["output_ids"]
    for rc, rf in zip(cached["rounds"], fresh["rounds"], strict=True):
        assert [d["token_id"] for d in rc["drafts"]] == [d["token_id"] for d in rf["drafts"]]
        assert [d["verdict"] for d in rc["drafts"]] == [d["verdict"] for d in rf["drafts"]]
        assert [d["u"] for d in rc["drafts"]] == [d["u"] for d in rf["drafts"]]
        assert [d["q"] for d in rc["drafts"]] == pytest.approx([d["q"] for d in rf["drafts"]], abs=1e-5)
        assert [d["p"] for d in rc["drafts"]] == pytest.approx([d["p"] for d in rf["drafts"]], abs=1e-5)
        assert rc["final_token_id"] == rf["final_token_id"]


def test_same_seed_same_trace(pair):
    drafter, target = pair
    a = speculative_generate([5, 7, 9], drafter, target, gamma=4, sampling=SAMPLED, max_new_tokens=40, seed=3)
    b = speculative_generate([5, 7, 9], drafter, target, gamma=4, sampling=SAMPLED, max_new_tokens=40, seed=3)
    c = speculative_generate([5, 7, 9], drafter, target, gamma=4, sampling=SAMPLED, max_new_tokens=40, seed=4)
    assert without_timings(a.to_dict()) == without_timings(b.to_dict())
    assert a.output_ids != c.output_ids


@pytest.mark.parametrize("seed", [0, 5, 2**40 + 3])
def test_a_seed_and_that_seed_plus_2_to_the_32_draw_differently(pair, seed):
    """torch's CPU generator keeps 32 bits of its seed; specviz hashes seeds above 2^32 so all 64 count."""
    drafter, target = pair
    runs = [
        speculative_generate(
            [5, 7, 9], drafter, target, gamma=4, sampling=SAMPLED, max_new_tokens=40, seed=s
        ).output_ids
        for s in (seed, seed + 2**32)
    ]
    assert runs[0] != runs[1]
    base = [
        autoregressive_generate([5, 7, 9], target, sampling=SAMPLED, max_new_tokens=40, seed=s).output_ids
        for s in (seed, seed + 2**32)
    ]
    assert base[0] != base[1]


def test_seeds_below_2_to_the_32_seed_torch_as_they_are_and_the_range_is_checked(pair):
    from specviz.engine.seeds import SEED_MAX, torch_seed

    assert [torch_seed(s) for s in (0, 7, 2**32 - 1)] == [0, 7, 2**32 - 1]  # recorded runs keep their draws
    assert 0 <= torch_seed(SEED_MAX) <= SEED_MAX
    drafter, target = pair
    speculative_generate([5], drafter, target, max_new_tokens=2, seed=SEED_MAX)
    for bad in (-1, SEED_MAX + 1, 1.5, True):
        with pytest.raises(ValueError, match="seed must be a whole number from 0 to"):
            speculative_generate([5], drafter, target, max_new_tokens=2, seed=bad)


def test_the_smallest_temperature_is_one_constant():
    from specviz.engine.sampling import MIN_TEMPERATURE

    assert MIN_TEMPERATURE == 0.01  # the page's slider and the engine's check read this one constant
    Sampling(temperature=MIN_TEMPERATURE)
    with pytest.raises(ValueError, match="at least 0.01"):
        Sampling(temperature=0.005)


def test_drafter_equal_to_target_accepts_everything(pair):
    _, target = pair
    for sampling in (GREEDY, SAMPLED, Sampling(temperature=1.0)):
        trace = speculative_generate([5, 7, 9], target, target, gamma=4, sampling=sampling, max_new_tokens=40, seed=1)
        # q comes from a one-token pass and p from a (gamma + 1)-token pass of the same model: in
        # fp32 they differ in the last bits, by an amount that depends on the CPU's kernels (a
        # min(1, p/q) of 0.99999988 was seen). A draft is then rejected only if u lands within
        # that much of 1: about 1e-7 per draft, so every draft of these few dozen is accepted.
        assert trace.acceptance_rate == 1.0
        assert all(r.final_kind in ("bonus", None) for r in trace.rounds)
        assert all(abs(d.accept_prob - 1.0) < 1e-5 for r in trace.rounds for d in r.drafts)
        assert all(abs(d.beta - 1.0) < 1e-5 for r in trace.rounds for d in r.drafts)
        assert all(0 <= t < 32 for t in trace.output_ids)


@pytest.mark.parametrize("max_new", list(range(1, 14)))
def test_max_new_tokens_is_exact_even_mid_round(pair, max_new):
    drafter, target = pair
    for gamma in (3, 4):
        trace = speculative_generate([5, 7, 9], drafter, target, gamma=gamma, sampling=GREEDY, max_new_tokens=max_new)
        assert len(trace.output_ids) == max_new
        assert trace.output_ids == hf_greedy(target, [5, 7, 9], max_new)
        assert trace.stop_reason == "max_new_tokens"


def test_eos_stops_everywhere_it_can_appear(pair):
    """EOS as an accepted draft, as a correction and as a bonus: output stops right after it."""
    drafter, target = pair
    full = autoregressive_generate([5, 7, 9], target, sampling=GREEDY, max_new_tokens=40).output_ids
    seen_kinds = set()
    for eos in sorted(set(full)):
        expected = full[: full.index(eos) + 1]
        for gamma in (1, 2, 3, 4, 6):
            trace = speculative_generate(
                [5, 7, 9], drafter, target, gamma=gamma, sampling=GREEDY, max_new_tokens=40, eos_token_id=eos
            )
            assert trace.output_ids == expected, (eos, gamma)
            assert trace.output_ids == hf_greedy(target, [5, 7, 9], 40, eos=eos)
            assert trace.stop_reason == "eos"
            last = trace.rounds[-1]
            assert last.emitted_ids[-1] == eos
            if last.final_token_id == eos:
                seen_kinds.add(last.final_kind)
            elif last.drafts and last.drafts[len(last.emitted_ids) - 1].token_id == eos:
                seen_kinds.add("accepted draft")
            # Nothing after EOS, no bonus after an accepted EOS draft.
            assert sum(len(r.emitted_ids) for r in trace.rounds) == len(expected)
    assert {"accepted draft", "correction", "bonus"} <= seen_kinds


def test_eos_in_sampled_runs_is_final(pair):
    drafter, target = pair
    for seed in range(30):
        trace = speculative_generate(
            [5, 7, 9],
            drafter,
            target,
            gamma=4,
            sampling=Sampling(1.0),
            max_new_tokens=40,
            eos_token_id=[3, 4],
            seed=seed,
        )
        ids = trace.output_ids
        stops = [i for i, t in enumerate(ids) if t in (3, 4)]
        if stops:
            assert stops == [len(ids) - 1]
            assert trace.stop_reason == "eos"


def test_one_token_prompt(pair):
    drafter, target = pair
    trace = speculative_generate([4], drafter, target, gamma=3, sampling=GREEDY, max_new_tokens=20)
    assert trace.output_ids == hf_greedy(target, [4], 20)


def test_context_limit_is_a_clear_error(pair):
    drafter, target = pair  # n_positions = 64
    with pytest.raises(ValueError, match="context of 64 tokens"):
        speculative_generate(list(range(1, 30)) * 2, drafter, target, gamma=4, sampling=GREEDY, max_new_tokens=10)
    # Right at the limit it works: the last pass sees exactly 64 positions.
    trace = speculative_generate(list(range(1, 31)) * 2, drafter, target, gamma=4, sampling=GREEDY, max_new_tokens=4)
    assert len(trace.output_ids) == 4


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(input_ids=[]), "prompt is empty"),
        (dict(gamma=0), "gamma must be"),
        (dict(gamma=-2), "gamma must be"),
        (dict(max_new_tokens=0), "max_new_tokens must be"),
        (dict(input_ids=[99]), "outside the vocabulary"),
    ],
)
def test_bad_input_is_a_clear_error(pair, kwargs, message):
    drafter, target = pair
    args = dict(input_ids=[5], drafter=drafter, target=target, gamma=4, sampling=GREEDY, max_new_tokens=5) | kwargs
    with pytest.raises(ValueError, match=message):
        speculative_generate(**args)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(temperature=float("nan")), "temperature"),
    ],
)
def test_bad_sampling_is_a_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sampling(**kwargs)


def test_trace_is_consistent_with_output(pair):
    drafter, target = pair
    trace = speculative_generate([5, 7, 9], drafter, target, gamma=4, sampling=SAMPLED, max_new_tokens=60, seed=11)
    assert [t for r in trace.rounds for t in r.emitted_ids] == trace.output_ids
    for r in trace.rounds:
        accepted = [d.token_id for d in r.drafts if d.accepted]
        verdicts = [d.verdict for d in r.drafts]
        assert verdicts == sorted(verdicts, key=["accepted", "rejected", "discarded"].index)
        assert r.emitted_ids[: len(accepted)] == accepted
        if r.final_token_id is not None:
            assert r.emitted_ids == accepted + [r.final_token_id]
            assert r.final_kind == ("bonus" if len(accepted) == len(r.drafts) else "correction")
        for d in r.drafts:
            assert d.accept_prob == pytest.approx(min(1.0, d.p / d.q))
            assert (d.u < d.accept_prob) == d.accepted or d.verdict == "discarded"
    drafted = sum(len(r.drafts) for r in trace.rounds)
    assert trace.acceptance_rate == sum(r.accepted_count for r in trace.rounds) / drafted
    assert trace.mean_tokens_per_round == len(trace.output_ids) / len(trace.rounds)
    d = json.loads(json.dumps(trace.to_dict()))
    assert d["acceptance_rate"] == trace.acceptance_rate
    assert without_timings(Trace.from_dict(d).to_dict()) == without_timings(d)


def test_stream_yields_every_round(pair):
    drafter, target = pair
    lengths = [
        len(t.rounds)
        for t in speculative_stream([5, 7, 9], drafter, target, gamma=3, sampling=GREEDY, max_new_tokens=20)
    ]
    assert lengths == list(range(1, len(lengths) + 1))


def test_padded_embedding_tables_are_cut_to_the_shared_vocabulary():
    """Same tokenizer, different logit rows (as Qwen2.5-0.5B vs 7B): both cut to the tokenizer size."""
    drafter = tiny_lm(vocab=40, seed=1, init=0.3)
    target = tiny_lm(vocab=48, layers=2, seed=2, init=0.3)
    for sampling in (GREEDY, Sampling(1.0)):
        trace = speculative_generate(
            [5, 7, 9], drafter, target, gamma=4, sampling=sampling, max_new_tokens=40, vocab_size=32, seed=2
        )
        assert all(t < 32 for t in trace.output_ids)
        assert all(d.token_id < 32 for r in trace.rounds for d in r.drafts)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("broken", ["drafter", "target"])
def test_nan_or_all_minus_inf_logits_are_a_clear_error(pair, sampling, broken):
    from tests.conftest import masked_lm

    drafter, target = pair
    dead = masked_lm(list(range(32)), vocab=32, layers=1, seed=3)  # every logit -inf
    models = (dead, target) if broken == "drafter" else (drafter, dead)
    with pytest.raises(ValueError, match="NaN or infinite"):
        speculative_generate([5, 7, 9], *models, gamma=3, sampling=sampling, max_new_tokens=10)
    with pytest.raises(ValueError, match="NaN or infinite"):
        autoregressive_generate([5, 7, 9], dead, sampling=sampling, max_new_tokens=10)
