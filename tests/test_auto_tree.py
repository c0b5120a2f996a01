"""The auto tree end to end on tiny models: explicit trees draft and emit the target's greedy output,
the calibration measures what the choice needs, and the choice is stated with its inputs.

Timings on a shared machine vary, so no test asserts which shape a measured calibration chooses;
``decide`` is tested on a calibration built by hand. The statistical test of an auto-chosen shape's
output law is in tests/test_tree_exactness.py.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from specviz import Sampling, autoregressive_generate
from specviz.engine.tree.loop import tree_generate
from specviz.engine.tree.spec import TreeSpec
from specviz.lab import PROMPT, models
from specviz.engine.tree import auto as tree_auto
from specviz.engine.tree import calibration
from specviz.measure import tree_bench
from specviz.pair import auto_tree as pair_auto
from specviz.theory import sequoia
from specviz.trace import Trace

# An irregular shape the DP picks from depth-dependent rates: no branching-per-depth shape is this tree.
RATES = [[0.45, 0.3, 0.1], [0.6, 0.2], [0.7, 0.1], [0.8]]


def auto_shape(budget: int = 9, cap: int = 3) -> tuple[int, ...]:
    return sequoia.best_trees(sequoia.RankAcceptance.from_rates(RATES).p, budget, cap, 3)[budget].parents


def test_the_auto_shape_is_not_a_static_one():
    parents = auto_shape()
    kids_per_depth: dict[int, set[int]] = {}
    depth: list[int] = []
    for par in parents:
        depth.append(1 if par < 0 else depth[par] + 1)
    for node in range(-1, len(parents)):
        n_kids = sum(1 for p in parents if p == node)
        d = 0 if node < 0 else depth[node]
        if d < max(depth):
            kids_per_depth.setdefault(d, set()).add(n_kids)
    assert any(len(v) > 1 for v in kids_per_depth.values()), parents


@pytest.mark.parametrize("parents, field", [((), "1 to"), ((0,), "parent"), ((-1, 0, -1), "by depth"),
                                            (tuple([-1] * 17), "16 children"), (tuple(range(-1, 16)), "depths")])
def test_explicit_trees_refuse_bad_shapes(parents, field):
    with pytest.raises(ValueError, match=field):
        TreeSpec.explicit(parents)


def test_an_explicit_tree_describes_itself_and_round_trips():
    spec = TreeSpec.explicit(auto_shape())
    assert spec.max_nodes == len(auto_shape()) and spec.depth == 3
    assert spec.describe()["kind"] == "explicit" and spec.label().startswith("tree of 9 nodes")
    drafter, target = models("different")
    trace = tree_generate(PROMPT, drafter, target, spec, sampling=Sampling(1.0, top_k=5), max_new_tokens=12, seed=2)
    again = Trace.from_dict(json.loads(json.dumps(trace.to_dict())))
    assert again.output_ids == trace.output_ids
    # Every round drafted the spec's tree (or a part of it near the token budget).
    assert all(len(r.tree.nodes) <= spec.max_nodes for r in trace.rounds)
    assert max(len(r.tree.nodes) for r in trace.rounds) == spec.max_nodes
    from specviz.views.text import run_label

    assert "tree of 9 nodes, any shape, depth 3" in run_label(trace)


@pytest.mark.parametrize("kind", ["similar", "different"])
def test_greedy_auto_tree_equals_the_targets_greedy_decoding(kind):
    drafter, target = models(kind)
    spec = TreeSpec.explicit(auto_shape())
    for prompt in (PROMPT, [4, 1], [7, 7, 2, 5]):
        plain = autoregressive_generate(prompt, target, sampling=Sampling(0.0), max_new_tokens=20)
        for cached in ("dynamic", "re-fed"):
            trace = tree_generate(
                prompt, drafter, target, spec, sampling=Sampling(0.0), max_new_tokens=20, seed=0, cached=cached
            )
            assert trace.output_ids == plain.output_ids


def test_calibration_measures_every_input_and_the_choice_states_them():
    drafter, target = models("similar")
    cal = calibration.calibrate(
        drafter, target, [PROMPT, [4, 1]], Sampling(0.0), 8, max_new_tokens=12, max_depth=4, max_nodes=8
    )
    assert cal.prompts == 2 and cal.tokens == 12
    assert set(cal.verify_curve) == {1, 2, 3, 4, 6, 8} and all(v > 0 for v in cal.verify_curve.values())
    assert cal.tree_pass_cost > 0 and cal.chain_step_cost > 0 and cal.target_step_ms > 0
    # Greedy: the ranking is a softmax, so every child the calibration tree asks for exists.
    assert cal.available and all(rounds == with_k for rounds, with_k in cal.available)
    for row in cal.rank_counts:
        assert all(0 <= a <= o for o, a in row)
    # At one reached parent at most one child is accepted: per depth, accepted over ranks <= offered at rank 1.
    assert all(sum(a for _, a in row) <= row[0][0] for row in cal.rank_counts)
    assert all(0 <= a <= o for o, a in cal.chain_counts)
    auto = tree_auto.decide(cal, max_nodes=8, max_depth=4)
    d = auto.describe()
    json.dumps(d)
    assert d["inputs"]["acceptance_by_rank"] == cal.rank_counts and d["sentence"].startswith("auto: ")
    assert auto.choice.best.speedup >= auto.choice.best_chain.speedup


def _calibration(v_slope: float) -> calibration.Calibration:
    """A calibration by hand: a ranked drafter whose second choice often wins, a chain at 0.6."""
    return calibration.Calibration(
        rank_counts=[[(100, 55), (100, 25), (100, 8)]] * 6,
        chain_counts=[(100, 60)] * 6,
        verify_curve={1: 1.0, 64: 1.0 + 63 * v_slope},
        tree_pass_cost=0.1,
        chain_step_cost=0.1,
        target_step_ms=10.0,
        calibration_tree=(-1,),
        prompts=3,
        tokens=64,
    )


def test_decide_picks_a_tree_on_a_flat_device_and_a_small_one_or_a_chain_on_a_steep_one():
    flat, steep = tree_auto.decide(_calibration(0.002)), tree_auto.decide(_calibration(0.2))
    assert flat.tree is not None and flat.tree.max_nodes > 8
    assert steep.tree is None or steep.tree.max_nodes < flat.tree.max_nodes
    assert flat.gamma == flat.choice.best.depth
    for a in (flat, steep):
        assert a.choice.best.speedup >= a.choice.best_chain.speedup


def test_bench_report_puts_prediction_beside_measurement():
    auto = tree_auto.decide(_calibration(0.002))

    class T:
        def __init__(self, rounds, out, drafted):
            self.rounds, self.output_ids, self.drafted = [None] * rounds, [0] * out, drafted

    traces = {
        "speculative": [T(10, 30, 40)],
        "speculative_auto": [T(10, 33, 200)],
        "speculative_best_chain": [T(10, 31, 50)],
    }
    med = {"autoregressive": 10.0, "speculative": 12.0, "speculative_auto": 15.0, "speculative_best_chain": 13.0}
    r = tree_bench.bench_report(auto, traces, med, gamma=99)
    assert r["measured"]["tokens_per_round"] == 3.3 and r["measured"]["speedup"] == 1.5
    assert r["speedup_vs_best_measured_chain"] == pytest.approx(1.5 / 1.3)
    assert r["tokens_per_round_error"] == pytest.approx(3.3 / auto.choice.best.tokens_per_round - 1)
    text = "\n".join(tree_bench.format_bench_report(r))
    assert "auto: tree of" in text and "chain of gamma 99" in text and "d1: 55/100 25/100 8/100" in text


@pytest.mark.slow
def test_the_pages_auto_choice_runs_and_keeps_the_targets_greedy_output(embedded):
    """The page's "auto" menu entry on the embedded pair: calibrated once (the second call is the
    cache's), stated in one sentence, and a greedy run with it emits the target's own tokens."""
    from specviz import speculative_generate
    from specviz.drafters import make_drafter
    from specviz.ui.tabs.tree import AUTO, TREES, resolve_tree

    assert AUTO in TREES
    drafter = make_drafter("model", drafter_model=embedded.drafter, target=embedded.target)
    tree, gamma, sentence = resolve_tree(AUTO, embedded, drafter, Sampling(0.0), 4)
    assert resolve_tree(AUTO, embedded, drafter, Sampling(0.0), 4)[1:] == (gamma, sentence)
    assert sentence.startswith("auto: ") and "best chain (gamma" in sentence and 1 <= gamma <= 8
    assert resolve_tree("chain", embedded, drafter, Sampling(0.0), 4) == (None, 4, "")
    ids = embedded.tokenizer("def fibonacci(n):\n    ", add_special_tokens=False)["input_ids"]
    plain = autoregressive_generate(
        ids, embedded.target, sampling=Sampling(0.0), max_new_tokens=32, vocab_size=embedded.vocab_size
    )
    trace = speculative_generate(
        ids,
        drafter,
        embedded.target,
        gamma=gamma,
        tree=tree,
        sampling=Sampling(0.0),
        max_new_tokens=32,
        vocab_size=embedded.vocab_size,
    )
    assert trace.output_ids == plain.output_ids


def test_the_budget_figure_and_the_rank_table_show_the_choice_and_its_counts():
    from specviz.views.tree_budget import budget_figure, rank_table_html

    d = tree_auto.decide(_calibration(0.002)).describe()
    fig = budget_figure(d, {"nodes_per_round": 20.0, "speedup": 1.4})
    names = [t.name for t in fig.data]
    assert names[0].startswith("best tree of n nodes") and any(n.startswith("best chain, gamma") for n in names)
    assert names[-1].startswith("this run, measured") and fig.data[-1].x[0] == 20.0
    assert list(fig.data[0].x) == [c["budget"] for c in d["by_budget"]] == list(range(1, 65))
    chosen = next(t for t in fig.data if t.name.startswith("chosen: "))
    assert chosen.y[0] == d["predicted_speedup"] and chosen.x[0] == d["nodes"]
    # The hand-made shapes are points on the same terms (3-2-2-1: 33 nodes, 2-2-2-1: 22).
    hand = {t.name.split(" (")[0]: t for t in fig.data if t.name.startswith("tree ")}
    assert (
        set(hand) == {"tree 3-2-2-1", "tree 2-2-2-1"}
        and hand["tree 3-2-2-1"].x[0] == 33
        and hand["tree 2-2-2-1"].x[0] == 22
    )
    # The chosen tree is the fastest tree of every budget, and no slower than any chain or hand-made shape.
    assert d["predicted_speedup"] >= max(c["speedup"] for c in d["by_budget"] + d["chains"] + d["hand_made"]) - 1e-12
    drafter, target = models("different")
    trace = tree_generate(
        PROMPT, drafter, target, TreeSpec.explicit(auto_shape()), sampling=Sampling(1.0), max_new_tokens=12, seed=4
    )
    html = rank_table_html(trace)
    counts = sequoia.acceptance_by_rank(trace)
    o, a = counts[0][0]
    assert f"<td>{a} / {o} ({a / o:.2f})</td>" in html and "depth 1" in html
    assert rank_table_html(autoregressive_generate(PROMPT, target, max_new_tokens=4)) == ""


def test_the_eagle_head_drafts_an_auto_shape_and_keeps_the_targets_greedy_output():
    import torch

    from tests.test_drafters import outlier_llama
    from tests.conftest import assert_same_greedy
    from tests.test_eagle import tiny_eagle

    target = outlier_llama(outlier=20.0)
    ids = [1, 2, 3, 4, 5]
    drafter = tiny_eagle(target)
    trace = tree_generate(
        ids, drafter, target, TreeSpec.explicit(auto_shape()), sampling=Sampling(0.0), max_new_tokens=24
    )
    ref = target.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        do_sample=False,
        max_new_tokens=24,
        pad_token_id=0,
        eos_token_id=None,
    )
    assert_same_greedy(target, ids, trace.output_ids, ref[0, len(ids) :].tolist())
    assert trace.drafted > 0 and trace.accepted > 0
    assert trace.drafter_forward_passes == drafter.passes


def test_a_calibration_round_trips_through_its_checked_form():
    cal = _calibration(0.01)
    cal = calibration.Calibration(
        **{
            **cal.__dict__,
            "overhead": {1.5: 0.2, 9.0: 0.4},
            "calibration_tree": (-1, -1, 0),
            "available": ((10, 10), (10, 7)),
        }
    )
    again = calibration.Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert again == cal
    assert tree_auto.decide(again).describe() == tree_auto.decide(cal).describe()
    # Stored before availability was measured: every child then exists, as it did.
    older = {k: v for k, v in cal.to_dict().items() if k != "available"}
    assert calibration.Calibration.from_dict(older).available == ()


@pytest.mark.parametrize(
    "field, value",
    [
        ("format", 0),
        ("rank_counts", [[[5, 6]]]),
        ("rank_counts", [[[-1, 0]]]),
        ("rank_counts", [[[1.5, 1]]]),
        ("rank_counts", "x"),
        ("rank_counts", [[[1, 1]]] * 40),
        ("chain_counts", []),
        ("chain_counts", [[3, True]]),
        ("verify_curve", {}),
        ("verify_curve", {"1": 0.0}),
        ("verify_curve", {"1": float("nan")}),
        ("verify_curve", {"x": 1.0}),
        ("verify_curve", {"1": 1e300}),
        ("tree_pass_cost", -0.1),
        ("tree_pass_cost", "0.1"),
        ("target_step_ms", 0),
        ("calibration_tree", [0]),
        ("calibration_tree", None),
        ("prompts", 0),
        ("tokens", None),
        ("overhead", {"a": 1.0}),
        ("overhead", {"1.0": -2.0}),
        ("available", [[3, 4]]),
        ("available", "x"),
        ("available", [[1.5, 1]]),
    ],
)
def test_a_stored_calibration_is_checked_as_data_from_outside(field, value):
    d = _calibration(0.01).to_dict() | {field: value}
    with pytest.raises(ValueError):
        calibration.Calibration.from_dict(d)


def test_the_disk_cache_keeps_a_calibration_per_key_refuses_bad_files_and_stays_bounded(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE_DIR", str(tmp_path))
    cal = _calibration(0.01)
    key = pair_auto.disk_key(("embedded", "cpu"), "cpu")
    assert key != pair_auto.disk_key(("embedded", "cpu"), "cuda: a GPU") and key != pair_auto.disk_key(
        ("english", "cpu"), "cpu"
    )
    assert pair_auto.load_cached(key) is None
    pair_auto.store_cached(key, cal)
    assert pair_auto.load_cached(key) == cal
    path = tmp_path / "auto_tree.json"
    # A corrupt entry, a corrupt file, a file that is not an object, one too large: each reads as "not cached".
    data = json.loads(path.read_text())
    data[key]["chain_counts"] = [[1, 2]]
    path.write_text(json.dumps(data))
    assert pair_auto.load_cached(key) is None
    for text in ("{not json", "[1, 2]", "{" + " " * (pair_auto.DISK_BYTES + 1) + "}"):
        path.write_text(text)
        assert pair_auto.load_cached(key) is None
    pair_auto.store_cached(key, cal)  # a bad file is replaced by a good one
    assert pair_auto.load_cached(key) == cal
    for i in range(pair_auto.DISK_ENTRIES + 5):
        pair_auto.store_cached(f"k{i}", cal)
    data = json.loads(path.read_text())
    assert len(data) == pair_auto.DISK_ENTRIES and f"k{pair_auto.DISK_ENTRIES + 4}" in data and key not in data
    assert not list(tmp_path.glob("*.tmp"))


def test_auto_tree_calibrates_once_then_reads_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(pair_auto, "_CACHE", {})
    from specviz.drafters import make_drafter

    model, target = models("similar")
    # a drafter that names its kind (a bare model is never stored)
    drafter = make_drafter("model", drafter_model=model, target=target)
    calls = []
    real = pair_auto.calibrate_steps

    def counted(*a, **k):
        calls.append(1)
        return (yield from real(*a, **k))

    monkeypatch.setattr(pair_auto, "calibrate_steps", counted)
    args = dict(max_new_tokens=8, max_nodes=6, max_depth=3)
    first = pair_auto.auto_tree(drafter, target, [PROMPT], Sampling(0.0), 8, key=("lab", "cpu"), **args)
    pair_auto._CACHE.clear()  # a new process: only the disk remembers
    second = pair_auto.auto_tree(drafter, target, [PROMPT], Sampling(0.0), 8, key=("lab", "cpu"), **args)
    assert len(calls) == 1 and second.describe() == first.describe()
    pair_auto._CACHE.clear()
    pair_auto.auto_tree(drafter, target, [PROMPT], Sampling(1.0), 8, key=("lab", "cpu"), **args)  # another regime
    assert len(calls) == 2
    path = tmp_path / "auto_tree.json"
    path.write_text(path.read_text().replace('"format": 1', '"format": "x"'))  # every entry corrupt: measured again
    pair_auto._CACHE.clear()
    pair_auto.auto_tree(drafter, target, [PROMPT], Sampling(0.0), 8, key=("lab", "cpu"), **args)
    assert len(calls) == 3


def test_the_theory_tabs_tree_section_draws_an_auto_run_and_says_how_to_get_one_otherwise():
    from specviz.recording import Recording
    from specviz.ui.page.outputs import RUN_OUTPUTS, auto_tree_outputs

    assert {"auto_note", "budget_plot", "auto_tree_plot", "rank_table"} <= set(RUN_OUTPUTS)
    auto = tree_auto.decide(_calibration(0.02), max_nodes=16, max_depth=4, device="cpu")
    drafter, target = models("different")
    spec = tree_generate(PROMPT, drafter, target, auto.tree, sampling=Sampling(1.0, top_k=5), max_new_tokens=16, seed=3)
    base = autoregressive_generate(PROMPT, target, sampling=Sampling(1.0, top_k=5), max_new_tokens=16, seed=3)
    rec = Recording(spec, base, auto=auto.record())
    # The record survives a file: checked on load, decided again to the same choice.
    again = Recording.from_json(rec.to_json())
    assert (
        again.auto == json.loads(json.dumps(rec.auto))
        and tree_auto.from_record(again.auto).describe() == auto.describe()
    )
    out = auto_tree_outputs(again)
    note = out["auto_note"]
    rounds, emitted = len(spec.rounds), len(spec.output_ids)
    # Every number names its denominator; the prediction its formula and inputs; the sentence says why this size.
    assert f"{emitted} tokens / {rounds} rounds" in note and f"{spec.drafted} nodes / {rounds} rounds" in note
    assert "Chosen: " in note and "E[tokens per round]" in note and "held-out prompts" in note and "v(1) = 1.00" in note
    assert "On this cpu, v(n) " in note and "-node tree wins" in note
    names = [t.name for t in out["budget_plot"].data]
    assert names[-1].startswith("this run, measured")
    assert out["budget_plot"].data[-1].x[0] == pytest.approx(spec.drafted / rounds)
    assert "Calibration (what the choice used)" in out["rank_table"] and "55 / 100 (0.55)" in out["rank_table"]
    assert "This run: accepted / offered" in out["rank_table"]
    assert out["auto_tree_plot"].layout.title.text.startswith("The tree as drafted in round ")
    # A chain run without auto: the note says how to get the section; no tree, no table.
    from specviz import speculative_generate

    chain = speculative_generate(PROMPT, drafter, target, gamma=3, max_new_tokens=8)
    out = auto_tree_outputs(Recording(chain))
    assert (
        out["auto_note"].startswith("This run drafted a chain") and "auto: fastest for this device" in out["auto_note"]
    )
    assert out["rank_table"] == "" and "drafted a chain" in out["auto_tree_plot"].layout.title.text


@pytest.mark.parametrize(
    "bad",
    [
        {"calibration": {}, "max_nodes": 8, "max_depth": 4},
        {"max_nodes": 8},
        [],
        {"calibration": None, "max_nodes": 0, "max_depth": 4},
        {"extra": 1},
    ],
)
def test_a_recording_with_a_bad_auto_record_is_refused(bad):
    from specviz.recording import Recording

    drafter, target = models("different")
    spec = tree_generate(
        PROMPT, drafter, target, TreeSpec.explicit(auto_shape()), sampling=Sampling(0.0), max_new_tokens=6, seed=0
    )
    text = json.loads(Recording(spec).to_json()) | {"auto": bad}
    with pytest.raises(ValueError, match="not a specviz recording: auto"):
        Recording.from_json(json.dumps(text))


def test_whole_rounds_leave_out_the_rounds_the_token_budget_cut():
    drafter, target = models("similar")
    spec = TreeSpec.explicit(auto_shape())  # depth 3
    trace = tree_generate(PROMPT, drafter, target, spec, sampling=Sampling(0.0), max_new_tokens=13, seed=0)
    emitted, rounds = tree_bench.untruncated([trace], spec.depth)
    left, want = 13, (0, 0)
    for r in trace.rounds:
        if left >= spec.depth + 1:
            want = (want[0] + len(r.emitted_ids), want[1] + 1)
        left -= len(r.emitted_ids)
    assert (emitted, rounds) == want and 0 < rounds < len(trace.rounds)
    assert all(len(r.emitted_ids) <= spec.depth + 1 for r in trace.rounds)


def test_refined_counts_put_the_chosen_shapes_own_rounds_in_place_of_the_wide_runs():
    cal = _calibration(0.01)
    drafter, target = models("similar")
    chain = [
        tree_generate(
            PROMPT, drafter, target, TreeSpec.explicit(auto_shape()), sampling=Sampling(0.0), max_new_tokens=24, seed=0
        )
    ]
    best = tree_auto.decide(cal).choice
    tree = sequoia.Candidate("tree", 9, 3, 2.0, 1.0, auto_shape())
    out = calibration.refined_counts(cal, tree, chain)
    mine = sequoia.acceptance_by_rank(*chain)
    for d, row in enumerate(mine):
        for k, (o, a) in enumerate(row):
            base = cal.rank_counts[d][k] if d < len(cal.rank_counts) and k < len(cal.rank_counts[d]) else (0, 0)
            assert out.rank_counts[d][k] == ((o, a) if o >= sequoia.MIN_COUNT else (base[0] + o, base[1] + a))
    assert out.refined == "tree of 9 nodes, depth 3" and out.chain_counts == cal.chain_counts
    from specviz import speculative_generate

    runs = [speculative_generate(PROMPT, drafter, target, gamma=2, sampling=Sampling(0.0), max_new_tokens=20)]
    out = calibration.refined_counts(out, best.chains[1], runs)
    from specviz.theory.tree import acceptance_by_depth

    assert out.chain_counts[:2] == list(acceptance_by_depth(*runs))[:2] and out.chain_counts[2:] == cal.chain_counts[2:]
    assert out.refined == "tree of 9 nodes, depth 3; chain of gamma 2"
    assert calibration.Calibration.from_dict(json.loads(json.dumps(out.to_dict()))) == out


def test_a_calibration_ends_within_the_round_its_stop_check_asks_it_to():
    """The calibration is work a visitor's job starts: its stop check is asked after every round of every
    run and before every timed pass size, and once it answers True nothing more runs."""
    from specviz.engine.stopping import Stopped

    drafter, target = models("similar")
    args = dict(max_new_tokens=12, max_depth=4, max_nodes=8, refine=0)  # refinements depend on timings: no fixed count
    asks = []

    def counted():
        asks.append(1)
        return False

    calibration.calibrate(drafter, target, [PROMPT, [4, 1]], Sampling(0.0), 8, stop=counted, **args)
    whole = len(asks)
    assert whole > 20  # every round of about 10 runs, and each v(n) size
    for at in (1, whole // 2, whole):  # the first round, mid-way, and the last pass size
        asks.clear()

        def stop_at(n=at):
            asks.append(1)
            return len(asks) >= n

        with pytest.raises(Stopped):
            calibration.calibrate(drafter, target, [PROMPT, [4, 1]], Sampling(0.0), 8, stop=stop_at, **args)
        assert len(asks) == at  # not asked again: nothing ran after it said stop


def test_a_stopped_calibration_keeps_what_it_measured_and_the_next_goes_on_from_it(tmp_path, monkeypatch):
    """Stopped at its fourth step (the texts are generated in one batch, the stop check asked before each step),
    the calibration is not cached as a calibration (nothing is chosen from it), but the three tokens of each
    text, the target's own greedy continuation, are stored; the next call for the same key generates only the
    five tokens left of each, and once complete the partial record is dropped."""
    from specviz.drafters import make_drafter
    from specviz.engine import batch
    from specviz.engine.stopping import Stopped

    monkeypatch.setenv("SPECVIZ_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(pair_auto, "_CACHE", {})
    model, target = models("similar")
    drafter = make_drafter("model", drafter_model=model, target=target)
    args = dict(max_new_tokens=8, max_nodes=6, max_depth=3, key=("lab", "cpu"))
    prompts = [PROMPT, [4, 1]]
    asks = []

    def stop_at_fourth_step():
        asks.append(1)
        return len(asks) >= 4

    with pytest.raises(Stopped):
        pair_auto.auto_tree(drafter, target, prompts, Sampling(0.0), 8, stop=stop_at_fourth_step, **args)
    assert not pair_auto._CACHE
    data = json.loads((tmp_path / "auto_tree.json").read_text())
    assert len(data) == 1 and next(iter(data)).endswith(pair_auto.PARTIAL)  # only the partial record
    kept = next(iter(data.values()))
    greedy = [
        autoregressive_generate(ids, target, sampling=Sampling(0.0), max_new_tokens=8, vocab_size=8).output_ids
        for ids in prompts
    ]
    assert kept["texts"] == [g[:3] for g in greedy] and kept["target_ms"] is None
    calls = []
    real = batch.autoregressive_generate_batch

    def counted(rows, *a, **k):
        calls.append((len(rows), k["max_new_tokens"]))
        out = real(rows, *a, **k)
        assert [list(r) + t.output_ids for r, t in zip(rows, out.traces)] == [
            list(p) + g for p, g in zip(prompts, greedy)
        ]
        return out

    monkeypatch.setattr(batch, "autoregressive_generate_batch", counted)
    done = pair_auto.auto_tree(drafter, target, prompts, Sampling(0.0), 8, **args)
    assert calls == [(2, 5)] and done.calibration.prompts == 2  # the first three tokens came from the store
    data = json.loads((tmp_path / "auto_tree.json").read_text())
    assert len(data) == 1 and not next(iter(data)).endswith(pair_auto.PARTIAL)


def test_a_tampered_partial_record_is_measured_again():
    good = {"texts": [[1, 2], []], "target_ms": {"0": 1.0, "4": 2.0}, "drafter_ms": None}
    assert calibration.check_partial(good, 2, 8, 8) == good
    for bad in (
        {"texts": [[9], []]},
        {"texts": [[1] * 9, []]},
        {"texts": [[1]]},
        {"texts": [[], []], "target_ms": {"4": 1.0}},
        {"texts": [[], []], "target_ms": {"0": float("nan")}},
        {"texts": [[True], []]},
        {"texts": [[], []], "extra": 1},
        [],
    ):
        with pytest.raises(ValueError):
            calibration.check_partial(bad, 2, 8, 8)


def test_per_rank_acceptance_is_p_at_the_drafters_kth_candidate():
    """Stand-in distributions over 4 tokens at 2 positions. Greedy: one-hot p; the drafter's ranking
    [2, 0, 3, 1] at position 0 puts the target's token 3 third. Sampled: p(x_k) for each candidate q gives
    mass (two), and the chain's sum of min(p, q)."""
    import torch

    p = torch.tensor([[0, 0, 0, 1.0], [1.0, 0, 0, 0]])
    logits = torch.tensor([[0.5, -1.0, 2.0, 0.1], [3.0, 0, 0, -1.0]])
    q = torch.nn.functional.one_hot(logits.argmax(-1), 4).float()
    out = calibration.position_acceptance(p, q, torch.softmax(logits, -1), max_rank=4)
    assert out.by_rank == ((0.0, 0.0, 1.0, 0.0), (1.0, 0.0, 0.0, 0.0)) and out.chain == (0.0, 1.0)
    p = torch.tensor([[0.5, 0.2, 0.2, 0.1]])
    q = torch.tensor([[0.1, 0.0, 0.9, 0.0]])
    out = calibration.position_acceptance(p, q, q, max_rank=3)
    assert len(out.by_rank) == 1 and out.by_rank[0] == pytest.approx((0.2, 0.5)) and out.chain == pytest.approx((0.3,))


def test_walks_over_teacher_forced_positions_give_exact_greedy_counts():
    """Greedy positions by hand (1 where the k-th candidate is the target's token): text A ranks the
    target's token 1, 2, none, 1, 1; text B 1, 1. The tree: two children at the root, one below the first.
    Rounds start at A0 (rank 1 accepted; at A1 the token is ranked 2 but the node offers one child: 2 tokens),
    A2 (nothing accepted: 1 token), A3 (rank 1, then rank 1 at A4: 3 tokens) and B0 (rank 1, rank 1: 3 tokens).
    Then the walks over the lab pair's teacher-forced texts give the counts its tree runs give."""
    one = lambda k: tuple(1.0 if j == k else 0.0 for j in range(1, 4))  # noqa: E731
    a = calibration.PositionAcceptance(
        by_rank=(one(1), one(2), one(0), one(1), one(1)), chain=(1.0, 0.0, 0.0, 1.0, 1.0)
    )
    b = calibration.PositionAcceptance(by_rank=(one(1), one(1)), chain=(1.0, 1.0))
    counts, available, (tokens, rounds) = calibration.walk_tree([a, b], (-1, -1, 0))
    assert counts == [[(4, 3), (4, 0)], [(3, 2)]]
    assert available == [(4, 4), (4, 4)] and (tokens, rounds) == (2 + 1 + 3 + 3, 4)
    assert calibration.walk_chain([a, b], 3) == [(4, 3), (3, 2)]
    # The same trees and chains run on the lab pair agree with the walks over its teacher-forced texts.
    drafter, target = models("similar")
    texts = [
        autoregressive_generate(ids, target, sampling=Sampling(0.0), max_new_tokens=12, vocab_size=8).output_ids
        for ids in (PROMPT, [4, 1])
    ]
    forced = [
        calibration.teacher_forced(drafter, target, ids, t, Sampling(0.0), 8) for ids, t in zip((PROMPT, [4, 1]), texts)
    ]
    shape = (-1, -1, 0, 0, 1, 2)
    runs = [
        tree_generate(ids, drafter, target, TreeSpec.explicit(shape), sampling=Sampling(0.0), max_new_tokens=12, seed=0)
        for ids in (PROMPT, [4, 1])
    ]
    counts, _, (tokens, rounds) = calibration.walk_tree(forced, shape)
    assert counts == sequoia.acceptance_by_rank(*runs)
    assert rounds == sum(len(r.rounds) for r in runs)


def _run_request(tree: str, max_new_tokens: int = 16):
    from specviz.ui.guard.request import RunRequest

    return RunRequest.checked(
        "embedded", "def f(n):", 4, 0, 0, 1.0, max_new_tokens, 0, False, "", "", "model", "constant", 1.0, tree
    )


def test_the_runs_time_limit_starts_after_the_auto_trees_calibration(monkeypatch):
    """A calibration that takes longer than the runs' shared limit (here 2 x 1 s) leaves them all of it:
    before, the limit started before the calibration and the run stopped after its first round."""
    from types import SimpleNamespace

    from specviz.ui.running import device
    from specviz.ui.tabs.tree import AUTO

    def slow_calibration(*args, stop=None, **kwargs):
        time.sleep(2.5)
        yield 1, 1
        return SimpleNamespace(
            tree=None, gamma=3, choice=SimpleNamespace(sentence=lambda: "auto: chain of gamma 3"), record=lambda: None
        )

    monkeypatch.setattr(pair_auto, "auto_for_pair_steps", slow_calibration)
    monkeypatch.setattr(device, "RUN_SECONDS_MAX", 1.0)
    events = list(device.run_on_device(_run_request(AUTO)))
    assert events[-1][0] == "done"
    spec, status = events[-1][1], events[-1][4]
    assert "time limit" not in status and spec.stop_reason != "time_limit" and len(spec.output_ids) == 16
    assert "auto: chain of gamma 3" in status
    assert events[0][0] == "calibrating" and "Stop ends it" in events[0][2]  # the page says what it waits for


@pytest.mark.slow
def test_stop_during_the_pages_calibration_ends_the_job_before_any_run(tmp_path, monkeypatch):
    """On the embedded pair, the real calibration: the job's check answers True at its third ask, and the
    device half ends there, with no run; the Generate handler then shows "Stopped by you" and the time
    cap of the calibration gives a message naming the field."""
    from types import SimpleNamespace

    import gradio as gr

    from specviz.ui.running import device

    from specviz.ui.tabs import generate, tree

    from specviz.ui.page import state
    from specviz.ui.tabs.tree import AUTO

    monkeypatch.setenv("SPECVIZ_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(pair_auto, "_CACHE", {})
    asks = []

    def stop_at_third():
        asks.append(1)
        return len(asks) >= 3

    events = list(device.run_on_device(_run_request(AUTO), stop_at_third))
    assert events[0][0] == "calibrating" and {e[0] for e in events[1:]} <= {"calibration"} and len(asks) == 3
    assert not pair_auto._CACHE

    # The handler: Stop pressed while the calibration runs.
    real = pair_auto.calibrate_steps
    session = "calibration-stop-test"

    def press_stop_then_calibrate(*args, stop=None, **kwargs):
        state.stop_asked.add(session)
        return (yield from real(*args, stop=stop, **kwargs))

    monkeypatch.setattr(pair_auto, "calibrate_steps", press_stop_then_calibrate)
    shown = list(
        generate.generate(
            "embedded",
            "def f(n):",
            4,
            0,
            0,
            1.0,
            16,
            0,
            False,
            "",
            "",
            "model",
            "constant",
            1.0,
            AUTO,
            progress=lambda *a, **k: None,
            request=SimpleNamespace(session_hash=session),
        )
    )
    state.stop_asked.discard(session)
    assert (
        shown[0]["status"].startswith("Token tree auto: measuring")
        and shown[-1]["status"] == "Stopped by you before the first round."
    )

    # Its own cap: at 0 s it ends at the first ask, and the visitor is told which field and what to choose.
    monkeypatch.setattr(pair_auto, "calibrate_steps", real)
    monkeypatch.setattr(tree, "CALIBRATION_SECONDS_MAX", 0.0)
    with pytest.raises(gr.Error) as err:
        list(device.run_on_device(_run_request(AUTO)))
    assert err.value.title == "Token tree" and "choose the chain" in err.value.message


def test_an_uncached_auto_job_is_never_sized_short_in_the_queue_or_when_giving_way():
    """A 1-token auto job is sized with its calibration: the seconds ZeroGPU is asked for it
    (``RunRequest.duration``), behind an 8-token chain job that came after it, and neither short enough to make
    a running job give way nor kept from giving way itself. Before, it was sized by its token (2.9 s) and
    counted as short."""
    from tests.test_device_order import ATTACKERS, VICTIM, _served, fake_queue, queued, run_data
    from specviz.ui.running import share, sizing
    from specviz.ui.guard.admission import order
    from specviz.ui.tabs.tree import AUTO

    assert (
        sizing.calibration_seconds(AUTO) == _run_request(AUTO, 1).duration() - _run_request("chain", 1).duration() > 0
    )
    auto_s = share.sized(4, 1, AUTO)
    assert auto_s >= sizing.calibration_seconds(AUTO) and auto_s > share.SHORT_S
    waiting = [queued(a, 1, arrived=100.0 + k, data=run_data(1, tree=AUTO)) for k, a in enumerate(ATTACKERS)]
    waiting.append(queued(VICTIM, 8, arrived=110.0))
    order(fake_queue(), waiting, "device")
    assert waiting[0]._id == VICTIM
    request, queue = _served(ATTACKERS[0])  # a running auto job gives way to the victim's 8-token job
    queue.append(queued(VICTIM, 8, 0.0))
    assert share.shorter_other_job(request, share.sized(4, 1, AUTO)) == VICTIM
    request, queue = _served(VICTIM)  # the victim's running 32-token job does not give way to an auto job
    queue.append(queued(ATTACKERS[1], 1, 0.0, data=run_data(1, tree=AUTO)))
    assert share.shorter_other_job(request, share.sized(4, 32)) is None


def test_while_calibrating_the_page_clears_the_last_verdict_and_says_what_it_measures():
    from specviz.serving import device_thread
    from specviz.ui.running import device
    from specviz.ui.tabs import generate

    out = list(generate._shown(("calibrating", None, device.CALIBRATING), None, None, device_thread.Owner()))
    assert len(out) == 1 and out[0]["status"] == device.CALIBRATING and out[0]["export_file"] is None
    # no speedup of the last run
    assert "measuring this pair first" in out[0]["headline"] and "×" not in out[0]["headline"]
    assert (
        "k-th candidate" in device.CALIBRATING
        and "v(n)" in device.CALIBRATING
        and "keeps what it measured" in device.CALIBRATING
    )


def test_this_processs_calibrations_are_bounded(monkeypatch):
    """Issue 53: a visitor asking for the auto tree at a new temperature each time made a new calibration each time,
    all kept for the process's life. The process keeps the most recently used MEMORY_ENTRIES (the disk its own)."""
    from specviz.pair import auto_tree as at

    monkeypatch.setattr(at, "_CACHE", at.OrderedDict())

    def calibration(*a, **k):
        return "calibration"
        yield

    monkeypatch.setattr(at, "calibrate_steps", calibration)
    monkeypatch.setattr(at, "decide", lambda cal, *a: cal)
    for t in range(at.MEMORY_ENTRIES + 5):
        at.auto_tree(object(), object(), [[1]], Sampling(temperature=0.3 + t / 100), 16, key=("pair", "cpu"))
    assert len(at._CACHE) == at.MEMORY_ENTRIES
    assert [k[2] for k in at._CACHE][-1] == json.dumps(
        Sampling(temperature=0.3 + (at.MEMORY_ENTRIES + 4) / 100).to_dict(), sort_keys=True
    )


@pytest.mark.slow
def test_the_pages_calibration_takes_device_steps_and_says_how_far_it_got(tmp_path, monkeypatch):
    """Issue 59/61: the auto tree's calibration is cut into steps, each one ``next`` of the device half (so the device
    thread runs other visitors' steps between them, ``specviz.serving.device_thread``), and its status says how many
    of its parts are measured and about how long the rest take. Its parts count up to all of them, and the choice is
    the one the calibration run at once makes."""
    from specviz.engine.stopping import run_steps
    from specviz.ui.running import device
    from specviz.ui.tabs.tree import AUTO

    monkeypatch.setenv("SPECVIZ_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(pair_auto, "_CACHE", {})
    monkeypatch.setattr(device, "STREAM_INTERVAL_MS", 0.0)  # every step says how far it got
    events = list(device.run_on_device(_run_request(AUTO)))
    steps = [e for e in events if e is not None and e[0] == "calibration"]
    told = [re.search(r"Measured (\d+) of (\d+) parts in \d+ s", e[2]) for e in steps]
    assert len(steps) > 10 and all(told)
    done = [int(m[1]) for m in told]
    total = int(told[0][2])
    assert done == sorted(done) and done[-1] == total and all(int(m[2]) == total for m in told)
    assert any("left at that pace" in e[2] for e in steps)
    assert events[-1][0] == "done"
    # the steps compute what the call at once does (greedy: the same texts, so the same counts)
    drafter, target = models("similar")
    # a refinement follows the timings: no fixed counts
    args = dict(max_new_tokens=12, max_depth=4, max_nodes=8, refine=0)
    told_at_once = []
    at_once = calibration.calibrate(
        drafter, target, [PROMPT, [4, 1]], Sampling(0.0), 8, progress=lambda *t: told_at_once.append(t), **args
    )
    stepped = run_steps(calibration.calibrate_steps(drafter, target, [PROMPT, [4, 1]], Sampling(0.0), 8, **args))
    assert (at_once.rank_counts, at_once.chain_counts) == (stepped.rank_counts, stepped.chain_counts)
    assert told_at_once[-1][0] == told_at_once[-1][1]
