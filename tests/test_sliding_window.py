"""Models with a sliding attention window (a tiny Mistral with sliding_window = 4).

A cache built from the model's config keeps only the window and cannot be rolled back once it is
full (``DynamicCache.crop`` raised RuntimeError); the runner's plain cache keeps every position
and the model's mask applies the window, so the cached run equals the re-fed reference run token
for token (greedy and sampled, fixed seed). A batch's masked columns would count against the
window, so batches that could outgrow it are refused.
"""

from __future__ import annotations

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from specviz import Sampling, autoregressive_generate, speculative_generate
from specviz.engine.batch import autoregressive_generate_batch, speculative_generate_batch
from specviz.engine.batch_runner import sliding_window
from specviz.drafters import PromptLookupDrafter
from specviz.lab import models


def tiny_mistral(window: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    config = MistralConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=1, head_dim=8, max_position_embeddings=64, sliding_window=window,
                           initializer_range=0.5, bos_token_id=0, eos_token_id=0, pad_token_id=0)
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
    refed = speculative_generate(prompt, drafter, target, cached=False, **kw)
    assert len(cached.output_ids) == 24 and cached.output_ids == refed.output_ids
    assert any(d.verdict == "rejected" for r in cached.rounds for d in r.drafts)  # a rollback past a full window happened
    base = dict(sampling=sampling, max_new_tokens=24, seed=3)
    assert autoregressive_generate(prompt, target, **base).output_ids == autoregressive_generate(prompt, target, cached=False, **base).output_ids


def test_batches_of_sliding_window_models_are_refused_where_the_window_could_fill():
    target = tiny_mistral()
    with pytest.raises(ValueError, match="sliding window of 4 tokens"):
        speculative_generate_batch([[1, 2], [3]], tiny_mistral(seed=1), target, gamma=2, max_new_tokens=8)
    with pytest.raises(ValueError, match="sliding window"):
        speculative_generate_batch([[1, 2], [3]], PromptLookupDrafter(), target, gamma=2, max_new_tokens=8)
    # The baseline masks no column between a row's tokens (only left padding): exact, and allowed.
    batch = autoregressive_generate_batch([[1, 2], [3]], target, max_new_tokens=8, seed=2)
    for b, prompt in enumerate([[1, 2], [3]]):
        assert batch.traces[b].output_ids == autoregressive_generate(prompt, target, max_new_tokens=8, seed=2 + b).output_ids
    # A window the batch cannot outgrow changes nothing: the batch runs.
    roomy = tiny_mistral(window=60)
    speculative_generate_batch([[1, 2], [3]], tiny_mistral(window=60, seed=1), roomy, gamma=2, max_new_tokens=4)


def test_models_without_a_window_have_none():
    drafter, target = models("similar")
    assert sliding_window(target) is None
