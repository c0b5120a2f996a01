"""Argmax drafts (``specviz.drafters.argmax``): a drafter proposing its most likely token keeps the target's law.

The same harness as ``tests/test_exactness.py`` (Pearson's chi-square against the enumerated two-token law,
ALPHA = 1e-4 per case, 3,000 seeded runs), with two planted-fault controls at the same sample size: the
correction drawn from p instead of p with the draft removed, and argmax drafts judged with the drafter's soft q
(u < p(d) / q(d) instead of u < p(d)), the fault one would write by switching a drafter to greedy and keeping
its q.
"""

from __future__ import annotations

import pytest
import torch

from specviz import Sampling, speculative_generate, autoregressive_generate
from specviz.drafters import ArgmaxDrafts, ModelDrafter, with_rule
from specviz.drafters.argmax import argmax_request
from specviz.engine.drafter import Proposal
from specviz.engine.sampling import contexts
from specviz.engine.tree.spec import TreeSpec
from specviz.lab import ALPHA, PROMPT, chi_square, models


class SoftQArgmax(ModelDrafter):
    """A planted fault: drafts argmax q but reports the processed soft q, so u < p(d) / q(d) keeps d too often."""

    def propose(self, request):
        r, seq, n = request, request.seq, request.n
        rows = []
        for i in range(r.gamma):
            ctx = contexts(seq, [n + i], r.vocab) if r.sampling.needs_context else None
            q = r.sampling.probs(self.runner.logits(seq, n + i, 1), r.warpers, ctx)
            seq[n + i] = q.argmax(dim=-1)[0]
            rows.append(q)
        return Proposal(q=torch.cat(rows))


CASES = [
    ("similar-t1-gamma3", "similar", Sampling(temperature=1.0), 3),
    ("unlike-t0.7-topk-topp-gamma2", "unlike", Sampling(temperature=0.7, top_k=5, top_p=0.9), 2),
]


@pytest.mark.slow
@pytest.mark.parametrize("kind, sampling, gamma", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_argmax_drafts_keep_the_targets_distribution(kind, sampling, gamma):
    drafter, target = models(kind)
    stat, pvalue, acceptance = chi_square(ArgmaxDrafts(ModelDrafter(drafter)), target, sampling, gamma)
    print(
        f"\nargmax drafts {kind} {sampling} gamma={gamma}: chi2={stat:.1f} p={pvalue:.3g} acceptance={acceptance:.3f}"
    )
    assert pvalue > ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["residual_is_p", "soft_q"])
def test_planted_faults_of_argmax_drafts_are_caught(fault):
    drafter, target = models("similar")
    sampling = Sampling(temperature=1.0)
    if fault == "soft_q":
        stat, pvalue, _ = chi_square(SoftQArgmax(drafter), target, sampling, 3)
    else:
        stat, pvalue, _ = chi_square(ArgmaxDrafts(ModelDrafter(drafter)), target, sampling, 3, fault=fault)
    print(f"\nplanted {fault}: chi2={stat:.1f} p={pvalue:.3g}")
    assert pvalue < ALPHA


def test_an_argmax_draft_has_a_one_hot_q_and_is_accepted_with_probability_p():
    drafter, target = models("similar")
    trace = speculative_generate(
        PROMPT,
        ArgmaxDrafts(ModelDrafter(drafter)),
        target,
        gamma=3,
        sampling=Sampling(temperature=0.8, top_k=6),
        max_new_tokens=24,
        seed=3,
    )
    drafts = [d for r in trace.rounds for d in r.drafts]
    assert drafts and all(d.q == 1.0 and d.accept_prob == pytest.approx(d.p) for d in drafts)
    assert all(d.accepted == (d.u < d.p) for d in drafts if d.verdict != "discarded")
    assert trace.settings["drafter"] == {"kind": "model", "drafts": "argmax"}


def test_the_argmax_request_keeps_the_repetition_penalty_and_drops_the_warpers():
    drafter, target = models("similar")
    inner = ModelDrafter(drafter)
    seen = []
    original = inner.propose
    inner.propose = lambda request: seen.append(request) or original(request)
    speculative_generate(
        PROMPT,
        ArgmaxDrafts(inner),
        target,
        gamma=2,
        max_new_tokens=4,
        seed=0,
        sampling=Sampling(temperature=0.7, top_p=0.8, repetition_penalty=1.3),
    )
    assert seen and all(
        r.sampling == Sampling(temperature=0.0, repetition_penalty=1.3) and len(r.warpers) == 0 for r in seen
    )
    assert argmax_request(seen[0]).sampling == seen[0].sampling


def test_greedy_argmax_drafts_give_the_targets_own_greedy_output():
    drafter, target = models("unlike")
    for seed in range(3):
        spec = speculative_generate(
            PROMPT, ArgmaxDrafts(ModelDrafter(drafter)), target, gamma=4, max_new_tokens=20, seed=seed
        )
        assert spec.output_ids == autoregressive_generate(PROMPT, target, max_new_tokens=20, seed=seed).output_ids


def test_a_batch_of_argmax_drafts_is_each_rows_own_run():
    from specviz.engine.batch import speculative_generate_batch

    drafter, target = models("similar")
    sampling = Sampling(temperature=1.0)
    prompts = [PROMPT, PROMPT[:2]]
    batch = speculative_generate_batch(
        prompts, ArgmaxDrafts(ModelDrafter(drafter)), target, gamma=3, sampling=sampling, max_new_tokens=8, seed=5
    )
    for prompt, seed, trace in zip(prompts, (5, 6), batch.traces):
        alone = speculative_generate(
            prompt, ArgmaxDrafts(ModelDrafter(drafter)), target, gamma=3, sampling=sampling, max_new_tokens=8, seed=seed
        )
        assert trace.output_ids == alone.output_ids


def test_argmax_drafts_refuse_a_tree_and_an_unknown_rule():
    drafter, target = models("similar")
    with pytest.raises(TypeError, match="chains"):
        speculative_generate(
            PROMPT,
            ArgmaxDrafts(ModelDrafter(drafter)),
            target,
            sampling=Sampling(temperature=1.0),
            max_new_tokens=4,
            tree=TreeSpec.static((2, 1)),
        )
    with pytest.raises(ValueError, match="sampled, argmax"):
        with_rule(ModelDrafter(drafter), "top-1")
    wrapped = with_rule(ModelDrafter(drafter), "argmax")
    assert with_rule(wrapped, "argmax") is wrapped


def test_argmax_drafts_answer_every_verb_of_the_interface_themselves():
    """The wrapper delegates completely: every public member of the Drafter interface is its own (a verb added to
    the interface and not to the wrapper would silently fall back to the base class's default, here it fails)."""
    from specviz.engine.drafter import Drafter

    members = {name for name in vars(Drafter) if not name.startswith("_")} - {"empty"}  # a static helper
    per_instance = ("kind", "models", "reads_target_features")  # set in __init__ from the wrapped drafter
    missing = sorted(name for name in members - set(per_instance) if name not in vars(ArgmaxDrafts))
    assert not missing, f"ArgmaxDrafts falls back to Drafter for {missing}"
    drafter, _ = models("similar")
    wrapped = ArgmaxDrafts(ModelDrafter(drafter))
    twin = wrapped.fork()
    assert isinstance(twin, ArgmaxDrafts) and twin.inner is not wrapped.inner and twin.kind == wrapped.kind
    assert wrapped.forced_model is None and not wrapped.drafts_trees


def test_a_tree_from_a_drafter_of_chains_is_refused_by_name_before_the_run():
    from specviz.engine.drafter import UnsupportedDrafting

    drafter, target = models("similar")
    calls = []

    class Counting(ModelDrafter):
        def start(self, *args):
            calls.append("start")
            super().start(*args)

    with pytest.raises(UnsupportedDrafting, match="argmax drafts are offered for chains"):
        speculative_generate(PROMPT, ArgmaxDrafts(Counting(drafter)), target, max_new_tokens=4,
                             tree=TreeSpec.static((2, 1)))
    assert calls == []  # refused before the drafter started
