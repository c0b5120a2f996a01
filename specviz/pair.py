"""Model pairs: the embedded pair, curated hub presets, custom ids, and loading a drafter and a target together.

Local folders and hub ids go through the same ``from_pretrained`` calls, always with
``trust_remote_code=False`` and safetensors only. Every failure a visitor can cause becomes a
``PairError`` with a message meant for them; the caller decides how to show it.

Environment (read at each call, so an operator can change them without code):

- ``SPECVIZ_ALLOW_CUSTOM_MODELS=1``: visitors may ask for hub ids outside the presets
  (``owner/name`` or ``owner/name@revision``). Off by default.
- ``SPECVIZ_MAX_MODEL_GB`` (default 16): the largest custom pair, drafter plus target, in GB of
  weights as loaded (bf16 on a GPU, fp32 on the CPU), checked from the hub's safetensors
  metadata before anything is downloaded.
- ``SPECVIZ_RESIDENT_PAIRS`` (default 1): how many pairs stay loaded; asking for another one
  frees the least recently used.
- ``SPECVIZ_PRELOAD`` (default ``embedded``): presets loaded at start-up by ``preload()``,
  comma-separated display names (on ZeroGPU, the pairs the Space serves).
- ``HF_TOKEN``: read by huggingface_hub itself; needed for gated presets (Llama 3.2).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import re
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specviz import gpu
from specviz.assets import ASSETS  # re-exported as specviz.pair.ASSETS

EMBEDDED = "embedded"

ALLOW_CUSTOM_ENV = "SPECVIZ_ALLOW_CUSTOM_MODELS"
MAX_MODEL_GB_ENV = "SPECVIZ_MAX_MODEL_GB"
RESIDENT_PAIRS_ENV = "SPECVIZ_RESIDENT_PAIRS"
PRELOAD_ENV = "SPECVIZ_PRELOAD"
DEFAULT_MAX_MODEL_GB = 16.0
DEFAULT_RESIDENT_PAIRS = 1
HUB_TIMEOUT_S = 10

# The errors that mean "not enough memory", on the CPU or on a GPU; callers catch these around generation.
OOM_ERRORS: tuple[type[BaseException], ...] = (MemoryError, torch.OutOfMemoryError)

Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class Preset:
    """A curated drafter/target pair whose tokenizers are known to match.

    Attributes:
        drafter, target: hub ids (or local folders, for the embedded pair).
        licence: the models' licence (SPDX-style id, or the licence's hub name).
        drafter_params, target_params: parameter counts (approximate, from the model cards).
        bytes_per_param: how the weights are stored on the hub (2 for bf16, 4 for fp32): the download size.
        instruct: chat-tuned models; their prompts get the chat template (a toggle in the UI).
        gated: the hub asks each user to accept the licence; needs HF_TOKEN with access.
        drafter_revision, target_revision: a pinned commit or tag, or None for the default branch.
        note: one line for the menu.
    """

    drafter: str
    target: str
    licence: str
    drafter_params: int
    target_params: int
    bytes_per_param: int = 2
    instruct: bool = False
    gated: bool = False
    drafter_revision: str | None = None
    target_revision: str | None = None
    note: str = ""

    @property
    def bundled(self) -> bool:
        """The models are folders inside specviz (the embedded pair): no hub, no download."""
        return Path(self.drafter).is_absolute()

    @property
    def download_gb(self) -> float:
        """Both models' weights as stored on the hub, in GB (10^9 bytes)."""
        return (self.drafter_params + self.target_params) * self.bytes_per_param / 1e9

    def memory_gb(self, device: torch.device | str) -> float:
        """Both models' weights as loaded on ``device`` (bf16 on CUDA, fp32 on the CPU), in GB."""
        return (self.drafter_params + self.target_params) * _dtype_for(torch.device(device)).itemsize / 1e9

    @property
    def summary(self) -> str:
        """One line for a menu: licence, sizes, and what the pair needs."""
        parts = [self.licence, f"{_human(self.drafter_params)} -> {_human(self.target_params)} parameters",
                 "ships with specviz" if self.bundled else f"{self.download_gb:.1f} GB download"]
        if self.instruct:
            parts.append("instruct (chat template)")
        if self.gated:
            parts.append("gated: needs HF_TOKEN")
        if self.note:
            parts.append(self.note)
        return " · ".join(parts)


def _human(n: int) -> str:
    return f"{n / 1e9:.2g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


# Display name -> preset. Each hub pair shares one tokenizer (checked again at load time).
PRESETS: dict[str, Preset] = {
    EMBEDDED: Preset(
        str(ASSETS / "models" / "drafter"), str(ASSETS / "models" / "target"), "PSF-2.0 (training data)",
        990_000, 5_330_000, bytes_per_param=4, note="trained on the Python standard library; no hub needed",
    ),
    "SmolLM2-135M-Instruct -> SmolLM2-360M-Instruct": Preset(
        "HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-360M-Instruct", "apache-2.0",
        135_000_000, 362_000_000, instruct=True,
    ),
    "SmolLM2-135M-Instruct -> SmolLM2-1.7B-Instruct": Preset(
        "HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-1.7B-Instruct", "apache-2.0",
        135_000_000, 1_711_000_000, instruct=True,
    ),
    "Qwen2.5-0.5B-Instruct -> Qwen2.5-1.5B-Instruct": Preset(
        "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct", "apache-2.0",
        494_000_000, 1_544_000_000, instruct=True,
    ),
    "Qwen2.5-0.5B-Instruct -> Qwen2.5-7B-Instruct": Preset(
        "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "apache-2.0",
        494_000_000, 7_616_000_000, instruct=True,
        note="embedding tables padded differently (151,936 vs 152,064 rows), same tokenizer",
    ),
    "gpt2 -> gpt2-large": Preset(
        "openai-community/gpt2", "openai-community/gpt2-large", "mit", 124_000_000, 774_000_000, bytes_per_param=4,
    ),
    "gpt2 -> gpt2-xl": Preset(
        "openai-community/gpt2", "openai-community/gpt2-xl", "mit", 124_000_000, 1_558_000_000, bytes_per_param=4,
    ),
    "Llama-3.2-1B-Instruct -> Llama-3.2-3B-Instruct": Preset(
        "meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-3B-Instruct", "llama3.2",
        1_236_000_000, 3_213_000_000, instruct=True, gated=True,
    ),
}


class PairError(ValueError):
    """A pair that cannot be loaded or used; the message is written for the person who asked."""


@dataclass
class Pair:
    """A loaded drafter and target with their shared tokenizer.

    ``vocab_size`` is the tokenizer's size: both models' logits are cut to it before softmax.
    ``instruct`` says whether prompts should get the chat template by default.
    """

    name: str
    drafter: object
    target: object
    tokenizer: object
    device: torch.device
    instruct: bool = False
    preset: Preset | None = None
    drafter_id: str = ""
    target_id: str = ""
    revisions: tuple[str | None, str | None] = (None, None)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    @property
    def eos_token_ids(self) -> list[int]:
        """Every id that ends a reply: the tokenizer's EOS and the target's generation config's.

        Instruct models end a turn with a token of their own (``<|im_end|>``, ``<|eot_id|>``),
        listed in their generation config; pass this list as ``eos_token_id`` to the engine.
        """
        ids: list[int] = []
        config = getattr(self.target, "generation_config", None)
        for value in (self.tokenizer.eos_token_id, getattr(config, "eos_token_id", None)):
            for t in [value] if isinstance(value, int) else (value or []):
                if t is not None and int(t) not in ids and 0 <= int(t) < self.vocab_size:
                    ids.append(int(t))
        return ids

    @property
    def param_counts(self) -> tuple[int, int]:
        """(drafter, target) parameter counts."""
        return tuple(sum(p.numel() for p in m.parameters()) for m in (self.drafter, self.target))  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# Settings from the environment


def custom_models_allowed() -> bool:
    """True when the operator set SPECVIZ_ALLOW_CUSTOM_MODELS to 1/true/yes."""
    return os.environ.get(ALLOW_CUSTOM_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def max_model_gb() -> float:
    """The size limit for custom pairs, GB of weights as loaded (SPECVIZ_MAX_MODEL_GB, default 16)."""
    return _env_number(MAX_MODEL_GB_ENV, DEFAULT_MAX_MODEL_GB, float, minimum=0.0)


def resident_limit() -> int:
    """How many pairs stay loaded at once (SPECVIZ_RESIDENT_PAIRS, default 1)."""
    return _env_number(RESIDENT_PAIRS_ENV, DEFAULT_RESIDENT_PAIRS, int, minimum=1)


def _env_number(name: str, default, kind, minimum):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise PairError(f"{name}={raw!r} is not a number; unset it or give a number (default {default})") from None
    return max(value, minimum)


def default_device() -> torch.device:
    """CUDA when there is a GPU or on a ZeroGPU Space (its GPU appears only inside @spaces.GPU), else the CPU."""
    return torch.device("cuda" if gpu.on_zerogpu() or torch.cuda.is_available() else "cpu")


def _dtype_for(device: torch.device) -> torch.dtype:
    # bf16 halves memory traffic on the GPU; the CPU keeps fp32, where greedy equality is exact in practice.
    return torch.bfloat16 if device.type == "cuda" else torch.float32


# ---------------------------------------------------------------------------------------------
# Naming models and pairs


@dataclass(frozen=True)
class ModelRef:
    """One model: a local folder, or a hub id with an optional revision."""

    id: str
    revision: str | None = None
    local: bool = False

    def __str__(self) -> str:
        return f"{self.id}@{self.revision}" if self.revision else self.id

    @property
    def shown(self) -> str:
        """How progress messages name it: a folder by its last part, a hub id in full."""
        return Path(self.id).name if self.local else str(self)


def parse_model_ref(text: str, allow_local: bool = True) -> ModelRef:
    """A local folder (when ``allow_local``), ``owner/name`` or ``owner/name@revision`` (a branch, tag or commit).

    Raises:
        PairError: an empty or malformed id.
    """
    text = (text or "").strip()
    if not text:
        raise PairError("give a model id (owner/name, optionally @revision)")
    if allow_local and Path(text).exists():
        return ModelRef(text, None, local=True)
    repo, at, rev = text.partition("@")
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError:
        raise PairError(f"'{text}' is not a model id: expected owner/name, optionally followed by @revision") from None
    if at and not _REVISION.fullmatch(rev):
        raise PairError(f"'{text}': the part after @ must be a branch, tag or commit hash")
    return ModelRef(repo, rev or None)


_REVISION = re.compile(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")


def resolve(name: str | None = None, drafter: str | None = None, target: str | None = None) -> tuple[str, str, str]:
    """(label, drafter, target) from a preset name or explicit ids; ids may carry ``@revision``.

    Raises:
        PairError: for an unknown preset name, or only one of drafter and target.
    """
    if drafter or target:
        if not (drafter and target):
            raise PairError("give both a drafter and a target")
        return f"{drafter.strip()} -> {target.strip()}", drafter.strip(), target.strip()
    name = name or EMBEDDED
    if name not in PRESETS:
        raise PairError(f"unknown pair '{name}'; choose one of: {', '.join(PRESETS)}")
    p = PRESETS[name]
    return name, str(ModelRef(p.drafter, p.drafter_revision)), str(ModelRef(p.target, p.target_revision))


# ---------------------------------------------------------------------------------------------
# Errors


def _is_unreachable(err: BaseException) -> bool:
    """A connection failure, a timeout, or offline mode: the hub did not answer."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    if isinstance(err, (ConnectionError, TimeoutError, OfflineModeIsEnabled, LocalEntryNotFoundError)):
        return True
    # huggingface_hub's HTTP client (httpx or its fork) raises its own transport errors.
    return any(c.__module__.split(".")[0].startswith("httpx") and c.__name__ in ("TransportError", "TimeoutException")
               for c in type(err).__mro__)


def _explain(model_id: str, err: BaseException) -> PairError:
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
        return PairError(f"'{model_id}' is gated: accept its licence on its hub page and set HF_TOKEN to a token with access")
    if isinstance(err, RepositoryNotFoundError):
        return PairError(f"'{model_id}' was not found on the model hub (check the spelling, or set HF_TOKEN if it is private)")
    if isinstance(err, RevisionNotFoundError):
        return PairError(f"'{model_id}': the requested revision does not exist on the model hub")
    if isinstance(err, NotASafetensorsRepoError):
        return PairError(f"'{model_id}' has no safetensors weights; specviz loads only safetensors (other formats can run code when loaded)")
    if _is_unreachable(err):
        return PairError(f"'{model_id}' is not in the local cache and the model hub cannot be reached; use the embedded pair")
    if isinstance(err, OOM_ERRORS):
        return PairError(f"'{model_id}' does not fit in this machine's memory; pick a smaller pair")
    text = str(err)
    low = text.lower()
    if "trust_remote_code" in low or "custom code" in low:
        return PairError(f"'{model_id}' needs its own Python code to load (trust_remote_code); specviz never runs code from the hub")
    if "gated" in low:
        return PairError(f"'{model_id}' is gated: accept its licence on its hub page and set HF_TOKEN to a token with access")
    if "safetensors" in low and ("not found" in low or "no file" in low or "does not appear" in low):
        return PairError(f"'{model_id}' has no safetensors weights; specviz loads only safetensors (other formats can run code when loaded)")
    if "connect" in low or "offline" in low:
        return PairError(f"'{model_id}' could not be downloaded: the model hub cannot be reached; use the embedded pair")
    return PairError(f"'{model_id}' could not be loaded: {text.splitlines()[0] if text else type(err).__name__}")


def _root_cause(err: BaseException) -> BaseException:
    """transformers wraps hub errors in OSError/ValueError; the hub's own type is the cause."""
    cause = err.__cause__
    return cause if isinstance(cause, Exception) else err


# ---------------------------------------------------------------------------------------------
# Asking the hub before downloading


def hub_reachable(model_id: str) -> bool:
    """Ask the hub about ``model_id`` once, with a short timeout and no retries.

    Returns True for a local folder or a model the hub answered for, False when the hub
    cannot be reached (loading then uses the local cache only, instead of retrying for a minute).

    Raises:
        PairError: the hub answered that the model (or its revision) does not exist.
    """
    if Path(model_id).exists():
        return True
    ref = parse_model_ref(model_id)
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        HfApi().model_info(ref.id, revision=ref.revision, timeout=5)
        return True
    except GatedRepoError:
        return True  # the download says whether the token grants access
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:
        raise _explain(str(ref), err) from err
    except HfHubHTTPError:
        return True  # the hub answered; let the download report the details
    except Exception:  # connection refused, DNS failure, offline mode: no hub here
        return False


@dataclass
class _Checked:
    """What the hub said about one model before any weights were downloaded."""

    ref: ModelRef
    params: int | None  # from the safetensors headers; None when unknown (offline preset)
    offline: bool  # load from the local cache only
    revision: str | None  # the commit to download (pinned: the branch cannot move mid-load)


def _check_hub_model(ref: ModelRef, custom: bool) -> _Checked:
    """Existence, revision, access and safetensors weights, from metadata only.

    A preset whose hub cannot be reached falls back to the local cache; a custom id is refused,
    because its size cannot be checked.
    """
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        info = api.model_info(ref.id, revision=ref.revision, timeout=HUB_TIMEOUT_S)
        meta = api.get_safetensors_metadata(ref.id, revision=info.sha or ref.revision, timeout=HUB_TIMEOUT_S)
    except Exception as err:
        if _is_unreachable(err):
            if custom:
                raise PairError(f"the model hub cannot be reached, so '{ref}' cannot be checked; try again later or use a preset pair") from err
            return _Checked(ref, None, True, ref.revision)
        raise _explain(str(ref), err) from err
    return _Checked(ref, int(sum(meta.parameter_count.values())), False, info.sha or ref.revision)


def _local_params(folder: str) -> int | None:
    """Parameter count from the headers of a folder's safetensors files (None when there are none)."""
    total, found = 0, False
    for f in sorted(Path(folder).glob("*.safetensors")):
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error):
            return None
        for name, t in header.items():
            if name != "__metadata__":
                count = 1
                for d in t.get("shape", []):
                    count *= d
                total += count
        found = True
    return total if found else None


def _cgroup_free_bytes(root: str = "/sys/fs/cgroup") -> int | None:
    """Memory left under this process's cgroup limit (v2, else v1), or None without a limit.

    In a container (a Space, say) the limit is the cgroup's, not the host's memory that
    /proc/meminfo reports.
    """
    for limit, used in (("memory.max", "memory.current"), ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            cap, now = (Path(root) / limit).read_text().strip(), int((Path(root) / used).read_text().strip())
        except (OSError, ValueError):
            continue
        if cap.isdigit() and int(cap) < 2**60:  # "max", or v1's huge number: no limit
            return max(0, int(cap) - now)
        return None
    return None


def _available_memory_bytes(device: torch.device) -> int | None:
    """Free memory where the weights will go, or None when it cannot be told (then nothing is refused)."""
    if device.type == "cpu":
        free = []
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    free.append(int(line.split()[1]) * 1024)
        except (OSError, ValueError, IndexError):
            pass
        if (in_cgroup := _cgroup_free_bytes()) is not None:
            free.append(in_cgroup)
        return min(free) if free else None
    if device.type == "cuda" and not gpu.on_zerogpu():  # ZeroGPU attaches a GPU only inside @spaces.GPU
        try:
            return torch.cuda.mem_get_info(device)[0]
        except Exception:
            return None
    return None


# ---------------------------------------------------------------------------------------------
# Loading


def _load_tokenizer(ref: ModelRef, revision: str | None, local_only: bool):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(ref.id, revision=revision, local_files_only=local_only, trust_remote_code=False)
    except Exception as err:  # transformers wraps hub errors in OSError and ValueError
        raise _explain(str(ref), _root_cause(err)) from err


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


def _load_model(ref: ModelRef, revision: str | None, device: torch.device, local_only: bool):
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            ref.id, revision=revision, dtype=_dtype_for(device), local_files_only=local_only,
            trust_remote_code=False, use_safetensors=True,
        )
    except Exception as err:
        raise _explain(str(ref), _root_cause(err)) from err
    # Inference only: with no parameter asking for gradients, no forward pass ever builds an
    # autograd graph, whichever thread runs it and whatever its grad mode (a streaming handler
    # may be resumed on another worker thread, outside the inference mode it entered).
    model.requires_grad_(False)
    try:
        # On ZeroGPU this runs outside @spaces.GPU, as its docs require: the weights are placed
        # on "cuda" once, at load time, and the GPU is attached when a decorated function runs.
        return model.to(device).eval()
    except OOM_ERRORS as err:
        del model
        raise _explain(str(ref), err) from err


def free_memory(device: torch.device | str | None = None) -> None:
    """Collect garbage and give cached memory back: CUDA's cached blocks, and on Linux the C
    heap's free pages (after an out-of-memory error, an eviction, or a finished run)."""
    gc.collect()
    dev = torch.device(device) if device is not None else None
    if (dev is None or dev.type == "cuda") and torch.cuda.is_available() and not gpu.on_zerogpu():
        torch.cuda.empty_cache()
    if dev is None or dev.type == "cpu":
        _trim_c_heap()


def _trim_c_heap() -> None:
    # glibc keeps freed tensor memory for reuse, so a server's RSS creeps up run after run
    # (measured: +17 MB over 30 runs of the embedded pair, flat with a trim after each).
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        pass


class _Loading:
    """A load in progress: later callers for the same pair wait on it instead of loading twice."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.pair: Pair | None = None
        self.error: BaseException | None = None


_resident: OrderedDict[tuple, Pair] = OrderedDict()  # least recently used first
_loading: dict[tuple, _Loading] = {}
_state_lock = threading.Lock()  # guards _resident and _loading; held only for bookkeeping, never while loading
_load_lock = threading.Lock()  # one load at a time, so two loads never hold twice the memory


def resident_pairs() -> list[str]:
    """Labels of the pairs loaded now, least recently used first."""
    with _state_lock:
        return [p.name for p in _resident.values()]


def loaded_pair(name: str | None = None, drafter: str | None = None, target: str | None = None,
                device: str | torch.device | None = None) -> Pair | None:
    """The pair if it is resident now, else None; never loads anything.

    For code that must not load, such as a function running under ``@spaces.GPU`` on ZeroGPU
    (loading there would repeat on every call).
    """
    _, refs, _ = _plan(name, drafter, target, allow_custom=True)
    key = _key(refs, torch.device(device) if device is not None else default_device())
    with _state_lock:
        return _resident.get(key)


def unload_all() -> None:
    """Forget every resident pair (tests; an operator freeing memory)."""
    with _state_lock:
        dropped = list(_resident.values())
        _resident.clear()
    devices = {p.device for p in dropped}
    dropped.clear()
    for d in devices:
        free_memory(d)


def preload_names() -> list[str]:
    """The presets to load at start-up: SPECVIZ_PRELOAD, comma-separated display names (default: embedded).

    Raises:
        PairError: a name that is not a preset.
    """
    raw = os.environ.get(PRELOAD_ENV, "").strip()
    names = [n.strip() for n in raw.split(",") if n.strip()] if raw else [EMBEDDED]
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        raise PairError(f"{PRELOAD_ENV} names unknown pairs {unknown}; choose from: {', '.join(PRESETS)}")
    return names


def preload(names: list[str] | None = None, device: str | torch.device | None = None,
            progress: Progress | None = None) -> dict[str, Pair | PairError]:
    """Load pairs before the app starts serving; a pair that fails is reported, not raised.

    On ZeroGPU this is where weights must be placed: ZeroGPU packs everything on "cuda" when the
    app launches and hands it to each GPU worker; a worker forked earlier does not see a pair
    loaded later (it would load its own copy on every new worker).

    Args:
        names: preset names (default: ``preload_names()``).

    Raises:
        PairError: more names than SPECVIZ_RESIDENT_PAIRS keeps, or an unknown name.
    """
    names = preload_names() if names is None else list(names)
    if len(names) > resident_limit():
        raise PairError(f"{len(names)} pairs to preload but {RESIDENT_PAIRS_ENV}={resident_limit()} keeps fewer; raise it to {len(names)}")
    results: dict[str, Pair | PairError] = {}
    for name in names:
        try:
            results[name] = load_pair(name, device=device, progress=progress)
        except PairError as err:
            results[name] = err
    return results


def _key(refs: tuple[ModelRef, ModelRef], device: torch.device) -> tuple:
    return (str(refs[0]), str(refs[1]), str(device))


def _evict_for_one_more() -> None:
    """Drop least recently used pairs until one more fits within the resident limit.

    A visitor still generating with a dropped pair keeps it alive until they finish; its
    memory comes back then.
    """
    with _state_lock:
        dropped = []
        while _resident and len(_resident) >= resident_limit():
            dropped.append(_resident.popitem(last=False)[1])
    devices = {p.device for p in dropped}
    dropped.clear()
    for d in devices:
        free_memory(d)


def _plan(name, drafter, target, allow_custom) -> tuple[str, tuple[ModelRef, ModelRef], Preset | None]:
    """(label, (drafter, target), preset or None), refusing custom ids the server does not accept."""
    label, drafter_s, target_s = resolve(name, drafter, target)
    if not (drafter or target):
        return label, (parse_model_ref(drafter_s), parse_model_ref(target_s)), PRESETS[label]
    if allow_custom is False:
        raise PairError("custom model ids are not accepted here; pick one of the preset pairs")
    if allow_custom is None and not custom_models_allowed():
        raise PairError(
            "custom model ids are turned off on this server; pick one of the preset pairs "
            f"(the operator can allow them with {ALLOW_CUSTOM_ENV}=1)"
        )
    # The web demo (allow_custom None) takes hub ids only: a visitor never names a server folder.
    local = allow_custom is True
    return label, (parse_model_ref(drafter_s, local), parse_model_ref(target_s, local)), None


def load_pair(name: str | None = None, drafter: str | None = None, target: str | None = None,
              device: str | torch.device | None = None, *, progress: Progress | None = None,
              allow_custom: bool | None = None) -> Pair:
    """Load a pair once and share it across callers and threads.

    Up to ``SPECVIZ_RESIDENT_PAIRS`` pairs (default 1) stay loaded; loading another frees the least
    recently used. Threads asking for the same pair share one load; threads asking for
    different pairs load one after the other, so two loads never need memory at once.

    Args:
        name: a key of ``PRESETS`` (default: the embedded pair).
        drafter, target: model folders or hub ids (``owner/name[@revision]``), instead of ``name``.
        device: "cpu", "cuda", or None for CUDA when available (and on ZeroGPU).
        progress: called as ``progress(fraction, message)`` at each loading stage (fraction 0..1).
        allow_custom: whether ids outside the presets are accepted. None: hub ids only, and only
            when the operator set SPECVIZ_ALLOW_CUSTOM_MODELS=1 (the web demo). True: hub ids and
            local folders (the command line and the Python API, where the caller is the operator).
            False: presets only.

    Raises:
        PairError: unknown preset, custom ids turned off, malformed id, model or revision not found,
            hub unreachable (with no cached copy), gated model without a token, no safetensors
            weights, custom pair over the size limit, tokenizers that differ, not enough memory.
    """
    say = progress or (lambda fraction, message: None)
    label, refs, preset = _plan(name, drafter, target, allow_custom)
    dev = torch.device(device) if device is not None else default_device()
    key = _key(refs, dev)

    with _state_lock:
        if key in _resident:
            _resident.move_to_end(key)
            pair = _resident[key]
            say(1.0, f"{label} is loaded")
            return pair
        job = _loading.get(key)
        owner = job is None
        if owner:
            job = _loading[key] = _Loading()
    if not owner:
        say(0.0, f"Waiting: {label} is being loaded for another visitor")
        job.done.wait()
        if isinstance(job.error, PairError):
            raise PairError(str(job.error))
        if job.error is not None:
            raise PairError(f"'{label}' could not be loaded ({type(job.error).__name__}); try again")
        say(1.0, f"{label} is loaded")
        return job.pair

    try:
        if not _load_lock.acquire(blocking=False):
            say(0.0, "Waiting for another pair to finish loading")
            _load_lock.acquire()
        try:
            job.pair = _load(label, refs, dev, preset, say)
            with _state_lock:  # still under the load lock: no other load evicts in between
                _resident[key] = job.pair
        finally:
            _load_lock.release()
        say(1.0, f"{label} is ready on {dev.type}")
        return job.pair
    except BaseException as err:
        job.error = err
        free_memory(dev)
        raise
    finally:
        with _state_lock:
            _loading.pop(key, None)
        job.done.set()


def _load(label: str, refs: tuple[ModelRef, ModelRef], dev: torch.device, preset: Preset | None, say: Progress) -> Pair:
    """The loading stages, in the order that refuses a bad pair before downloading weights."""
    dref, tref = refs
    say(0.02, f"Checking {label}")
    if preset is not None and preset.gated:
        from huggingface_hub import get_token

        if not get_token():
            raise PairError(f"'{label}' is gated: accept the licence on each model's hub page and set HF_TOKEN to a token with access")

    checked = []
    for i, ref in enumerate(refs):
        if ref.local:
            checked.append(_Checked(ref, _local_params(ref.id), True, None))
        else:
            say(0.05 + 0.05 * i, f"Checking {ref} on the model hub")
            checked.append(_check_hub_model(ref, custom=preset is None))
    dc, tc = checked

    dtype = _dtype_for(dev)
    params = [c.params for c in checked]
    if preset is not None:  # offline: the catalogue's counts
        params = [p if p is not None else q for p, q in zip(params, (preset.drafter_params, preset.target_params))]
    need_gb = sum(p or 0 for p in params) * dtype.itemsize / 1e9
    if preset is None and not (dref.local or tref.local) and need_gb > max_model_gb():
        raise PairError(
            f"'{dref}' and '{tref}' have {_human(sum(params))} parameters together: {need_gb:.1f} GB in "
            f"{str(dtype).removeprefix('torch.')} on {dev.type}, over this server's limit of {max_model_gb():g} GB "
            f"({MAX_MODEL_GB_ENV}); pick smaller models"
        )

    say(0.15, "Loading the tokenizers")
    d_tok = _load_tokenizer(dref, dc.revision, dc.offline)
    t_tok = _load_tokenizer(tref, tc.revision, tc.offline)
    say(0.2, "Comparing the tokenizers")
    check_same_tokenizer(str(dref), d_tok, str(tref), t_tok)

    say(0.25, "Making room")
    _evict_for_one_more()
    free = _available_memory_bytes(dev)
    if free is not None and need_gb * 1e9 > free:
        raise PairError(
            f"'{label}' needs about {need_gb:.1f} GB of memory on {dev.type} and {free / 1e9:.1f} GB is free; pick a smaller pair"
        )

    say(0.3, f"Loading the drafter {dref.shown}" + ("" if dc.offline else " (downloading it if it is not cached)"))
    d_model = _load_model(dref, dc.revision, dev, dc.offline)
    say(0.6, f"Loading the target {tref.shown}" + ("" if tc.offline else " (downloading it if it is not cached)"))
    t_model = _load_model(tref, tc.revision, dev, tc.offline)
    instruct = preset.instruct if preset is not None else bool(getattr(t_tok, "chat_template", None))
    return Pair(label, d_model, t_model, t_tok, dev, instruct=instruct, preset=preset, drafter_id=str(dref),
                target_id=str(tref), revisions=(dc.revision, tc.revision))


# ---------------------------------------------------------------------------------------------
# Prompts


def encode_prompt(pair: Pair, prompt: str, chat: bool | None = None) -> list[int]:
    """The prompt's token ids, wrapped in the chat template for an instruct pair.

    Args:
        chat: True applies the tokenizer's chat template (one user turn, then the assistant's
            turn opened); False encodes the text as it is; None does what suits the pair
            (the template for instruct pairs).

    Raises:
        PairError: the template was asked for and the tokenizer has none.
    """
    tok = pair.tokenizer
    if chat is None:
        chat = pair.instruct
    if not chat:
        return tok(prompt, add_special_tokens=False)["input_ids"]
    if not getattr(tok, "chat_template", None):
        raise PairError(f"'{pair.name}' has no chat template; turn the chat template off to send the text as it is")
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    # The template writes the special tokens (BOS included) itself.
    return tok(text, add_special_tokens=False)["input_ids"]
