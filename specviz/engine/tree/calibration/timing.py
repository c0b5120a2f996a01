"""v(n) and the drafter's passes, timed: a target pass over a prefix's pending token and n tree nodes under the tree
mask, over a one-token step, the fastest of several passes timed in turns."""

from __future__ import annotations

import time
import torch
from specviz.engine.rounds import held
from specviz.engine.runner import Cache, make_runner
from specviz.engine.stopping import StopCheck, Stopped, asked, run_steps
from specviz.engine.tree.attention import ancestor_matrix, masked_logits


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def pass_ms(
    model,
    prompt_ids: list[int],
    nodes: list[int],
    vocab: int,
    repeats: int = 7,
    cached: Cache = "auto",
    stop: StopCheck | None = None,
) -> dict[int, float]:
    """{n: ms} of ``model``'s fastest masked pass over the pending token and n nodes after ``prompt_ids``,
    for 0 (a one-token cached step) and each n in ``nodes``, timed in turns as ``verify_cost_curve``
    says; ``stop`` as there.

    Raises:
        specviz.engine.stopping.Stopped: ``stop`` asked to end."""
    return run_steps(pass_ms_steps(model, prompt_ids, nodes, vocab, repeats, cached, stop))


def pass_ms_steps(
    model,
    prompt_ids: list[int],
    nodes: list[int],
    vocab: int,
    repeats: int = 7,
    cached: Cache = "auto",
    stop: StopCheck | None = None,
):
    """``pass_ms`` as steps: yields None after the warm-up and after each repeat (every size timed once), returns
    its {n: ms}. Other work between steps costs nothing measured: a pass is timed whole or not at all."""
    device = model.device
    seq = torch.tensor(list(prompt_ids) + [0] * 130, dtype=torch.long, device=device)
    prefix = len(prompt_ids) - 1
    runner = make_runner(model, vocab, cached)
    sizes = [0, *nodes]
    times: dict[int, list[float]] = {n: [] for n in sizes}

    def timed(n: int) -> float:
        if asked(stop):
            raise Stopped
        tokens = seq[prefix : prefix + n + 1].clone()
        positions = torch.arange(prefix, prefix + n + 1, device=device)
        allow = ancestor_matrix(list(range(-1, n))).to(device)
        _sync(device)
        t0 = time.perf_counter()
        masked_logits(runner, seq, prefix, tokens, positions, allow, n + 1)
        _sync(device)
        runner.rollback(prefix)
        return time.perf_counter() - t0

    with held(runner):
        with torch.inference_mode():  # per step: inference mode is thread-local, and other jobs run between steps
            runner.prefill(seq, prefix)
            for n in sizes:  # a warm-up pass of each size, not counted
                timed(n)
        yield
        for r in range(repeats):
            with torch.inference_mode():
                for n in sizes[r % len(sizes) :] + sizes[: r % len(sizes)]:
                    times[n].append(timed(n))
            yield
    return {n: min(t) * 1000.0 for n, t in times.items()}


def verify_cost_curve(
    target,
    prompt_ids: list[int],
    nodes: list[int],
    vocab: int,
    repeats: int = 7,
    cached: Cache = "auto",
    stop: StopCheck | None = None,
) -> dict[int, float]:
    """v(n) for each n in ``nodes``: the fastest of ``repeats`` masked target passes over the pending token
    and n nodes / the fastest of as many one-token cached steps, after ``prompt_ids`` (dimensionless);
    ``cached`` the KV cache both are timed over (``specviz.engine.cache.make_runner``: True, "static", "graphs").
    ``stop`` is asked before each timed pass (None: never); raises ``specviz.engine.stopping.Stopped`` when it asks.

    The pass's cost depends on how many tokens it scores, not on the tree's shape (the mask only
    hides entries), so a chain of n nodes stands for any tree of n. The sizes are timed in turns
    (every size once per repeat, the order rotated), so a burst of other work on the machine slows
    several sizes a little rather than one size a lot, and the fastest pass of each size is kept:
    other work only adds time, so the fastest is the closest to the pass's own cost (both sides of
    the ratio alike). On a busy 2-core CPU, medians timed one size after another gave v(2) 0.86 and
    v(3) 0.83 against v(1) 0.99, and medians timed in turns v(4) 1.41 against v(6) 1.17.
    """
    ms = pass_ms(target, prompt_ids, nodes, vocab, repeats, cached, stop)
    return {n: ms[n] / ms[0] for n in nodes}
