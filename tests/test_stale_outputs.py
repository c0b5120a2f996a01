"""No table of an earlier run is shown as this run's. After an auto-tree run the stats table kept "…" and then the
previous run's counts, and the rank table labelled "This run" showed the previous tree run's: a calibration that ended
without a round left the last run's text, numbers and tree tables under its status; a streaming run kept the last
run's tree section until it ended; and the Stop button's hand-over (``state.stopped``) could hold the outputs of a run
a timed-out Stop had cancelled, which the next Stop in the session showed over a newer run."""

from __future__ import annotations

import pytest

from specviz.serving.device_thread import Owner
from specviz.trace import Round, Trace
from specviz.ui.tabs import generate
from specviz.ui.page import state
from specviz.ui.running.device import CALIBRATING


def _spec(rounds: int) -> Trace:
    made = [
        Round(
            drafts=[],
            emitted_ids=[1],
            final_token_id=1,
            final_text="a",
            final_kind="target",
            final_prob=1.0,
            draft_ms=0.0,
            verify_ms=1.0,
            end_ms=float(i + 1),
        )
        for i in range(rounds)
    ]
    return Trace(mode="speculative", prompt_ids=[1], output_ids=[1] * rounds, rounds=made, settings={"gamma": 4})


def test_while_calibrating_the_last_runs_text_numbers_and_tree_tables_are_cleared():
    (out,) = generate._shown(("calibrating", None, CALIBRATING), None, None, Owner())
    assert out["status"] == CALIBRATING and out["export_file"] is None
    assert "first round" in out["stats"] and "sv-stat\"" not in out["stats"]  # no number of the last run
    assert "sv-tokens" in out["tokens"] and "sv-span" not in out["tokens"] and out["rank_table"] == ""
    assert "drawn when this run ends" in out["auto_note"]
    assert {"budget_plot", "auto_tree_plot"} <= set(out)


def test_a_runs_first_round_clears_the_last_runs_tree_section():
    (out,) = generate._shown(("round", _spec(1), "t"), None, None, Owner())
    assert out["rank_table"] == "" and "drawn when this run ends" in out["auto_note"]
    (later,) = generate._shown(("round", _spec(3), "t"), None, None, Owner())
    assert "rank_table" not in later  # cleared once; the finished run draws it


def test_a_stop_takes_only_the_outputs_of_the_run_it_stopped(monkeypatch):
    session = "s-stale"
    old = generate._started(session)
    generate._kept(session, old, {"status": "Stopped by you after 12 tokens (the old run)"})
    new = generate._started(session)  # a new run: what the old one left is gone
    assert session not in state.stopped
    # The old run's step under way when a timed-out Stop cancelled it ends after the new run began, and leaves its
    # outputs.
    generate._kept(session, old, {"status": "Stopped by you after 12 tokens (the old run)"})
    monkeypatch.setattr(generate, "STOP_WAIT_S", 0.1)
    state.running[session] = 1
    try:
        # not the old run's counts over the new run
        assert generate.stop(type("R", (), {"session_hash": session})()) == {}
        generate._kept(session, new, {"status": "Stopped by you after 3 tokens"})
        assert generate.stop(type("R", (), {"session_hash": session})()) == {"status": "Stopped by you after 3 tokens"}
    finally:
        state.running.pop(session, None)
        state.stop_asked.discard(session)
        generate._runs.pop(session, None)


@pytest.mark.parametrize("event", [None, ("calibrating", None, CALIBRATING)])
def test_a_calibration_stopped_before_the_first_round_leaves_no_earlier_run_in_view(event):
    """Stopped during the calibration, the run hands the Stop button only a status; what the calibration cleared stays
    cleared (it showed the last run's counts under "Stopped before the first round")."""
    session = "s-calibration"
    run = generate._started(session)
    state.stop_asked.add(session)
    try:
        (out,) = generate._halted(event, None, session, None, run)
        assert set(out) == {"status"}
        assert generate._taken(session, run) == out
    finally:
        state.stop_asked.discard(session)
        generate._runs.pop(session, None)
