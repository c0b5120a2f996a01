"""The resident pairs: loaded once, shared across callers and threads, the least recently used freed first."""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable

import torch

from specviz.pair.catalogue import PRESETS, ModelRef, check_drafter_kind, default_pair
from specviz.pair.errors import PairError
from specviz.pair.loading import Pair, Progress, forget_shared, load, plan
from specviz.pair.memory import available_memory_bytes, default_device, free_memory, freeze_long_lived, thaw
from specviz.pair.settings import PRELOAD_ENV, RESIDENT_PAIRS_ENV, resident_limit

log = logging.getLogger("specviz")


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
    """The pair if it is resident now (then marked the most recently used, as a load of it would), else None;
    never loads anything.

    For code that must not load, such as a function running under ``@spaces.GPU`` on ZeroGPU
    (loading there would repeat on every call), or a caller that must not wait behind another pair's load.
    """
    _, refs, _ = plan(name, drafter, target, allow_custom=True)
    key = _key(refs, torch.device(device) if device is not None else default_device())
    # Read without waiting for the lock: a run's first step on the device thread asks here, and a load holding the lock
    # may itself be waiting for the device thread's turn (``specviz.serving.device_thread.deferring``). A dict's read
    # is atomic; the mark as most recently used is skipped while another thread holds the lock.
    pair = _resident.get(key)
    if pair is not None and _state_lock.acquire(blocking=False):
        try:
            if key in _resident:
                _resident.move_to_end(key)
        finally:
            _state_lock.release()
    return pair


def unload_all() -> None:
    """Forget every resident pair, and every model and tokenizer kept to share between pairs (tests; an operator
    freeing memory): the next load reads all of its pair again."""
    with _state_lock:
        dropped = list(_resident.values())
        _resident.clear()
    forget_shared()
    devices = {p.device for p in dropped}
    _forget_graphs(dropped)
    dropped.clear()
    thaw()
    for d in devices:
        free_memory(d)


def preload_names() -> list[str]:
    """The presets to load at start-up: SPECVIZ_PRELOAD, comma-separated display names (default:
    ``default_pair()``, the English pair where it loads offline, else the embedded pair).

    Raises:
        PairError: a name that is not a preset.
    """
    raw = os.environ.get(PRELOAD_ENV, "").strip()
    names = [n.strip() for n in raw.split(",") if n.strip()] if raw else [default_pair()]
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
        raise PairError(
            f"{len(names)} pairs to preload but {RESIDENT_PAIRS_ENV}={resident_limit()} keeps fewer; raise it to "
            f"{len(names)}"
        )
    results: dict[str, Pair | PairError] = {}
    for name in names:
        try:
            results[name] = load_pair(name, device=device, progress=progress)
        except PairError as err:
            results[name] = err
    return results


def _forget_graphs(pairs) -> None:
    """The captured CUDA graphs and caches of ``pairs``' models let go with them (``specviz.engine.graphs.forget``)."""
    from specviz.engine import graphs

    graphs.forget(*(m for p in pairs for m in (p.target, p.drafter)))


def _key(refs: tuple[ModelRef, ModelRef], device: torch.device) -> tuple:
    return (str(refs[0]), str(refs[1]), str(device))


def _weight_bytes(pair: Pair) -> int:
    """Bytes of ``pair``'s weights (its drafter's and target's parameters; one model counted once)."""
    models = {id(pair.drafter): pair.drafter, id(pair.target): pair.target}.values()
    return sum(p.numel() * p.element_size() for model in models for p in model.parameters())


def _make_room(need_bytes: int, dev: torch.device) -> None:
    """Drop least recently used pairs until one more fits: within the resident limit (SPECVIZ_RESIDENT_PAIRS), and,
    where the free memory on ``dev`` is known, until the weights dropped on ``dev`` cover what the new pair's
    ``need_bytes`` lack. Each pair dropped is logged once, with the reason.

    A visitor still generating with a dropped pair keeps it alive until they finish; its
    memory comes back then.
    """
    free = available_memory_bytes(dev)
    short = 0 if free is None else max(0, need_bytes - free)
    dropped: list[tuple[Pair, str]] = []
    with _state_lock:
        while _resident and len(_resident) >= resident_limit():
            limit = f"at most {resident_limit()} pairs stay loaded ({RESIDENT_PAIRS_ENV})"
            dropped.append((_resident.popitem(last=False)[1], limit))
        freed = sum(_weight_bytes(p) for p, _ in dropped if p.device == dev)
        for key in [k for k, p in _resident.items() if p.device == dev]:  # least recently used first
            if freed >= short:
                break
            pair = _resident.pop(key)
            freed += _weight_bytes(pair)
            dropped.append((pair, f"{need_bytes / 1e9:.2f} GB needed on {dev.type}, {free / 1e9:.2f} GB free"))
    for pair, why in dropped:
        log.warning("unloaded the pair %s, the least recently used, to load another: %s", pair.name, why)
    devices = {p.device for p, _ in dropped}
    _forget_graphs([p for p, _ in dropped])
    if dropped:
        thaw()  # a frozen pair's cycles would never be collected
    dropped.clear()
    for d in devices:
        free_memory(d)


def _reclaimable_bytes(dev: torch.device) -> int:
    """Bytes of weights on ``dev`` that ``_make_room`` could free: every resident pair's there."""
    with _state_lock:
        return sum(_weight_bytes(pair) for pair in _resident.values() if pair.device == dev)


def load_pair(
    name: str | None = None,
    drafter: str | None = None,
    target: str | None = None,
    device: str | torch.device | None = None,
    *,
    progress: Progress | None = None,
    allow_custom: bool | None = None,
    own_tokenizer: bool = False,
    kind: str | None = None,
    timing: Callable | None = None,
) -> Pair:
    """Load a pair once and share it across callers and threads.

    Up to ``SPECVIZ_RESIDENT_PAIRS`` pairs (default 1) stay loaded, fewer where memory is short; loading
    another frees the least recently used, as many as it needs (``_make_room``, which logs each). Threads asking
    for the same pair share one load; threads asking for different pairs load one after the other, so two loads
    never need memory at once.

    Args:
        name: a key of ``PRESETS`` (default: the embedded pair).
        drafter, target: model folders or hub ids (``owner/name[@revision]``), instead of ``name``.
        device: "cpu", "cuda", or None for CUDA when available (and on ZeroGPU).
        progress: called as ``progress(fraction, message)`` at each loading stage (fraction 0..1).
        allow_custom: whether ids outside the presets are accepted. None: hub ids only, and only
            when the operator set SPECVIZ_ALLOW_CUSTOM_MODELS=1 (the web demo). True: hub ids and
            local folders (the command line and the Python API, where the caller is the operator).
            False: presets only.
        own_tokenizer: the caller drafts with the cross-tokenizer kind, so a drafter whose tokenizer
            differs from the target's is accepted when the two share enough tokens (presets marked
            ``own_tokenizer`` always are); the Pair then carries both tokenizers.
        kind: the drafter kind the caller drafts with (None: the pair's own). A preset that does not
            draft with it is refused before anything loads (``check_drafter_kind``); "cross-tokenizer"
            implies ``own_tokenizer``.
        timing: runs the product kernels' timing a fp32 load makes, ``timing(fn, *args)``, where the passes will run
            (a server's device thread: ``specviz.serving.device_thread.run``); None: on the loading thread.

    Raises:
        PairError: unknown preset, custom ids turned off, malformed id, model or revision not found,
            hub unreachable (with no cached copy), gated model without a token, no safetensors
            weights, custom pair over the size limit, tokenizers that differ (unless the drafter may
            bring its own, and then too little shared vocabulary), not enough memory; a preset asked
            for a drafter kind it does not draft with.
    """
    say = progress or (lambda fraction, message: None)
    label, refs, preset = plan(name, drafter, target, allow_custom)
    if preset is not None:
        check_drafter_kind(label, kind)
    own_tokenizer = own_tokenizer or kind == "cross-tokenizer"
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
            job.pair = load(
                label,
                refs,
                dev,
                preset,
                say,
                make_room=_make_room,
                reclaimable=_reclaimable_bytes,
                own_tokenizer=own_tokenizer,
                timing=timing,
            )
            with _state_lock:  # still under the load lock: no other load evicts in between
                _resident[key] = job.pair
            freeze_long_lived(full=False)  # the new pair lives on: later collections leave it out
        finally:
            _load_lock.release()
        form = f" in {job.pair.form.name}" if job.pair.form is not None else ""
        say(1.0, f"{label} is ready on {dev.type}{form}")
        return job.pair
    except BaseException as err:
        job.error = err
        free_memory(dev)
        raise
    finally:
        with _state_lock:
            _loading.pop(key, None)
        job.done.set()
