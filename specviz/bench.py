"""``python -m specviz bench``: tokens/s of five methods on one pair, interleaved, in one run.

Methods, all on the same pair, held-out prompts, settings and number of new tokens (EOS is
ignored so every run generates exactly max_new_tokens):
  autoregressive        specviz's baseline loop (the one the demo shows)
  speculative           specviz's speculative loop with the full trace
  speculative_untraced  the same loop with recording off (the trace's cost)
  hf_generate           transformers ``target.generate``
  hf_assisted           transformers assisted generation with the same drafter,
                        ``num_assistant_tokens=gamma``, a constant schedule, no confidence threshold

Each repeat runs every method once per prompt, in an order that rotates, after one warm-up
pass. Reported per method: median tokens/s and the interquartile range over all timed runs.
Derived: speedup (speculative / autoregressive), speedup over hf_assisted, alpha (accepted /
(accepted + rejected), Leviathan et al.'s per-draft acceptance probability) beside the draft
acceptance rate (accepted / drafted) and mean beta, the measured cost coefficient c, the verify
cost v (target pass over gamma + 1 tokens / one target step), the speedup Leviathan et al.
(2023, Thm 3.8) predict from alpha, gamma and c, the same with the measured v
(E[tokens per round] / (gamma c + v)), and efficiency = measured / each prediction.
"""

from __future__ import annotations

import json
import platform
import statistics
import time

import torch

from specviz import Sampling, autoregressive_generate, speculative_generate, theory
from specviz.pair import ASSETS, load_pair

METHODS = ["autoregressive", "speculative", "speculative_untraced", "hf_generate", "hf_assisted"]


def held_out_prompts(count: int) -> list[str]:
    """The first ``count`` prompts of assets/prompts.json (held out from training)."""
    prompts = json.loads((ASSETS / "prompts.json").read_text())
    return [p["prompt"] for p in prompts[:count]]


def _hf_kwargs(pair, sampling: Sampling, n: int) -> dict:
    kw = dict(max_new_tokens=n, min_new_tokens=n, pad_token_id=pair.eos_token_id)
    if sampling.greedy:
        kw.update(do_sample=False)
    else:
        kw.update(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    return kw


def _runner(method: str, pair, sampling: Sampling, gamma: int, n: int):
    """A callable(prompt_ids, seed) -> (tokens generated, trace or None) for one method."""
    common = dict(sampling=sampling, max_new_tokens=n, eos_token_id=None)
    if method == "autoregressive":
        return lambda ids, seed: autoregressive_generate(ids, pair.target, seed=seed, vocab_size=pair.vocab_size, **common)
    if method in ("speculative", "speculative_untraced"):
        record = method == "speculative"
        return lambda ids, seed: speculative_generate(ids, pair.drafter, pair.target, gamma=gamma, seed=seed, vocab_size=pair.vocab_size, record=record, **common)
    hf = _hf_kwargs(pair, sampling, n)
    if method == "hf_assisted":
        pair.drafter.generation_config.assistant_confidence_threshold = 0.0
        hf.update(assistant_model=pair.drafter, num_assistant_tokens=gamma, num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)

    def run(ids, seed):
        torch.manual_seed(seed)
        x = torch.tensor([ids], device=pair.device)
        out = pair.target.generate(x, attention_mask=torch.ones_like(x), **hf)
        return out.shape[1] - len(ids), None

    return run


def _timed(fn, ids, seed, device) -> tuple[float, object, int]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = fn(ids, seed)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if isinstance(result, tuple):
        tokens, trace = result
    else:
        tokens, trace = len(result.output_ids), result
    return seconds, trace, tokens


def _spread(values: list[float]) -> dict:
    qs = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": qs[0], "q3": qs[2], "min": min(values), "max": max(values), "runs": len(values)}


def benchmark(pair_name="embedded", drafter=None, target=None, device=None, gamma=4, sampling=Sampling(), max_new_tokens=128,
              repeats=3, prompts=8, methods=METHODS) -> dict:
    """Run the benchmark and return the report (the dict ``--json`` prints)."""
    pair = load_pair(pair_name, drafter, target, device=device, allow_custom=True)
    texts = held_out_prompts(prompts)
    prompt_ids = [pair.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    runners = {m: _runner(m, pair, sampling, gamma, max_new_tokens) for m in methods}
    tps: dict[str, list[float]] = {m: [] for m in methods}
    traces: dict[str, list] = {m: [] for m in methods}
    with torch.inference_mode():
        for m in methods:  # warm-up: first-call allocations and kernel selection
            _timed(runners[m], prompt_ids[0], 0, pair.device)
        for r in range(repeats):
            for i, ids in enumerate(prompt_ids):
                k = (r * len(prompt_ids) + i) % len(methods)
                for m in methods[k:] + methods[:k]:  # rotate the order
                    seconds, trace, tokens = _timed(runners[m], ids, 1000 * r + i, pair.device)
                    tps[m].append(tokens / seconds)
                    if trace is not None:
                        traces[m].append(trace)
    report: dict = {m: {"tokens_per_second": _spread(tps[m])} for m in methods}
    med = {m: report[m]["tokens_per_second"]["median"] for m in methods}
    spec, base = traces.get("speculative"), traces.get("autoregressive")
    if spec and base:
        accepted, drafted = sum(t.accepted for t in spec), sum(t.drafted for t in spec)
        tested = accepted + sum(t.rejected for t in spec)
        alpha = accepted / tested
        betas = [d.beta for t in spec for r in t.rounds for d in r.drafts if d.verdict != "discarded" and d.beta is not None]
        drafter_ms, target_ms = theory.drafter_step_ms(*spec), theory.target_step_ms(*base)
        verify_ms = theory.verify_ms_per_round(*spec)
        c, v = drafter_ms / target_ms, verify_ms / target_ms
        predicted = theory.predicted_speedup(alpha, gamma, c)
        predicted_v = theory.predicted_speedup_with_verify_cost(alpha, gamma, c, v)
        speedup = med["speculative"] / med["autoregressive"]
        report.update(
            alpha=alpha,
            draft_acceptance_rate=accepted / drafted,
            acceptance_rate=accepted / drafted,  # the same, under Trace.acceptance_rate's name
            mean_beta=sum(betas) / len(betas) if betas else None,
            mean_tokens_per_round=sum(len(t.output_ids) for t in spec) / sum(len(t.rounds) for t in spec),
            predicted_tokens_per_round=theory.expected_tokens_per_round(alpha, gamma),
            drafter_step_ms=drafter_ms,
            target_step_ms=target_ms,
            verify_ms_per_round=verify_ms,
            cost_coefficient=c,
            verify_cost=v,
            predicted_speedup=predicted,
            predicted_speedup_verify=predicted_v,
            speedup=speedup,
            efficiency=speedup / predicted,
            efficiency_verify=speedup / predicted_v,
        )
        report["speculative"].update(alpha=alpha, draft_acceptance_rate=accepted / drafted,
                                     mean_tokens_per_round=report["mean_tokens_per_round"])
    if "hf_assisted" in med and "speculative" in med:
        report["speedup_vs_hf_assisted"] = med["speculative"] / med["hf_assisted"]
    if "hf_generate" in med and "autoregressive" in med:
        report["autoregressive_vs_hf_generate"] = med["autoregressive"] / med["hf_generate"]
    if "speculative_untraced" in med and "speculative" in med:
        report["trace_overhead"] = med["speculative_untraced"] / med["speculative"] - 1.0
    report["settings"] = {
        "pair": pair.name, "gamma": gamma, "sampling": sampling.to_dict(), "max_new_tokens": max_new_tokens,
        "repeats": repeats, "prompts": len(prompt_ids), "device": str(pair.device),
        "dtype": str(pair.target.dtype).removeprefix("torch."), "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
    }
    return report


def format_report(report: dict) -> str:
    """A plain-text table of the report."""
    lines = [f"{'method':<22}{'tokens/s (median)':>18}{'IQR':>20}"]
    for m in METHODS:
        if m in report:
            s = report[m]["tokens_per_second"]
            iqr = f"{s['q1']:.1f}-{s['q3']:.1f}"
            lines.append(f"{m:<22}{s['median']:>18.1f}{iqr:>20}")
    for key, label in [
        ("alpha", "alpha (accepted / tested)"), ("draft_acceptance_rate", "draft acceptance rate (accepted / drafted)"),
        ("mean_beta", "mean beta"), ("mean_tokens_per_round", "tokens per round"),
        ("predicted_tokens_per_round", "tokens per round, Eq. (1)"),
        ("cost_coefficient", "cost coefficient c"), ("verify_cost", "verify cost v"), ("speedup", "speedup over autoregressive"),
        ("speedup_vs_hf_assisted", "speedup over hf_assisted"), ("autoregressive_vs_hf_generate", "autoregressive / hf_generate"),
        ("predicted_speedup", "predicted speedup, Thm 3.8"), ("predicted_speedup_verify", "predicted with measured v"),
        ("efficiency", "efficiency (measured / Thm 3.8)"), ("efficiency_verify", "efficiency (measured / with v)"),
        ("trace_overhead", "trace overhead"),
    ]:
        if report.get(key) is not None:
            lines.append(f"{label:<46}{report[key]:.3f}")
    lines.append(f"settings: {json.dumps(report['settings'])}")
    return "\n".join(lines)


def run(args) -> int:
    """The ``bench`` subcommand."""
    from specviz.pair import PairError

    try:
        sampling = Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
        report = benchmark(args.pair, args.drafter, args.target, args.device, args.gamma, sampling, args.max_new_tokens, args.repeats, args.prompts)
    except (PairError, ValueError) as err:
        print(f"error: {err}", file=__import__("sys").stderr)
        return 2
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0
