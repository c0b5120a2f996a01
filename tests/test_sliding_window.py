"""Models with a sliding attention window (a tiny Mistral with sliding_window = 4).

A cache built from the model's config keeps only the window and cannot be rolled back once it is
full (``DynamicCache.crop`` raised RuntimeError); the runner's plain cache keeps every position
and the model's mask applies the window, so the cached run equals the re-fed reference run token
for token (greedy and sampled, fixed seed). A batch's masked columns would count against the
window, so batches that could outgrow it are refused.

Token trees build their own 4-D mask, which transformers uses as given, so the tree mask applies the
window itself, in positions (specviz.engine.window): greedy trees (static, dynamic, sampled children,
EAGLE's; dynamic cache with either compaction, static cache, re-fed path) equal the target's own
``generate`` token for token over windows smaller than the prompt, than the tree's depth, and both;
with the window ignored (``TreeFault(window_ignored=True)``, the fault the trees had) they do not.
The trees' law with a window is tested in tests/test_tree_exactness.py.
"""

from __future__ import annotations

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from specviz import Sampling, autoregressive_generate, speculative_generate
from specviz.engine.batch import autoregressive_generate_batch, speculative_generate_batch
from specviz.engine.batch_runner import sliding_window
from specviz.drafters import PromptLookupDrafter
from specviz.engine.tree.accept import TreeFault
from specviz.engine.tree.loop import tree_generate
from specviz.engine.tree.spec import TreeSpec
from specviz.lab import models
from specviz.lab.models import noisy_copy


def tiny_mistral(
    window: int = 4, seed: int = 0, layers: int = 2, vocab: int = 16, eos: int | None = 0, init: float = 0.5
):
    torch.manual_seed(seed)
    config = MistralConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=window,
        initializer_range=init,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    return MistralForCausalLM(config).eval()


@pytest.mark.parametrize("sampling", [Sampling(0.0), Sampling(1.0)])
@pytest.mark.parametrize("kind", ["model", "ngram"])
def test_a_sliding_window_run_equals_the_refed_run(sampling, kind):
    target = tiny_mistral()
    assert sliding_window(target) == 4
    drafter = tiny_mistral(seed=1) if kind == "model" else PromptLookupDrafter()
    prompt = [1, 2, 3, 1, 2, 3]
    kw = dict(gamma=3, sampling=sampling, max_new_tokens=24, seed=3)
    cached = speculative_generate(prompt, drafter, target, **kw)
    refed = speculative_generate(prompt, drafter, target, cached="re-fed", **kw)
    assert len(cached.output_ids) == 24 and cached.output_ids == refed.output_ids
    # a rollback past a full window happened
    assert any(d.verdict == "rejected" for r in cached.rounds for d in r.drafts)
    base = dict(sampling=sampling, max_new_tokens=24, seed=3)
    assert (
        autoregressive_generate(prompt, target, **base).output_ids
        == autoregressive_generate(prompt, target, cached="re-fed", **base).output_ids
    )


def test_batches_of_sliding_window_models_are_refused_where_the_window_could_fill():
    target = tiny_mistral()
    with pytest.raises(ValueError, match="sliding window of 4 tokens"):
        speculative_generate_batch([[1, 2], [3]], tiny_mistral(seed=1), target, gamma=2, max_new_tokens=8)
    with pytest.raises(ValueError, match="sliding window"):
        speculative_generate_batch([[1, 2], [3]], PromptLookupDrafter(), target, gamma=2, max_new_tokens=8)
    # The baseline masks no column between a row's tokens (only left padding): exact, and allowed.
    batch = autoregressive_generate_batch([[1, 2], [3]], target, max_new_tokens=8, seed=2)
    for b, prompt in enumerate([[1, 2], [3]]):
        assert (
            batch.traces[b].output_ids
            == autoregressive_generate(prompt, target, max_new_tokens=8, seed=2 + b).output_ids
        )
    # A window the batch cannot outgrow changes nothing: the batch runs.
    roomy = tiny_mistral(window=60)
    speculative_generate_batch([[1, 2], [3]], tiny_mistral(window=60, seed=1), roomy, gamma=2, max_new_tokens=4)


def test_models_without_a_window_have_none():
    drafter, target = models("similar")
    assert sliding_window(target) is None


# (window, prompt, tree): the window smaller than the prompt (8 tokens) but not the tree's depth (3),
# than the depth (4) but not the prompt (2 tokens), and than both.
WINDOWS = [
    (5, [1, 5, 2, 7, 3, 6, 0, 4], (2, 2, 1)),
    (3, [1, 5], (2, 2, 1, 1)),
    (2, [1, 5, 2, 7, 3, 6, 0, 4], (2, 2, 1)),
]
NEW = 20


def window_pair(window: int):
    """A 2-layer target and a drafter close to it (its weights plus noise, the same window), no EOS (the
    runs are NEW tokens long): about half of each run's tokens are accepted tree nodes."""
    target = tiny_mistral(window, seed=0, eos=None)
    return target, noisy_copy(target, 0.1, seed=1)


def targets_generate(target, prompt: list[int]) -> list[int]:
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False)
    return out[0, len(prompt) :].tolist()


def tree_runs(drafter, target, prompt, shape, cached, fault=TreeFault()):
    """(label, greedy Trace) of every tree kind over one cache kind."""
    depth = len(shape)
    specs = [TreeSpec.static(shape), TreeSpec.static(shape, "sampled"), TreeSpec.dynamic(8, depth=depth, topk=3)]
    compactions = ["gather", "refeed"] if cached == "dynamic" else ["gather"]
    for spec in specs:
        for how in compactions:
            trace = tree_generate(
                prompt,
                drafter,
                target,
                spec,
                sampling=Sampling(0.0),
                max_new_tokens=NEW,
                cached=cached,
                compaction=how,
                seed=4,
                fault=fault,
            )
            yield f"{spec.label()} {how}", trace


@pytest.mark.parametrize("cached", ["dynamic", "static", "re-fed"], ids=["dynamic-cache", "static-cache", "refed"])
@pytest.mark.parametrize("window, prompt, shape", WINDOWS, ids=["window<prompt", "window<depth", "window<both"])
def test_greedy_trees_over_a_sliding_window_equal_the_targets_generate(window, prompt, shape, cached):
    target, drafter = window_pair(window)
    expected = targets_generate(target, prompt)
    assert len(set(expected)) >= 4  # not a constant run, which any mask would reproduce
    for label, trace in tree_runs(drafter, target, prompt, shape, cached):
        assert trace.output_ids == expected, label
        assert trace.accepted >= 5, label  # tree nodes reached the output: the tree mask made them


@pytest.mark.parametrize("cached", ["dynamic", "static", "re-fed"], ids=["dynamic-cache", "static-cache", "refed"])
def test_greedy_trees_with_the_window_ignored_depart_from_the_targets_generate(cached):
    """The planted fault: the same runs with the tree mask blind to the window (what the trees did)."""
    window, prompt, shape = WINDOWS[2]
    target, drafter = window_pair(window)
    expected = targets_generate(target, prompt)
    for label, trace in tree_runs(drafter, target, prompt, shape, cached, fault=TreeFault(window_ignored=True)):
        assert trace.output_ids != expected, label


@pytest.mark.parametrize("cached", ["dynamic", "re-fed"], ids=["dynamic-cache", "refed"])
def test_eagle_trees_over_a_sliding_window_equal_the_targets_generate(cached):
    """An untrained EAGLE head (its own layer attends to everything) over a windowed target's features."""
    from tests.test_eagle import tiny_eagle

    window, prompt, shape = WINDOWS[2]
    target, _ = window_pair(window)
    drafter = tiny_eagle(target, head=(1, 2, 5, 7, 10, 13))
    expected = targets_generate(target, prompt)
    for spec in [TreeSpec.dynamic(8, depth=3, topk=3), TreeSpec.static(shape)]:
        trace = tree_generate(prompt, drafter, target, spec, sampling=Sampling(0.0), max_new_tokens=NEW, cached=cached)
        assert trace.output_ids == expected, spec.label()
        broken = tree_generate(
            prompt,
            drafter,
            target,
            spec,
            sampling=Sampling(0.0),
            max_new_tokens=NEW,
            cached=cached,
            fault=TreeFault(window_ignored=True),
        )
        assert broken.output_ids != expected, spec.label()


def test_a_tree_round_leaves_every_column_in_a_plain_cache():
    """The runner's cache keeps every position of a windowed model (plain dynamic layers), so the gather
    compaction's column indices are the sequence's positions: after a run, one column per position held."""
    from transformers.cache_utils import DynamicLayer

    from specviz.engine.runner import ModelRunner

    window, prompt, shape = WINDOWS[2]
    target, _ = window_pair(window)
    runner = ModelRunner(target, 16)
    seq = torch.tensor(prompt + [3, 9, 11, 2])
    runner.prefill(seq, len(seq))
    assert all(type(layer) is DynamicLayer for layer in runner.cache.layers)
    assert runner.cache.get_seq_length() == len(seq) > window


def tiny_qwen2_mixed(window: int = 2, seed: int = 0):
    """A Qwen2 whose first layer attends to everything and whose second slides (``max_window_layers`` = 1)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=16,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        use_sliding_window=True,
        sliding_window=window,
        max_window_layers=1,
        initializer_range=0.5,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return Qwen2ForCausalLM(config).eval()


@pytest.mark.parametrize("cached", ["dynamic", "re-fed"], ids=["dynamic-cache", "refed"])
def test_trees_over_a_model_mixing_sliding_and_full_layers_equal_its_generate(cached):
    """Each layer kind gets its own mask (a dict by ``layer_types``); the static cache, one mask for every
    layer, refuses such a model before any pass and names the window."""
    target = tiny_qwen2_mixed()
    assert target.config.layer_types == ["full_attention", "sliding_attention"]
    drafter = noisy_copy(target, 0.1, seed=1)
    prompt = WINDOWS[2][1]
    expected = targets_generate(target, prompt)
    assert len(set(expected)) >= 4
    for spec in [TreeSpec.static((2, 2, 1)), TreeSpec.dynamic(8, depth=3, topk=3)]:
        trace = tree_generate(prompt, drafter, target, spec, sampling=Sampling(0.0), max_new_tokens=NEW, cached=cached)
        assert trace.output_ids == expected, spec.label()
        assert trace.accepted >= 3, spec.label()
        broken = tree_generate(
            prompt,
            drafter,
            target,
            spec,
            sampling=Sampling(0.0),
            max_new_tokens=NEW,
            cached=cached,
            fault=TreeFault(window_ignored=True),
        )
        assert broken.output_ids != expected, spec.label()
    with pytest.raises(ValueError, match="sliding window of 2 tokens"):
        tree_generate(prompt, drafter, target, TreeSpec.static((2, 2, 1)), max_new_tokens=4, cached="static")


def test_layer_windows_name_each_layer_kind_and_its_window():
    from transformers import Gemma2Config, LlamaConfig, Qwen2Config

    from specviz.engine.window import layer_windows, within

    assert layer_windows(tiny_mistral(3).config) == {"sliding_attention": 3}
    assert layer_windows(LlamaConfig()) == {"full_attention": None}
    assert layer_windows(Qwen2Config(num_hidden_layers=2)) == {"full_attention": None}  # use_sliding_window off
    assert layer_windows(tiny_qwen2_mixed(2).config) == {"full_attention": None, "sliding_attention": 2}
    assert layer_windows(Gemma2Config(num_hidden_layers=2, sliding_window=5)) == {
        "full_attention": None,
        "sliding_attention": 5,
    }
    # transformers' overlay: the key at k is inside the window of the query at q when q - w < k (<= q, the caller's
    # causality)
    q, k = torch.tensor([4, 6]), torch.arange(7)
    assert within(q, k, 3).tolist() == [[k_ > q_ - 3 for k_ in range(7)] for q_ in (4, 6)]
    assert within(q, k, None).all()
