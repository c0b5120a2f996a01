"""The exactness lab's verdict explains its threshold beside the p-value: why 1e-4 and not 0.05 (a correct engine's
p is uniform, so many runs at 0.05 would raise false alarms), and which side of it this run's p fell."""

from __future__ import annotations

import numpy as np

from specviz.lab.faults import FAULTS
from specviz.records.lab import ALPHA, Result
from specviz.views.lab import lab_html, threshold_note


def _result(shift: float) -> Result:
    exact = np.full(64, 1 / 64)
    counts = np.round(exact * 6400).astype(int)
    counts[0] += int(shift * 6400)
    counts[1] -= int(shift * 6400)
    return Result(counts=counts, exact=exact, runs=int(counts.sum()), accepted=10, drafted=20)


def test_the_threshold_is_explained_with_this_runs_p():
    exact_run, shifted = _result(0.0), _result(0.015)
    p_ok, p_bad = exact_run.test()[1], shifted.test()[1]
    assert p_ok > ALPHA > p_bad
    ok, bad = threshold_note(p_ok), threshold_note(p_bad)
    assert f"Why {ALPHA:g} and not 0.05" in ok and "once in 10,000 runs" in ok and "is above it" in ok
    assert f"p = {p_bad:.3g} is below it" in bad and "planted fault" in bad
    html = lab_html(shifted, FAULTS["none"])
    assert "Why 0.0001 and not 0.05" in html and "rejected" in html
