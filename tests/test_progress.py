"""Compare drafters and Batch say while they run how much is done and about how long the rest takes."""

from __future__ import annotations


def test_compare_says_how_many_kinds_are_done_and_about_how_long_the_rest_take():
    from specviz.views.compare import progress_line

    line = progress_line(2, 5, 30.0)
    assert "2 of 5 kinds done in 30 s" in line and "about 45 s left" in line
    assert progress_line(0, 5, 3.0) == "" and progress_line(5, 5, 60.0) == "" and progress_line(2, 5, None) == ""


def test_batch_says_how_many_batches_are_measured_and_about_how_long_the_rest_take():
    from specviz.ui.tabs.batch import _progress

    line = _progress(2, 6, "1, 2, 4", 40.0)
    assert (
        line.startswith("Measured 2 of 6 batches (batch sizes 1, 2, 4")
        and "in 40 s; about 80 s left at that pace" in line
    )
    assert "left" not in _progress(0, 6, "1, 2, 4", 5.0) and "left" not in _progress(6, 6, "1, 2, 4", 90.0)
