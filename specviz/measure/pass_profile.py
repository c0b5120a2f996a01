"""Where a verify pass spends its time beyond one step: the target's pass over n tokens against its one-token step,
module kind by module kind.

The verify cost v(n) = pass over n tokens / one step (``specviz.measure.pass_cost``) decides whether speculation pays
(Leviathan et al. 2023, Thm 3.8 assume v = 1; the speedup is E[tokens per round] / (gamma c + v)). Where v is well
above 1, this module says which part of the model pays for the extra rows: every linear layer (a matrix product),
grouped by its name in the model (``q_proj``, ``gate_proj``, ``lm_head``, GPT-2's ``c_attn`` ...), the attention
modules without their products (the attention kernel, rotary embeddings, the cache update), the norms, and the rest
of the pass (the residual adds, the activation, the mask, the engine's own work around the model call).

Each module is timed by forward hooks around it (``time.perf_counter``), so a hooked pass runs a little slower than
a plain one (a few microseconds per module); the plain passes' medians are reported beside it.

    python -m specviz.measure.pass_profile --pair english --rows 5
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
from transformers.pytorch_utils import Conv1D

from specviz.engine.runner import ModelRunner

NORM_SUFFIX = "Norm"  # LlamaRMSNorm, LayerNorm, Qwen2RMSNorm ...
ATTENTION_SUFFIX = "Attention"  # LlamaAttention, Qwen2Attention, GPT2Attention ...
CORE = "attention (no products)"
NORMS = "norms"
REST = "rest of the pass"


@dataclass(frozen=True)
class PassProfile:
    """ms per module kind in a pass over ``rows`` tokens and in a one-token step, after ``context`` cached tokens.

    Attributes:
        rows, context: the pass's new tokens and the tokens cached before it.
        step_ms, pass_ms: medians of plain (unhooked) calls: the one-token step and the pass over ``rows``.
        one, many: {kind: mean ms per call} in hooked one-token steps and hooked passes over ``rows``; the kinds are
            each linear layer's name ("q_proj", "lm_head" ...), ``CORE``, ``NORMS`` and ``REST`` (the hooked call's
            time not inside any of them); each dict sums to its hooked call's mean ms.
    """

    rows: int
    context: int
    step_ms: float
    pass_ms: float
    one: dict[str, float]
    many: dict[str, float]

    @property
    def v(self) -> float:
        """The verify cost of the plain passes: pass_ms / step_ms."""
        return self.pass_ms / self.step_ms

    def rows_table(self) -> list[tuple[str, float, float, float, float]]:
        """(kind, ms at one token, ms at ``rows``, their ratio, the extra ms), products first in model order, then
        CORE, NORMS, REST."""
        out = []
        for kind in self.one:
            a, b = self.one[kind], self.many.get(kind, 0.0)
            out.append((kind, a, b, b / a if a > 0 else float("nan"), b - a))
        return out


PRODUCTS = (torch.nn.Linear, Conv1D)  # Conv1D: GPT-2's linear layers, its weight transposed


def _kind_of(name: str, module: torch.nn.Module) -> str | None:
    if isinstance(module, PRODUCTS):
        return name.rsplit(".", 1)[-1]
    cls = type(module).__name__
    if cls.endswith(ATTENTION_SUFFIX):
        return CORE
    if cls.endswith(NORM_SUFFIX):
        return NORMS
    return None


def profile_pass(
    model, vocab_size: int, rows: int = 5, context: int = 200, repeats: int = 15, seed: int = 0
) -> PassProfile:
    """Time ``model``'s one-token step and its pass over ``rows`` tokens, each after ``context`` cached random tokens,
    plain and then module by module.

    Args:
        model: a transformers causal LM in eval mode, on a CPU (a CUDA model's kernels run asynchronously, so the
            hooks would time their launches, not their work).
        vocab_size: logits columns kept (the tokenizer's size).
        rows: the pass's width, gamma + 1 for a chain's verify pass (at least 2).
        context: tokens in the cache before each call.
        repeats: timed calls of each kind (after one untimed call), plain and hooked.
        seed: the random ids' seed.

    Returns:
        the ``PassProfile``; plain calls are interleaved (step, pass, step, ...) so that other load on the machine
        falls on both alike.

    Raises:
        ValueError: ``rows`` under 2, ``repeats`` under 1, or a model not on a CPU.
    """
    if rows < 2 or repeats < 1:
        raise ValueError(f"rows must be at least 2 and repeats at least 1; got rows {rows}, repeats {repeats}")
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("profile_pass times modules with host clocks: the model must be on a CPU")
    gen = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, vocab_size, (context + rows,), generator=gen)
    runner = ModelRunner(model, vocab_size)

    def call(n: int) -> float:
        t0 = time.perf_counter()
        runner.logits(seq, context + n, n)
        ms = (time.perf_counter() - t0) * 1000
        runner.rollback(context)
        return ms

    with torch.inference_mode():
        runner.prefill(seq, context)
        call(1), call(rows)  # first calls of each shape: kernel selection, allocations
        plain = {1: [], rows: []}
        for _ in range(repeats):
            for n in (1, rows):
                plain[n].append(call(n))
        hooked = {n: _hooked_means(model, lambda n=n: call(n), repeats) for n in (1, rows)}
    return PassProfile(
        rows=rows,
        context=context,
        step_ms=statistics.median(plain[1]),
        pass_ms=statistics.median(plain[rows]),
        one=hooked[1],
        many=hooked[rows],
    )


def _hooked_means(model, call, repeats: int) -> dict[str, float]:
    """{kind: mean ms per call} of ``call()`` with every module of a kind timed by hooks; CORE excludes the
    products inside the attention modules, REST is the call's time outside every timed module."""
    totals: dict[str, float] = defaultdict(float)
    started: dict[int, float] = {}
    inner: dict[int, float] = defaultdict(float)  # products' time inside the attention module running now
    open_attention: list[int] = []
    handles = []

    def before(module, args):
        started[id(module)] = time.perf_counter()

    def after_for(kind):
        def after(module, args, output):
            ms = (time.perf_counter() - started.pop(id(module))) * 1000
            if kind == CORE:
                key = open_attention.pop()
                totals[CORE] += ms - inner.pop(key, 0.0)
                return
            totals[kind] += ms
            if open_attention:  # a product or a norm inside the attention module: not its core's time
                inner[open_attention[-1]] += ms

        return after

    def before_attention(module, args):
        open_attention.append(id(module))
        before(module, args)

    order: list[str] = []
    for name, module in model.named_modules():
        kind = _kind_of(name, module)
        if kind is None:
            continue
        if kind not in order:
            order.append(kind)
        pre = before_attention if kind == CORE else before
        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(after_for(kind)))
    try:
        call()  # untimed: the hooks' first calls
        totals.clear()
        whole = 0.0
        for _ in range(repeats):
            whole += call()
    finally:
        for h in handles:
            h.remove()
    products = [k for k in order if k not in (CORE, NORMS)]
    means = {k: totals.get(k, 0.0) / repeats for k in products + [CORE, NORMS]}
    means[REST] = whole / repeats - sum(means.values())
    return means


def format_profile(p: PassProfile) -> list[str]:
    """Lines of a table: each kind's ms in a one-token step and in the pass over ``rows``, the ratio and the extra ms,
    with the products' and the whole call's sums."""
    lines = [
        f"target pass over {p.rows} tokens after {p.context} cached against one step (plain calls, medians): "
        f"{p.pass_ms:.1f} / {p.step_ms:.1f} ms, v({p.rows}) = {p.v:.2f}",
        f"{'module kind (hooked, mean ms per call)':<40}{'1 token':>9}{p.rows:>7} tok{'ratio':>8}{'extra':>9}",
    ]
    table = p.rows_table()
    for kind, a, b, ratio, extra in table:
        lines.append(f"  {kind:<38}{a:>9.2f}{b:>11.2f}{ratio:>8.2f}{extra:>9.2f}")
    products = [r for r in table if r[0] not in (CORE, NORMS, REST)]
    for label, rows_ in (("all products", products), ("the whole hooked call", table)):
        a, b = sum(r[1] for r in rows_), sum(r[2] for r in rows_)
        lines.append(f"  {label:<38}{a:>9.2f}{b:>11.2f}{b / a if a else float('nan'):>8.2f}{b - a:>9.2f}")
    return lines


if __name__ == "__main__":
    import argparse

    from specviz.pair import load_pair

    parser = argparse.ArgumentParser(
        prog="python -m specviz.measure.pass_profile",
        description="where the target's pass over n tokens spends its time beyond one step, module kind by kind",
    )
    parser.add_argument("--pair", default="english", help="a preset pair name (default: english)")
    parser.add_argument("--rows", type=int, default=5, help="the pass's tokens: gamma + 1 for a chain (default: 5)")
    parser.add_argument("--context", type=int, default=200, help="tokens cached before each pass (default: 200)")
    parser.add_argument("--repeats", type=int, default=15, help="timed calls of each kind (default: 15)")
    a = parser.parse_args()
    pair = load_pair(a.pair, device="cpu")
    print(f"{pair.target.__class__.__name__}, {next(pair.target.parameters()).dtype}, {torch.get_num_threads()} "
          "threads")
    print("\n".join(format_profile(profile_pass(pair.target, pair.vocab_size, a.rows, a.context, a.repeats))))
