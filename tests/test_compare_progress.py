"""Compare drafters says while it runs how many kinds are done and about how long the rest take."""

from __future__ import annotations


def test_compare_says_how_many_kinds_are_done_and_about_how_long_the_rest_take():
    from specviz.views.compare import progress_line

    line = progress_line(2, 5, 30.0)
    assert "2 of 5 kinds done in 30 s" in line and "about 45 s left" in line
    assert progress_line(0, 5, 3.0) == "" and progress_line(5, 5, 60.0) == "" and progress_line(2, 5, None) == ""
