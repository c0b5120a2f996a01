"""The Batch tab's measurement: throughput of batched speculative and autoregressive decoding
against batch size, the two methods in turns so machine noise falls on both.

The command line's fuller benchmark (with transformers' batched ``generate``) is ``specviz.measure.batch_bench``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from specviz.engine.batch import autoregressive_generate_batch, speculative_generate_batch


@dataclass
class BatchPoint:
    """Throughput of one batch size: tokens/s over the batch (all rows' tokens / wall time) per run."""

    batch_size: int
    speculative: list[float] = field(default_factory=list)
    autoregressive: list[float] = field(default_factory=list)

    @property
    def speedups(self) -> list[float]:
        """Speculative / autoregressive tokens/s of each pair of runs made in turns."""
        return [s / a for s, a in zip(self.speculative, self.autoregressive) if a > 0]


def batch_sizes_up_to(size: int) -> list[int]:
    """The batch sizes the page measures for a batch of ``size``: powers of two below it, and it."""
    return sorted({2 ** k for k in range(size.bit_length()) if 2 ** k < size} | {size})


def throughput_stream(prompts: list[list[int]], drafter, target, batch_size: int, gamma: int = 4, schedule: str = "constant",
                      repeats: int = 2, deadline: float | None = None, **common) -> Iterator[tuple[object, list[BatchPoint]]]:
    """The Batch tab's measurement: batched speculative and autoregressive decoding at each of
    ``batch_sizes_up_to(batch_size)`` (rows: ``prompts`` cycled), ``repeats`` times each, the two
    methods in turns with the order alternating, so machine noise falls on both.

    Yields (the speculative BatchResult at ``batch_size``, or None before it is run; the points
    so far) after each measurement, the full batch first. ``deadline`` (time.monotonic())
    ends the measurement early. ``common``: sampling, max_new_tokens, eos_token_id, seed,
    tokenizer, as ``speculative_generate_batch`` takes them.

    Raises:
        ValueError: as ``speculative_generate_batch``.
    """
    sizes = batch_sizes_up_to(batch_size)
    points = {b: BatchPoint(b) for b in sizes}
    main = None
    for r in range(repeats):
        for b in [batch_size] + [s for s in sizes if s != batch_size]:
            rows = [prompts[i % len(prompts)] for i in range(b)]
            order = ("speculative", "autoregressive") if (r + b) % 2 == 0 else ("autoregressive", "speculative")
            for method in order:
                if method == "speculative":
                    res = speculative_generate_batch(rows, drafter, target, gamma=gamma, schedule=schedule, **common)
                    main = main or (res if b == batch_size else None)
                    points[b].speculative.append(res.tokens_per_s)
                else:
                    res = autoregressive_generate_batch(rows, target, **common)
                    points[b].autoregressive.append(res.tokens_per_s)
            yield main, list(points.values())
            if deadline is not None and time.monotonic() > deadline:
                return
