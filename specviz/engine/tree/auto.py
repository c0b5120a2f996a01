"""The ``auto`` tree: measure this pair on this device (``specviz.engine.tree.calibration``), then let
``specviz.theory.sequoia`` choose.

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
from dataclasses import dataclass
from pathlib import Path

import torch

from specviz.engine.sampling import Sampling
from specviz.engine.stopping import StopCheck
from specviz.engine.tree.calibration import FORMAT, METHOD, Calibration, calibrate, check_partial, teacher_forcible
from specviz.engine.tree.spec import TreeSpec
from specviz.theory import sequoia

AUTO = "auto"
CALIBRATION_PROMPTS = 8
HAND_MADE = ((3, 2, 2, 1), (2, 2, 2, 1))  # the page's hand-made shapes, predicted beside the choice
# This process's calibrations, the most recently used last; at most MEMORY_ENTRIES (the disk keeps DISK_ENTRIES): a
# visitor who asks for the auto tree at a new temperature each time makes a new entry each time.
_CACHE: OrderedDict[tuple, "Calibration"] = OrderedDict()
MEMORY_ENTRIES = 16
DISK_ENTRIES = 32  # calibrations the disk cache keeps (the newest), over pairs, drafters, regimes and machines
DISK_BYTES = 2 * 1024 * 1024  # a cache file larger than this is not ours: it is ignored (and rewritten)


@dataclass(frozen=True)
class AutoTree:
    """The auto choice: ``tree`` (None: a chain) and ``gamma`` (the chain's; a tree's depth), the
    sequoia ``choice`` and the ``calibration`` it came from."""

    tree: TreeSpec | None
    gamma: int
    choice: sequoia.AutoChoice
    calibration: Calibration
    max_nodes: int = 64
    max_depth: int = 8
    device: str = ""  # what it was measured on ("cpu", "cuda: <GPU name>"), for the sentence that says why

    def describe(self) -> dict:
        """JSON-ready: the choice, its prediction, the best chain, and the inputs."""
        b, c = self.choice.best, self.choice.best_chain
        cal = self.calibration
        return {
            "chosen": b.label(), "kind": b.kind, "nodes": b.nodes, "depth": b.depth,
            "nodes_by_depth": nodes_by_depth(b.parents) if b.parents else [1] * b.depth,
            "parents": list(b.parents) if b.parents else None,
            "predicted_tokens_per_round": b.tokens_per_round, "predicted_cost": b.cost, "predicted_speedup": b.speedup,
            "best_chain": {"gamma": c.depth, "predicted_tokens_per_round": c.tokens_per_round, "predicted_cost": c.cost,
                           "predicted_speedup": c.speedup},
            "speedup_by_budget": sequoia.speedup_by_budget(self.choice),
            "by_budget": [dict(_cand(c), budget=n) for n, c in self.choice.by_budget],
            "chains": [_cand(c) for c in self.choice.chains],
            "hand_made": [dict(_cand(self.predict(sequoia.static_parents(shape))), label=f"tree {'-'.join(map(str, shape))}")
                          for shape in HAND_MADE],
            "inputs": {"acceptance_by_rank": cal.rank_counts, "chain_acceptance_by_depth": cal.chain_counts,
                       "verify_cost_by_nodes": cal.verify_curve, "tree_pass_cost": cal.tree_pass_cost,
                       "chain_step_cost": cal.chain_step_cost, "target_step_ms": cal.target_step_ms,
                       "overhead_by_nodes": cal.overhead, "children_available": [list(c) for c in cal.available],
                       "calibration_prompts": cal.prompts, "calibration_tokens": cal.tokens, "refined_with": cal.refined},
            "sentence": self.choice.sentence(),
            "device": self.device,
        }

    def predict(self, parents) -> sequoia.Candidate:
        """Any tree's prediction from this calibration, on the choice's terms (``sequoia.tree_candidate``)."""
        cal = self.calibration
        return sequoia.tree_candidate(parents, cal.rank_acceptance().p, cal.verify_curve, cal.tree_pass_cost, cal.overhead)

    def record(self) -> dict:
        """What a recording keeps of the choice: the calibration and the bounds it was decided under
        (``from_record`` decides again, so a file cannot carry a choice its measurements do not give)."""
        return {"calibration": self.calibration.to_dict(), "max_nodes": self.max_nodes, "max_depth": self.max_depth,
                "device": self.device}


def from_record(d) -> AutoTree:
    """``AutoTree.record``'s data, checked (``Calibration.from_dict``, bounds in range) and decided again.

    Raises:
        ValueError: naming the first field that is wrong."""
    from specviz.limits import MAX_GAMMA

    if not isinstance(d, dict) or set(d) - {"calibration", "max_nodes", "max_depth", "device"}:
        raise ValueError("auto: must be an object of calibration, max_nodes, max_depth and device")
    nodes, depth, device = d.get("max_nodes"), d.get("max_depth"), d.get("device", "")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= 64:
        raise ValueError("auto.max_nodes: must be a whole number from 1 to 64")
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= min(MAX_GAMMA, 8):
        raise ValueError("auto.max_depth: must be a whole number from 1 to 8")
    if not isinstance(device, str) or len(device) > 80:
        raise ValueError("auto.device: must be text of at most 80 characters")
    try:
        cal = Calibration.from_dict(d.get("calibration"))
    except ValueError as e:
        raise ValueError(f"auto.calibration: {e}") from None
    return decide(cal, nodes, depth, device)


def nodes_by_depth(parents) -> list[int]:
    """How many nodes a tree has at depth 1, 2, ... (its shape in one line: 4-6-5-3-2)."""
    depth: list[int] = []
    for par in parents:
        depth.append(1 if par < 0 else depth[par] + 1)
    return [depth.count(d) for d in range(1, max(depth, default=0) + 1)]


def _cand(c: sequoia.Candidate) -> dict:
    return {"kind": c.kind, "nodes": c.nodes, "depth": c.depth, "tokens_per_round": c.tokens_per_round, "cost": c.cost,
            "speedup": c.speedup}


def calibration_prompt_ids(tokenize, texts: list[str], reserved: int, count: int = CALIBRATION_PROMPTS) -> list[list[int]]:
    """The last ``count`` of ``texts`` tokenised by ``tokenize`` (text -> ids), held out from the
    first ``reserved`` (a benchmark's prompts).

    Raises:
        ValueError: fewer than ``reserved + count`` prompts."""
    if len(texts) < reserved + count:
        raise ValueError(f"the auto tree calibrates on {count} prompts after the {reserved} measured; the set has {len(texts)}")
    return [tokenize(t) for t in texts[len(texts) - count:]]


def decide(cal: Calibration, max_nodes: int = 64, max_depth: int = 8, device: str = "") -> AutoTree:
    """The choice from a calibration (no model runs): ``sequoia.choose``; ``device`` names where it was measured."""
    choice = cal.choose(max_nodes, max_depth)
    best = choice.best
    tree = TreeSpec.explicit(best.parents) if best.kind == "tree" else None
    return AutoTree(tree=tree, gamma=best.depth, choice=choice, calibration=cal, max_nodes=max_nodes, max_depth=max_depth, device=device)


def auto_tree(drafter, target, prompts: list[list[int]], sampling: Sampling, vocab_size: int, key=None, max_new_tokens: int = 64,
              max_nodes: int = 64, max_depth: int = 8, seed: int = 0, cached="auto", stop: StopCheck | None = None) -> AutoTree:
    """Calibrate (or reuse this process's calibration for the same ``key``, drafter and sampling) and choose.

    ``key``: what names the pair and device (e.g. (pair name, device)); None: never cached. ``stop``: the
    calibration's stop check. A stopped calibration is not cached as a calibration, but what it measured
    is kept on disk (``store_partial``) and the next call for the same key goes on from there. Raises as
    ``calibrate``."""
    cache_key = None
    if key is not None:
        who = json.dumps(drafter.describe(), sort_keys=True, default=str) if hasattr(drafter, "describe") else id(drafter)
        cache_key = (key, who, json.dumps(sampling.to_dict(), sort_keys=True),
                     max_new_tokens, max_depth, max_nodes, str(cached))
    cal = _CACHE.get(cache_key) if cache_key else None
    if cal is not None:
        _CACHE.move_to_end(cache_key)
    disk = disk_key(cache_key, _device_of(target)) if cache_key and hasattr(drafter, "describe") else None
    if cal is None and disk:
        cal = load_cached(disk)
    if cal is None:
        extra = {}
        if disk and teacher_forcible(drafter):
            extra = dict(partial=load_partial(disk, len(prompts), max_new_tokens, vocab_size), keep=lambda r: store_partial(disk, r))
        cal = calibrate(drafter, target, prompts, sampling, vocab_size, max_new_tokens, max_depth, max_nodes, seed, cached, stop=stop,
                        **extra)
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

    return hashlib.sha256(json.dumps([FORMAT, METHOD, machine_key(), device, repr(cache_key)]).encode()).hexdigest()[:24]


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


def auto_for_pair(pair, drafter, sampling: Sampling, max_new_tokens: int = 64, max_nodes: int = 64, cached="auto",
                  stop: StopCheck | None = None) -> AutoTree:
    """``auto_tree`` for a loaded pair, calibrated on the last held-out prompts (never a visitor's
    or a user's own prompt), cached per (pair, device, drafter, sampling); ``stop`` as ``calibrate``'s."""
    from specviz.pair.prompt import encode_prompt

    ids = calibration_prompt_ids(lambda t: encode_prompt(pair, t, chat=False), held_out_prompts(), 0)
    return auto_tree(drafter, pair.target, ids, sampling, pair.vocab_size, key=(pair.name, str(pair.device)),
                     max_new_tokens=max_new_tokens, max_nodes=max_nodes, cached=cached, stop=stop)


def held_out_prompts() -> list[str]:
    """Every prompt of the held-out set (assets/prompts.json, held out from the embedded pair's training;
    bench's "held-out" set), read as text: it is no chat set, so a pair encodes each as it is."""
    from specviz.assets import ASSETS

    return [p["prompt"] for p in json.loads((ASSETS / "prompts.json").read_text())]
