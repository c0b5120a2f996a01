"""The auto tree end to end on tiny models: explicit trees draft and emit the target's greedy output,
the calibration measures what the choice needs, and the choice is stated with its inputs.

Timings on a shared machine vary, so no test asserts which shape a measured calibration chooses;
``decide`` is tested on a calibration built by hand. The statistical test of an auto-chosen shape's
output law is in tests/test_tree_exactness.py.
"""

from __future__ import annotations

import json

import pytest

from specviz import Sampling, autoregressive_generate
from specviz.engine.tree.loop import tree_generate
from specviz.engine.tree.spec import TreeSpec
from specviz.lab import PROMPT, models
from specviz.measure import auto_tree
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
        for cached in (True, False):
            trace = tree_generate(prompt, drafter, target, spec, sampling=Sampling(0.0), max_new_tokens=20, seed=0, cached=cached)
            assert trace.output_ids == plain.output_ids


def test_calibration_measures_every_input_and_the_choice_states_them():
    drafter, target = models("similar")
    cal = auto_tree.calibrate(drafter, target, [PROMPT, [4, 1]], Sampling(0.0), 8, max_new_tokens=12, max_depth=4, max_nodes=8)
    assert cal.prompts == 2 and cal.tokens == 12
    assert set(cal.verify_curve) == {1, 2, 3, 4, 6, 8} and all(v > 0 for v in cal.verify_curve.values())
    assert cal.tree_pass_cost > 0 and cal.chain_step_cost > 0 and cal.target_step_ms > 0
    for row in cal.rank_counts:
        assert all(0 <= a <= o for o, a in row)
    # At one reached parent at most one child is accepted: per depth, accepted over ranks <= offered at rank 1.
    assert all(sum(a for _, a in row) <= row[0][0] for row in cal.rank_counts)
    assert all(0 <= a <= o for o, a in cal.chain_counts)
    auto = auto_tree.decide(cal, max_nodes=8, max_depth=4)
    d = auto.describe()
    json.dumps(d)
    assert d["inputs"]["acceptance_by_rank"] == cal.rank_counts and d["sentence"].startswith("auto: ")
    assert auto.choice.best.speedup >= auto.choice.best_chain.speedup


def _calibration(v_slope: float) -> auto_tree.Calibration:
    """A calibration by hand: a ranked drafter whose second choice often wins, a chain at 0.6."""
    return auto_tree.Calibration(rank_counts=[[(100, 55), (100, 25), (100, 8)]] * 6, chain_counts=[(100, 60)] * 6,
                                 verify_curve={1: 1.0, 64: 1.0 + 63 * v_slope}, tree_pass_cost=0.1, chain_step_cost=0.1,
                                 target_step_ms=10.0, calibration_tree=(-1,), prompts=3, tokens=64)


def test_decide_picks_a_tree_on_a_flat_device_and_a_small_one_or_a_chain_on_a_steep_one():
    flat, steep = auto_tree.decide(_calibration(0.002)), auto_tree.decide(_calibration(0.2))
    assert flat.tree is not None and flat.tree.max_nodes > 8
    assert steep.tree is None or steep.tree.max_nodes < flat.tree.max_nodes
    assert flat.gamma == flat.choice.best.depth
    for a in (flat, steep):
        assert a.choice.best.speedup >= a.choice.best_chain.speedup


def test_bench_report_puts_prediction_beside_measurement():
    auto = auto_tree.decide(_calibration(0.002))

    class T:
        def __init__(self, rounds, out, drafted):
            self.rounds, self.output_ids, self.drafted = [None] * rounds, [0] * out, drafted

    traces = {"speculative": [T(10, 30, 40)], "speculative_auto": [T(10, 33, 200)], "speculative_best_chain": [T(10, 31, 50)]}
    med = {"autoregressive": 10.0, "speculative": 12.0, "speculative_auto": 15.0, "speculative_best_chain": 13.0}
    r = auto_tree.bench_report(auto, traces, med, gamma=99)
    assert r["measured"]["tokens_per_round"] == 3.3 and r["measured"]["speedup"] == 1.5
    assert r["speedup_vs_best_measured_chain"] == pytest.approx(1.5 / 1.3)
    assert r["tokens_per_round_error"] == pytest.approx(3.3 / auto.choice.best.tokens_per_round - 1)
    text = "\n".join(auto_tree.format_bench_report(r))
    assert "auto: tree of" in text and "chain of gamma 99" in text and "d1: 55/100 25/100 8/100" in text


@pytest.mark.slow
def test_the_pages_auto_choice_runs_and_keeps_the_targets_greedy_output(embedded):
    """The page's "auto" menu entry on the embedded pair: calibrated once (the second call is the
    cache's), stated in one sentence, and a greedy run with it emits the target's own tokens."""
    from specviz import speculative_generate
    from specviz.drafters import make_drafter
    from specviz.ui.tree import AUTO, TREES, resolve_tree

    assert AUTO in TREES
    drafter = make_drafter("model", drafter_model=embedded.drafter, target=embedded.target)
    tree, gamma, sentence = resolve_tree(AUTO, embedded, drafter, Sampling(0.0), 4)
    assert resolve_tree(AUTO, embedded, drafter, Sampling(0.0), 4)[1:] == (gamma, sentence)
    assert sentence.startswith("auto: ") and "best chain (gamma" in sentence and 1 <= gamma <= 8
    assert resolve_tree("chain", embedded, drafter, Sampling(0.0), 4) == (None, 4, "")
    ids = embedded.tokenizer("def fibonacci(n):\n    ", add_special_tokens=False)["input_ids"]
    plain = autoregressive_generate(ids, embedded.target, sampling=Sampling(0.0), max_new_tokens=32, vocab_size=embedded.vocab_size)
    trace = speculative_generate(ids, drafter, embedded.target, gamma=gamma, tree=tree, sampling=Sampling(0.0), max_new_tokens=32,
                                 vocab_size=embedded.vocab_size)
    assert trace.output_ids == plain.output_ids


def test_the_budget_figure_and_the_rank_table_show_the_choice_and_its_counts():
    from specviz.views.tree_budget import budget_figure, rank_table_html

    d = auto_tree.decide(_calibration(0.002)).describe()
    fig = budget_figure(d, {"nodes_per_round": 20.0, "speedup": 1.4})
    names = [t.name for t in fig.data]
    assert names[0].startswith("best tree") and any(n.startswith("best chain, gamma") for n in names) and names[-1] == "measured"
    assert list(fig.data[0].x) == [n for n, _ in d["speedup_by_budget"]]
    assert fig.data[2].y[0] == d["predicted_speedup"]
    drafter, target = models("different")
    trace = tree_generate(PROMPT, drafter, target, TreeSpec.explicit(auto_shape()), sampling=Sampling(1.0), max_new_tokens=12, seed=4)
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
    trace = tree_generate(ids, drafter, target, TreeSpec.explicit(auto_shape()), sampling=Sampling(0.0), max_new_tokens=24)
    ref = target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), do_sample=False,
                          max_new_tokens=24, pad_token_id=0, eos_token_id=None)
    assert_same_greedy(target, ids, trace.output_ids, ref[0, len(ids):].tolist())
    assert trace.drafted > 0 and trace.accepted > 0
    assert trace.drafter_forward_passes == drafter.passes
