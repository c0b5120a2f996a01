"""A drafter LM with a small output layer: the English pair's distilled drafter.

A drafter for a 49,152-token target pays for its output layer on every draft: at width 384 a
full head is 18.9 M multiply-adds, more than the rest of a small drafter together. As FR-Spec
does (Zhao et al. 2025, "FR-Spec: Accelerating Large-Vocabulary Language Models via
Frequency-Ranked Speculative Sampling"), the head here scores only the ``head_size`` tokens the
target writes most often; every other token gets the dtype's lowest logit, so after softmax its
q is exactly 0. A draft is then never one of those tokens, and when the target wants one the
rejection rule's residual norm(max(0, p - q)) supplies it: the output stays exactly the
target's (Leviathan et al. 2023, Theorem 3.5 holds for any q).

The input side is factorised as in ALBERT (Lan et al. 2020): a narrow table of the full
vocabulary (``embedding_size`` wide) and a projection to the model's width, so the weights stay
small enough to ship. The body is transformers' ``LlamaModel``, unpatched; the class is an
ordinary ``PreTrainedModel`` with ``GenerationMixin``, so ``from_pretrained``, ``generate`` and
transformers' assisted generation take it like any causal LM.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import GenerationMixin, LlamaConfig, LlamaModel, LlamaPreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast


class SmallHeadConfig(LlamaConfig):
    """A Llama config plus the drafter's two narrowings.

    Attributes:
        vocab_size: the target's full vocabulary (logits come back this wide).
        embedding_size: width of the input embedding table before its projection to ``hidden_size``.
        head_size: how many tokens the output layer scores (the most frequent in the target's text).
    """

    model_type = "specviz_small_head"

    def __init__(self, embedding_size: int = 128, head_size: int = 8192, **kwargs):
        self.embedding_size = embedding_size
        self.head_size = head_size
        super().__init__(**kwargs)


class SmallHeadLM(LlamaPreTrainedModel, GenerationMixin):
    """A causal LM whose logits are (batch, length, vocab_size), finite on ``head_ids`` only.

    Forward takes what a transformers causal LM takes (``input_ids``, ``past_key_values``,
    ``attention_mask``, ``position_ids``, ``logits_to_keep``) and returns ``CausalLMOutputWithPast``.
    Logits outside ``head_ids`` are ``torch.finfo(dtype).min`` rather than -inf, so no softmax or
    processor downstream meets inf - inf; their probability underflows to exactly 0.
    """

    config_class = SmallHeadConfig
    base_model_prefix = "model"
    _no_split_modules = ["LlamaDecoderLayer"]

    def __init__(self, config: SmallHeadConfig):
        super().__init__(config)
        body = copy.deepcopy(config)
        body.vocab_size, body.pad_token_id = 1, None  # the body's own table is unused (inputs come as embeddings)
        self.model = LlamaModel(body)
        self.embed = nn.Embedding(config.vocab_size, config.embedding_size)
        self.embed_proj = nn.Linear(config.embedding_size, config.hidden_size, bias=False)
        self.head = nn.Linear(config.hidden_size, config.head_size, bias=False)
        # Which token each head row scores (filled by training; saved with the weights).
        self.register_buffer("head_ids", torch.arange(config.head_size, dtype=torch.long), persistent=True)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed

    def set_input_embeddings(self, value):
        self.embed = value

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., hidden_size) -> (..., head_size) logits over ``head_ids``."""
        return self.head(hidden)

    def scatter(self, small: torch.Tensor) -> torch.Tensor:
        """(..., head_size) head logits -> (..., vocab_size), the dtype's minimum elsewhere."""
        full = small.new_full((*small.shape[:-1], self.config.vocab_size), torch.finfo(small.dtype).min)
        return full.index_copy_(-1, self.head_ids, small)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, use_cache=None, logits_to_keep: int | torch.Tensor = 0, **kwargs):
        if inputs_embeds is None:
            inputs_embeds = self.embed_proj(self.embed(input_ids))
        out = self.model(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values, use_cache=use_cache, **kwargs)
        hidden = out.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.scatter(self.head_logits(hidden[:, keep, :]))
        return CausalLMOutputWithPast(logits=logits, past_key_values=out.past_key_values)


def deepened(model: SmallHeadLM, extra_layers: int) -> SmallHeadLM:
    """``model`` with ``extra_layers`` decoder layers appended after its own, each passing its input through unchanged
    at first (its attention's and MLP's output projections zero, so both add exactly 0 to the residual stream): the
    new model's logits equal ``model``'s, and training then moves the new layers (function-preserving growth, as in
    Net2Net: Chen, Goodfellow and Shlens, ICLR 2016). Same dtype as ``model``; ``model`` is left as it was.

    Raises:
        ValueError: ``extra_layers`` below 0.
    """
    if extra_layers < 0:
        raise ValueError(f"extra_layers must be at least 0, got {extra_layers}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers += extra_layers
    grown = SmallHeadLM(config).to(model.dtype)
    missing, unexpected = grown.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all(".layers." in name for name in missing), (missing, unexpected)
    with torch.no_grad():
        for layer in grown.model.layers[model.config.num_hidden_layers:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return grown
