"""The EAGLE head: a one-layer decoder that reads the target's own features (Li et al. 2024).

EAGLE ("Speculative Sampling Requires Rethinking Feature Uncertainty", Li et al. 2024) drafts at the
feature level: at position t it takes the target's feature f_t (the hidden state the target's output
layer reads) and the embedding of the token x_{t+1} that follows it, and predicts f_{t+1}; the
target's own output layer turns that prediction into q(x_{t+2}). The target's verify pass already
computes f_t at every position it scores, so reading it costs no extra target pass.

Shapes: H is the target's width (576 for SmolLM2-135M), V the target's vocabulary, K the head's
tokens (a frequency-ranked subset of V, FR-Spec, Zhao et al. 2025; q is exactly 0 outside it).

    e = emb_norm(E[x_{t+1}])            (B, T, H)  E: the target's input table, frozen and shared g = feat_norm(f_t)    
    (B, T, H) h = fc([e; g])                      (B, T, H) f^_{t+1} = body(h)                  (B, T, H)  one Llama
    decoder layer, then RMSNorm logits = f^_{t+1} W[head_ids]^T     (B, T, K)  W: the target's output layer, frozen and
    shared

Only fc, the two input norms and the body are the head's own weights (saved, a few MB); the input
table and the output rows come from the target at load time.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig, LlamaModel
from transformers.models.llama.modeling_llama import LlamaRMSNorm

WEIGHTS = "model.safetensors"
CONFIG = "eagle_config.json"


@dataclass
class EagleConfig:
    """The head's shape; the attention and MLP sizes follow the target's layers."""

    hidden_size: int = 576
    intermediate_size: int = 1536
    num_attention_heads: int = 9
    num_key_value_heads: int = 3
    rms_norm_eps: float = 1e-5
    rope_theta: float = 100000.0
    max_position_embeddings: int = 8192
    head_size: int = 8192
    target_vocab_size: int = 49152

    @classmethod
    def from_target(cls, target_config, head_size: int) -> "EagleConfig":
        """The shape of a head for ``target_config`` (a transformers LlamaConfig)."""
        c = target_config
        return cls(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                   num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                   rms_norm_eps=c.rms_norm_eps, rope_theta=rope_theta(c),
                   max_position_embeddings=c.max_position_embeddings, head_size=head_size,
                   target_vocab_size=c.vocab_size)

    def llama(self) -> LlamaConfig:
        """The body's config: one decoder layer; no table of its own (it is fed embeddings)."""
        return LlamaConfig(
            vocab_size=1,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=1,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=False,
        )


def rope_theta(config) -> float:
    """The rotary base of a transformers config: ``rope_parameters["rope_theta"]`` (transformers 5),
    else the legacy ``rope_theta`` field, else Llama's 10,000."""
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0)


class EagleHead(nn.Module):
    """The head's own weights plus references to the target's input table and output rows.

    Args:
        config: the head's shape.
        embed: the target's input table, (V, H); used, never trained or saved.
        out_rows: the target's output layer rows for the head's tokens, (K, H); never trained or saved.
        head_ids: (K,) long, the head's token ids, sorted.
    """

    def __init__(
        self,
        config: EagleConfig,
        embed: torch.Tensor | None = None,
        out_rows: torch.Tensor | None = None,
        head_ids: torch.Tensor | None = None,
    ):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.emb_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.feat_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.body = LlamaModel(config.llama())
        self.body.embed_tokens = None  # fed embeddings; the target's table is shared
        self.register_buffer(
            "head_ids", head_ids if head_ids is not None else torch.arange(config.head_size), persistent=False
        )
        self._embed = embed
        self._out_rows = out_rows

    def share(self, target) -> "EagleHead":
        """Take the input table and the head's output rows from ``target`` (frozen references)."""
        self._embed = target.get_input_embeddings().weight.detach()
        self._out_rows = target.get_output_embeddings().weight.detach()[self.head_ids.to(self._embed.device)]
        return self

    def features(
        self,
        next_ids: torch.Tensor,
        target_features: torch.Tensor,
        past_key_values=None,
        position_ids: torch.Tensor | None = None,
        attention_mask=None,
    ) -> torch.Tensor:
        """Predicted features f^_{t+1}: (B, T, H), from x_{t+1} (B, T) long and f_t (B, T, H)."""
        e = self.emb_norm(nn.functional.embedding(next_ids, self._embed).to(self.fc.weight.dtype))
        g = self.feat_norm(target_features.to(self.fc.weight.dtype))
        h = self.fc(torch.cat([e, g], dim=-1))
        out = self.body(
            inputs_embeds=h,
            past_key_values=past_key_values,
            position_ids=position_ids,
            attention_mask=attention_mask,
            use_cache=past_key_values is not None,
        )
        return out.last_hidden_state

    def head_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Logits over the head's tokens: (..., K) from features (..., H)."""
        return features @ self._out_rows.to(features.dtype).T

    def save(self, folder: Path, extra: dict | None = None) -> None:
        """Weights (fp16 safetensors), the config and the head's token ids into ``folder``."""
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in self.state_dict().items()}
        tensors["head_ids"] = self.head_ids.detach().to(torch.int64).cpu().contiguous()
        save_file(tensors, str(folder / WEIGHTS))
        (folder / CONFIG).write_text(json.dumps({**asdict(self.config), **(extra or {})}, indent=1))

    @classmethod
    def load(cls, folder: Path, dtype: torch.dtype = torch.float32) -> "EagleHead":
        """A head saved by ``save`` (call ``share(target)`` before use).

        Raises:
            FileNotFoundError: no weights or config in ``folder``.
        """
        from safetensors.torch import load_file

        raw = json.loads((Path(folder) / CONFIG).read_text())
        config = EagleConfig(**{k: raw[k] for k in EagleConfig.__dataclass_fields__ if k in raw})
        tensors = load_file(str(Path(folder) / WEIGHTS))
        head = cls(config, head_ids=tensors.pop("head_ids"))
        head.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=True)
        return head.to(dtype).eval()
