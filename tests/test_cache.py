"""The static KV cache (specviz.engine.cache) against the re-fed uncached path, the tests' reference.

Tolerance for logits: 1e-4 absolute on tiny fp32 models. The static cache attends over its whole
capacity with the stale columns masked to the dtype's minimum (their softmax weight is exactly 0),
but a pass over n new tokens and a pass over the whole sequence reduce in different orders, so the
last bits differ (pitfalls: "fp32 results of a one-token pass and a multi-token pass differ in the
last bits"). Token ids, greedy and sampled, are compared exactly.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specviz import Sampling, autoregressive_generate, speculative_generate
from specviz.engine.cache import StaticKV, StaticRunner
from specviz.engine.runner import ModelRunner, make_runner
from specviz.engine.tree.loop import tree_stream
from specviz.engine.tree.spec import TreeSpec
from tests.conftest import tiny_lm

ATOL = 1e-4


def _llama(seed: int = 0, window: int | None = None):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=16,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(config).eval()


def _model(family: str, seed: int = 0):
    return tiny_lm(vocab=16, layers=2, init=0.3, n_positions=128, seed=seed) if family == "gpt2" else _llama(seed)


FAMILIES = ["gpt2", "llama"]


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_the_refed_path_through_rollbacks(family):
    """Prefill, chain passes of several tokens, rollbacks by an index, and passes again: each pass's
    logits equal a re-fed pass over the whole sequence."""
    model = _model(family)
    seq = torch.randint(0, 16, (40,), generator=torch.Generator().manual_seed(1))
    static, ref = StaticRunner(model, 16), ModelRunner(model, 16, keeps_cache=False)
    with torch.inference_mode():
        static.prefill(seq, 7)
        steps = [(12, 5), (13, 1), ("rollback", 9), (14, 5), ("rollback", 14), (20, 6), ("rollback", 3), (30, 4)]
        for end, n_last in steps:
            if end == "rollback":
                static.rollback(n_last)
                assert static.seen == n_last and static.kv.length == n_last
                continue
            got = static.logits(seq, end, n_last)
            want = ref.logits(seq, end, n_last)
            assert got.shape == want.shape == (n_last, 16)
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert static.kv.capacity == 40 + 128  # seq's room + MAX_TREE_NODES: allocated once
    keys = static.kv.cache.layers[0].keys
    assert keys.data_ptr() == static.kv.cache.layers[0].keys.data_ptr()  # never reallocated


def test_the_mask_hides_stale_entries_and_applies_a_window():
    model = _llama()
    kv = StaticKV(model, 8)
    mask = kv.causal_mask(torch.tensor([2, 3]))
    assert mask.shape == (1, 1, 2, 8)
    assert (mask[0, 0, 0, :3] == 0).all() and (mask[0, 0, 0, 3:] < -1e30).all()
    kv.window = 2
    mask = kv.causal_mask(torch.tensor([3]))
    assert (mask[0, 0, 0] == 0).tolist() == [False, False, True, True, False, False, False, False]
    with pytest.raises(ValueError):
        kv.set_length(9)


def test_a_model_mixing_sliding_and_full_layers_is_refused():
    model = _llama()
    model.config.layer_types = ["sliding_attention", "full_attention"]
    StaticKV(model, 8)  # layers called sliding without a window all see the whole context: one mask serves
    model.config.sliding_window = 4
    with pytest.raises(ValueError, match="mixes"):
        StaticKV(model, 8)


def test_make_runner_names_its_choices():
    model = tiny_lm()
    assert isinstance(make_runner(model, 16, "static"), StaticRunner)
    assert make_runner(model, 16, "dynamic").keeps_cache and not make_runner(model, 16, "re-fed").keeps_cache
    for refused in ("paged", True, False):  # booleans meant two things once: refused by name now
        with pytest.raises(ValueError, match="cached must be one of auto, dynamic, static, graphs, re-fed"):
            make_runner(model, 16, refused)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "sampling", [Sampling(0.0), Sampling(1.0), Sampling(0.8, top_k=5, top_p=0.9)], ids=["greedy", "t1", "t08"]
)
def test_speculative_and_autoregressive_ids_equal_the_refed_path(family, sampling):
    """Same seed, same token ids as the re-fed reference: greedy and sampled, chain and baseline."""
    target, drafter = _model(family, 0), _model(family, 1)
    prompt = [3, 1, 4, 1, 5]
    for seed in (0, 1):
        kwargs = dict(sampling=sampling, max_new_tokens=24, seed=seed, vocab_size=16)
        ref = speculative_generate(prompt, drafter, target, gamma=3, cached="re-fed", **kwargs)
        got = speculative_generate(prompt, drafter, target, gamma=3, cached="static", **kwargs)
        assert got.output_ids == ref.output_ids
        assert [len(r.drafts) for r in got.rounds] == [len(r.drafts) for r in ref.rounds]
        assert (
            autoregressive_generate(prompt, target, cached="static", **kwargs).output_ids
            == autoregressive_generate(prompt, target, cached="re-fed", **kwargs).output_ids
        )


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "spec", [TreeSpec.static((3, 2, 1)), TreeSpec.dynamic(8, depth=3, topk=3)], ids=["static", "dynamic"]
)
def test_tree_ids_equal_the_refed_path(family, spec):
    """A token tree over the static cache: nodes under their ancestors' mask, the accepted path
    compacted in place; same ids as re-feeding everything."""
    target, drafter = _model(family, 0), _model(family, 1)
    kwargs = dict(sampling=Sampling(1.0), max_new_tokens=20, seed=3, vocab_size=16)
    last = {}
    for cached in ("re-fed", "static"):
        for trace in tree_stream([2, 7, 1], drafter, target, spec, cached=cached, **kwargs):
            pass
        last[cached] = trace.output_ids
    assert last["static"] == last["re-fed"]


def test_compact_moves_the_path_down_in_place():
    model = _llama()
    seq = torch.randint(0, 16, (20,), generator=torch.Generator().manual_seed(2))
    runner = StaticRunner(model, 16, capacity=32)
    with torch.inference_mode():
        runner.prefill(seq, 6)
        layer = runner.kv.cache.layers[0]
        before = layer.keys[:, :, 6:10].clone()
        runner.logits(seq, 10, 4)  # four slots after the prefix
        slots = layer.keys[:, :, 6:10].clone()
        runner.compact(6, [1, 3])
    assert runner.seen == 8 and runner.kv.length == 8
    torch.testing.assert_close(layer.keys[:, :, 6:8], slots[:, :, [1, 3]])
    assert not torch.equal(before, slots)


def test_bench_runs_over_the_static_cache_and_refuses_graphs_off_cuda():
    """The bench's --cache: the static run adds the eager baseline and v(n) over the static cache (no
    timing asserted); graphs on a CPU and an unknown cache are refused before anything runs."""
    from specviz.measure.bench import benchmark, format_report

    report = benchmark(
        "embedded",
        device="cpu",
        max_new_tokens=4,
        repeats=1,
        prompts=1,
        methods=["autoregressive", "speculative"],
        cache="static",
    )
    assert {"autoregressive", "speculative", "autoregressive_eager"} <= set(
        report
    ) and "hf_generate_static" not in report
    assert report["settings"]["cache"] == "static" and report["capture_ms"] is None
    assert set(report["verify_cost_by_nodes"]) == {1, 2, 4, 8, 16, 32} and report["overhead_ms_per_round"] is not None
    assert "autoregressive_eager" in format_report(report)
    for cache in ("graphs", "paged"):
        with pytest.raises(ValueError):
            benchmark(
                "embedded",
                device="cpu",
                max_new_tokens=4,
                repeats=1,
                prompts=1,
                methods=["autoregressive"],
                cache=cache,
            )


def test_the_cache_index_moves_outside_inference_mode():
    """A CUDA graph's capture rolls the cache back outside the passes' inference mode; the cache's lengths,
    made by a pass inside it, must still move (on a GPU this refused the capture)."""
    model = _llama()
    seq = torch.randint(0, 16, (20,), generator=torch.Generator().manual_seed(2))
    static = StaticRunner(model, 16)
    with torch.inference_mode():
        static.prefill(seq, 6)
    static.kv.set_length(0)
    static.kv.set_length(4)
    assert static.kv.length == 4
    assert all(int(layer.cumulative_length) == 4 for layer in static.kv.cache.layers)


def test_a_pass_keeping_fewer_logits_than_it_feeds_passes_their_indices_on_a_cpu(monkeypatch):
    """``logits_kept``: the last n of a pass's positions as indices on a CPU (an int-sliced view of the hidden states
    sends torch's CPU matmul down a path that costs about as much as copying the output layer), the int where all
    are kept or off a CPU; a runner's logits are the same either way (ATOL: the output layer reads the same rows)."""
    from specviz.engine.kept_logits import logits_kept

    cpu = torch.device("cpu")
    assert torch.equal(logits_kept(1, 5, cpu), torch.tensor([4])) and torch.equal(
        logits_kept(2, 5, cpu), torch.tensor([3, 4])
    )
    assert logits_kept(5, 5, cpu) == 5 and logits_kept(1, 5, torch.device("cuda")) == 1
    model = _llama(seed=3)
    seq = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9])
    seen = []
    forward = model.forward

    def spied(*args, **kwargs):
        seen.append(kwargs["logits_to_keep"])
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", spied)
    for keeps_cache in (True, False):
        runner = ModelRunner(model, 16, keeps_cache=keeps_cache)
        runner.prefill(seq, 4)
        kept = runner.logits(seq, 9, 2)
        full = ModelRunner(model, 16, keeps_cache=False).logits(seq, 9, 9)[-2:]
        assert torch.allclose(kept, full, atol=ATOL)
    assert [k if isinstance(k, int) else k.tolist() for k in seen] == [[3], [3, 4], 9, [7, 8], 9]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("cached", ["dynamic", "static"])
def test_a_long_prompt_is_prefilled_in_passes_giving_the_refed_paths_ids(family, cached, monkeypatch):
    """A prompt longer than PREFILL_CHUNK (64 here: the tiny models hold 128 positions) is fed in passes of at most
    that many tokens, the stream yielding its trace (no rounds yet) between them (a server's device thread runs other
    jobs' steps there); the ids are the re-fed reference's, chain, tree and baseline."""
    from specviz.engine import prefill
    from specviz.engine.chain import autoregressive_stream, speculative_stream
    from specviz.engine.prefill import prefill_ends

    monkeypatch.setattr(prefill, "PREFILL_CHUNK", 64)
    PREFILL_CHUNK = 64
    assert prefill_ends(0) == [0] and prefill_ends(PREFILL_CHUNK) == [PREFILL_CHUNK]
    assert prefill_ends(PREFILL_CHUNK + 1) == [PREFILL_CHUNK, PREFILL_CHUNK + 1]
    assert prefill_ends(20, rows=PREFILL_CHUNK // 8) == [8, 16, 20]  # at most PREFILL_CHUNK tokens over all rows
    target, drafter = _model(family, 0), _model(family, 1)
    prompt = torch.randint(0, 16, (PREFILL_CHUNK + 20,), generator=torch.Generator().manual_seed(2)).tolist()
    kwargs = dict(sampling=Sampling(1.0), max_new_tokens=16, seed=1, vocab_size=16)
    for run in (
        lambda c: speculative_stream(prompt, drafter, target, gamma=3, cached=c, **kwargs),
        lambda c: speculative_stream(prompt, drafter, target, tree=TreeSpec.static((2, 1)), cached=c, **kwargs),
        lambda c: autoregressive_stream(prompt, target, cached=c, **kwargs),
    ):
        items = [(len(t.rounds), list(t.output_ids)) for t in run(cached)]
        assert [n for n, _ in items[:2]] == [0, 1]  # one pause between the prefill's two passes, then the rounds
        ref = [list(t.output_ids) for t in run("re-fed")]
        assert items[-1][1] == ref[-1] and len(ref[-1]) == 16
