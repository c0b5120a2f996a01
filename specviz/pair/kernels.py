"""Which matrix-product kernel each linear layer runs on a CPU, chosen per machine and per number of rows.

A verify pass over the gamma + 1 verified tokens pays only if it costs about one target step (the
verify cost v near 1; Leviathan et al. 2023, Thm 3.8 assumes v = 1). On a CPU without bf16
instructions the model runs fp32, and there the product ``x @ W.T`` of a handful of rows costs
several single-row products: with one row, MKL takes a matrix-vector route that streams the weight
once; with two or more it takes a general-matrix route that repacks the weight on every call
(measured on a 2-core AMD EPYC with AVX2 only, SmolLM2-135M's 576 x 49,152 output layer: 1 row
41 ms, 2 rows 120 ms, 17 rows 180 ms). The arithmetic of 17 rows is small next to reading the weight;
the route, not the arithmetic, decides v.

So every ``nn.Linear`` of a model on a CPU in fp32 gets a route per row count, chosen from:

- ``linear``: ``torch.nn.functional.linear`` as transformers runs it (the reference);
- ``w_xt``: the same product as ``(W @ x.T).T``, the weight as the left operand;
- ``onednn``: oneDNN's matrix product with the weight reordered once, at load, into its blocked
  layout (``torch.ops.mkldnn._reorder_linear_weight``, what PyTorch's inductor does for frozen
  weights on a CPU), so no call repacks it; the reordered copy is kept beside the weight.

``choose`` times each route over the model's own weights, layer after layer as a pass reads them (so the weights stream
from memory as in a pass, not from a warm cache), for 1, 2, 3, 5, 9, 17, 33 and 65 rows (a chain's verify pass, a
tree's, a batch's), interleaving the routes so that other load on the machine falls on all alike, and keeps the fastest
per row count. A one-row product (the autoregressive step) keeps ``linear`` unless another route is faster there too, so
the step is never slower than transformers' own. The timing (a few seconds, once) is cached per machine (CPU model and
flags, torch version, threads) and per weight shape in the specviz cache, as ``specviz.pair.precision`` caches the dtype
choice.

The routes compute the same sums in different orders: logits differ from ``linear``'s in the last
bits (relative 1e-6 in fp32), so greedy output can differ from the target's own greedy decoding only
where its top-2 logits are that close (a near-tie; the tests count them). Sampling is exact given the
logits a pass gave (``specviz.engine.rejection``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import statistics
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

# timed row counts (trees and batches reach 33-65); a call with r rows takes the choice of the first >= r
ROWS = (1, 2, 3, 5, 9, 17, 33, 65)
REPEATS = 3  # timed sweeps over a shape's layers per route and row count (after one untimed sweep)
MAX_TIMED_BYTES = 64e6  # per shape, the weights one timed sweep reads (enough to leave the cache)
ROUTES = ("linear", "w_xt", "onednn")


def _onednn_available() -> bool:
    try:
        w = torch.zeros(4, 8)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 2)
        torch.ops.mkldnn._linear_pointwise(torch.zeros(2, 8), packed, None, "none", [], "")
        return torch.backends.mkldnn.is_available()
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def _run(
    route: str, x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ weight.T + bias`` for x (rows, in) by ``route``; returns (rows, out), contiguous."""
    if route == "onednn" and packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    if route == "w_xt":
        out = torch.mm(weight, x.t()).t().contiguous()
        return out.add_(bias) if bias is not None else out
    return F.linear(x, weight, bias)


@dataclass
class Choice:
    """The routes of one weight shape: ``by_rows[i]`` serves calls of up to ``ROWS[i]`` rows (the last, any more).

    Attributes:
        by_rows: a route name per entry of ROWS.
        ms: {route: [median ms per entry of ROWS]} as timed (per layer), for the sentence and for bench.
    """

    by_rows: list[str]
    ms: dict[str, list[float]] = field(default_factory=dict)

    def route(self, rows: int) -> str:
        for limit, name in zip(ROWS, self.by_rows):
            if rows <= limit:
                return name
        return self.by_rows[-1]


def _time_routes(layers: list[torch.nn.Linear], routes: tuple[str, ...], repeats: int) -> dict[str, list[float]]:
    """Median ms per layer of each route over ``layers`` in turn, for each row count of ROWS."""
    gen = torch.Generator().manual_seed(0)
    n_in = layers[0].in_features
    packed = [getattr(m, "specviz_packed", None) for m in layers]
    out = {r: [] for r in routes}
    with torch.inference_mode():
        for rows in ROWS:
            x = torch.randn(rows, n_in, generator=gen).to(layers[0].weight.dtype)
            times = {r: [] for r in routes}
            for sweep in range(repeats + 1):
                for r in routes:
                    t0 = time.perf_counter()
                    for m, p in zip(layers, packed):
                        _run(r, x, m.weight, p, m.bias)
                    if sweep:  # the first sweep of each shape: kernel selection, allocations
                        times[r].append((time.perf_counter() - t0) * 1000 / len(layers))
            for r in routes:
                out[r].append(statistics.median(times[r]))
    return out


def _pick(ms: dict[str, list[float]]) -> list[str]:
    """The fastest route per row count; one row keeps ``linear`` unless another is faster by 5 %."""
    picks = []
    for i, rows in enumerate(ROWS):
        best = min(ms, key=lambda r: ms[r][i])
        if rows == 1 and "linear" in ms and ms[best][i] > 0.95 * ms["linear"][i]:
            best = "linear"
        picks.append(best)
    return picks


def _cache_file() -> Path:
    from specviz.pair.settings import cache_dir

    return cache_dir() / "cpu_kernels.json"


def _shape_key(machine: str, weight: torch.Tensor, count: int) -> str:
    return hashlib.sha256(
        json.dumps([machine, list(weight.shape), str(weight.dtype), count, ROWS, ROUTES]).encode()
    ).hexdigest()[:16]


def _load_cached() -> dict:
    try:
        data = json.loads(_cache_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _store_cached(entries: dict) -> None:
    path = _cache_file()
    try:
        data = _load_cached()
        data.update(entries)
        data = dict(list(data.items())[-64:])  # a few machines and models at most
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home: time again next process


def _valid(entry) -> Choice | None:
    try:
        by_rows = [str(r) for r in entry["by_rows"]]
        if len(by_rows) != len(ROWS) or any(r not in ROUTES for r in by_rows):
            return None
        ms = {str(k): [float(t) for t in v] for k, v in entry.get("ms", {}).items()}
        return Choice(by_rows, ms)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _routed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    route = self.specviz_choice.route(rows)
    if route == "linear" or rows == 0 or x.dtype != self.weight.dtype or x.device.type != "cpu":
        return F.linear(x, self.weight, self.bias)
    flat = x.reshape(rows, x.shape[-1])
    if not flat.is_contiguous():
        flat = flat.contiguous()
    out = _run(route, flat, self.weight, getattr(self, "specviz_packed", None), self.bias)
    return out.reshape(*x.shape[:-1], out.shape[-1])


@dataclass(frozen=True)
class Kernels:
    """What ``choose`` gave a model: a sentence for the page and the timing behind it.

    Attributes:
        summary: one sentence a class reads, e.g. "matrix products chosen per row count, timed at load
            (2-17 rows mostly with oneDNN-packed weights): 5 rows measured 1.10x one row's cost
            (transformers' own products: 1.47x)".
        ratio: {rows: the model's linear layers' summed time at ``rows`` / at one row} under the chosen routes.
        reference_ratio: the same under ``linear`` alone (transformers' own products).
    """

    summary: str
    ratio: dict[int, float]
    reference_ratio: dict[int, float]


_NAMES = {"linear": "as transformers runs them", "w_xt": "as W x^T", "onednn": "with oneDNN-packed weights"}


def _describe(choices: dict[tuple, Choice], counts: dict[tuple, int]) -> Kernels:
    def total(pick_route, i):
        return sum(counts[k] * c.ms[pick_route(c, i)][i] for k, c in choices.items() if c.ms)

    if not all(c.ms for c in choices.values()):  # forced: nothing timed
        main = next(iter(choices.values())).by_rows[-1]
        return Kernels(f"matrix products {_NAMES[main]} (forced)", {}, {})
    chosen = {rows: total(lambda c, i: c.by_rows[i], i) for i, rows in enumerate(ROWS)}
    reference = {rows: total(lambda c, i: "linear", i) for i, rows in enumerate(ROWS)}
    ratio = {r: chosen[r] / chosen[1] for r in ROWS} if chosen[1] else {}
    ref_ratio = {r: reference[r] / reference[1] for r in ROWS} if reference[1] else {}
    weight_of = {route: 0 for route in ROUTES}
    for key, c in choices.items():
        for rows, route in zip(ROWS[1:], c.by_rows[1:]):
            if rows <= 17:
                weight_of[route] += counts[key] * key[0] * key[1]
    main = max(weight_of, key=weight_of.get)
    summary = f"matrix products chosen per row count, timed at load (2-17 rows mostly {_NAMES[main]})"
    if ratio:
        summary += f": 5 rows measured {ratio[5]:.2f}x one row's cost (transformers' own products: {ref_ratio[5]:.2f}x)"
    return Kernels(summary, ratio, ref_ratio)


def choose(model, machine: str = "", repeats: int = REPEATS, force: str | None = None) -> Kernels | None:
    """Give every fp32 ``nn.Linear`` of ``model`` (on a CPU) its routes, timed or read from the cache.

    Each linear layer's ``forward`` is replaced (on the instance) by one that picks the route of its
    call's row count; a layer whose routes include ``onednn`` keeps its reordered weight in a
    non-persistent buffer ``specviz_packed`` (as many bytes again as the weight; not saved), offered
    only where such copies of every weight fit in half the free memory.

    Args:
        model: a transformers model (any module) whose ``nn.Linear`` layers are routed in place.
        machine: names this machine in the cache's keys (``specviz.pair.precision.machine_key``).
        repeats: timed sweeps per route and row count.
        force: one of ROUTES for every row count, untimed and not cached (tests, experiments).

    Returns:
        the ``Kernels`` description, or None where nothing was routed (not a CPU, not fp32, no linear
        layers).

    Raises:
        ValueError: ``force`` not one of the routes this build of torch has.
    """
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    if not linears or linears[0].weight.device.type != "cpu" or linears[0].weight.dtype != torch.float32:
        return None
    routes = ROUTES if _onednn_available() and _room_for_copies(linears) else tuple(r for r in ROUTES if r != "onednn")
    if force is not None and force not in routes:
        raise ValueError(f"force must be one of {', '.join(routes)}")
    groups: dict[tuple, list[torch.nn.Linear]] = {}
    for m in linears:
        groups.setdefault((m.out_features, m.in_features, m.bias is not None), []).append(m)
    cached = _load_cached()
    choices, fresh = {}, {}
    for key, layers in groups.items():
        shape_key = _shape_key(machine, layers[0].weight, len(layers))
        choice = Choice([force] * len(ROWS)) if force else _valid(cached.get(shape_key))
        if choice is None:
            per_layer = layers[0].weight.numel() * layers[0].weight.element_size()
            timed = layers[: max(1, min(len(layers), int(MAX_TIMED_BYTES // max(per_layer, 1))))]
            if "onednn" in routes:
                for m in timed:
                    _pack(m)
            ms = _time_routes(timed, routes, repeats)
            choice = Choice(_pick(ms), ms)
            fresh[shape_key] = {"by_rows": choice.by_rows, "ms": ms}
            for m in timed:
                if "onednn" not in choice.by_rows and hasattr(m, "specviz_packed"):
                    del m.specviz_packed
        choices[key] = choice
        for m in layers:
            if "onednn" in choice.by_rows:
                _pack(m)
            m.specviz_choice = choice
            m.forward = types.MethodType(_routed_forward, m)
    if fresh:
        _store_cached(fresh)
    return _describe(choices, {k: len(v) for k, v in groups.items()})


def _room_for_copies(linears: list[torch.nn.Linear]) -> bool:
    """Whether reordered copies of every linear weight fit in half the memory free now (else ``onednn``
    is not offered: the pair must not be pushed out of memory for speed)."""
    from specviz.pair.memory import available_memory_bytes

    need = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    free = available_memory_bytes(torch.device("cpu"))
    return free is None or need <= free / 2


def _pack(layer: torch.nn.Linear) -> None:
    if getattr(layer, "specviz_packed", None) is None:
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), 17)  # a verify pass's rows
        layer.register_buffer("specviz_packed", packed, persistent=False)


def unroute(model) -> None:
    """Undo ``choose``: every linear layer back to ``torch.nn.Linear.forward``, reordered copies dropped."""
    for m in model.modules():
        if type(m) is torch.nn.Linear and hasattr(m, "specviz_choice"):
            del m.forward, m.specviz_choice
            if hasattr(m, "specviz_packed"):
                del m.specviz_packed


def unrouted_copy(model):
    """A deep copy of ``model`` that runs transformers' own products, for code that copies a model
    (transformers' assisted generation with ``assistant_tokenizer`` prunes its assistant's output
    layer in place, so it is given a copy).

    ``copy.deepcopy`` cannot copy a routed model: a reordered weight (``specviz_packed``) is an opaque
    oneDNN tensor with no storage to copy (NotImplementedError). The copy leaves those behind, and its
    linear layers run ``torch.nn.Linear.forward`` on copies of the same weights (same shapes, dtype
    and device; tied weights stay tied); ``model`` keeps its routes. A model ``choose`` never routed is
    copied as ``copy.deepcopy`` copies it.

    Args:
        model: any module, routed by ``choose`` or not.

    Returns:
        the copy, with no ``specviz_choice``, ``specviz_packed`` or model-level ``specviz_kernels``
        (``specviz.pair.precision.apply_form``'s record of the routing).
    """
    memo = {
        id(m.specviz_packed): None
        for m in model.modules()
        if type(m) is torch.nn.Linear and getattr(m, "specviz_packed", None) is not None
    }
    twin = copy.deepcopy(model, memo)  # each reordered weight is copied as None: the buffer is then dropped
    unroute(twin)
    twin.__dict__.pop("specviz_kernels", None)
    return twin
