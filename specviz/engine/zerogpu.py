"""Whether this process runs on a Hugging Face ZeroGPU Space: the platform's flag, read in one place.

The platform sets ``SPACES_ZERO_GPU`` and preinstalls the ``spaces`` package. ``specviz.serving.gpu``
(the ``@spaces.GPU`` decorator), ``specviz.pair`` (where weights go, whether CUDA may be
queried) and the engine's CUDA graphs (never fused there, ``specviz.engine.graphs``) all ask this
module, so none imports another for it; it lives in the engine, the lowest of the three
(``specviz.serving.zerogpu`` re-exports it). It imports neither torch nor ``spaces``.
"""

from __future__ import annotations

import importlib.util
import os

ZEROGPU_ENV = "SPACES_ZERO_GPU"


def truthy(value: str | None) -> bool:
    """True for 1/true/yes/on, in any case and with spaces around."""
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def on_zerogpu() -> bool:
    """True on a ZeroGPU Space: the platform's flag is set and the ``spaces`` package is installed."""
    return truthy(os.environ.get(ZEROGPU_ENV)) and importlib.util.find_spec("spaces") is not None
