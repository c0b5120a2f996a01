"""Grouped-query attention on a CPU without copying the key/value heads for every masked pass.

transformers' SDPA attention (``transformers.integrations.sdpa_attention.sdpa_attention_forward``) lets
torch's kernel share each key/value head among its query heads (``enable_gqa=True``) only when no mask is
passed (and packs the query heads for a single-token step). A pass with a mask -- every verify pass over
a pending token and its drafts after a cached prefix, every token tree, every padded batch -- copies each
layer's keys and values ``num_key_value_groups`` times first (``repeat_kv``). On the English target
(9 query heads over 3 key/value heads, 30 layers) that is 60 copies of the whole cache per verify pass,
work a single-token step never does, so it lands in the verify cost v.

``use_shared_kv_heads(model)`` switches a model on a CPU to an attention function registered with
transformers' ``AttentionInterface`` that passes the mask and the unrepeated keys and values to
``torch.nn.functional.scaled_dot_product_attention`` with ``enable_gqa=True`` (torch's CPU kernels index
the shared head; the arithmetic is the same, and the outputs are bit-identical in the tests). Passes
without a mask, models without grouped heads and other devices go to transformers' own function
unchanged (on CUDA, a mask with ``enable_gqa`` would leave the fused kernels).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

NAME = "specviz_sdpa_gqa"


def sdpa_shared_kv(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                   is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query (B, Hq, n, D), key and value (B, Hkv, L, D),
    attention_mask (B or 1, 1, n, L) bool or additive, or None; returns ((B, n, Hq, D), None)."""
    groups = getattr(module, "num_key_value_groups", 1)
    if attention_mask is None or groups == 1 or query.device.type != "cpu" or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, sdpa_shared_kv)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_shared_kv_heads(model) -> bool:
    """Run ``model``'s attention through ``sdpa_shared_kv`` where it pays: a model on a CPU using SDPA with
    grouped key/value heads. Returns whether it was switched (in place)."""
    config = getattr(model, "config", None)
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if config is None or not heads or not kv_heads or kv_heads == heads:
        return False
    if next(model.parameters()).device.type != "cpu" or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, AttributeError):  # a model class that cannot take a registered function
        return False
    return True
