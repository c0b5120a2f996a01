"""Which machine, build and engine recorded a run: kept in the file, checked when read, said when replayed; the
prepared recordings are today's engine's (or say they are not) and the English ones of the default drafter show
speculation paying (or say in their title that they show a slowdown on purpose)."""

from __future__ import annotations

import json

import pytest

from specviz.engine import ENGINE_VERSION
from specviz.recording import Recording, made_by_here
from specviz.ui.page.defaults import RECORDINGS
from specviz.views.verdict import weigh

PREPARED = sorted(RECORDINGS.glob("*.json"))


def _small() -> dict:
    return json.loads((RECORDINGS / "sampled-gamma8.json").read_text())


def test_made_by_round_trips_and_names_this_machine():
    made = made_by_here("cpu")
    assert made["engine_version"] == ENGINE_VERSION and made["machine"] and made["build"] and made["torch"]
    rec = Recording.from_json(json.dumps({**_small(), "made_by": made}))
    assert rec.made_by == made
    assert Recording.from_json(rec.to_json()).made_by == made


@pytest.mark.parametrize("bad, field", [
    ({"machine": 5}, "made_by.machine"),
    ({"machine": "x" * 201}, "made_by.machine"),
    ({"engine_version": True}, "made_by.engine_version"),
    ({"engine_version": "2"}, "made_by.engine_version"),
    ({"who": "me"}, "made_by:"),
    (["a list"], "made_by:"),
])
def test_a_malformed_made_by_is_refused_by_name(bad, field):
    with pytest.raises(ValueError, match=field):
        Recording.from_json(json.dumps({**_small(), "made_by": bad}))


def test_the_replay_status_says_who_recorded_it_and_whether_its_engine_is_older():
    pytest.importorskip("gradio")
    from specviz.ui.tabs.files import made_by_note, replaying

    rec = Recording.from_json(json.dumps({**_small(), "made_by": {**made_by_here("cpu"), "machine": "<b>Box</b> `x`"}}))
    note = replaying(rec)
    assert "Recorded on ``" in note and "<b>Box</b>" in note.split("``")[1]  # a code span: Markdown makes no tag of it
    assert "older" not in note
    old = made_by_note({"machine": "m", "engine_version": ENGINE_VERSION - 1})
    assert f"version {ENGINE_VERSION - 1}" in old and "older than this build's" in old
    assert "does not say which machine" in made_by_note(None)


@pytest.mark.parametrize("path", PREPARED, ids=lambda p: p.stem)
def test_a_prepared_recording_names_its_machine_and_is_todays_engine(path):
    rec = Recording.load(path)
    assert rec.made_by and rec.made_by.get("machine"), f"{path.name} does not say which machine recorded it"
    if rec.made_by.get("engine_version") != ENGINE_VERSION:
        assert "older engine" in rec.title.lower(), (
            f"{path.name} was recorded by engine {rec.made_by.get('engine_version')} (this build's: {ENGINE_VERSION}): "
            "record it again (scripts/record_examples.sh) or say 'older engine' in its title")


ENGLISH_DEFAULT = [
    p
    for p in PREPARED
    if p.stem.startswith("english-")
    and (json.loads(p.read_text())["speculative"]["settings"].get("drafter") or {}).get("kind") == "model"
]


@pytest.mark.parametrize("path", ENGLISH_DEFAULT, ids=lambda p: p.stem)
def test_a_prepared_english_recording_of_the_default_drafter_shows_speculation_paying(path):
    """The headline's speedup (``specviz.views.verdict.weigh``) of what a class loads first: at least 1.1x, or the
    title says it shows a slowdown on purpose."""
    rec = Recording.load(path)
    j = weigh(rec.speculative, rec.baseline)
    assert j is not None, f"{path.name}: no speedup to show"
    if j.speedup < 1.1:
        assert "slowdown" in rec.title.lower(), f"{path.name} shows {j.speedup:.2f}x and does not say it is a slowdown"


def test_the_english_recordings_of_the_default_drafter_are_checked():
    assert {p.stem for p in ENGLISH_DEFAULT} >= {"english-greedy-gamma3-sweep", "english-page-defaults"}
