"""Model pairs: the embedded pair, curated hub presets, custom ids, and loading a drafter and a target together.

Each module holds one concern; this package re-exports the public names, so callers write
``from specviz.pair import load_pair``:

- ``catalogue``: the presets (``PRESETS``, ``Preset``), the default pair (``default_pair``: the
  English pair when it loads offline, else the embedded one) and how models and pairs are named
  (``ModelRef``, ``parse_model_ref``, ``resolve``).
- ``converted``: a model shipped as a GGUF file, converted once to a cached safetensors folder.
- ``small_head``: ``SmallHeadLM``, the English pair's drafter class.
- ``hub``: what the model hub says about a model before anything is downloaded.
- ``memory``: the device and dtype a pair gets, free memory there, giving memory back.
- ``loading``: the loading stages and the loaded ``Pair``.
- ``cache``: the resident pairs, shared across callers and threads (``load_pair``, ``preload``).
- ``prompt``: a prompt as token ids, with or without the chat template.
- ``settings``: the operator's environment variables; ``errors``: ``PairError`` and its messages.

Every failure a visitor can cause becomes a ``PairError`` with a message meant for them; the
caller decides how to show it. Whether this is a ZeroGPU Space is asked of ``specviz.engine.zerogpu``.
"""

from specviz.pair.cache import loaded_pair, load_pair, preload, preload_names, resident_pairs, unload_all
from specviz.pair.catalogue import (
    ASSETS,
    CROSS,
    EMBEDDED,
    ENGLISH,
    PRESETS,
    ModelRef,
    Preset,
    default_pair,
    english_available,
    parse_model_ref,
    resolve,
)
from specviz.pair.errors import OOM_ERRORS, PairError
from specviz.pair.hub import HUB_TIMEOUT_S
from specviz.pair.loading import Pair, Progress, check_same_tokenizer, check_shared_vocabulary
from specviz.pair.memory import bound_kernel_caches, default_device, free_memory, one_heap, freeze_long_lived
from specviz.pair.prompt import encode_prompt
from specviz.pair.settings import (
    ALLOW_CUSTOM_ENV,
    DEFAULT_MAX_MODEL_GB,
    DEFAULT_RESIDENT_PAIRS,
    MAX_MODEL_GB_ENV,
    PRELOAD_ENV,
    RESIDENT_PAIRS_ENV,
    custom_models_allowed,
    max_model_gb,
    resident_limit,
)

__all__ = [
    "ALLOW_CUSTOM_ENV",
    "ASSETS",
    "CROSS",
    "DEFAULT_MAX_MODEL_GB",
    "DEFAULT_RESIDENT_PAIRS",
    "EMBEDDED",
    "ENGLISH",
    "HUB_TIMEOUT_S",
    "MAX_MODEL_GB_ENV",
    "OOM_ERRORS",
    "PRELOAD_ENV",
    "PRESETS",
    "RESIDENT_PAIRS_ENV",
    "ModelRef",
    "Pair",
    "PairError",
    "Preset",
    "Progress",
    "check_same_tokenizer",
    "check_shared_vocabulary",
    "custom_models_allowed",
    "default_device",
    "default_pair",
    "encode_prompt",
    "english_available",
    "bound_kernel_caches",
    "free_memory",
    "load_pair",
    "loaded_pair",
    "max_model_gb",
    "one_heap",
    "parse_model_ref",
    "preload",
    "preload_names",
    "freeze_long_lived",
    "resident_limit",
    "resident_pairs",
    "resolve",
    "unload_all",
]
