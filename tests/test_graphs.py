"""CUDA graphs over the static KV cache (specviz.engine.graphs), and the round's device-side timing.

The graphed tests are marked ``cuda`` and skipped without a GPU (python -m pytest -n 0 -m cuda
tests/test_graphs.py); the CPU tests below them check what runs everywhere (the clock's marks, the
refusal off CUDA).

Tolerances: on CUDA a graph replays the same kernels as the eager pass it was captured from, but over
a padded bucket (b >= n rows), so matrix products may pick other kernels and differ in the last bits:
logits are compared at 1e-3 absolute in fp32 (tiny models, logits of order 1), token ids exactly
(greedy away from near-ties: the tiny models' top two logits are checked to differ by more).
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch

from specviz import Sampling, autoregressive_generate, speculative_generate, speculative_stream
from specviz.engine.cache import StaticRunner
from specviz.engine.runner import make_runner
from specviz.lab import ALPHA, PROMPT, VOCAB, exact_two_token_distribution, models
from specviz.lab.experiment import Result, outcome
from specviz.engine.rounds import Clock
from tests.conftest import tiny_lm

CUDA = torch.cuda.is_available()
# As tests/test_cuda.py: SPECVIZ_TEST_DEVICE=cpu runs the end-to-end tests below on the CPU over the
# static cache (graphs need CUDA), a check of the tests themselves on a machine without a GPU.
DEVICE = torch.device(os.environ.get("SPECVIZ_TEST_DEVICE", "cuda"))
CACHE = "graphs" if DEVICE.type == "cuda" else "static"
needs_device = pytest.mark.skipif(DEVICE.type == "cuda" and not CUDA, reason="needs a CUDA GPU")


def _pair(seed: int = 0, device=DEVICE):
    target = tiny_lm(vocab=16, layers=2, init=0.3, n_positions=128, seed=seed).to(device)
    drafter = tiny_lm(vocab=16, layers=2, init=0.3, n_positions=128, seed=seed + 1).to(device)
    return drafter, target


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_graphed_logits_equal_the_static_eager_pass_at_every_bucket():
    from specviz.engine.graphs import BUCKETS, GraphedRunner

    _, target = _pair(device="cuda")
    seq = torch.randint(0, 16, (120,), generator=torch.Generator().manual_seed(0)).cuda()
    graphed = GraphedRunner(target, 16)
    ms = graphed.capture()
    assert ms > 0 and set(graphed.graphs) == set(BUCKETS)
    eager = StaticRunner(target, 16, capacity=graphed.kv.capacity)
    with torch.inference_mode():
        graphed.prefill(seq, 5)
        eager.prefill(seq, 5)
        end = 5
        for n in (1, 3, 4, 7, 16, 2, 33):  # padded buckets and exact ones
            got, want = graphed.logits(seq, end + n, n), eager.logits(seq, end + n, n)
            torch.testing.assert_close(got, want, atol=1e-3, rtol=0)
            graphed.rollback(end + n - 1)
            eager.rollback(end + n - 1)
            end = end + n - 1
    assert graphed.replays == 8  # the 5-token prefill replays bucket 8, then one replay per pass


@pytest.mark.cuda
@needs_device
@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_graphed_greedy_equals_eager_and_the_targets_greedy(gamma):
    drafter, target = _pair()
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    kwargs = dict(sampling=Sampling(0.0), max_new_tokens=40, vocab_size=16)
    reference = autoregressive_generate(prompt, target, cached="re-fed", **kwargs).output_ids
    assert autoregressive_generate(prompt, target, cached=CACHE, **kwargs).output_ids == reference
    eager = speculative_generate(prompt, drafter, target, gamma=gamma, cached="dynamic", **kwargs)
    graphed = speculative_generate(prompt, drafter, target, gamma=gamma, cached=CACHE, **kwargs)
    assert graphed.output_ids == eager.output_ids == reference


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_graphs_are_captured_once_per_model_and_role_and_replay_on_another_thread():
    from specviz.engine.graphs import graphed

    drafter, target = _pair(seed=5, device="cuda")
    first = graphed(target, 16)
    assert graphed(target, 16) is first and graphed(target, 16, role="drafter") is not first
    prompt = [1, 2, 3]
    kwargs = dict(sampling=Sampling(1.0), max_new_tokens=30, vocab_size=16, seed=7)
    want = speculative_generate(prompt, drafter, target, gamma=3, cached="dynamic", **kwargs).output_ids
    stream = iter(speculative_stream(prompt, drafter, target, gamma=3, cached="graphs", **kwargs))
    traces = [next(stream)]

    def rest():  # the page resumes a generator on another thread
        traces.extend(stream)

    worker = threading.Thread(target=rest)
    worker.start()
    worker.join()
    assert traces[-1].output_ids == want


@pytest.mark.cuda
@needs_device
@pytest.mark.slow
def test_graphed_output_distribution_is_the_targets():
    """The chi-square harness of tests/test_exactness.py (ALPHA = 1e-4, 3000 runs) through graphs;
    control: the same counts against a planted wrong law (another model's) must be rejected."""
    drafter, target = models("similar")
    sampling, gamma, runs = Sampling(temperature=1.0), 3, 3000
    exact = exact_two_token_distribution(target, sampling, PROMPT).ravel()  # on the CPU, before the move
    unlike, _ = models("unlike")
    wrong_law = exact_two_token_distribution(unlike, sampling, PROMPT).ravel()
    drafter, target = drafter.to(DEVICE), target.to(DEVICE)
    result = Result(counts=np.zeros(VOCAB * VOCAB), exact=exact, runs=0)
    for seed in range(runs):
        trace = speculative_generate(PROMPT, drafter, target, gamma=gamma, sampling=sampling, max_new_tokens=gamma + 1,
                                     seed=seed, cached=CACHE)
        result.counts[outcome(trace.output_ids)] += 1
        result.runs += 1
    _, pvalue = result.test()
    assert pvalue > ALPHA
    assert Result(counts=result.counts, exact=wrong_law, runs=runs).test()[1] < ALPHA


# ---- on every device -------------------------------------------------------------------------


def test_graphs_are_refused_off_cuda():
    with pytest.raises(ValueError, match="CUDA"):
        make_runner(tiny_lm(), 16, "graphs")


def test_clock_marks_time_phases_without_a_synchronisation_on_the_cpu():
    clock = Clock(torch.device("cpu"))
    a = clock.mark()
    torch.ones(1000).sum()
    b = clock.mark()
    assert a.event is None and clock.ms(a, b) >= 0.0


class _EagerGraph:
    """A stand-in for a captured graph on the CPU: ``replay`` runs the pass over the same buffers."""

    def __init__(self, runner, buf):
        self.runner, self.buf = runner, buf

    def replay(self):
        self.buf["logits"].copy_(self.runner._model_pass(self.buf))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_bucket_padding_keeps_logits_and_ids_on_the_cpu(family, monkeypatch):
    """The graphed runner's bookkeeping (buffers, padding rows, write index) without CUDA: each
    'replay' runs the pass eagerly over the captured buffers, so only the graph itself is left out."""
    from specviz.engine import graphs
    from tests.test_cache import ATOL, _model

    model = _model(family)
    monkeypatch.setattr(
        graphs.GraphedRunner,
        "__init__",
        lambda self, m, v, buckets=graphs.BUCKETS: (
            StaticRunner.__init__(self, m, v, 64),
            setattr(self, "buckets", (1, 2, 4, 8)),
            setattr(self, "graphs", {}),
            setattr(self, "capture_ms", None),
            setattr(self, "replays", 0),
        )[0],
    )
    runner = graphs.GraphedRunner(model, 16)
    kv = runner._kv(torch.empty(0))
    for b in runner.buckets:
        zeros = torch.zeros(b, dtype=torch.long)
        buf = {"ids": torch.zeros(1, b, dtype=torch.long), "positions": zeros.clone(), "mask": kv.causal_mask(zeros)}
        buf["logits"] = runner._model_pass(buf).clone()
        runner.graphs[b] = (_EagerGraph(runner, buf), buf)
    reference = StaticRunner(model, 16, capacity=kv.capacity)
    seq = torch.randint(0, 16, (60,), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        runner.prefill(seq, 4)
        reference.prefill(seq, 4)
        end = 4
        for n in (1, 3, 5, 8, 2, 12):  # 12 > the largest bucket: an eager pass
            torch.testing.assert_close(
                runner.logits(seq, end + n, n), reference.logits(seq, end + n, n), atol=ATOL, rtol=0
            )
            end += n - 1
            runner.rollback(end)
            reference.rollback(end)
    assert runner.replays == 6  # the 4-token prefill and five passes; the 12-token one ran eagerly
