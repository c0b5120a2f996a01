"""Token trees: the mask, the caches after a round, greedy equality, the trace and its checks.

The statistical tests of the tree's output law are in tests/test_tree_exactness.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specviz import Sampling, autoregressive_generate, speculative_generate
from specviz.drafters import PromptLookupDrafter
from specviz.lab import PROMPT, models, tiny_lm
from specviz.engine.runner import ModelRunner
from specviz.trace import Trace
from specviz.theory import tree as theory
from specviz.engine.tree.attention import ancestor_matrix, compact, masked_logits
from specviz.engine.tree.loop import tree_generate
from specviz.engine.tree.spec import TreeSpec, parse_shape

# fp32: a node's logits under the tree mask and those of a separate pass over its own path come
# from matmuls and softmaxes of different shapes (masked keys weigh exactly 0 after exp of the
# dtype's minimum), so they differ by reduction order only: measured up to 1.2e-6 on these models.
FP32_TOLERANCE = 1e-5


def _llama():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=16,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("cached", ["dynamic", "re-fed"])
def test_each_node_sees_only_its_own_path(family, cached):
    model = tiny_lm(vocab=16, layers=2, init=0.3, n_positions=64) if family == "gpt2" else _llama()
    prefix = 5
    seq = torch.tensor([1, 2, 3, 4, 5] + [0] * 8)
    # slot 0: the pending token; siblings and cousins at several depths
    parents = [-1, 0, 0, 0, 1, 1, 2, 4, 4, 6]
    tokens = torch.tensor([5, 7, 8, 9, 10, 11, 12, 13, 14, 15])
    depth = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    runner = ModelRunner(model, 16, cached == "dynamic")
    runner.prefill(seq, prefix - 1)
    with torch.inference_mode():
        logits = masked_logits(
            runner,
            seq,
            prefix - 1,
            tokens,
            torch.tensor([prefix - 1 + d for d in depth]),
            ancestor_matrix(parents),
            len(parents),
        )
        for i in range(len(parents)):
            path, j = [], i
            while j >= 0:
                path.append(j)
                j = parents[j]
            ids = torch.cat([seq[: prefix - 1], tokens[list(reversed(path))]])
            alone = model(input_ids=ids[None]).logits[0, -1]
            assert torch.allclose(logits[i], alone, atol=FP32_TOLERANCE, rtol=0), (i, (logits[i] - alone).abs().max())


@pytest.mark.parametrize("how", ["gather", "refeed"])
def test_compacted_cache_equals_the_path_fed_alone(how):
    model = _llama()
    seq = torch.tensor([1, 2, 3, 4, 0, 0, 0, 0, 0, 0])
    parents, tokens = [-1, 0, 0, 1, 2, 2], torch.tensor([4, 6, 7, 8, 9, 10])
    runner = ModelRunner(model, 16, True)
    runner.prefill(seq, 3)
    with torch.inference_mode():
        masked_logits(runner, seq, 3, tokens, torch.tensor([3, 4, 4, 5, 5, 5]), ancestor_matrix(parents), 6)
        seq[4:6] = torch.tensor([7, 10])  # the path: slot 2, then its second child (slot 5)
        seq[6] = 3
        compact(runner, seq, 3, [0, 2, 5], how)
        assert runner.seen == 6 and runner.cache.get_seq_length() == 6
        cached = runner.logits(seq, 7, 1)[0]
        alone = model(input_ids=seq[None, :7]).logits[0, -1]
    assert torch.allclose(cached, alone, atol=FP32_TOLERANCE, rtol=0)


class _Spy:
    """Logs every forward call of the models it watches, in order: (name, 4-D mask or not, logits)."""

    def __init__(self, **named):
        self.calls = []
        for name, model in named.items():
            model.register_forward_hook(
                lambda m, a, kw, out, name=name: self.calls.append(
                    (
                        name,
                        kw.get("attention_mask") is not None and kw["attention_mask"].dim() == 4,
                        out.logits[0].detach().clone(),
                    )
                ),
                with_kwargs=True,
            )

    def rounds(self):
        """Per round: (the verify pass's logits, the drafter's last plain pass before it: its catch-up to
        the pending token; refeeds and tree passes come elsewhere)."""
        out, last_plain = [], None
        for name, tree_mask, logits in self.calls:
            if name == "drafter" and not tree_mask:
                last_plain = logits
            elif name == "target" and tree_mask:
                out.append((logits, last_plain))
        return out


@pytest.mark.parametrize(
    "spec", [TreeSpec.static((3, 2, 1)), TreeSpec.dynamic(8, depth=3, topk=3)], ids=["static", "dynamic"]
)
@pytest.mark.parametrize("how", ["gather", "refeed"])
def test_after_each_round_the_cached_logits_equal_an_uncached_recompute(spec, how):
    """The first row of each verify pass (the pending token's, from the compacted cache) and the drafter's
    catch-up pass of each round equal a fresh pass over the whole sequence so far."""
    drafter, target = models("different")
    spy = _Spy(drafter=drafter, target=target)
    trace = tree_generate(
        PROMPT, drafter, target, spec, sampling=Sampling(1.0), max_new_tokens=14, seed=3, compaction=how
    )
    rounds = spy.rounds()
    assert len(rounds) == len(trace.rounds) >= 3
    context = list(PROMPT)
    with torch.inference_mode():
        for r, (p_logits, q_logits) in zip(trace.rounds, rounds):
            ids = torch.tensor([context])
            assert torch.allclose(p_logits[0], target(ids).logits[0, -1], atol=FP32_TOLERANCE, rtol=0)
            assert torch.allclose(q_logits[-1], drafter(ids).logits[0, -1], atol=FP32_TOLERANCE, rtol=0)
            context += r.emitted_ids


@pytest.mark.parametrize(
    "spec",
    [TreeSpec.static((3, 2, 1)), TreeSpec.static((2, 2), "sampled"), TreeSpec.dynamic(10, depth=4, topk=3)],
    ids=["static", "sampled", "dynamic"],
)
def test_cached_and_uncached_trees_emit_the_same_tokens(spec):
    drafter, target = models("similar")
    for sampling in (Sampling(0.0), Sampling(1.0, top_k=5)):
        a = tree_generate(PROMPT, drafter, target, spec, sampling=sampling, max_new_tokens=16, seed=5)
        b = tree_generate(PROMPT, drafter, target, spec, sampling=sampling, max_new_tokens=16, seed=5, cached="re-fed")
        assert a.output_ids == b.output_ids


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec",
    [TreeSpec.static((3, 2, 2, 1)), TreeSpec.dynamic(24, depth=6, topk=4), "lookup"],
    ids=["static", "dynamic", "lookup"],
)
def test_greedy_tree_equals_the_targets_greedy_decoding(embedded, spec):
    prompts = [
        "def fibonacci(n):\n    ",
        "import os\n\n\ndef main(args):\n    ",
        "class Stack:\n    def __init__(self):\n        self.items = []\n",
    ]
    drafter = PromptLookupDrafter(3) if spec == "lookup" else embedded.drafter
    tree = TreeSpec.static((4, 1, 1, 1, 1)) if spec == "lookup" else spec
    for text in prompts:
        ids = embedded.tokenizer(text, add_special_tokens=False)["input_ids"]
        plain = autoregressive_generate(
            ids, embedded.target, sampling=Sampling(0.0), max_new_tokens=48, vocab_size=embedded.vocab_size
        )
        trace = speculative_generate(
            ids,
            drafter,
            embedded.target,
            sampling=Sampling(0.0),
            max_new_tokens=48,
            tree=tree,
            vocab_size=embedded.vocab_size,
        )
        assert trace.output_ids == plain.output_ids
        assert trace.mean_tokens_per_round > 1.0
        Trace.from_dict(json.loads(json.dumps(trace.to_dict())))


def test_prompt_lookup_branches_are_distinct_earlier_matches():
    _, target = models("similar")
    prompt = [1, 2, 3, 1, 2, 4, 5, 1, 2, 3, 6, 1, 2]
    trace = tree_generate(
        prompt, PromptLookupDrafter(2), target, TreeSpec.static((3, 1, 1)), sampling=Sampling(1.0), max_new_tokens=4
    )
    tree = trace.rounds[0].tree
    # "1 2" occurs before at 0, 3 and 7: continuations (3 6 1), (4 5 1), (3 1 2): a trie of 3 at the root
    # with 2 children (3 merges two of them), then one child each.
    roots = [n for n in tree.nodes if n.parent == -1]
    assert sorted(n.token_id for n in roots) == [3, 4]
    assert len(tree.nodes) == 2 + 3 + 3
    assert all(n.q == 1.0 for n in tree.nodes) and tree.rule == "without-replacement"
    assert {n.source for n in roots} == {9, 5}  # the most recent copy of each first token


def _tree_trace():
    drafter, target = models("different")
    return tree_generate(
        PROMPT, drafter, target, TreeSpec.static((3, 2)), sampling=Sampling(1.0), max_new_tokens=12, seed=1
    )


def test_a_tree_trace_round_trips_and_counts_its_nodes():
    trace = _tree_trace()
    again = Trace.from_dict(json.loads(json.dumps(trace.to_dict())))
    assert again.to_dict() == trace.to_dict()
    assert trace.drafted == sum(len(r.tree.nodes) for r in trace.rounds)
    assert trace.accepted == sum(len(r.tree.path) for r in trace.rounds)
    assert trace.rejected == sum(n.verdict == "rejected" for r in trace.rounds for n in r.tree.nodes)
    for r in trace.rounds:
        assert [d.token_id for d in r.drafts] == [r.tree.nodes[i].token_id for i in r.tree.path]


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda t: t["rounds"][0]["tree"]["nodes"][0].update(parent=3), "tree.nodes.0.parent"),
        (lambda t: t["rounds"][0]["tree"]["nodes"][1].update(depth=2), "tree.nodes.1.depth"),
        (lambda t: t["rounds"][0]["tree"]["nodes"][0].update(u=1.5), "tree.nodes.0.u"),
        (lambda t: t["rounds"][0]["tree"].update(nodes=t["rounds"][0]["tree"]["nodes"] * 50), "tree.nodes"),
        (lambda t: next(r for r in t["rounds"] if r["tree"]["path"])["tree"].update(path=[]), "tree.path"),
    ],
)
def test_a_tampered_tree_is_refused_naming_the_field(edit, field):
    d = json.loads(json.dumps(_tree_trace().to_dict()))
    edit(d)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        Trace.from_dict(d)


def test_a_verdict_against_its_test_is_refused():
    d = json.loads(json.dumps(_tree_trace().to_dict()))
    for r in d["rounds"]:
        for node in r["tree"]["nodes"]:
            if node["verdict"] == "rejected":
                node["u"] = 0.0
                with pytest.raises(ValueError, match="rejected although u"):
                    Trace.from_dict(d)
                return
    pytest.fail("no rejected node to tamper with")


def test_a_chain_trace_of_schema_4_still_loads():
    drafter, target = models("similar")
    d = speculative_generate(PROMPT, drafter, target, gamma=3, sampling=Sampling(1.0), max_new_tokens=8).to_dict()
    d["schema_version"] = 4
    for r in d["rounds"]:
        del r["tree"]
    assert Trace.from_dict(d).rounds[0].tree is None


def test_tree_specs_refuse_what_is_out_of_range():
    assert parse_shape("3,2,2,1") == (3, 2, 2, 1)
    assert TreeSpec.static((3, 2, 2, 1)).max_nodes == 33
    for bad in ("3,x", "0,2", "17", ",".join(["1"] * 17), "8,8,8"):
        with pytest.raises(ValueError):
            parse_shape(bad)
    for budget in (0, 129, True):
        with pytest.raises(ValueError, match="tree-dynamic"):
            TreeSpec.dynamic(budget)
    with pytest.raises(ValueError, match="repetition penalty"):
        tree_generate(PROMPT, *models("similar"), TreeSpec.static((2,)), sampling=Sampling(1.0, repetition_penalty=1.2))


def test_expected_tokens_from_per_depth_acceptance_is_eq_1_for_a_chain():
    from specviz.theory import expected_tokens_per_round

    for alpha in (0.3, 0.8):
        assert theory.expected_tokens_per_round([alpha] * 4) == pytest.approx(expected_tokens_per_round(alpha, 4))
    trace = _tree_trace()
    counts = theory.acceptance_by_depth(trace)
    assert counts[0][0] == len(trace.rounds)
    assert sum(a for _, a in counts) == trace.accepted


def test_the_tree_figure_draws_every_node_and_escapes_token_text():
    from specviz.views.tree import depth_figure, tree_figure

    trace = _tree_trace()
    r = next(k for k, x in enumerate(trace.rounds) if x.tree.rejected)
    rnd = trace.rounds[r]
    rnd.tree.nodes[0].text = '<b>"x"</b>'
    fig = tree_figure(trace, r)
    shown = [
        n
        for t in fig.data
        if t.mode == "markers+text" and t.name in ("accepted", "rejected", "never tested")
        for n in t.x
    ]
    assert len(shown) == len(rnd.tree.nodes)
    texts = [x for t in fig.data if t.text is not None for x in t.text]
    assert any('&lt;b&gt;"x"&lt;/b&gt;' in x for x in texts) and not any("<b>" in x for x in texts)
    # Each tested node's label ends with its acceptance probability (the test), the untested ones with their token.
    for t in fig.data:
        if t.name in ("accepted", "rejected", "never tested"):
            nodes = [n for n in rnd.tree.nodes if n.verdict == {"never tested": "discarded"}.get(t.name, t.name)]
            for label, n in zip(t.text, nodes):
                assert (" · " in label) == (n.accept_prob is not None)
                assert n.accept_prob is None or label.endswith(f" · {n.accept_prob:.2f}")
    # Labelled: the accepted path's nodes carry a tick, the final token names its kind; the title fits a phone.
    k = next(k for k, x in enumerate(trace.rounds) if x.tree.path)
    path = [t for t in tree_figure(trace, k).data if t.name == "accepted"]
    assert sum(x.startswith("✓ ") for x in path[0].text) == len(trace.rounds[k].tree.path)
    final = [t for t in fig.data if t.name in ("correction token", "bonus token")]
    assert final and final[0].text[0].startswith(("correction: ", "bonus: "))
    assert len(fig.layout.title.text) <= 34 and "rejection sampling" in fig.layout.title.subtitle.text
    assert depth_figure(trace).data


def test_the_path_length_law_is_the_capped_geometric_one_for_a_constant_rate():
    from specviz.theory import accepted_drafts_distribution

    for alpha, depth in ((0.3, 4), (0.8, 6)):
        assert theory.path_length_distribution([alpha] * depth, depth) == pytest.approx(
            accepted_drafts_distribution(alpha, depth)
        )
    law = theory.path_length_distribution([0.9, 0.5], 4)  # depths 3 and 4 never measured: the walk stops at 2
    assert sum(law) == pytest.approx(1.0) and law == pytest.approx([0.1, 0.45, 0.45, 0.0, 0.0])


def test_a_tree_runs_numbers_are_a_trees_predictions():
    """The page's numbers for a tree: no Thm 3.8 (a chain's, with a gamma the tree does not have);
    the prediction is E[tokens] from the measured acceptance by depth over (drafting + v), in target
    steps; the acceptance by depth is accepted / offered per depth."""
    from specviz.views.stats import stats_html, summary
    from specviz.views.theory import accepted_histogram_figure, position_figure, speedup_figure

    drafter, target = models("different")
    trace = _tree_trace()
    base = autoregressive_generate(PROMPT, target, sampling=Sampling(1.0), max_new_tokens=12, seed=1)
    s = summary(trace, base)
    rates = theory.depth_rates(theory.acceptance_by_depth(trace))
    assert s["tree"] and s["gamma"] is None and s["predicted_speedup"] is None
    assert s["acceptance_by_depth"] == rates and s["nodes_per_round"] == trace.drafted / len(trace.rounds)
    assert s["predicted_tokens_per_round"] == pytest.approx(theory.expected_tokens_per_round(rates))
    step = base.verify_ms / len(base.rounds)
    drafting = trace.draft_ms / len(trace.rounds) / step
    v = trace.verify_ms / len(trace.rounds) / step
    assert s["predicted_speedup_verify"] == pytest.approx(theory.expected_tokens_per_round(rates) / (drafting + v))
    html = stats_html(trace, base)
    assert "tokens per round, predicted" in html and "acceptance by depth" in html and "Thm 3.8 is a chain" in html
    assert position_figure(trace).layout.title.text.startswith("Acceptance by depth")
    speed = speedup_figure(trace, base)
    # a tree's prediction, no gamma curve
    assert list(speed.data[0].y)[0] == pytest.approx(s["predicted_speedup_verify"])
    hist = accepted_histogram_figure(trace)
    depth = theory.typical_depth(trace)
    assert list(hist.data[1].y) == pytest.approx(theory.path_length_distribution(rates, depth))
    assert "tree" not in summary(
        tree_free := autoregressive_generate(PROMPT, target, sampling=Sampling(1.0), max_new_tokens=4, seed=1)
    )
    assert not tree_free.has_tree


def test_tree_rules_carry_the_literatures_names_and_old_recordings_still_load():
    """Recursive rejection sampling without replacement (top-k children) and with replacement
    (sampled children); a tree round has a depth, no gamma. A recording with the old names
    ("one-hot", "specinfer") and a gamma per tree round loads under the new names."""
    drafter, target = models("different")
    topk = _tree_trace()
    sampled = tree_generate(
        PROMPT, drafter, target, TreeSpec.static((3, 2), "sampled"), sampling=Sampling(1.0), max_new_tokens=8, seed=1
    )
    assert {r.tree.rule for r in topk.rounds} == {"without-replacement"} and {r.tree.rule for r in sampled.rounds} == {
        "with-replacement"
    }
    assert (
        topk.settings["gamma"] is None
        and all(r.gamma is None for r in topk.rounds)
        and topk.settings["tree"]["depth"] == 2
    )
    old = json.loads(json.dumps(sampled.to_dict()))
    old["schema_version"], old["settings"]["gamma"] = 5, 2
    for r in old["rounds"]:
        r["tree"]["rule"] = "specinfer"
        r["tree"].pop("drafter_passes")
        r["gamma"] = r["tree"] and max(n["depth"] for n in r["tree"]["nodes"])
    loaded = Trace.from_dict(old)
    assert {r.tree.rule for r in loaded.rounds} == {"with-replacement"} and old["rounds"][0]["tree"][
        "rule"
    ] == "specinfer"
    assert loaded.output_ids == sampled.output_ids


@pytest.mark.parametrize("rule", ["with-replacement", "without-replacement"])
@pytest.mark.parametrize("with_q", [True, False], ids=["q", "no-q"])
def test_greedy_judging_from_argmaxes_is_the_judging_of_one_hot_rows(rule, with_q):
    """judge_greedy (each slot's argmax) gives exactly judge's verdicts and records on greedy's one-hot p, for
    random trees whose children often hit the argmax, with tied logits, duplicated siblings and q one-hot at the
    argmax (a rejection then leaves no mass: the siblings' mass record falls to 0)."""
    from specviz.engine.tree.accept import judge, judge_greedy

    rng = torch.Generator().manual_seed(3)
    vocab, checked = 10, 0
    for trial in range(60):
        n = int(torch.randint(1, 16, (1,), generator=rng))
        parents = [int(torch.randint(-1, i, (1,), generator=rng)) if i else -1 for i in range(n)]
        logits = torch.randint(0, 3, (n + 1, vocab), generator=rng).float()  # ties at the top are common
        p_all = Sampling(0.0).probs(logits)
        best = logits.max(dim=-1).indices
        assert torch.equal(best, p_all.argmax(dim=-1))
        hit = torch.rand(n, generator=rng) < 0.4
        tokens = torch.where(hit, best[torch.tensor(parents) + 1], torch.randint(0, vocab, (n,), generator=rng))
        q = None
        if with_q:
            q_slot = torch.softmax(3 * torch.randn(n + 1, vocab, generator=rng), dim=-1)
            q_slot[trial % (n + 1)] = torch.nn.functional.one_hot(best[trial % (n + 1)], vocab).float()
            q = q_slot[torch.tensor(parents) + 1]  # siblings share their parent's q
        slow = judge(p_all, tokens, parents, q, rule, True, torch.Generator().manual_seed(trial))
        fast = judge_greedy(best, tokens, parents, q, rule, torch.Generator().manual_seed(trial))
        assert set(fast) == set(slow) - {"residual"}
        for key, value in fast.items():
            assert torch.equal(value, slow[key]), (trial, key, value, slow[key])
        checked += int(fast["accepted"].sum())
    assert checked > 20  # accepted children were judged, not only rejections


@pytest.mark.parametrize("rule", ["with-replacement", "without-replacement"])
@pytest.mark.parametrize("with_q", [True, False], ids=["q", "no-q"])
def test_judging_on_the_columns_with_mass_is_judging_on_the_whole_vocabulary(rule, with_q, monkeypatch):
    """A sampled tree round judged over ``mass_columns`` (the columns where some slot's p is positive, and the
    nodes' tokens) gives the verdicts, accepted children and final tokens of the round judged over the whole
    vocabulary, exactly, with the same random draws; the recorded probabilities agree to float32 rounding (their
    normalising sums run over fewer zeros). Random trees under top-k and top-p, nodes often outside the target's
    nucleus; q from a different model, so rejections and corrections are common."""
    from specviz.engine.drafter import DraftTree
    from specviz.engine.tree import loop

    rng = torch.Generator().manual_seed(5)
    vocab, used, corrections = 300, 0, 0
    for trial in range(80):
        n = int(torch.randint(1, 14, (1,), generator=rng))
        parents = [int(torch.randint(-1, i, (1,), generator=rng)) if i else -1 for i in range(n)]
        depths = []
        for parent in parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        sampling = Sampling(0.8, top_k=[0, 6, 40][trial % 3], top_p=[0.9, 1.0, 0.8][trial % 3])
        warpers = sampling.warpers()
        logits = 4 * torch.randn(n + 1, vocab, generator=rng)
        q = None
        if with_q:
            q_slot = sampling.probs(logits + 2 * torch.randn(n + 1, vocab, generator=rng), warpers)
            q = q_slot[torch.tensor(parents) + 1]
        p_slot = sampling.probs(logits, warpers)
        likely = p_slot[torch.tensor(parents) + 1].multinomial(1, generator=rng)[:, 0]
        tokens = torch.where(torch.rand(n, generator=rng) < 0.7, likely, torch.randint(0, vocab, (n,), generator=rng))
        drafted = DraftTree(tokens=tokens, parents=parents, depths=depths, q=q, rule=rule)
        fast = loop.judge_slots(
            logits, drafted, sampling, warpers, torch.Generator().manual_seed(trial), loop.NO_FAULT, 10
        ).fetch()
        cols = loop.mass_columns(p_slot, logits, tokens, 10)
        used += cols is not None and cols.numel() < vocab
        with monkeypatch.context() as m:
            m.setattr(loop, "mass_columns", lambda *a: None)
            slow = loop.judge_slots(
                logits, drafted, sampling, warpers, torch.Generator().manual_seed(trial), loop.NO_FAULT, 10
            ).fetch()
        assert set(fast) == set(slow)
        for key in ("accepted", "accepted_child", "finals", "tokens", "finite", "u"):
            assert fast[key] == slow[key], (trial, key)
        for key in ("p", "p_residual", "q", "accept_prob", "mass", "final_probs", "top_prob"):
            assert fast[key] == pytest.approx(slow[key], abs=1e-6), (trial, key)
        # the records' top tokens of p': the same where p' is positive (zeros tie, and either side may list
        # any token of p' 0, with its own p and q)
        for i, (a, b, pa) in enumerate(zip(fast["top_ids"], slow["top_ids"], fast["top_prob"])):
            assert a == b or pa == 0.0, (trial, a, b)
            if a == b:
                assert (fast["top_p"][i], fast["top_q"][i]) == pytest.approx(
                    (slow["top_p"][i], slow["top_q"][i]), abs=1e-6
                )
        corrections += sum(1 for slot, child in enumerate(fast["accepted_child"]) if child < 0 and slot == 0)
    assert used >= 60 and corrections >= 5  # the column path ran, and rounds ended in corrections at the root


def test_a_tree_round_records_the_drafters_entropy_and_the_figure_draws_it():
    """Each node keeps H(q) in bits of the q it was drawn from: round 1's depth-1 nodes the drafter's
    entropy after the context (recomputed here from the drafter's own logits at T 1), drawn under the
    pending token; every drawn entropy label is its children's recorded value."""
    from specviz.views.tree import tree_figure

    drafter, target = models("different")
    trace = _tree_trace()
    before = len(trace.output_ids) - sum(len(r.emitted_ids) for r in trace.rounds)  # the prefill's token(s)
    context = torch.tensor([PROMPT + trace.output_ids[:before]])
    with torch.no_grad():
        q = torch.softmax(drafter(context).logits[0, -1].double(), dim=-1)
    h = float(-(q * q.log2()).sum())
    first = trace.rounds[0].tree
    assert [n.q_entropy for n in first.nodes if n.depth == 1] == pytest.approx(
        [h] * sum(n.depth == 1 for n in first.nodes), abs=1e-4
    )
    assert all(0 <= n.q_entropy <= 3 for r in trace.rounds for n in r.tree.nodes)  # a vocabulary of 8: log2 8 = 3 bits
    # a one-hot q reads 0.00, not -0.00
    assert all(str(n.q_entropy) != "-0.0" for r in trace.rounds for n in r.tree.nodes)
    for k, r in enumerate(trace.rounds):
        (labels,) = [t for t in tree_figure(trace, k).data if t.name and t.name.startswith("H(q)")]
        parents = sorted({n.parent for n in r.tree.nodes})
        first_child = {p: next(n for n in r.tree.nodes if n.parent == p) for p in parents}
        assert list(labels.text) == [
            f"H {first_child[p].q_entropy:.2f}" for p in dict.fromkeys(n.parent for n in r.tree.nodes)
        ]
    # a recording made before the entropy was kept still loads and draws, without the labels
    d = trace.to_dict()
    for r in d["rounds"]:
        for n in r["tree"]["nodes"]:
            del n["q_entropy"]
    old = Trace.from_dict(d)
    assert not [t for t in tree_figure(old, 0).data if t.name and t.name.startswith("H(q)")]
    d["rounds"][0]["tree"]["nodes"][0]["q_entropy"] = 21.0  # over log2 of the largest vocabulary a recording may name
    with pytest.raises(ValueError, match="q_entropy.*from 0 to 20"):
        Trace.from_dict(d)
