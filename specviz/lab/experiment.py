"""The first two tokens of seeded speculative runs against the target's exact law: Pearson's chi-square.

For a vocabulary of 8 the exact probability of every two-token continuation of PROMPT under the
target's processed distribution is enumerated from the target's own forward passes, through the
engine's ``Sampling.probs`` (the test suite checks this law against one written independently,
and tests tokens 1..3 over several rounds: tests/test_exactness_reference.py). Seeded
speculative runs are counted per cell; cells with an expected count under 5 are pooled into one
(Cochran's rule), and the counts are compared with the law by a chi-square test. Under exactness
the p-value is uniform on [0, 1]: a correct engine fails at significance ALPHA = 1e-4 once in
10,000 experiments; a fault that shifts the law fails once the sample is large enough.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from specviz import metrics
from specviz.engine.chain import speculative_stream
from specviz.lab.faults import fault_steps
from specviz.lab.tree_faults import tree_fault
from specviz.engine.tree.accept import NO_FAULT
from specviz.engine.tree.loop import tree_generate
from specviz.engine.sampling import Sampling
from specviz.engine.stopping import StopCheck, asked
from specviz.records.lab import ALPHA, VOCAB, Result  # the experiment's record lives with the trace (the views read it)

PROMPT = [1, 2, 3]
# The test's size, from the effect it must catch: a wrong law at Cohen's w >= MIN_EFFECT from the target's
# (w = sqrt(sum_x (p1(x) - p0(x))^2 / p0(x)); Cohen 1988, ch. 7) is rejected with probability >= POWER at ALPHA
# (``runs_to_catch``). The planted faults of the suite move the two-token law by w 0.34 and more (raw_q, the weakest:
# chi-square 382.5 over 3,000 runs), so they are caught at this size with room to spare; a wrong law nearer than 0.25
# to the target's may pass one experiment, and is what a larger lab run (the page's samples) is for.
MIN_EFFECT = 0.25
POWER = 0.99


def exact_two_token_distribution(target, sampling: Sampling, prompt: list[int] = PROMPT, vocab: int = VOCAB,
                                  eos: int | None = None) -> np.ndarray:
    """P(x1, x2 | prompt) = p(x1 | prompt) p(x2 | prompt, x1) under the processed p; shape (vocab, vocab), float64.

    With ``eos``, a run whose first token is EOS stops there: its outcome is the cell (eos, eos),
    which holds P(x1 = eos), and the rest of that row is 0 (see ``outcome``).
    """
    with torch.inference_mode():
        ctx1 = torch.tensor([prompt])
        p1 = sampling.probs(target(ctx1).logits[0, -1:, :vocab], sampling.warpers(), ctx1)[0]
        batch = torch.tensor([list(prompt) + [x] for x in range(vocab)])
        p2 = sampling.probs(target(batch).logits[:, -1, :vocab], sampling.warpers(), batch)
    law = (p1[:, None] * p2).double().numpy()
    if eos is not None:
        law[eos, :] = 0.0
        law[eos, eos] = float(p1[eos])
    return law


def vocab_of(target) -> int:
    """The vocabulary an experiment counts over: the target's (the lab's own models have VOCAB = 8)."""
    return int(getattr(getattr(target, "config", None), "vocab_size", VOCAB))


def outcome(output_ids: list[int], eos: int | None = None, vocab: int = VOCAB) -> int:
    """The cell of a run's first two tokens (a run stopped by EOS at its first token: (eos, eos))."""
    x1 = output_ids[0]
    x2 = eos if eos is not None and x1 == eos else output_ids[1]
    return x1 * vocab + x2


def counted_rounds(rounds: Iterator):
    """The trace of a speculative stream (one growing Trace per round) once it holds the two tokens an experiment
    counts, or once it has ended; the stream is closed there.

    The rounds after the one that emitted the second token cannot change the first two, so the counted outcome of a
    seeded run is the same as its whole run's, at a fraction of the passes when drafts are rejected early (gamma 8,
    unlike models: 22 against 49 ms a run). Its ``accepted`` and ``drafted`` are those of the rounds run.
    """
    trace = None
    try:
        for trace in rounds:
            if len(trace.output_ids) >= 2:
                break
    finally:
        rounds.close()
    return trace


def stream(drafter, target, sampling: Sampling, gamma: int, runs: int, every: int = 250, first_seed: int = 0,
           prompt: list[int] = PROMPT, schedule="constant", tree=None, fault: str = "none",
           stop: StopCheck | None = None) -> Iterator[Result]:
    """Run ``runs`` seeded speculative generations of gamma + 1 tokens (so the first round drafts
    all gamma), each until it holds the two counted tokens (``counted_rounds``), and yield the growing
    Result every ``every`` runs and at the end.

    ``stop`` (``specviz.engine.stopping``) is asked before every run: when it answers True the
    experiment yields the runs done so far (if any since the last yield) once more and ends.

    ``drafter`` is a causal LM or a ``specviz.drafters.Drafter``; ``schedule`` a schedule name or a
    function returning a fresh GammaSchedule (each run starts its own); ``prompt`` the context
    whose two-token continuations are counted (prompt lookup needs one that repeats itself);
    ``tree`` a ``specviz.engine.tree.spec.TreeSpec`` drafts token trees (gamma is then ignored and each
    run generates two tokens, the first round's tree cut to depth 2); ``fault`` a name of
    ``specviz.lab.faults.FAULTS`` (chains) or ``specviz.lab.tree_faults.TREE_FAULTS`` (trees),
    passed to these runs only.

    Raises:
        KeyError: an unknown fault.
    """
    vocab = vocab_of(target)
    exact = exact_two_token_distribution(target, sampling, prompt, vocab=vocab).ravel()
    result = Result(counts=np.zeros(vocab * vocab), exact=exact, runs=0)
    steps = fault_steps(fault) if tree is None else None
    broken = NO_FAULT if tree is None or fault == "none" else tree_fault(fault)

    def run(seed: int):
        if tree is not None:
            return tree_generate(
                prompt, drafter, target, tree, sampling=sampling, max_new_tokens=2, seed=seed, fault=broken
            )
        return counted_rounds(
            speculative_stream(
                prompt,
                drafter,
                target,
                gamma=gamma,
                sampling=sampling,
                max_new_tokens=gamma + 1,
                seed=seed,
                schedule=schedule if isinstance(schedule, str) else schedule(),
                steps=steps,
            )
        )

    for seed in range(first_seed, first_seed + runs):
        if asked(stop):
            if result.runs % every:  # runs since the last yield
                yield result
            return
        trace = run(seed)
        result.counts[outcome(trace.output_ids, vocab=vocab)] += 1
        result.runs += 1
        result.accepted += trace.accepted
        result.drafted += trace.drafted
        if result.runs % every == 0 or result.runs == runs:
            yield result


def runs_to_catch(
    exact: np.ndarray, effect: float = MIN_EFFECT, alpha: float = ALPHA, power: float = POWER, at_most: int = 20_000
) -> int:
    """The fewest runs (a multiple of 100, at most ``at_most``) at which the chi-square test of ``exact`` (the law, any
    shape, summing to 1) rejects, with probability ``power`` at significance ``alpha``, a law at Cohen's w = ``effect``
    from it.

    Under such a law Pearson's statistic over n runs is about noncentral chi-square with noncentrality n w^2 (Cohen
    1988, Sec. 7.2) and the test's degrees of freedom: the cells expected at 5 or more at n, and the pooled rest as one
    (``Result.test``), less one. The power is that distribution's mass above the central one's 1 - ``alpha`` quantile.
    """
    from scipy.stats import chi2, ncx2

    p = np.asarray(exact, dtype=float).ravel()
    for n in range(100, at_most + 1, 100):
        big = p * n >= 5
        df = max(1, int(big.sum()) + int(p[~big].sum() > 0) - 1)
        if ncx2.sf(chi2.isf(alpha, df), df, n * effect**2) >= power:
            return n
    return at_most


def chi_square(
    drafter,
    target,
    sampling: Sampling,
    gamma: int,
    runs: int | None = None,
    prompt: list[int] = PROMPT,
    schedule="constant",
    tree=None,
    fault: str = "none",
):
    """(statistic, p-value, draft acceptance rate) of ``runs`` speculative runs against the exact law
    (``prompt``, ``schedule``, ``tree`` and ``fault`` as in ``stream``); ``runs`` None: ``runs_to_catch`` of that law
    (a wrong law at Cohen's w MIN_EFFECT rejected with probability POWER at ALPHA).

    Raises:
        AssertionError: the law leaves fewer than 8 testable cells (the test would lack power).
    """
    if runs is None:
        runs = runs_to_catch(exact_two_token_distribution(target, sampling, prompt, vocab=vocab_of(target)))
    result = None
    for result in stream(
        drafter, target, sampling, gamma, runs, every=runs, prompt=prompt, schedule=schedule, tree=tree, fault=fault
    ):
        pass
    assert (result.exact * runs >= 5).sum() >= 8, "a near-deterministic target leaves the test without power"
    stat, pvalue = result.test()
    return stat, pvalue, metrics.draft_acceptance_rate(result.accepted, result.drafted)


def batch_results(
    drafter,
    target,
    sampling: Sampling,
    gamma: int,
    runs: int,
    prompts: list[list[int]],
    eos: int | None = None,
    schedule: str = "constant",
    fault: str = "none",
) -> list[Result]:
    """One Result per prompt from ``runs`` batches of all ``prompts`` decoded together by
    ``specviz.engine.batch.speculative_generate_batch`` (gamma + 1 tokens each, batch s seeded
    s * len(prompts), so no two rows anywhere share a seed).

    Each row is counted against the exact law of its own prompt; with ``eos``, rows whose first
    token is EOS stop and leave the batch while the others go on (``outcome``); ``fault`` as in
    ``stream`` (chains).
    """
    from specviz.engine.batch import speculative_generate_batch

    vocab = vocab_of(target)
    results = [
        Result(
            counts=np.zeros(vocab * vocab),
            exact=exact_two_token_distribution(target, sampling, p, vocab, eos).ravel(),
            runs=0,
        )
        for p in prompts
    ]
    for s in range(runs):
        batch = speculative_generate_batch(
            prompts,
            drafter,
            target,
            gamma=gamma,
            sampling=sampling,
            max_new_tokens=gamma + 1,
            eos_token_id=eos,
            seed=s * len(prompts),
            schedule=schedule,
            steps=fault_steps(fault),
        )
        for result, trace in zip(results, batch.traces):
            result.counts[outcome(trace.output_ids, eos, vocab)] += 1
            result.runs += 1
            result.accepted += trace.accepted
            result.drafted += trace.drafted
    return results
