"""An HTML export bounds its work before it starts (issue 39): the parts it would render (rounds,
drafts and every tree node) and the page's size are estimated from counts, and a recording over
either limit is refused before anything is built. A valid 8.3 MB recording of 4,096 rounds of
8-node trees ran 434 s before it was refused as over 32 MB: its drafts (the accepted paths) were
few, its nodes were not counted."""

from __future__ import annotations

import json

import pytest

from specviz import Sampling, autoregressive_generate, speculative_generate
from specviz.drafters import make_drafter
from specviz.engine.tree.loop import tree_generate
from specviz.engine.tree.spec import TreeSpec
from specviz.recording import Recording
from tests.conftest import tiny_lm

ROUNDS = 4096


def _pair():
    target = tiny_lm(vocab=64, layers=1, seed=3, init=0.1, n_positions=1024)
    # unlike the target: most trees fail at depth 1
    drafter = tiny_lm(vocab=64, layers=1, seed=6, init=1.0, n_positions=1024)
    return drafter, target


def many_tree_rounds() -> Recording:
    """A valid recording of ROUNDS rounds of 8-node trees (shape 2-3), each emitting one token: the
    one-token rounds of a real tree run, repeated, its output and budget made to match, loaded
    through the recording's own validation (about 7.5 MB of JSON)."""
    drafter, target = _pair()
    spec = tree_generate(
        [1, 2, 3], drafter, target, TreeSpec.static((2, 3)), sampling=Sampling(1.0), max_new_tokens=48, seed=1
    )
    d = json.loads(Recording(spec, None, title="many trees").to_json())
    trace = d["speculative"]
    ones = [r for r in trace["rounds"] if len(r["emitted_ids"]) == 1 and len(r["tree"]["nodes"]) == 8]
    assert ones, "the tiny pair's tree run had no one-token round"
    for r in ones:  # under the 8 MB a recording may have: no top tokens, the untested nodes' q and p shortened
        r["final_top"] = []
        for node in r["tree"]["nodes"]:
            if node["verdict"] == "discarded":
                node["q"], node["p"] = round(node["q"], 3), round(node["p"], 3)
    rounds = [dict(ones[i % len(ones)]) for i in range(ROUNDS)]
    for i, r in enumerate(rounds):
        r["end_ms"] = float(i + 1)
    trace["rounds"] = rounds
    trace["output_ids"] = [r["emitted_ids"][0] for r in rounds]
    trace["total_ms"] = float(ROUNDS)
    trace["settings"]["max_new_tokens"] = ROUNDS
    trace["stop_reason"] = "max_new_tokens"
    return Recording.from_json(json.dumps(d, separators=(",", ":")))


def test_many_rounds_of_small_trees_are_refused_before_anything_is_built(monkeypatch):
    """The nodes are counted: 4,096 rounds of 8-node trees are 36,864 parts, over the limit, though
    their drafts alone were under the old one. Nothing is rendered: building is made to fail."""
    from specviz.ui.guard import downloads
    import specviz.views.export as export

    rec = many_tree_rounds()
    assert len(rec.speculative.rounds) == ROUNDS and all(len(r.tree.nodes) == 8 for r in rec.speculative.rounds)
    # what the old check counted: it let this through
    assert sum(len(r.drafts) + 1 for r in rec.speculative.rounds) <= 8192
    assert export.export_units(rec) == ROUNDS * 9
    built = lambda *a, **k: pytest.fail("the export started building")  # noqa: E731
    monkeypatch.setattr(downloads, "export_html", built)
    monkeypatch.setattr(export, "tree_figure", built)
    with pytest.raises(
        Exception, match=r"too large to export as one page: it has 36,864 rounds, drafts and tree nodes"
    ):
        downloads.save_export(rec)
    # Under a higher parts limit, the size estimate refuses it (about 90 MB, over 32 MB), still before building.
    monkeypatch.setattr(downloads, "EXPORT_MAX_UNITS", 10**6)
    assert export.export_bytes(rec) > downloads.EXPORT_MAX_BYTES
    with pytest.raises(Exception, match=r"it would be about \d+ MB, over 32 MB"):
        downloads.save_export(rec)


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_the_size_estimate_errs_large_but_not_by_much(kind):
    """The estimate is of the page that is then built: at least its size, at most a third over (the
    per-part costs are fitted, then rounded up). Token texts of markup characters, which escaping
    lengthens most, are counted at their worst."""
    from specviz.views.export import export_bytes, export_html

    drafter, target = _pair()
    kw = dict(sampling=Sampling(1.0), max_new_tokens=40, seed=2)
    if kind == "tree":
        spec = tree_generate([1, 2, 3], drafter, target, TreeSpec.static((2, 3)), **kw)
    else:
        spec = speculative_generate([1, 2, 3], make_drafter("model", drafter_model=drafter), target, gamma=4, **kw)
    base = autoregressive_generate([1, 2, 3], target, **kw)
    for r in spec.rounds[::2]:
        r.final_text = '&"<>' * 4
    rec = Recording(spec, base, title="sized")
    actual = len(export_html(rec).encode())
    assert actual <= export_bytes(rec) <= 1.34 * actual, (export_bytes(rec), actual)


def test_the_run_on_screen_exported_again_is_built_once(monkeypatch):
    """A second export of the run a session shows (the same recording object its state holds) hands back the same
    file without building the page again; another session exporting that run gets a file of its own, the page not
    built again; another recording is built afresh."""
    from specviz.ui.guard import downloads

    drafter, target = _pair()
    spec = speculative_generate([1, 2, 3], drafter, target, gamma=3, max_new_tokens=12, seed=2)
    base = autoregressive_generate([1, 2, 3], target, max_new_tokens=12, seed=2)
    rec, other = Recording(spec, base, title="one"), Recording(spec, base, title="two")
    real, builds = downloads.export_html, []
    monkeypatch.setattr(downloads, "export_html", lambda r: builds.append(r.title) or real(r))
    first = downloads.save_export(rec, "session-a")
    assert downloads.save_export(rec, "session-a") == first and builds == ["one"]
    elsewhere = downloads.save_export(rec, "session-b")
    assert elsewhere != first and builds == ["one"]
    assert open(elsewhere, encoding="utf-8").read() == open(first, encoding="utf-8").read()
    downloads.save_export(other, "session-a")
    assert builds == ["one", "two"]
