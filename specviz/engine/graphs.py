"""Passes captured as CUDA graphs over the static KV cache (``specviz.engine.cache``), replayed per round.

A small model's step on a GPU is bound by kernel launches and host work, not by arithmetic: the
135 M English target's eager pass costs 38-50 ms on an H100 for 1 to 33 tokens while its weights take
about 0.1 ms to read. A CUDA graph records a pass's kernels once and replays them with one launch.
It needs fixed shapes and fixed addresses, which the static cache gives: its keys and values never
move, its write index is a device tensor (``StaticLayer.cumulative_length``), and every input of a
pass (token ids, position ids, the 4-D mask) is copied into a buffer captured with the graph.

One graph per bucket size b (``BUCKETS``): a pass over n tokens replays the smallest bucket b >= n
with n real tokens and b - n padding tokens. The padding rows see only key 0 and their keys land
past the real ones, where no later query looks before a real pass overwrites them (the write index
is reset to start + n after every replay). A pass over more than the largest bucket runs eagerly.

Graphs are captured by hand (``torch.cuda.CUDAGraph``), not by ``torch.compile(mode="reduce-overhead")``:
compile's cudagraph trees are per thread, and the page resumes its generators on other threads;
a hand-captured graph replays from any thread. The logits of a replay live in the graph's output
buffer, so they are cloned before the next replay can overwrite them.

``fuse`` (``SPECVIZ_FUSE_GRAPHS=1``, or bench's ``--fuse``) first compiles the pass with inductor, without
inductor's own CUDA graphs, and then captures the compiled pass by hand, one compilation per bucket: the
graph then replays fused kernels instead of eager ones (SGLang captures its compiled forward the same way).
Off by default until a GPU measures it against its compile time; never on ZeroGPU, which does not support
``torch.compile``.

One ``GraphedRunner`` per model and device holds the graphs and the cache (``graphed``), captured
once per process (on ZeroGPU, once per worker process, which keeps them while it lives), with the
capture time kept (``capture_ms``). A run takes the runner (``acquire`` resets its index to 0): two
runs on one model at the same time would share one cache, so graphed runs take turns. The loops'
default ("auto", ``specviz.engine.runner.make_runner``) asks ``hold``: the runner if no other run holds
it, else None and why, and that run takes the dynamic cache instead (the page interleaves its
visitors' runs step by step on one device thread, so waiting for the holder there would never end);
``release`` gives it back when the run ends. A capture that fails is remembered, and the model's runs
take the dynamic cache, saying so.
"""

from __future__ import annotations

import logging
import os
import time
import weakref

import torch

from specviz.engine.cache import StaticKV, StaticRunner
from specviz.engine.vocab import widen

log = logging.getLogger(__name__)

FUSE_ENV = "SPECVIZ_FUSE_GRAPHS"


def fuse_default() -> bool:
    """Whether graphs are captured from an inductor-compiled pass (``SPECVIZ_FUSE_GRAPHS``: 1, true, yes, on;
    never on ZeroGPU)."""
    from specviz.engine.zerogpu import on_zerogpu, truthy

    return truthy(os.environ.get(FUSE_ENV)) and not on_zerogpu()


def compiled_pass(fn):
    """``fn`` compiled by inductor for fixed shapes, without inductor's CUDA graphs (the caller captures its own)."""
    return torch.compile(fn, dynamic=False, options={"triton.cudagraphs": False})

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MAX_CAPACITY = 4096  # positions held by a graphed model's cache, whatever its context


def _capacity(model) -> int:
    limit = (
        getattr(model.config, "max_position_embeddings", None)
        or getattr(model.config, "n_positions", None)
        or MAX_CAPACITY
    )
    return min(int(limit), MAX_CAPACITY)


class GraphedRunner(StaticRunner):
    """A ``StaticRunner`` whose passes of up to ``max(buckets)`` tokens replay CUDA graphs.

    Args:
        model: a transformers causal LM on a CUDA device, in eval mode.
        vocab_size: logits columns kept.
        buckets: the pass sizes captured, ascending.
        fuse: capture an inductor-compiled pass (module docstring); None: ``fuse_default()``.

    Raises:
        ValueError: a model not on CUDA (graphs need a GPU).
    """

    def __init__(self, model, vocab_size: int, buckets: tuple[int, ...] = BUCKETS, fuse: bool | None = None):
        if not supported(model):
            raise ValueError(f"CUDA graphs need a model on a CUDA device, not {model.device}")
        super().__init__(model, vocab_size, _capacity(model))
        self.buckets = tuple(sorted(buckets))
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]] = {}
        self.capture_ms: float | None = None
        self.replays = 0
        self.fuse = fuse_default() if fuse is None else fuse
        self.engine = "fused graphs" if self.fuse else "graphs"
        self.note = ""
        self.held = False  # a run holds it (``hold``) until ``release``

    def _kv(self, seq: torch.Tensor) -> StaticKV:
        if self.kv is None:
            # Room past the run's positions for the largest bucket's padding rows.
            self.kv = StaticKV(self.model, self.capacity + self.buckets[-1])
        return self.kv

    def capture(self) -> float:
        """Capture one graph per bucket (warm-up on a side stream first, as CUDA requires); returns ms."""
        if self.capture_ms is not None:
            return self.capture_ms
        torch.cuda.synchronize(self.model.device)
        start = time.perf_counter()
        device = self.model.device
        kv = self._kv(torch.empty(0))
        pool = torch.cuda.graph_pool_handle()
        model_pass = compiled_pass(self._model_pass) if self.fuse else self._model_pass
        with torch.inference_mode():
            for b in self.buckets:
                buf = {
                    "ids": torch.zeros(1, b, dtype=torch.long, device=device),
                    # Warm-up and capture at position 0 (a model's position table may be shorter than b).
                    "positions": torch.zeros(b, dtype=torch.long, device=device),
                    "mask": kv.causal_mask(torch.zeros(b, dtype=torch.long, device=device)),
                }
                if b == self.buckets[0]:  # allocate the cache's tensors on this stream, before any capture
                    kv.set_length(0)
                    self._model_pass(buf)
                side = torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    for _ in range(2):  # warm-up: lazy cache allocation, kernel selection (and the compilation)
                        kv.set_length(0)
                        model_pass(buf)
                torch.cuda.current_stream(device).wait_stream(side)
                kv.set_length(0)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    buf["logits"] = model_pass(buf)
                self.graphs[b] = (graph, buf)
        kv.set_length(0)
        torch.cuda.synchronize(device)
        self.capture_ms = (time.perf_counter() - start) * 1000.0
        return self.capture_ms

    def _model_pass(self, buf: dict) -> torch.Tensor:
        out = self.model(
            input_ids=buf["ids"],
            attention_mask=buf["mask"],
            position_ids=buf["positions"][None],
            past_key_values=self.kv.cache,
            use_cache=True,
        )
        return out.logits[0]

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, start: int, n_last: int):
        """As ``StaticRunner.forward``, replaying the smallest bucket that holds ``ids`` (1, n) when captured."""
        n = ids.shape[1]
        bucket = next((b for b in self.buckets if b >= n), None)
        if bucket is None or bucket not in self.graphs:
            return super().forward(ids, positions, mask, start, n_last)
        kv = self.kv
        if start + bucket > kv.capacity:
            raise ValueError(f"the static cache holds {kv.capacity} positions; this pass needs {start + bucket}")
        graph, buf = self.graphs[bucket]
        buf["ids"][0, :n] = ids[0]
        buf["positions"][:n] = positions
        buf["positions"][n:] = positions[-1]
        buf["mask"][..., :n, :] = mask
        buf["mask"][..., n:, :] = torch.finfo(buf["mask"].dtype).min
        buf["mask"][..., n:, 0] = 0  # a padding row sees key 0: no row is all -inf
        kv.set_length(start)
        graph.replay()
        self.passes += 1
        self.replays += 1
        kv.set_length(start + n)
        return widen(buf["logits"][n - n_last : n], self.vocab_size).clone()

    def acquire(self) -> "GraphedRunner":
        """Take the runner for a new run: the cache index back to 0 (nothing is freed or moved), the
        run's pass count to 0 (``replays`` keeps counting across runs)."""
        self.seen = 0
        self.passes = 0
        if self.kv is not None:
            self.kv.set_length(0)
        return self

    def release(self) -> None:
        """The run that held this runner is over: the next run may take it."""
        self.held = False


_RUNNERS: dict[tuple[int, str, str], GraphedRunner] = {}
_SPARES: dict[tuple[int, str, str], list[GraphedRunner]] = {}  # runners captured beside the first, for runs at once
_FAILED: dict[tuple[int, str, str], tuple[weakref.ref, str]] = {}  # captures that failed, and why: not tried again
HELD_PER_MODEL = 4  # runners (caches and graphs) per model and role: two Generates' runs and baselines at once


def supported(model) -> bool:
    """Whether ``model``'s device replays CUDA graphs (a CUDA device)."""
    param = next(model.parameters(), None)
    return param is not None and param.device.type == "cuda"


def hold(model, vocab_size: int, role: str = "target") -> tuple[GraphedRunner | None, str]:
    """A graphed runner of the model for ``role`` that no run holds, acquired and held for one run
    (``GraphedRunner.release`` gives it back), its ``note`` saying "CUDA graphs captured in X s" when this call
    captured them. Up to ``HELD_PER_MODEL`` runners per model and role are captured, each with its own cache:
    the page's Generate runs the speculative run and its baseline in turns on one target, and the page interleaves
    visitors' jobs. (None, why) when every one is held, or when a capture failed (then logged once and not tried again).
    """
    key = (id(model), str(model.device), role)
    failed = _FAILED.get(key)
    if failed is not None and failed[0]() is model:
        return None, failed[1]
    primary = _RUNNERS.get(key)
    pool = (
        [primary, *_SPARES.get(key, [])]
        if primary is not None and primary.model is model and primary.vocab_size == vocab_size
        else []
    )
    runner = next((r for r in pool if not r.held), None)
    fresh = runner is None
    if fresh and len(pool) >= HELD_PER_MODEL:
        return None, f"eager passes over the dynamic cache: other runs hold this model's {len(pool)} captured caches"
    if fresh:
        try:
            if not pool:
                _SPARES.pop(key, None)
                runner = graphed(model, vocab_size, role=role)
            else:
                runner = GraphedRunner(model, vocab_size, primary.buckets)
                runner.capture()
                _SPARES.setdefault(key, []).append(runner)
        except (RuntimeError, ValueError) as err:  # a model or device whose passes cannot be captured
            why = f"eager passes over the dynamic cache: capturing CUDA graphs failed ({type(err).__name__}: {err})"
            if not pool:  # the model's first capture: its runs take the dynamic cache from now on
                _FAILED[key] = (weakref.ref(model), why)
            log.warning("%s (%s)", why, role)
            return None, why
    runner.acquire()
    runner.held = True
    runner.note = f"CUDA graphs captured in {runner.capture_ms / 1000:.1f} s" if fresh else ""
    return runner, runner.note


def forget(*models) -> None:
    """Drop every captured runner (and failed capture) of ``models``: their caches and graphs are freed once no run
    holds them. ``specviz.pair`` calls it when it lets a pair go, so an evicted pair's GPU memory comes back."""
    ids = {id(m) for m in models if m is not None}
    for registry in (_RUNNERS, _SPARES, _FAILED):
        for key in [k for k in registry if k[0] in ids]:
            del registry[key]


def graphed(model, vocab_size: int, buckets: tuple[int, ...] = BUCKETS, role: str = "target") -> GraphedRunner:
    """The model's ``GraphedRunner`` on its device for ``role`` ("target" or "drafter": one model may
    be both, and each role needs its own cache), captured on first use (``capture_ms`` says how long).

    Raises:
        ValueError: a model not on CUDA.
    """
    key = (id(model), str(model.device), role)
    runner = _RUNNERS.get(key)
    if runner is None or runner.model is not model or runner.vocab_size != vocab_size:
        runner = GraphedRunner(model, vocab_size, buckets)
        runner.capture()
        _RUNNERS[key] = runner
    return runner


def prepare(target, drafter=None, *, vocab_size: int) -> float:
    """Capture the target's graphs (and a drafter model's) before a timed run; the capture time in ms
    (0 for what was already captured)."""
    total = 0.0
    for model, role in ((target, "target"), (drafter, "drafter")):
        if model is None:
            continue
        fresh = (id(model), str(model.device), role) not in _RUNNERS
        runner = graphed(model, vocab_size, role=role)
        total += runner.capture_ms if fresh else 0.0
    return total
