"""Model pairs: the embedded pair, hub presets, and loading a drafter and a target together.

Local folders and hub ids go through the same ``from_pretrained`` calls. Every failure a
visitor can cause becomes a ``PairError`` with a message meant for them; the caller decides
how to show it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import torch

ASSETS = Path(__file__).resolve().parent.parent / "assets"
EMBEDDED = "embedded"

# name -> (drafter, target). Hub pairs share a tokenizer; they need a reachable hub.
PRESETS: dict[str, tuple[str, str]] = {
    EMBEDDED: (str(ASSETS / "models" / "drafter"), str(ASSETS / "models" / "target")),
    "SmolLM2-135M -> SmolLM2-360M": ("HuggingFaceTB/SmolLM2-135M", "HuggingFaceTB/SmolLM2-360M"),
    "Qwen2.5-0.5B -> Qwen2.5-1.5B": ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B"),
    "gpt2 -> gpt2-large": ("openai-community/gpt2", "openai-community/gpt2-large"),
}


class PairError(ValueError):
    """A pair that cannot be loaded or used; the message is written for the person who asked."""


@dataclass
class Pair:
    """A loaded drafter and target with their shared tokenizer.

    ``vocab_size`` is the tokenizer's size: both models' logits are cut to it before softmax.
    """

    name: str
    drafter: object
    target: object
    tokenizer: object
    device: torch.device

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _dtype_for(device: torch.device) -> torch.dtype:
    # bf16 halves memory traffic on the GPU; the CPU keeps fp32, where greedy equality is exact in practice.
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _explain(model_id: str, err: Exception) -> PairError:
    """Turn a hub or loading error into a message for the visitor."""
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(err, GatedRepoError):
        return PairError(f"'{model_id}' is gated: accept its licence on the hub and set HF_TOKEN to a token with access")
    if isinstance(err, RepositoryNotFoundError):
        return PairError(f"'{model_id}' was not found on the model hub (check the spelling, or set HF_TOKEN if it is private)")
    if isinstance(err, RevisionNotFoundError):
        return PairError(f"'{model_id}': the requested revision does not exist")
    if isinstance(err, (LocalEntryNotFoundError, OfflineModeIsEnabled)):
        return PairError(f"'{model_id}' is not in the local cache and the model hub cannot be reached; use the embedded pair")
    if isinstance(err, (MemoryError, torch.OutOfMemoryError)):
        return PairError(f"'{model_id}' does not fit in this machine's memory; pick a smaller pair")
    text = str(err)
    if "gated" in text.lower():
        return PairError(f"'{model_id}' is gated: accept its licence on the hub and set HF_TOKEN to a token with access")
    if "connect" in text.lower() or "offline" in text.lower() or "resolve" in text.lower():
        return PairError(f"'{model_id}' could not be downloaded: the model hub cannot be reached; use the embedded pair")
    return PairError(f"'{model_id}' could not be loaded: {text.splitlines()[0] if text else type(err).__name__}")


def hub_reachable(model_id: str) -> bool:
    """Ask the hub about ``model_id`` once, with a short timeout and no retries.

    Returns True for a local folder or a model the hub answered for, False when the hub
    cannot be reached (loading then uses the local cache only, instead of retrying for a minute).

    Raises:
        PairError: the hub answered that the model does not exist.
    """
    if Path(model_id).exists():
        return True
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        HfApi().model_info(model_id, timeout=5)
        return True
    except (RepositoryNotFoundError, GatedRepoError) as err:
        if isinstance(err, GatedRepoError):
            return True  # the download says whether the token grants access
        raise _explain(model_id, err) from err
    except HfHubHTTPError:
        return True  # the hub answered; let the download report the details
    except Exception:  # connection refused, DNS failure, offline mode: no hub here
        return False


def _load_tokenizer(model_id: str, local_only: bool):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_id, local_files_only=local_only)
    except Exception as err:  # transformers wraps hub errors in OSError and ValueError
        raise _explain(model_id, err.__cause__ if isinstance(err.__cause__, Exception) else err) from err


def check_same_tokenizer(drafter_id: str, drafter_tok, target_id: str, target_tok) -> None:
    """Refuse a pair whose tokenizers map text to different ids.

    The vocabularies are compared token by token (``get_vocab``), not by ``vocab_size``:
    models of one family pad their embedding tables differently while sharing a tokenizer.

    Raises:
        PairError: naming both models and the first difference found.
    """
    dv, tv = drafter_tok.get_vocab(), target_tok.get_vocab()
    if dv != tv:
        only_d = sorted(set(dv) - set(tv))[:3]
        only_t = sorted(set(tv) - set(dv))[:3]
        differ = [t for t in dv if t in tv and dv[t] != tv[t]][:3]
        detail = (
            f"{len(dv)} vs {len(tv)} tokens"
            + (f"; only in the drafter: {only_d}" if only_d else "")
            + (f"; only in the target: {only_t}" if only_t else "")
            + (f"; different ids for {differ}" if differ else "")
        )
        raise PairError(
            f"the drafter '{drafter_id}' and the target '{target_id}' use different tokenizers ({detail}); "
            "speculative decoding needs one shared vocabulary"
        )


def _load_model(model_id: str, device: torch.device, local_only: bool):
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(model_id, dtype=_dtype_for(device), local_files_only=local_only)
    except Exception as err:
        raise _explain(model_id, err.__cause__ if isinstance(err.__cause__, Exception) else err) from err
    try:
        return model.to(device).eval()
    except (MemoryError, torch.OutOfMemoryError) as err:
        raise _explain(model_id, err) from err


_cache: dict[tuple[str, str, str], Pair] = {}
_lock = threading.Lock()


def resolve(name: str | None = None, drafter: str | None = None, target: str | None = None) -> tuple[str, str, str]:
    """(label, drafter id, target id) from a preset name or explicit ids.

    Raises:
        PairError: for an unknown preset name.
    """
    if drafter or target:
        if not (drafter and target):
            raise PairError("give both a drafter and a target")
        return f"{drafter} -> {target}", drafter, target
    name = name or EMBEDDED
    if name not in PRESETS:
        raise PairError(f"unknown pair '{name}'; choose one of: {', '.join(PRESETS)}")
    return (name, *PRESETS[name])


def load_pair(name: str | None = None, drafter: str | None = None, target: str | None = None, device: str | torch.device | None = None) -> Pair:
    """Load a pair once and keep it for later calls (thread-safe).

    Args:
        name: a key of ``PRESETS`` (default: the embedded pair).
        drafter, target: model folders or hub ids, instead of ``name``.
        device: "cpu", "cuda", or None for CUDA when available.

    Raises:
        PairError: unknown preset, model not found, hub unreachable, gated model without a
            token, tokenizers that differ, not enough memory.
    """
    label, drafter_id, target_id = resolve(name, drafter, target)
    dev = torch.device(device) if device is not None else default_device()
    key = (drafter_id, target_id, str(dev))
    with _lock:
        if key in _cache:
            return _cache[key]
        local = {m: not hub_reachable(m) for m in (drafter_id, target_id)}
        drafter_tok = _load_tokenizer(drafter_id, local[drafter_id])
        target_tok = _load_tokenizer(target_id, local[target_id])
        check_same_tokenizer(drafter_id, drafter_tok, target_id, target_tok)
        pair = Pair(label, _load_model(drafter_id, dev, local[drafter_id]), _load_model(target_id, dev, local[target_id]), target_tok, dev)
        # One resident pair: a visitor switching pairs frees the previous one.
        _cache.clear()
        _cache[key] = pair
        return pair
