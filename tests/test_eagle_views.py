"""The replay of an EAGLE run names, per round, the target position whose feature the drafts grew from.

The engine records it (``Round.features_from``) for chains, token trees and batch rows: the last
position the target scored and kept, two before the round's first draft. Traces saved before schema
7 load without it, a file's value is checked against the positions settled before its round, and the
panel shows it with the token there (escaped: a recording is data from outside). Compare drafters
gives an EAGLE run its own column (label and colour); the Explanation tab says in two sentences why
reading the target's features raises acceptance, and the drafter's description names its source.
"""

from __future__ import annotations

import re
from html import escape

import pytest

from specviz import Sampling, speculative_generate
from specviz.engine.tree.loop import tree_generate
from specviz.engine.tree.spec import TreeSpec
from specviz.trace import Trace
from specviz.views import round_html
from tests.test_drafters import outlier_llama
from tests.test_eagle import tiny_eagle

PROMPT = [1, 2, 3, 4, 5]


def _settled_before(trace: Trace, index: int) -> int:
    return len(trace.prompt_ids) + sum(len(r.emitted_ids) for r in trace.rounds[:index])


@pytest.mark.parametrize("tree", [None, TreeSpec.dynamic(8, depth=3, topk=3)], ids=["chain", "dynamic-tree"])
def test_each_round_records_and_shows_where_its_drafts_grew_from(tree):
    target = outlier_llama(outlier=20.0)

    def decode(ids):
        return [f"<t{i}>" for i in ids]  # markup-like texts: the panel must escape them

    tokenizer = type("Tok", (), {"decode": lambda self, ids, **k: "".join(decode(ids)),
                                 "batch_decode": lambda self, rows, **k: ["".join(decode(r)) for r in rows],
                                 "__len__": lambda self: 8})()
    kwargs = dict(sampling=Sampling(temperature=1.0), max_new_tokens=16, seed=2, tokenizer=tokenizer)
    if tree is None:
        trace = speculative_generate(PROMPT, tiny_eagle(target), target, gamma=3, **kwargs)
    else:
        trace = tree_generate(PROMPT, tiny_eagle(target), target, tree, **kwargs)
    shown = 0
    for i, r in enumerate(trace.rounds):
        drafted = r.drafted_count > 0
        assert (r.features_from is not None) == drafted
        html = round_html(trace, i)
        assert not re.search(r"<t\d", html) and re.search(r"&lt;t\d", html)  # the token texts shown, escaped
        if not drafted:
            assert "sv-features-from" not in html
            continue
        n = _settled_before(trace, i)
        assert r.features_from == n - 2  # the last position scored and kept; the pending token n - 1 is not yet scored
        assert f"position {n - 1}</b>" in html  # 1-based on the page
        where = f"prompt token {n - 1}" if n - 2 < len(PROMPT) else f"output token {n - 2 - len(PROMPT) + 1}"
        assert where in html
        shown += 1
    assert shown >= 3
    back = Trace.from_dict(trace.to_dict())
    assert [r.features_from for r in back.rounds] == [r.features_from for r in trace.rounds]


def test_other_drafters_and_old_recordings_have_no_such_line():
    from specviz.lab import models

    drafter, target = models("different")
    trace = speculative_generate([1, 2, 3], drafter, target, gamma=3, max_new_tokens=8, seed=1)
    assert all(r.features_from is None for r in trace.rounds)
    assert "sv-features-from" not in round_html(trace, 0)
    d = trace.to_dict()
    d["schema_version"] = 6
    for r in d["rounds"]:
        del r["features_from"]
    assert all(r.features_from is None for r in Trace.from_dict(d).rounds)


def test_a_files_features_from_must_be_a_position_scored_before_its_round():
    target = outlier_llama(outlier=20.0)
    trace = speculative_generate(PROMPT, tiny_eagle(target), target, gamma=3, sampling=Sampling(0.0), max_new_tokens=12)
    i = next(k for k, r in enumerate(trace.rounds) if r.features_from is not None and k > 0)
    for bad in (_settled_before(trace, i) - 1, -1, 10**9, 2.5):  # (pydantic reads "3" as 3, as for every whole field)
        d = trace.to_dict()
        d["rounds"][i]["features_from"] = bad
        with pytest.raises(ValueError, match=rf"rounds\.{i}\.features_from|features_from"):
            Trace.from_dict(d)



def test_compare_drafters_has_an_eagle_column():
    """Every drafter kind has a label and a colour in Compare drafters; an EAGLE run gets its own column."""
    from specviz import autoregressive_generate
    from specviz.drafters import KINDS
    from specviz.measure.comparison import Comparison
    from specviz.views.compare import COLOURS, LABELS, compare_figure, compare_html

    assert set(KINDS) <= set(COLOURS) and set(KINDS) <= set(LABELS)
    target = outlier_llama(outlier=20.0)
    spec = speculative_generate(PROMPT, tiny_eagle(target), target, gamma=3, max_new_tokens=8, seed=1)
    base = autoregressive_generate(PROMPT, target, max_new_tokens=8, seed=1)
    comparison = Comparison(runs={"eagle": (spec, base)}, kinds=("model", "eagle"))
    html = compare_html(comparison)
    # the model column is still running
    assert escape(LABELS["eagle"]) in html and COLOURS["eagle"] in html and "running" in html
    assert any(t.name == LABELS["eagle"] for t in compare_figure(comparison).data)


def test_the_page_says_why_reading_the_targets_features_raises_acceptance_and_names_eagles_source():
    import re

    from specviz.drafters import DESCRIPTIONS
    from specviz.views.explain import explanation_markdown

    text = explanation_markdown()
    para = text[text.index("**Why EAGLE accepts more.**"):].split("\n\n")[0]
    body = para.replace("**Why EAGLE accepts more.**", "").replace("Li et al.", "Li et al")
    assert len(re.findall(r"[.!?](?:\s|$)", body.strip())) == 2  # two sentences
    assert "hidden state" in para and "Li et al. 2024" in para
    assert "Li et al. 2024" in DESCRIPTIONS["eagle"]
