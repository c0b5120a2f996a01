"""The ``auto`` tree for a loaded pair: measure this pair on this device (``specviz.engine.tree.calibration``),
then let the engine's choice decide (``specviz.engine.tree.auto.decide``, ``specviz.theory.sequoia``).

The calibration is cached per (pair key, drafter, sampling regime) for the process's life, and on
disk per (pair key, drafter, sampling regime, machine key) across processes (``cache_dir()``'s
auto_tree.json, a few dozen entries at most, written atomically); a stopped teacher-forced calibration
keeps what it measured there (``store_partial``) and the next one goes on from it. The file is data from
outside: every entry is checked on reading (``Calibration.from_dict``, ``check_partial``) and one that
fails is measured again.

``auto_tree(...)`` returns an ``AutoTree``: the TreeSpec to draft (None: the chain won) and the
gamma to run a chain at, with the choice and its inputs to state.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from pathlib import Path

import torch

from specviz.engine.sampling import Sampling
from specviz.engine.stopping import ProgressReport, StopCheck, run_steps
from specviz.engine.tree.auto import AutoTree, calibration_prompt_ids, decide
from specviz.engine.tree.calibration import (
    FORMAT,
    METHOD,
    Calibration,
    calibrate_steps,
    check_partial,
    teacher_forcible,
)

# This process's calibrations, the most recently used last; at most MEMORY_ENTRIES (the disk keeps DISK_ENTRIES): a
# visitor who asks for the auto tree at a new temperature each time makes a new entry each time.
_CACHE: OrderedDict[tuple, "Calibration"] = OrderedDict()
MEMORY_ENTRIES = 16
DISK_ENTRIES = 32  # calibrations the disk cache keeps (the newest), over pairs, drafters, regimes and machines
DISK_BYTES = 2 * 1024 * 1024  # a cache file larger than this is not ours: it is ignored (and rewritten)


def auto_tree(
    drafter,
    target,
    prompts: list[list[int]],
    sampling: Sampling,
    vocab_size: int,
    key=None,
    max_new_tokens: int = 64,
    max_nodes: int = 64,
    max_depth: int = 8,
    seed: int = 0,
    cached="auto",
    stop: StopCheck | None = None,
    progress: ProgressReport | None = None,
) -> AutoTree:
    """Calibrate (or reuse this process's calibration for the same ``key``, drafter and sampling) and choose.

    ``key``: what names the pair and device (e.g. (pair name, device)); None: never cached. ``stop``: the
    calibration's stop check. A stopped calibration is not cached as a calibration, but what it measured
    is kept on disk (``store_partial``) and the next call for the same key goes on from there. ``progress``:
    the calibration's (``calibrate``), told nothing when a cached one is reused. Raises as ``calibrate``."""
    return run_steps(
        auto_tree_steps(
            drafter,
            target,
            prompts,
            sampling,
            vocab_size,
            key,
            max_new_tokens,
            max_nodes,
            max_depth,
            seed,
            cached,
            stop,
        ),
        progress,
    )


def auto_tree_steps(
    drafter,
    target,
    prompts: list[list[int]],
    sampling: Sampling,
    vocab_size: int,
    key=None,
    max_new_tokens: int = 64,
    max_nodes: int = 64,
    max_depth: int = 8,
    seed: int = 0,
    cached="auto",
    stop: StopCheck | None = None,
):
    """``auto_tree`` as steps (``specviz.engine.stopping.run_steps``): yields the calibration's (parts done, parts in
    all) between its pieces of work (nothing when a cached one is reused) and returns the AutoTree."""
    cache_key = None
    if key is not None:
        who = (
            json.dumps(drafter.describe(), sort_keys=True, default=str) if hasattr(drafter, "describe") else id(drafter)
        )
        cache_key = (
            key,
            who,
            json.dumps(sampling.to_dict(), sort_keys=True),
            max_new_tokens,
            max_depth,
            max_nodes,
            str(cached),
        )
    cal = _CACHE.get(cache_key) if cache_key else None
    if cal is not None:
        _CACHE.move_to_end(cache_key)
    disk = disk_key(cache_key, _device_of(target)) if cache_key and hasattr(drafter, "describe") else None
    if cal is None and disk:
        cal = load_cached(disk)
    if cal is None:
        extra = {}
        if disk and teacher_forcible(drafter):
            extra = dict(
                partial=load_partial(disk, len(prompts), max_new_tokens, vocab_size),
                keep=lambda r: store_partial(disk, r),
            )
        cal = yield from calibrate_steps(
            drafter,
            target,
            prompts,
            sampling,
            vocab_size,
            max_new_tokens,
            max_depth,
            max_nodes,
            seed,
            cached,
            stop=stop,
            **extra,
        )
        if disk:
            store_cached(disk, cal)
    if cache_key:
        _CACHE[cache_key] = cal
        while len(_CACHE) > MEMORY_ENTRIES:
            _CACHE.popitem(last=False)
    return decide(cal, max_nodes, max_depth, _device_of(target))


def _device_of(model) -> str:
    """The device a model runs on, with the GPU's name on CUDA (the machine key names the CPU only)."""
    try:
        device = next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        return "unknown"
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return device.type


def disk_key(cache_key: tuple, device: str) -> str:
    """The disk cache's key: a hash of the in-process key (pair, drafter, sampling regime, bounds), the
    device and the machine's key (``specviz.pair.precision.machine_key``: CPU, flags, torch, threads)."""
    from specviz.pair.precision import machine_key

    return hashlib.sha256(json.dumps([FORMAT, METHOD, machine_key(), device, repr(cache_key)]).encode()).hexdigest()[
        :24
    ]


def _cache_file() -> Path:
    from specviz.pair.settings import cache_dir

    return cache_dir() / "auto_tree.json"


def _read_file() -> dict:
    """The cache file's entries, or {} (missing, unreadable, too large, not a JSON object)."""
    path = _cache_file()
    try:
        if path.stat().st_size > DISK_BYTES:
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def load_cached(key: str) -> Calibration | None:
    """The stored calibration under ``key``, or None: none stored, or one that fails ``Calibration.from_dict``'s
    checks (a corrupt or tampered entry is measured again, and the new one replaces it)."""
    entry = _read_file().get(key)
    try:
        return Calibration.from_dict(entry) if entry is not None else None
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None


def store_cached(key: str, cal: Calibration) -> None:
    """Store ``cal`` under ``key`` (and drop the partial record of its calibration, ``store_partial``)."""
    _store(key, cal.to_dict(), drop=key + PARTIAL)


PARTIAL = "+partial"  # the suffix of the key a stopped calibration's measurements are kept under


def store_partial(key: str, record: dict) -> None:
    """Keep what a stopped (or still running) calibration has measured (``calibrate_forced``'s ``keep``)."""
    _store(key + PARTIAL, json.loads(json.dumps(record)))


def load_partial(key: str, prompts: int, max_new_tokens: int, vocab_size: int) -> dict | None:
    """The partial record under ``key``, checked (``check_partial``), or None (none, or one that fails the checks)."""
    entry = _read_file().get(key + PARTIAL)
    try:
        return check_partial(entry, prompts, max_new_tokens, vocab_size) if entry is not None else None
    except (ValueError, TypeError, AttributeError, RecursionError):
        return None


def _store(key: str, entry: dict, drop: str | None = None) -> None:
    """Store ``entry`` under ``key``, keeping the newest DISK_ENTRIES entries (and none the file cannot
    read back); written to a temporary file named by process and thread, then renamed over the file."""
    path = _cache_file()
    try:
        data = {k: v for k, v in _read_file().items() if isinstance(k, str) and len(k) <= 64 and k != drop}
        data.pop(key, None)
        data[key] = entry
        data = dict(list(data.items())[-DISK_ENTRIES:])
        text = json.dumps(data)
        while len(text) > DISK_BYTES and len(data) > 1:  # never more than the reader accepts
            data.pop(next(iter(data)))
            text = json.dumps(data)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # a read-only home: calibrate again in the next process


def auto_for_pair(
    pair,
    drafter,
    sampling: Sampling,
    max_new_tokens: int = 64,
    max_nodes: int = 64,
    cached="auto",
    stop: StopCheck | None = None,
    progress: ProgressReport | None = None,
) -> AutoTree:
    """``auto_tree`` for a loaded pair, calibrated on the last held-out prompts (never a visitor's
    or a user's own prompt), cached per (pair, device, drafter, sampling); ``stop`` and ``progress`` as
    ``calibrate``'s."""
    return run_steps(auto_for_pair_steps(pair, drafter, sampling, max_new_tokens, max_nodes, cached, stop), progress)


def auto_for_pair_steps(
    pair,
    drafter,
    sampling: Sampling,
    max_new_tokens: int = 64,
    max_nodes: int = 64,
    cached="auto",
    stop: StopCheck | None = None,
):
    """``auto_for_pair`` as steps (``auto_tree_steps``)."""
    from specviz.pair.prompt import encode_prompt

    ids = calibration_prompt_ids(lambda t: encode_prompt(pair, t, chat=False), held_out_prompts(), 0)
    return (
        yield from auto_tree_steps(
            drafter,
            pair.target,
            ids,
            sampling,
            pair.vocab_size,
            key=(pair.name, str(pair.device)),
            max_new_tokens=max_new_tokens,
            max_nodes=max_nodes,
            cached=cached,
            stop=stop,
        )
    )


def held_out_prompts() -> list[str]:
    """Every prompt of the held-out set (assets/prompts.json, held out from the embedded pair's training;
    bench's "held-out" set), read as text: it is no chat set, so a pair encodes each as it is."""
    from specviz.assets import ASSETS

    return [p["prompt"] for p in json.loads((ASSETS / "prompts.json").read_text())]
