"""The verify cost v(n): what a target pass over n tokens costs in target steps, and the output layer's share.

Leviathan et al. (2023, Thm 3.8) assume a pass over the gamma + 1 verified tokens costs one target
step; where it costs v(gamma + 1) steps the speedup is E[tokens per round] / (gamma c + v)
(``specviz.theory.predicted_speedup_with_verify_cost``). On a CPU v depends on the dtype's matrix
kernels (``specviz.pair.precision``), so bench measures it directly: after ``context`` cached
tokens, the median time of a pass over n new tokens (the logits of all n kept, as a verify pass
keeps them), rolled back after each call, for n in NS; v(n) = ms(n) / ms(1).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from tqdm.auto import tqdm

from specviz.engine.runner import ModelRunner

NS = (1, 2, 3, 5, 9, 17)


def _median_ms(fn, repeats: int) -> float:
    fn()  # first call of this shape: kernel selection, allocations
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def pass_costs(
    model, vocab_size: int, ns: tuple[int, ...] = NS, context: int = 200, repeats: int = 9, seed: int = 0
) -> dict:
    """Median ms of a cached pass over n tokens and of the output layer over n rows, for each n.

    Args:
        model: a transformers causal LM in eval mode (CPU or CUDA; CUDA is synchronised per call).
        vocab_size: logits columns kept (the tokenizer's size).
        ns: the pass widths; must include 1 (the step v is measured against).
        context: tokens in the KV cache before each timed pass (random ids).
        repeats: timed calls per n (after one untimed call).

    Returns:
        {"dtype": name, "ms": {n: ms}, "v": {n: ms(n) / ms(1)}, "head_ms": {n: ms},
        "head_share": {n: head_ms(n) / ms(n)}}; ``head_*`` empty where the model has no output layer to time.

    Raises:
        ValueError: ``ns`` without 1, or a width under 1.
    """
    if 1 not in ns or min(ns) < 1:
        raise ValueError(f"ns must hold widths of at least 1, including 1; got {ns}")
    device = next(model.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, vocab_size, (context + max(ns),), generator=gen).to(device)
    runner = ModelRunner(model, vocab_size)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    width = getattr(model.config, "hidden_size", None) or getattr(model.config, "n_embd", None)
    ms, head_ms = {}, {}
    with torch.inference_mode():
        runner.prefill(seq, context)
        for n in tqdm(ns, desc="v(n) passes", unit="n", file=sys.stderr, leave=False):

            def one_pass(n=n):
                runner.logits(seq, context + n, n)
                sync()
                runner.rollback(context)

            ms[n] = _median_ms(one_pass, repeats)
            if head is not None and width:
                hidden = torch.randn(1, n, width, generator=gen).to(device=device, dtype=head.weight.dtype)

                def one_head(hidden=hidden):
                    head(hidden)
                    sync()

                head_ms[n] = _median_ms(one_head, repeats)
    dtype = next(model.parameters()).dtype
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "ms": ms,
        "v": {n: ms[n] / ms[1] for n in ns},
        "head_ms": head_ms,
        "head_share": {n: head_ms[n] / ms[n] for n in head_ms},
    }


def format_pass_costs(costs: dict[str, dict]) -> list[str]:
    """Lines of a v(n) table, one row per form measured (e.g. {"bf16": ..., "fp32 (for comparison)": ...})."""
    lines = []
    for label, c in costs.items():
        ns = list(c["ms"])
        lines.append(f"target pass over n tokens after 200 cached, {label} (medians; v = ms(n) / ms(1)):")
        lines.append("  n            " + "".join(f"{n:>8}" for n in ns))
        lines.append("  ms           " + "".join(f"{c['ms'][n]:>8.1f}" for n in ns))
        lines.append("  v(n)         " + "".join(f"{c['v'][n]:>8.2f}" for n in ns))
        if c.get("head_share"):
            lines.append("  output layer " + "".join(f"{c['head_share'][n]:>7.0%} " for n in ns) + " of the pass")
    return lines
