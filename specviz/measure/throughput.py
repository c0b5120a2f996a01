"""The Batch tab's measurement: throughput of batched speculative and autoregressive decoding
against batch size, the two methods in turns so machine noise falls on both.

The command line's fuller benchmark (with transformers' batched ``generate``) is ``specviz.measure.batch_bench``.
"""

from __future__ import annotations

from collections.abc import Iterator

from specviz.engine.batch import BatchResult, autoregressive_batch_steps, speculative_batch_steps
from specviz.engine.stopping import StopCheck
from specviz.records.batch import BatchPoint  # the points' record lives with the trace (the views read it)


def batch_sizes_up_to(size: int) -> list[int]:
    """The batch sizes the page measures for a batch of ``size``: powers of two below it, and it."""
    return sorted({2 ** k for k in range(size.bit_length()) if 2 ** k < size} | {size})


def throughput_stream(
    prompts: list[list[int]],
    drafter,
    target,
    batch_size: int,
    gamma: int = 4,
    schedule: str = "constant",
    repeats: int = 2,
    stop: StopCheck | None = None,
    **common,
) -> Iterator[tuple[BatchResult | None, list[BatchPoint]] | None]:
    """The Batch tab's measurement: batched speculative and autoregressive decoding at each of
    ``batch_sizes_up_to(batch_size)`` (rows: ``prompts`` cycled), ``repeats`` times each, the two
    methods in turns with the order alternating, so machine noise falls on both.

    Yields (the speculative BatchResult at ``batch_size``, or None before it is run; the points
    so far) after each measurement, the full batch first, and None after every round (or step) of every batch
    between them (``speculative_batch_steps``: a server's device thread runs other jobs' steps there, and the time
    until the stream is resumed is not the batch's). ``stop`` (``specviz.engine.stopping``) is asked
    before every round of every batch; when it answers True the batch under way ends there and the
    measurement yields once more and ends: a stopped batch is no measurement (its points are left
    out), but the full batch, stopped while it was under way, is yielded so its rows show how far they
    got (``BatchResult.stopped``). ``common``: sampling, max_new_tokens, eos_token_id, seed,
    tokenizer, as ``speculative_batch_steps`` takes them.

    Raises:
        ValueError: as ``speculative_batch_steps``.
    """
    sizes = batch_sizes_up_to(batch_size)
    points = {b: BatchPoint(b) for b in sizes}
    main = None
    for r in range(repeats):
        for b in [batch_size] + [s for s in sizes if s != batch_size]:
            rows = [prompts[i % len(prompts)] for i in range(b)]
            order = ("speculative", "autoregressive") if (r + b) % 2 == 0 else ("autoregressive", "speculative")
            done = {}
            for method in order:
                if method == "speculative":
                    done[method] = yield from speculative_batch_steps(
                        rows, drafter, target, gamma=gamma, schedule=schedule, stop=stop, **common
                    )
                    main = main or (done[method] if b == batch_size else None)
                else:
                    done[method] = yield from autoregressive_batch_steps(rows, target, stop=stop, **common)
                if done[method].stopped:
                    yield main, list(points.values())
                    return
            points[b].speculative.append(done["speculative"].tokens_per_s)
            points[b].autoregressive.append(done["autoregressive"].tokens_per_s)
            yield main, list(points.values())
