"""The operator's settings for pair loading, read from the environment at each call.

- ``SPECVIZ_ALLOW_CUSTOM_MODELS=1``: visitors may ask for hub ids outside the presets
  (``owner/name`` or ``owner/name@revision``). Off by default.
- ``SPECVIZ_MAX_MODEL_GB`` (default 16): the largest custom pair, drafter plus target, in GB of
  weights as loaded (bf16 on a GPU; on the CPU in its form, ``specviz.pair.precision``), checked from the hub's
  safetensors metadata before anything is downloaded.
- ``SPECVIZ_RESIDENT_PAIRS`` (default 1): how many pairs stay loaded; asking for another one
  frees the least recently used.
- ``SPECVIZ_PRELOAD`` (default ``embedded``): presets loaded at start-up by ``preload()``,
  comma-separated display names (on ZeroGPU, the pairs the Space serves).
- ``SPECVIZ_CACHE_DIR``: where converted models are kept (default ``$XDG_CACHE_HOME/specviz``,
  else ``~/.cache/specviz``).
"""

from __future__ import annotations

import os
from pathlib import Path

from specviz.pair.errors import PairError
from specviz.engine.zerogpu import truthy

ALLOW_CUSTOM_ENV = "SPECVIZ_ALLOW_CUSTOM_MODELS"
MAX_MODEL_GB_ENV = "SPECVIZ_MAX_MODEL_GB"
RESIDENT_PAIRS_ENV = "SPECVIZ_RESIDENT_PAIRS"
PRELOAD_ENV = "SPECVIZ_PRELOAD"
CACHE_DIR_ENV = "SPECVIZ_CACHE_DIR"
DEFAULT_MAX_MODEL_GB = 16.0
DEFAULT_RESIDENT_PAIRS = 1


def custom_models_allowed() -> bool:
    """True when the operator set SPECVIZ_ALLOW_CUSTOM_MODELS to 1/true/yes."""
    return truthy(os.environ.get(ALLOW_CUSTOM_ENV))


def max_model_gb() -> float:
    """The size limit for custom pairs, GB of weights as loaded (SPECVIZ_MAX_MODEL_GB, default 16)."""
    return _env_number(MAX_MODEL_GB_ENV, DEFAULT_MAX_MODEL_GB, float, minimum=0.0)


def resident_limit() -> int:
    """How many pairs stay loaded at once (SPECVIZ_RESIDENT_PAIRS, default 1)."""
    return _env_number(RESIDENT_PAIRS_ENV, DEFAULT_RESIDENT_PAIRS, int, minimum=1)


def cache_dir() -> Path:
    """Where converted models are kept: SPECVIZ_CACHE_DIR, else $XDG_CACHE_HOME/specviz, else ~/.cache/specviz."""
    if os.environ.get(CACHE_DIR_ENV, "").strip():
        return Path(os.environ[CACHE_DIR_ENV].strip()).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache") / "specviz"


def _env_number(name: str, default, kind, minimum):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise PairError(f"{name}={raw!r} is not a number; unset it or give a number (default {default})") from None
    return max(value, minimum)
