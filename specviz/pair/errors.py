"""Errors a visitor can cause while choosing or loading a pair, and the messages they get.

Hub and loading errors (huggingface_hub's, transformers' wrappers of them, out of memory) become
one ``PairError`` each, with a message meant for the person who asked; the caller decides how
to show it.
"""

from __future__ import annotations

import torch


class PairError(ValueError):
    """A pair that cannot be loaded or used; the message is written for the person who asked."""


# The errors that mean "not enough memory", on the CPU or on a GPU; callers catch these around generation.
OOM_ERRORS: tuple[type[BaseException], ...] = (MemoryError, torch.OutOfMemoryError)


def is_unreachable(err: BaseException) -> bool:
    """A connection failure, a timeout, or offline mode: the hub did not answer."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    if isinstance(err, (ConnectionError, TimeoutError, OfflineModeIsEnabled, LocalEntryNotFoundError)):
        return True
    # huggingface_hub's HTTP client (httpx or its fork) raises its own transport errors.
    return any(c.__module__.split(".")[0].startswith("httpx") and c.__name__ in ("TransportError", "TimeoutException")
               for c in type(err).__mro__)


def explain(model_id: str, err: BaseException) -> PairError:
    """Turn a hub or loading error into a message for the visitor."""
    from huggingface_hub.errors import (
        GatedRepoError,
        NotASafetensorsRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(err, PairError):
        return err
    if isinstance(err, GatedRepoError):
        return PairError(
            f"'{model_id}' is gated: accept its licence on its hub page and set HF_TOKEN to a token with access"
        )
    if isinstance(err, RepositoryNotFoundError):
        return PairError(
            f"'{model_id}' was not found on the model hub (check the spelling, or set HF_TOKEN if it is private)"
        )
    if isinstance(err, RevisionNotFoundError):
        return PairError(f"'{model_id}': the requested revision does not exist on the model hub")
    if isinstance(err, NotASafetensorsRepoError):
        return PairError(
            f"'{model_id}' has no safetensors weights; specviz loads only safetensors (other formats can run code when "
            "loaded)"
        )
    if is_unreachable(err):
        return PairError(
            f"'{model_id}' is not in the local cache and the model hub cannot be reached; use the embedded pair"
        )
    if isinstance(err, OOM_ERRORS):
        return PairError(f"'{model_id}' does not fit in this machine's memory; pick a smaller pair")
    text = str(err)
    low = text.lower()
    if "trust_remote_code" in low or "custom code" in low:
        return PairError(
            f"'{model_id}' needs its own Python code to load (trust_remote_code); specviz never runs code from the hub"
        )
    if "gated" in low:
        return PairError(
            f"'{model_id}' is gated: accept its licence on its hub page and set HF_TOKEN to a token with access"
        )
    if "safetensors" in low and ("not found" in low or "no file" in low or "does not appear" in low):
        return PairError(
            f"'{model_id}' has no safetensors weights; specviz loads only safetensors (other formats can run code when "
            "loaded)"
        )
    if "connect" in low or "offline" in low:
        return PairError(
            f"'{model_id}' could not be downloaded: the model hub cannot be reached; use the embedded pair"
        )
    return PairError(f"'{model_id}' could not be loaded: {text.splitlines()[0] if text else type(err).__name__}")


def root_cause(err: BaseException) -> BaseException:
    """transformers wraps hub errors in OSError/ValueError; the hub's own type is the cause."""
    cause = err.__cause__
    return cause if isinstance(cause, Exception) else err
