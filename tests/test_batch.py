"""Batched speculative decoding is exact row by row.

- Each row is the single-sequence run of its prompt with seed ``seed + row``: same tokens, same
  verdicts, same draft counts, probabilities equal to float32 rounding (padding and batch shapes
  change the last bits of a pass: tolerance 1e-4 absolute). Token ids are compared exactly: a
  flip would need a uniform within about 1e-7 of a boundary, about 1e-4 over this file's draws.
- Greedy rows equal each prompt's own greedy decoding by transformers (or differ first at an
  fp32 near-tie, shown from the logits by ``assert_same_greedy``).
- Chi-square: three prompts of lengths 2, 3 and 5 decoded together, EOS on, each row against the
  exact law of its own prompt at ALPHA = 1e-4 per row (three rows: a false alarm in about 3e-4
  of runs); planted faults must be rejected in at least one row.
"""

from __future__ import annotations

import pytest
import torch

from specviz import Sampling, speculative_generate
from specviz.engine.batch import MAX_BATCH, autoregressive_generate_batch, speculative_generate_batch
from specviz.drafters import Drafter, EarlyExitDrafter, PromptLookupDrafter, Proposal
from specviz.drafters.quantized import QuantizedDrafter
from specviz.engine.chain import autoregressive_generate
from specviz.lab import ALPHA, batch_results, models
from tests.conftest import assert_same_greedy

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 1, 2], [3], [1, 2, 3, 1, 2]]
EOS = 0


def _kind(kind: str, drafter, target):
    if kind == "quantized":
        return QuantizedDrafter(target)
    return {"model": drafter, "ngram": PromptLookupDrafter(max_ngram=2), "early-exit": EarlyExitDrafter(target, 1)}[
        kind
    ]


def _same_run(one, row) -> None:
    assert row.output_ids == one.output_ids and row.stop_reason == one.stop_reason
    assert len(row.rounds) == len(one.rounds)
    for a, b in zip(row.rounds, one.rounds):
        assert [d.token_id for d in a.drafts] == [d.token_id for d in b.drafts]
        assert [d.verdict for d in a.drafts] == [d.verdict for d in b.drafts]
        assert (a.final_kind, a.final_token_id, a.emitted_ids, a.gamma) == (
            b.final_kind,
            b.final_token_id,
            b.emitted_ids,
            b.gamma,
        )
        for x, y in zip(a.drafts, b.drafts):
            assert (x.q, x.p, x.u) == pytest.approx((y.q, y.p, y.u), abs=1e-4)
            assert x.source == y.source


@pytest.mark.parametrize("schedule", ["constant", "heuristic", "confidence"])
@pytest.mark.parametrize("kind", ["model", "ngram", "early-exit", "quantized"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_row_is_its_prompts_own_run(kind, schedule, temperature):
    drafter, target = models("different")
    drafter = _kind(kind, drafter, target)
    sampling = Sampling(temperature, top_k=6 if temperature else 0)
    batch = speculative_generate_batch(
        PROMPTS,
        drafter,
        target,
        gamma=3,
        sampling=sampling,
        max_new_tokens=12,
        seed=5,
        eos_token_id=EOS,
        schedule=schedule,
    )
    for b, prompt in enumerate(PROMPTS):
        one = speculative_generate(
            prompt,
            drafter,
            target,
            gamma=3,
            sampling=sampling,
            max_new_tokens=12,
            seed=5 + b,
            eos_token_id=EOS,
            schedule=schedule,
        )
        _same_run(one, batch.traces[b])
        assert batch.traces[b].settings["batch"] == {"rows": len(PROMPTS), "row": b}


def test_a_batch_of_one_is_speculative_generate():
    drafter, target = models("similar")
    sampling = Sampling(0.8, top_p=0.9)
    for seed in range(4):
        one = speculative_generate([2, 5, 1], drafter, target, gamma=4, sampling=sampling, max_new_tokens=20, seed=seed)
        (row,) = speculative_generate_batch(
            [[2, 5, 1]], drafter, target, gamma=4, sampling=sampling, max_new_tokens=20, seed=seed
        ).traces
        _same_run(one, row)


def test_the_batched_baseline_rows_are_autoregressive_generate():
    _, target = models("different")
    batch = autoregressive_generate_batch(
        PROMPTS, target, sampling=Sampling(1.0), max_new_tokens=10, seed=3, eos_token_id=EOS
    )
    for b, prompt in enumerate(PROMPTS):
        one = autoregressive_generate(
            prompt, target, sampling=Sampling(1.0), max_new_tokens=10, seed=3 + b, eos_token_id=EOS
        )
        assert batch.traces[b].output_ids == one.output_ids
        assert [r.final_prob for r in batch.traces[b].rounds] == pytest.approx(
            [r.final_prob for r in one.rounds], abs=1e-5
        )


def test_rows_finish_on_their_own_and_leave_the_batch():
    drafter, target = models("different")
    budgets = speculative_generate_batch(
        PROMPTS, drafter, target, gamma=3, sampling=Sampling(1.0), max_new_tokens=16, seed=0, eos_token_id=EOS
    )
    lengths = [len(t.output_ids) for t in budgets.traces]
    assert any(t.stop_reason == "eos" for t in budgets.traces), lengths  # EOS is likely among 8 tokens
    rounds = [len(t.rounds) for t in budgets.traces]
    # The batch ran as many rounds as its longest row; each round lists the rows still in it.
    assert len(budgets.rounds) == max(rounds)
    for b in range(len(PROMPTS)):
        assert sum(b in active for active in budgets.rounds) == rounds[b]
    assert budgets.target_passes == len(budgets.rounds) + 1  # one prefill, one verify pass per round
    assert 0 < budgets.padded_positions < budgets.positions


def test_batch_counts_add_up():
    drafter, target = models("similar")
    batch = speculative_generate_batch(
        [[1, 2], [3, 4, 5, 6, 7]], drafter, target, gamma=2, sampling=Sampling(0.0), max_new_tokens=6
    )
    # Prefill: widths 1 and 4 -> 4 columns for 2 rows, 3 of them padding. Each verify pass: the
    # rows in it times (the most drafts of any of them + 1); a row's own drafts + 1 are real.
    nth = [0, 0]
    positions, real = 2 * 4, 2 * 4 - 3
    for active in batch.rounds:
        rounds = [batch.traces[b].rounds[nth[b]] for b in active]
        for b in active:
            nth[b] += 1
        positions += len(active) * (max(len(r.drafts) for r in rounds) + 1)
        real += sum(len(r.drafts) + 1 for r in rounds)
    assert (batch.positions, batch.padded_positions) == (positions, positions - real)
    assert batch.summary()["tokens"] == 12


def test_bad_batches_are_refused():
    drafter, target = models("similar")
    with pytest.raises(ValueError, match="non-empty list"):
        speculative_generate_batch([], drafter, target)
    with pytest.raises(ValueError, match="at most"):
        speculative_generate_batch([[1]] * (MAX_BATCH + 1), drafter, target)
    with pytest.raises(ValueError, match=r"prompts\[1\]: the prompt is empty"):
        speculative_generate_batch([[1], []], drafter, target, max_new_tokens=4)
    with pytest.raises(ValueError, match="gamma schedule"):
        speculative_generate_batch([[1]], drafter, target, max_new_tokens=4, schedule="fastest")
    with pytest.raises(TypeError, match="Drafter or a transformers causal LM"):
        speculative_generate_batch([[1]], object(), target, max_new_tokens=4)


class UniformDrafter(Drafter):
    """A drafter of no model: each draft is drawn from the uniform law over the first ``width``
    tokens, from the run's generator; it counts the rounds it drafted for (state of its own)."""

    kind = "uniform"

    def __init__(self, width: int):
        self.width, self.rounds = width, 0

    def start(self, seq, n, vocab, cached):
        self.rounds = 0

    def propose(self, request):
        self.rounds += 1
        q = torch.zeros(request.gamma, request.vocab, device=request.seq.device)
        q[:, : self.width] = 1.0 / self.width
        drafts = torch.multinomial(q, 1, generator=request.gen)[:, 0]
        request.seq[request.n : request.n + request.gamma] = drafts
        return Proposal(q=q)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_custom_drafter_batches_and_each_row_is_its_own_run(temperature):
    _, target = models("different")
    sampling = Sampling(temperature)
    drafter = UniformDrafter(4)
    batch = speculative_generate_batch(
        PROMPTS,
        drafter,
        target,
        gamma=3,
        sampling=sampling,
        max_new_tokens=12,
        seed=7,
        eos_token_id=EOS,
        schedule="heuristic",
    )
    for b, prompt in enumerate(PROMPTS):
        one = speculative_generate(
            prompt,
            UniformDrafter(4),
            target,
            gamma=3,
            sampling=sampling,
            max_new_tokens=12,
            seed=7 + b,
            eos_token_id=EOS,
            schedule="heuristic",
        )
        _same_run(one, batch.traces[b])
    assert sum(t.drafted for t in batch.traces) > 0 and batch.drafter_passes == 0


@pytest.mark.parametrize("kind", ["model", "ngram"])
def test_greedy_rows_equal_each_prompts_own_greedy_on_the_embedded_pair(embedded, kind):
    texts = [
        "def is_prime(n):",
        "class Stack:\n    def __init__(self):",
        "import os\n\n\ndef read_lines(path):",
        "x = 1\ny = 2\nx = 1\ny =",
    ]
    prompts = [embedded.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    drafter = embedded.drafter if kind == "model" else PromptLookupDrafter()
    batch = speculative_generate_batch(
        prompts,
        drafter,
        embedded.target,
        gamma=4,
        sampling=Sampling(0.0),
        max_new_tokens=40,
        eos_token_id=embedded.eos_token_id,
        tokenizer=embedded.tokenizer,
    )
    for ids, trace in zip(prompts, batch.traces):
        ref = embedded.target.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=40,
            eos_token_id=embedded.eos_token_id,
            pad_token_id=embedded.eos_token_id,
        )
        assert_same_greedy(
            embedded.target, ids, trace.output_ids, ref[0, len(ids) :].tolist(), vocab=embedded.vocab_size
        )
    assert sum(t.drafted for t in batch.traces) > 0


STAT_PROMPTS = [[1, 2, 3], [5, 6], [1, 2, 3, 1, 2]]


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, schedule, sampling",
    [
        ("model", "constant", Sampling(1.0)),
        ("model", "heuristic", Sampling(0.8, top_k=5, top_p=0.9)),
        ("ngram", "constant", Sampling(1.0)),
    ],
)
def test_batched_rows_keep_each_prompts_law(kind, schedule, sampling):
    drafter, target = models("different")
    results = batch_results(
        _kind(kind, drafter, target), target, sampling, 2, runs=1500, prompts=STAT_PROMPTS, eos=EOS, schedule=schedule
    )
    for prompt, result in zip(STAT_PROMPTS, results):
        stat, pvalue = result.test()
        print(
            f"\nbatched {kind}/{schedule} row {prompt}: chi2={stat:.1f} p={pvalue:.3g} "
            f"EOS-first share={result.counts[EOS * 8 + EOS] / result.runs:.3f}"
        )
        assert (result.exact * result.runs >= 5).sum() >= 8
        assert pvalue > ALPHA
    assert any(r.drafted > r.accepted > 0 for r in results)


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault, sampling", [("residual_is_p", Sampling(1.0)), ("drafter_only_filters", Sampling(1.0, top_k=3))]
)
def test_planted_faults_are_caught_in_batches(fault, sampling):
    """Control: the batched harness with a known fault planted must reject."""
    drafter, target = models("different")
    results = batch_results(drafter, target, sampling, 2, runs=1500, prompts=STAT_PROMPTS, eos=EOS, fault=fault)
    pvalues = [r.test()[1] for r in results]
    print(f"\nplanted {fault}, batched: p = {', '.join(f'{p:.3g}' for p in pvalues)}")
    assert min(pvalues) < ALPHA


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_repetition_penalty_gives_each_row_its_own_context(temperature):
    drafter, target = models("different")
    sampling = Sampling(temperature, repetition_penalty=1.8)
    batch = speculative_generate_batch(
        PROMPTS, drafter, target, gamma=3, sampling=sampling, max_new_tokens=12, seed=2, eos_token_id=EOS
    )
    base = autoregressive_generate_batch(
        PROMPTS, target, sampling=sampling, max_new_tokens=12, seed=2, eos_token_id=EOS
    )
    for b, prompt in enumerate(PROMPTS):
        _same_run(
            speculative_generate(
                prompt, drafter, target, gamma=3, sampling=sampling, max_new_tokens=12, seed=2 + b, eos_token_id=EOS
            ),
            batch.traces[b],
        )
        assert (
            base.traces[b].output_ids
            == autoregressive_generate(
                prompt, target, sampling=sampling, max_new_tokens=12, seed=2 + b, eos_token_id=EOS
            ).output_ids
        )


def test_a_batch_checks_every_rows_seed_and_takes_a_schedule_with_its_threshold():
    from specviz.engine.schedules import make_schedule
    from specviz.engine.seeds import SEED_MAX

    drafter, target = models("different")
    with pytest.raises(ValueError, match="seed must be a whole number"):
        speculative_generate_batch([[1], [2]], drafter, target, max_new_tokens=2, seed=SEED_MAX)
    schedule = make_schedule("confidence", 3, 0.99)
    batch = speculative_generate_batch(
        PROMPTS, drafter, target, gamma=3, sampling=Sampling(1.0), max_new_tokens=8, seed=1, schedule=schedule
    )
    for b, prompt in enumerate(PROMPTS):
        assert batch.traces[b].settings["gamma_schedule"] == {"name": "confidence", "gamma": 3, "threshold": 0.99}
        one = speculative_generate(
            prompt,
            drafter,
            target,
            gamma=3,
            sampling=Sampling(1.0),
            max_new_tokens=8,
            seed=1 + b,
            schedule=make_schedule("confidence", 3, 0.99),
        )
        _same_run(one, batch.traces[b])


def test_a_batch_as_steps_yields_after_every_round_and_the_time_between_is_not_its_own(monkeypatch):
    """The steps form (a device step a round on a server) gives the same rows; a consumer that keeps each yield an
    hour (a clock moved on by that much) adds nothing to the batch's wall time (the clock is suspended there:
    ``Clock.hand_over``)."""
    import time

    from specviz.engine import rounds
    from specviz.engine.batch import autoregressive_batch_steps, speculative_batch_steps

    hour_s, moved = 3600.0, [0.0]
    monkeypatch.setattr(rounds.time, "perf_counter", lambda: time.monotonic() + moved[0])
    drafter, target = models("different")
    kw = dict(sampling=Sampling(1.0), max_new_tokens=8, seed=3, eos_token_id=EOS)
    whole = speculative_generate_batch(PROMPTS, drafter, target, gamma=3, **kw)
    for steps in (
        speculative_batch_steps(PROMPTS, drafter, target, gamma=3, **kw),
        autoregressive_batch_steps(PROMPTS, target, **kw),
    ):
        yielded = 0
        while True:
            try:
                assert next(steps) is None
            except StopIteration as end:
                result = end.value
                break
            yielded += 1
            moved[0] += hour_s
        assert yielded == len(result.rounds) > 1
        assert result.total_ms < hour_s * 1000.0  # no hour counted
        if result.drafter_passes:
            assert [t.output_ids for t in result.traces] == [t.output_ids for t in whole.traces]


def test_long_prompts_are_prefilled_in_passes_and_each_row_is_still_its_prompts_own_run(monkeypatch):
    """A batch's prefill feeds at most PREFILL_CHUNK tokens a pass over all rows (64 here, 4 rows: 16 columns), yielding
    between passes; each row is still its prompt's own run, and a runner keeping features (EAGLE) holds every
    column's, as one pass gives them (1e-5: the passes' shapes differ)."""
    from specviz.engine import prefill
    from specviz.engine.batch import speculative_batch_steps
    from specviz.engine.batch_runner import BatchRunner
    from tests.conftest import tiny_lm

    monkeypatch.setattr(prefill, "PREFILL_CHUNK", 64)
    target = tiny_lm(vocab=8, layers=2, seed=3, init=0.3, n_positions=128)
    drafter = tiny_lm(vocab=8, layers=1, seed=5, init=0.5, n_positions=128)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 8, (n,), generator=g).tolist() for n in (40, 25, 3, 33)]
    assert prefill.prefill_ends(39, len(prompts)) == [16, 32, 39]
    kw = dict(sampling=Sampling(1.0), max_new_tokens=8, seed=5)
    steps, yielded = speculative_batch_steps(prompts, drafter, target, gamma=3, **kw), 0
    while True:
        try:
            next(steps)
            yielded += 1
        except StopIteration as end:
            batch = end.value
            break
    assert yielded == len(batch.rounds) + 2  # two pauses in the prefill
    for b, prompt in enumerate(prompts):
        _same_run(speculative_generate(prompt, drafter, target, gamma=3, **{**kw, "seed": 5 + b}), batch.traces[b])
    seqs = [torch.tensor(p) for p in prompts]
    features = []
    for chunk in (64, 10**6):
        monkeypatch.setattr(prefill, "PREFILL_CHUNK", chunk)
        runner = BatchRunner(target, 8, len(prompts), keep_features=True)
        with torch.inference_mode():
            runner.prefill(seqs, [len(p) for p in prompts])
        features.append(runner.features)
    assert features[0].shape == features[1].shape == (4, 40, target.config.n_embd)
    assert torch.allclose(features[0], features[1], atol=1e-5)
