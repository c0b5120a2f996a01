"""Drafters: where the drafts of speculative decoding come from.

- ``ModelDrafter``: a smaller model (Leviathan et al. 2023; Chen et al. 2023).
- ``PromptLookupDrafter``: drafts copied from earlier in the prompt and output (prompt lookup).
- ``EarlyExitDrafter``: the target's own first layers (LayerSkip, Elhoushi et al. 2024).
- ``QuantizedDrafter``: the target itself with int8 weights (self-speculation; CPU only).
- ``EagleDrafter``: a one-layer head over the target's own features (EAGLE, Li et al. 2024).
- ``CrossTokenizerDrafter``: a smaller model with a tokenizer of its own (token-level intersection,
  Timor et al. 2025; or greedy drafts re-encoded through text).

Any of them may draft its argmax instead of a draw from q in a sampled run (``ArgmaxDrafts``,
``with_rule``: the draft rule "argmax"; exact, its q one-hot).

``make_drafter`` builds one from a kind name; ``specviz.pair.drafter.pair_drafter`` builds it on a loaded
pair, as the command line, bench and the demo do (the pair's tokenizers decide whether its drafter model
drafts as "model" or as "cross-tokenizer").
"""

from __future__ import annotations

from specviz.drafters.argmax import RULES, ArgmaxDrafts, with_rule
from specviz.drafters.cross_tokenizer import CrossTokenizerDrafter, CrossTokenizerError
from specviz.engine.drafter import Drafter, DraftRequest, Proposal
from specviz.drafters.eagle import EagleDrafter, EagleUnsupported, head_folder
from specviz.drafters.early_exit import EarlyExitDrafter, early_exit_model, layer_count
from specviz.engine.model_drafter import ModelDrafter, as_drafter  # the engine wraps a plain causal LM itself
from specviz.drafters.prompt_lookup import PromptLookupDrafter, find_continuation
from specviz.drafters.quantized import QuantizedDrafter, quantize_target
from specviz.records.kinds import DESCRIPTIONS, KINDS, LABELS  # the kinds' names, which the views read too


def default_exit_layer(target) -> int:
    """Half the target's layers (at least 1): LayerSkip's drafts come from early to middle layers."""
    return max(1, layer_count(target) // 2)


def usable_kinds(target, cross_tokenizer: bool = False) -> tuple[str, ...]:
    """The kinds that can draft for ``target``: every kind, but "quantized" only for a target on the CPU
    (a bf16 one is quantized from an fp32 copy), "eagle" only for a target a shipped EAGLE head
    was trained for, and the pair's drafter model as "model" where it shares the target's tokenizer,
    as "cross-tokenizer" where it has a tokenizer of its own (``cross_tokenizer``), and as "argmax" (its argmax drafts)
    where it shares the target's."""
    param = next(target.parameters(), None)
    on_cpu = param is not None and param.device.type == "cpu"
    eagle = head_folder(target) is not None
    drafter_kinds = ("cross-tokenizer",) if cross_tokenizer else ("model", "argmax")
    return tuple(k for k in KINDS if (k != "quantized" or on_cpu) and (k != "eagle" or eagle)
                 and (k not in ("model", "argmax", "cross-tokenizer") or k in drafter_kinds))


def default_kind(pair) -> str:
    """The kind a loaded pair drafts with unless told otherwise: its drafter model, as "model", or as
    "cross-tokenizer" where the drafter has a tokenizer of its own (``Pair.own_tokenizer``)."""
    return "cross-tokenizer" if getattr(pair, "own_tokenizer", False) else "model"


def make_drafter(kind: str, drafter_model=None, target=None, ngram_max: int = 3, exit_layer: int | None = None,
                 drafter_tokenizer=None, target_tokenizer=None, scheme: str = "intersection") -> Drafter:
    """The drafter of ``kind``: "model" (needs ``drafter_model``), "argmax" (the same, proposing its argmax:
    ``specviz.drafters.argmax``), "ngram" (``ngram_max``; with ``target_tokenizer`` it never drafts a special token),
    "early-exit" (needs ``target``; ``exit_layer`` defaults to ``default_exit_layer``),
    "quantized" (needs a ``target`` on the CPU), "eagle" (needs ``target``) or "cross-tokenizer"
    (needs ``drafter_model`` and both tokenizers; ``scheme`` "intersection" or "string").

    Given both tokenizers, "model" refuses a drafter whose vocabulary is not the target's: its token
    ids would be read as the target's.

    Raises:
        ValueError: an unknown kind, a parameter out of range, a quantized drafter asked of a
            target off the CPU, or "model" with two different tokenizers; ``CrossTokenizerError`` (a
            ValueError) for a pair whose vocabularies cannot serve
            (``specviz.drafters.cross_tokenizer.shared_vocabulary``).
    """
    if kind in ("model", "argmax"):
        if drafter_model is None:
            raise ValueError("the drafter model kind needs a drafter model")
        if (drafter_tokenizer is not None and target_tokenizer is not None and drafter_tokenizer is not target_tokenizer
                and drafter_tokenizer.get_vocab() != target_tokenizer.get_vocab()):
            raise ValueError("this pair's drafter has a tokenizer of its own, so its token ids are not the target's: "
                             f"draft with the cross-tokenizer kind ({LABELS['cross-tokenizer']})")
        return (
            ModelDrafter(drafter_model) if kind == "model" else ArgmaxDrafts(ModelDrafter(drafter_model), kind="argmax")
        )
    if kind == "ngram":
        return PromptLookupDrafter(max_ngram=ngram_max, tokenizer=target_tokenizer)  # never drafts a chat marker
    if kind == "early-exit":
        if target is None:
            raise ValueError("early exit needs the target")
        return EarlyExitDrafter(target, exit_layer if exit_layer is not None else default_exit_layer(target))
    if kind == "quantized":
        if target is None:
            raise ValueError("the quantized drafter needs the target")
        return QuantizedDrafter(target)
    if kind == "eagle":
        if target is None:
            raise ValueError("the EAGLE drafter needs the target")
        return EagleDrafter.for_target(target)
    if kind == "cross-tokenizer":
        if drafter_model is None or drafter_tokenizer is None or target_tokenizer is None:
            raise ValueError("the cross-tokenizer drafter needs a drafter model and both tokenizers")
        return CrossTokenizerDrafter(drafter_model, drafter_tokenizer, target_tokenizer, scheme=scheme)
    raise ValueError(f"drafter kind must be one of {', '.join(KINDS)}, got {kind!r}")


__all__ = [
    "DESCRIPTIONS",
    "KINDS",
    "LABELS",
    "RULES",
    "ArgmaxDrafts",
    "with_rule",
    "CrossTokenizerDrafter",
    "CrossTokenizerError",
    "Drafter",
    "DraftRequest",
    "EagleDrafter",
    "EagleUnsupported",
    "EarlyExitDrafter",
    "ModelDrafter",
    "PromptLookupDrafter",
    "Proposal",
    "QuantizedDrafter",
    "as_drafter",
    "default_exit_layer",
    "default_kind",
    "early_exit_model",
    "find_continuation",
    "layer_count",
    "make_drafter",
    "quantize_target",
    "usable_kinds",
]
