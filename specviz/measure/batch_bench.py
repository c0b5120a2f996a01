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
row is done), the padding share of the target's positions, the cost coefficient c (the batch's
drafting time / its drafter passes, over one batched target step) and the verify cost v (one
verify pass over B x (gamma + 1) positions / one batched target step over B x 1), and the
speedup those predict from alpha, c and v: E[tokens per round] / (gamma c + v) with Eq. (1)'s
E[tokens per round] (Leviathan et al. 2023, Thm 3.8 with the verify pass costing v target
steps instead of 1). The prediction knows nothing of stragglers: a batch runs as many rounds as
its slowest row, which the measured speedup pays and the prediction does not.
"""

from __future__ import annotations

import statistics
import sys

import torch
from tqdm.auto import tqdm

from specviz import metrics, theory
from specviz.engine.sampling import Sampling
from specviz.engine.batch import MAX_BATCH, autoregressive_generate_batch, speculative_generate_batch
from specviz.measure.common import (
    benchmark_prompts,
    hf_kwargs,
    prompt_set_for,
    prompt_token_ids,
    pooled_acceptance,
    predictions,
    run_command,
    spread,
    timed,
)
from specviz.drafters import default_kind
from specviz.pair import default_pair, load_pair
from specviz.pair.drafter import pair_drafter
from specviz.engine.schedules import make_schedule

METHODS = ["autoregressive", "speculative", "hf_generate"]


def _hf_batch(pair, sampling: Sampling, n: int):
    """transformers' batched ``generate``, left-padded, with the settings ``bench`` gives it."""
    kw = hf_kwargs(pair, sampling, n)
    pad = kw["pad_token_id"]

    def run(prompts: list[list[int]], seed: int):
        torch.manual_seed(seed)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):  # left padding, as transformers wants for decoder-only batches
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        out = pair.target.generate(ids.to(pair.device), attention_mask=mask.to(pair.device), **kw)
        return (out.shape[1] - width) * len(prompts), None

    return run


def batch_benchmark(
    pair_name=None,
    drafter=None,
    target=None,
    device=None,
    gamma=4,
    sampling=Sampling(0.0),
    max_new_tokens=128,
    repeats=3,
    batch_sizes=(1, 2, 4, 8),
    kind="model",
    schedule="constant",
    ngram_max=3,
    exit_layer=None,
    prompt_set="held-out",
    confidence=None,
) -> dict:
    """Run the batch benchmark and return its report (the dict ``--json`` prints); ``pair_name``
    defaults to ``default_pair()``.

    ``confidence``: the threshold of the confidence or path schedule (None: the schedule's default,
    ``specviz.engine.schedules.DEFAULT_THRESHOLDS``).

    Raises:
        PairError, ValueError: as load_pair, make_drafter, make_schedule and benchmark_prompts; a
            batch size outside 1..MAX_BATCH.
    """
    if not batch_sizes or any(not 1 <= b <= MAX_BATCH for b in batch_sizes):
        raise ValueError(f"batch sizes must be whole numbers from 1 to {MAX_BATCH}, got {list(batch_sizes)}")
    make_schedule(schedule, gamma, confidence)  # refuses a bad name, gamma or threshold before the pair loads
    if pair_name is None and not (drafter or target):
        pair_name = default_pair()
    pair = load_pair(
        pair_name, drafter, target, device=device, allow_custom=True, own_tokenizer=kind == "cross-tokenizer", kind=kind
    )
    kind = kind or default_kind(pair)
    prompt_set = prompt_set_for(prompt_set, pair.name)
    ids = prompt_token_ids(pair, benchmark_prompts(8, prompt_set), prompt_set)
    batches = {b: [ids[i % len(ids)] for i in range(b)] for b in batch_sizes}
    the_drafter = pair_drafter(kind, pair, ngram_max=ngram_max, exit_layer=exit_layer)
    common = dict(sampling=sampling, max_new_tokens=max_new_tokens, eos_token_id=None, vocab_size=pair.vocab_size)

    def counted(run):
        """(tokens, BatchResult) from a batch run: the form ``bench_common.timed`` reads."""

        def run_counted(prompts, seed):
            res = run(prompts, seed)
            return res.tokens, res

        return run_counted

    runners = {
        "autoregressive": counted(
            lambda prompts, seed: autoregressive_generate_batch(prompts, pair.target, seed=seed, **common)
        ),
        "speculative": counted(
            lambda prompts, seed: speculative_generate_batch(
                prompts,
                the_drafter,
                pair.target,
                gamma=gamma,
                seed=seed,
                schedule=make_schedule(schedule, gamma, confidence),
                **common,
            )
        ),
        "hf_generate": _hf_batch(pair, sampling, max_new_tokens),
    }
    tps = {(m, b): [] for m in METHODS for b in batch_sizes}
    results = {(m, b): [] for m in ("autoregressive", "speculative") for b in batch_sizes}
    with (
        torch.inference_mode(),
        tqdm(
            total=len(METHODS) * (1 + repeats * len(batch_sizes)), desc="batch bench runs", file=sys.stderr, unit="run"
        ) as bar,
    ):
        for m in METHODS:  # warm-up
            runners[m](batches[batch_sizes[0]][:1], 0)
            bar.update()
        for r in range(repeats):
            for j, b in enumerate(batch_sizes):
                k = (r + j) % len(METHODS)
                for m in METHODS[k:] + METHODS[:k]:
                    seconds, out, tokens = timed(runners[m], batches[b], 1000 * r + j, pair.device)
                    tps[(m, b)].append(tokens / seconds)
                    if (m, b) in results:
                        results[(m, b)].append(out)
                    bar.update()
    rows = [_batch_row(b, tps, results, gamma, max_new_tokens, schedule, kind) for b in batch_sizes]
    return {
        "rows": rows,
        "settings": {
            "pair": pair.name,
            "gamma": gamma,
            "drafter_kind": kind,
            "gamma_schedule": schedule,
            "prompt_set": prompt_set,
            "confidence": make_schedule(schedule, gamma, confidence).describe().get("threshold"),
            "sampling": sampling.to_dict(),
            "max_new_tokens": max_new_tokens,
            "repeats": repeats,
            "batch_sizes": list(batch_sizes),
            "device": str(pair.device),
            "torch_threads": torch.get_num_threads(),
            "dtype": str(pair.target.dtype).removeprefix("torch."),
            "dtype_reason": pair.form.reason if getattr(pair, "form", None) is not None else None,
        },
    }


def _batch_row(b: int, tps: dict, results: dict, gamma: int, max_new_tokens: int, schedule: str, kind: str) -> dict:
    """One batch size's line of the report, from its timed runs (see the module docstring)."""
    med = {m: statistics.median(tps[(m, b)]) for m in METHODS}
    spec, base = results[("speculative", b)], results[("autoregressive", b)]
    traces = [t for res in spec for t in res.traces]
    acceptance = pooled_acceptance(traces)
    # Pooled over the repeats, each round of a batch counted once.
    step_ms = metrics.step_ms(sum(res.verify_ms for res in base), sum(len(res.rounds) for res in base))
    verify_ms = metrics.step_ms(sum(res.verify_ms for res in spec), sum(len(res.rounds) for res in spec))
    drafter_ms = metrics.step_ms(sum(res.draft_ms for res in spec), sum(res.drafter_step_passes for res in spec))
    c, v = metrics.cost_coefficient(drafter_ms, step_ms), metrics.verify_cost(verify_ms, step_ms)
    batch_rounds = statistics.mean(len(res.rounds) for res in spec)
    predicted = predictions(acceptance["alpha"], gamma, c, v, schedule, kind)
    return {
        "batch_size": b,
        **{m: {"tokens_per_second": spread(tps[(m, b)])} for m in METHODS},
        "speedup": med["speculative"] / med["autoregressive"],
        "speedup_vs_hf_generate": med["speculative"] / med["hf_generate"],
        "autoregressive_vs_hf_generate": med["autoregressive"] / med["hf_generate"],
        **acceptance,
        "batch_rounds": batch_rounds,
        "mean_row_rounds": statistics.mean(len(t.rounds) for t in traces),
        "tokens_per_round": max_new_tokens / batch_rounds,  # per row, over the batch's rounds (stragglers included)
        "mean_gamma": theory.mean_gamma(*traces),
        "padding_share": statistics.mean(res.padding_share for res in spec),
        "target_step_ms": step_ms,
        "drafter_step_ms": drafter_ms,
        "verify_ms_per_round": verify_ms,
        "cost_coefficient": c,
        "verify_cost": v,
        **predicted,
    }


def _cell(value, spec: str) -> str:
    return format(value, spec) if value is not None else format("-", spec.split(".")[0])


def format_batch_report(report: dict) -> str:
    """A plain-text table of the batch report."""
    head = (
        f"{'batch':>5} {'spec tok/s':>11} {'AR tok/s':>9} {'HF tok/s':>9} {'speedup':>8} {'vs HF':>6} {'AR/HF':>6} "
        f"{'alpha':>6} {'rounds':>7} {'row rds':>7} {'pad':>5} {'c':>6} {'v':>5} {'pred':>5}"
    )
    lines = [head]
    for r in report["rows"]:
        lines.append(
            f"{r['batch_size']:>5} {r['speculative']['tokens_per_second']['median']:>11.1f} "
            f"{r['autoregressive']['tokens_per_second']['median']:>9.1f} "
            f"{r['hf_generate']['tokens_per_second']['median']:>9.1f} "
            f"{r['speedup']:>8.2f} {r['speedup_vs_hf_generate']:>6.2f} {r['autoregressive_vs_hf_generate']:>6.2f} "
            f"{_cell(r['alpha'], '>6.3f')} {r['batch_rounds']:>7.1f} {r['mean_row_rounds']:>7.1f} "
            f"{r['padding_share']:>5.2f} "
            f"{_cell(r['cost_coefficient'], '>6.3f')} {_cell(r['verify_cost'], '>5.2f')} "
            f"{_cell(r['predicted_speedup_verify'], '>5.2f')}"
        )
    lines.append(
        "tok/s: all rows' tokens / wall time (median of repeats); speedup: speculative / autoregressive; rounds: the "
        "batch's "
        "rounds; row rds: a row's mean rounds; pad: padded share of the target's positions; c: the batch's drafting "
        "time per "
        "drafter pass / batched target step; v: verify pass / batched target step; pred: Eq. (1)'s tokens per round at "
        "alpha "
        "/ (gamma c + v), predicted without stragglers (constant schedule, drafter model; - otherwise)"
    )
    return "\n".join(lines)


def run(args) -> int:
    """The ``bench --batch-sizes`` subcommand."""

    def work(a, sampling):
        try:
            sizes = [int(x) for x in a.batch_sizes.split(",")]
        except ValueError:
            raise ValueError("--batch-sizes must be comma-separated whole numbers, e.g. 1,2,4,8") from None
        return batch_benchmark(
            a.pair,
            a.drafter,
            a.target,
            a.device,
            a.gamma,
            sampling,
            a.max_new_tokens,
            a.repeats,
            sizes,
            kind=a.drafter_kind,
            schedule=a.gamma_schedule,
            ngram_max=a.ngram_max,
            exit_layer=a.exit_layer,
            prompt_set=a.prompt_set,
            confidence=a.confidence,
        )

    return run_command(args, work, format_batch_report)
