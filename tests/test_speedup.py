"""The interleaved measurement changes no token, gives equal work, and its spread is arithmetic on the rounds."""

from __future__ import annotations

import pytest

from specviz import Sampling, autoregressive_generate, autoregressive_stream, speculative_generate, speculative_stream
from specviz.measure.speedup import estimate, interleave
from specviz.trace import Round, Trace
from tests.conftest import noisy_copy, tiny_lm


@pytest.fixture(scope="module")
def pair():
    target = tiny_lm(vocab=32, layers=2, seed=2, init=0.3)
    return noisy_copy(target, 0.02, seed=1), target


@pytest.mark.parametrize("sampling", [Sampling(0.0), Sampling(1.0)], ids=["greedy", "sampled"])
def test_interleaving_changes_no_token_and_gives_equal_work(pair, sampling):
    drafter, target = pair
    kw = dict(sampling=sampling, max_new_tokens=30, seed=5)
    steps = list(
        interleave(
            speculative_stream([5, 7, 9], drafter, target, gamma=4, **kw),
            autoregressive_stream([5, 7, 9], target, **kw),
        )
    )
    spec, base = steps[-1]
    assert spec.output_ids == speculative_generate([5, 7, 9], drafter, target, gamma=4, **kw).output_ids
    alone = autoregressive_generate([5, 7, 9], target, **kw).output_ids
    assert base.output_ids == alone[: len(base.output_ids)]
    assert len(base.output_ids) == min(len(spec.output_ids), len(alone))
    # turns alternate: the baseline never runs ahead of the speculative run
    assert all(s is None or b is None or len(b.output_ids) <= len(s.output_ids) for s, b in steps)
    assert base.stop_reason is not None and spec.stop_reason is not None


def _trace(mode, per_round: list[tuple[int, float]], prefill: float = 0.0) -> Trace:
    """A trace whose rounds emit n tokens and take ms each (token ids are placeholders)."""
    t, rounds, out = prefill, [], []
    for n, ms in per_round:
        t += ms
        rounds.append(
            Round(
                drafts=[],
                emitted_ids=[1] * n,
                final_token_id=1,
                final_text="",
                final_kind="target",
                final_prob=1.0,
                draft_ms=0.0,
                verify_ms=ms,
                end_ms=t,
            )
        )
        out += [1] * n
    return Trace(
        mode=mode,
        prompt_ids=[1],
        output_ids=out,
        rounds=rounds,
        stop_reason="max_new_tokens",
        prefill_ms=prefill,
        total_ms=t,
    )


def test_windows_measure_the_same_ratio_as_the_whole_run():
    # 32 tokens: speculative 4 tokens per 10 ms round, baseline 1 token per 5 ms: 2x everywhere.
    spec = _trace("speculative", [(4, 10.0)] * 8)
    base = _trace("autoregressive", [(1, 5.0)] * 32)
    est = estimate(spec, base, windows=2)
    assert est.speedup == pytest.approx(2.0)
    assert est.windows == pytest.approx([2.0, 2.0])
    assert est.relative_spread == pytest.approx(0.0) and est.readable


def test_a_slow_stretch_widens_the_spread():
    spec = _trace("speculative", [(4, 10.0)] * 4 + [(4, 40.0)] * 4)  # the second half ran 4x slower
    base = _trace("autoregressive", [(1, 5.0)] * 32)
    est = estimate(spec, base, windows=2)
    assert est.windows == pytest.approx([2.0, 0.5])
    assert not est.readable
    assert estimate(_trace("speculative", []), base) is None
