"""``python -m specviz bench --batch-sizes 1,2,4,8``: throughput against batch size, interleaved in one run.

Methods, on the same pair, settings and held-out prompts (cycled to fill a batch), every row
generating exactly max_new_tokens (EOS ignored):
  autoregressive   specviz's batched baseline (``autoregressive_generate_batch``)
  speculative      specviz's batched speculative decoding (``speculative_generate_batch``)
  hf_generate      transformers' batched ``generate`` with left padding

Each repeat runs every method once per batch size, in an order that rotates, after a warm-up.
Reported per batch size: tokens/s over the batch (all rows' tokens / wall time; median and
interquartile range of the repeats), the speedups (ratios of medians), and what explains them:
alpha, the rounds the batch ran against the mean row's rounds (a batch runs until its slowest
row is done), the padding share of the target's positions, the cost coefficient c (drafter
pass / target step) and the verify cost v (one verify pass over B x (gamma + 1) positions /
one batched target step over B x 1), and the speedup those predict:
E[tokens per round] / (gamma c + v) (Leviathan et al. 2023, Thm 3.8 with the verify pass
costing v target steps instead of 1), using the batch's own rounds.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from collections.abc import Iterator

import torch

from specviz import Sampling, theory
from specviz.batch import autoregressive_generate_batch, speculative_generate_batch
from specviz.bench import _hf_kwargs, _spread, _timed, held_out_prompts, prompt_set_for, prompt_token_ids
from specviz.drafters import make_drafter
from specviz.pair import default_pair, load_pair

METHODS = ["autoregressive", "speculative", "hf_generate"]


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


def _hf_batch(pair, sampling: Sampling, n: int):
    """transformers' batched ``generate``, left-padded, with the settings ``bench`` gives it."""
    kw = _hf_kwargs(pair, sampling, n)
    pad = kw["pad_token_id"]

    def run(prompts: list[list[int]], seed: int):
        torch.manual_seed(seed)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):  # left padding, as transformers wants for decoder-only batches
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        out = pair.target.generate(ids.to(pair.device), attention_mask=mask.to(pair.device), **kw)
        return (out.shape[1] - width) * len(prompts), None

    return run


def batch_benchmark(pair_name=None, drafter=None, target=None, device=None, gamma=4, sampling=Sampling(0.0), max_new_tokens=128,
                    repeats=3, batch_sizes=(1, 2, 4, 8), kind="model", schedule="constant", ngram_max=3, exit_layer=None,
                    prompt_set="held-out") -> dict:
    """Run the batch benchmark and return its report (the dict ``--json`` prints); ``pair_name``
    defaults to ``default_pair()``.

    Raises:
        PairError, ValueError: as load_pair, make_drafter and held_out_prompts; a batch size outside 1..64.
    """
    from specviz.batch import MAX_BATCH

    if not batch_sizes or any(not 1 <= b <= MAX_BATCH for b in batch_sizes):
        raise ValueError(f"batch sizes must be whole numbers from 1 to {MAX_BATCH}, got {list(batch_sizes)}")
    if pair_name is None and not (drafter or target):
        pair_name = default_pair()
    pair = load_pair(pair_name, drafter, target, device=device, allow_custom=True)
    prompt_set = prompt_set_for(prompt_set, pair.name)
    ids = prompt_token_ids(pair, held_out_prompts(8, prompt_set), prompt_set)
    batches = {b: [ids[i % len(ids)] for i in range(b)] for b in batch_sizes}
    the_drafter = make_drafter(kind, drafter_model=pair.drafter, target=pair.target, ngram_max=ngram_max, exit_layer=exit_layer)
    common = dict(sampling=sampling, max_new_tokens=max_new_tokens, eos_token_id=None, vocab_size=pair.vocab_size)
    def counted(run):
        """(tokens, BatchResult) from a batch run: the form ``bench._timed`` reads."""
        def run_counted(prompts, seed):
            res = run(prompts, seed)
            return res.tokens, res
        return run_counted

    runners = {
        "autoregressive": counted(lambda prompts, seed: autoregressive_generate_batch(prompts, pair.target, seed=seed, **common)),
        "speculative": counted(lambda prompts, seed: speculative_generate_batch(prompts, the_drafter, pair.target, gamma=gamma,
                                                                                seed=seed, schedule=schedule, **common)),
        "hf_generate": _hf_batch(pair, sampling, max_new_tokens),
    }
    tps = {(m, b): [] for m in METHODS for b in batch_sizes}
    results = {(m, b): [] for m in ("autoregressive", "speculative") for b in batch_sizes}
    with torch.inference_mode():
        for m in METHODS:  # warm-up
            runners[m](batches[batch_sizes[0]][:1], 0)
        for r in range(repeats):
            for j, b in enumerate(batch_sizes):
                k = (r + j) % len(METHODS)
                for m in METHODS[k:] + METHODS[:k]:
                    seconds, out, tokens = _timed(runners[m], batches[b], 1000 * r + j, pair.device)
                    tps[(m, b)].append(tokens / seconds)
                    if (m, b) in results:
                        results[(m, b)].append(out)
    rows = []
    for b in batch_sizes:
        med = {m: statistics.median(tps[(m, b)]) for m in METHODS}
        spec, base = results[("speculative", b)], results[("autoregressive", b)]
        traces = [t for res in spec for t in res.traces]
        accepted = sum(t.accepted for t in traces)
        tested = accepted + sum(t.rejected for t in traces)
        alpha = accepted / tested if tested else None
        step_ms = statistics.median(r.verify_ms for res in base for r in res.traces[0].rounds)
        first = [res.traces[0] for res in spec]
        verify_ms = statistics.median(r.verify_ms for t in first for r in t.rounds)
        draft_ms = theory.drafter_step_ms(*first)
        c = draft_ms / step_ms if draft_ms is not None else 0.0
        v = verify_ms / step_ms
        batch_rounds = statistics.mean(len(res.rounds) for res in spec)
        row_rounds = statistics.mean(len(t.rounds) for t in traces)
        tokens_per_round = max_new_tokens / batch_rounds  # per row, over the batch's rounds (stragglers included)
        mean_gamma = theory.mean_gamma(*traces) or gamma
        rows.append({
            "batch_size": b,
            **{m: {"tokens_per_second": _spread(tps[(m, b)])} for m in METHODS},
            "speedup": med["speculative"] / med["autoregressive"],
            "speedup_vs_hf_generate": med["speculative"] / med["hf_generate"],
            "autoregressive_vs_hf_generate": med["autoregressive"] / med["hf_generate"],
            "alpha": alpha,
            "batch_rounds": batch_rounds,
            "mean_row_rounds": row_rounds,
            "tokens_per_round": tokens_per_round,
            "padding_share": statistics.mean(res.padding_share for res in spec),
            "target_step_ms": step_ms,
            "verify_ms_per_round": verify_ms,
            "cost_coefficient": c,
            "verify_cost": v,
            "predicted_speedup_verify": tokens_per_round / (mean_gamma * c + v),
        })
    return {
        "rows": rows,
        "settings": {"pair": pair.name, "gamma": gamma, "drafter_kind": kind, "gamma_schedule": schedule, "prompt_set": prompt_set,
                     "sampling": sampling.to_dict(), "max_new_tokens": max_new_tokens, "repeats": repeats,
                     "batch_sizes": list(batch_sizes), "device": str(pair.device), "torch_threads": torch.get_num_threads()},
    }


def format_batch_report(report: dict) -> str:
    """A plain-text table of the batch report."""
    head = (f"{'batch':>5} {'spec tok/s':>11} {'AR tok/s':>9} {'HF tok/s':>9} {'speedup':>8} {'vs HF':>6} {'AR/HF':>6} "
            f"{'alpha':>6} {'rounds':>7} {'row rds':>7} {'pad':>5} {'c':>6} {'v':>5} {'pred':>5}")
    lines = [head]
    for r in report["rows"]:
        lines.append(
            f"{r['batch_size']:>5} {r['speculative']['tokens_per_second']['median']:>11.1f} "
            f"{r['autoregressive']['tokens_per_second']['median']:>9.1f} {r['hf_generate']['tokens_per_second']['median']:>9.1f} "
            f"{r['speedup']:>8.2f} {r['speedup_vs_hf_generate']:>6.2f} {r['autoregressive_vs_hf_generate']:>6.2f} "
            f"{(r['alpha'] or 0):>6.3f} {r['batch_rounds']:>7.1f} {r['mean_row_rounds']:>7.1f} {r['padding_share']:>5.2f} "
            f"{r['cost_coefficient']:>6.3f} {r['verify_cost']:>5.2f} {r['predicted_speedup_verify']:>5.2f}")
    lines.append("tok/s: all rows' tokens / wall time (median of repeats); speedup: speculative / autoregressive; rounds: the batch's "
                 "rounds; row rds: a row's mean rounds; pad: padded share of the target's positions; c: drafter pass / target step; "
                 "v: verify pass / batched target step; pred: tokens per round over the batch's rounds / (gamma c + v)")
    return "\n".join(lines)


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
