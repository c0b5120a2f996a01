"""``python -m specviz bench``: tokens/s of five methods on one pair, interleaved, in one run.

Methods, all on the same pair, held-out prompts, settings and number of new tokens (EOS is
ignored so every run generates exactly max_new_tokens):
  autoregressive        specviz's baseline loop (the one the demo shows)
  speculative           specviz's speculative loop with the full trace
  speculative_untraced  the same loop with recording off (the trace's cost)
  hf_generate           transformers ``target.generate``
  hf_assisted           transformers' counterpart of the drafter kind and schedule (``hf_method``):
                        assisted generation with the same drafter model (``num_assistant_tokens=gamma``,
                        the same schedule where transformers has it), ``prompt_lookup_num_tokens``
                        for prompt lookup, and for early exit assisted generation with the same
                        early-exit view of the target as assistant (transformers' own
                        ``assistant_early_exit`` sets ``config.num_hidden_layers``, which GPT-2's
                        forward ignores: it would draft with every layer)

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
from specviz.drafters import early_exit_model, make_drafter
from specviz.pair import ASSETS, load_pair
from specviz.schedules import make_schedule

PROMPT_SETS = {"held-out": "prompts.json", "grounded": "prompts_grounded.json"}

METHODS = ["autoregressive", "speculative", "speculative_untraced", "hf_generate", "hf_assisted"]


def held_out_prompts(count: int, prompt_set: str = "held-out") -> list[str]:
    """The first ``count`` prompts of a set: "held-out" (assets/prompts.json, held out from
    training) or "grounded" (assets/prompts_grounded.json: code whose continuation repeats names
    and lines of the prompt, where prompt lookup has something to copy).

    Raises:
        ValueError: an unknown set.
    """
    if prompt_set not in PROMPT_SETS:
        raise ValueError(f"prompt set must be one of {', '.join(PROMPT_SETS)}, got {prompt_set!r}")
    prompts = json.loads((ASSETS / PROMPT_SETS[prompt_set]).read_text())
    return [p["prompt"] for p in prompts[:count]]


def _hf_kwargs(pair, sampling: Sampling, n: int) -> dict:
    kw = dict(max_new_tokens=n, min_new_tokens=n, pad_token_id=pair.eos_token_id)
    if sampling.greedy:
        kw.update(do_sample=False)
    else:
        kw.update(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    if sampling.repetition_penalty != 1.0:
        kw.update(repetition_penalty=sampling.repetition_penalty)
    return kw


def hf_counterpart(kind: str, schedule: str, pair, gamma: int, ngram_max: int = 3, exit_layer: int | None = None,
                   confidence: float = 0.4) -> tuple[str, dict]:
    """(name, extra ``generate`` arguments) of transformers' counterpart of a drafter kind and schedule."""
    if kind == "ngram":
        return (f"prompt_lookup_num_tokens={gamma}, max_matching_ngram_size={ngram_max} (constant: transformers has no "
                "other schedule for it)", dict(prompt_lookup_num_tokens=gamma, max_matching_ngram_size=ngram_max))
    hf_schedule = {"constant": "constant", "confidence": "constant", "heuristic": "heuristic", "optimal": "heuristic"}[schedule]
    threshold = confidence if schedule == "confidence" else 0.0
    if kind == "early-exit":
        assistant = early_exit_model(pair.target, exit_layer or make_drafter("early-exit", target=pair.target).exit_layer)
        name = f"assisted generation, assistant = the target's first {assistant.config.num_hidden_layers} layers"
    else:
        assistant, name = pair.drafter, "assisted generation with the same drafter"
    assistant.generation_config.assistant_confidence_threshold = threshold
    name += f", num_assistant_tokens={gamma}, schedule {hf_schedule}" + (f", confidence threshold {threshold}" if threshold else "")
    if schedule == "optimal":
        name += " (transformers has no theory-guided schedule: its heuristic is the nearest)"
    return name, dict(assistant_model=assistant, num_assistant_tokens=gamma, num_assistant_tokens_schedule=hf_schedule,
                      assistant_confidence_threshold=threshold)


def _runner(method: str, pair, sampling: Sampling, gamma: int, n: int, kind: str = "model", schedule: str = "constant",
            ngram_max: int = 3, exit_layer: int | None = None, confidence: float = 0.4, tree=None):
    """A callable(prompt_ids, seed) -> (tokens generated, trace or None) for one method."""
    common = dict(sampling=sampling, max_new_tokens=n, eos_token_id=None)
    if method == "autoregressive":
        return lambda ids, seed: autoregressive_generate(ids, pair.target, seed=seed, vocab_size=pair.vocab_size, **common)
    if method == "speculative_tree":
        drafter = make_drafter(kind, drafter_model=pair.drafter, target=pair.target, ngram_max=ngram_max, exit_layer=exit_layer)
        return lambda ids, seed: speculative_generate(ids, drafter, pair.target, seed=seed, vocab_size=pair.vocab_size, tree=tree, **common)
    if method in ("speculative", "speculative_untraced"):
        record = method == "speculative"
        drafter = make_drafter(kind, drafter_model=pair.drafter, target=pair.target, ngram_max=ngram_max, exit_layer=exit_layer)
        return lambda ids, seed: speculative_generate(ids, drafter, pair.target, gamma=gamma, seed=seed, vocab_size=pair.vocab_size,
                                                      record=record, schedule=make_schedule(schedule, gamma, confidence), **common)
    hf = _hf_kwargs(pair, sampling, n)
    if method == "hf_assisted":
        hf.update(hf_counterpart(kind, schedule, pair, gamma, ngram_max, exit_layer, confidence)[1])

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
              repeats=3, prompts=8, methods=METHODS, kind="model", schedule="constant", ngram_max=3, exit_layer=None,
              confidence=0.4, prompt_set="held-out", tree=None) -> dict:
    """Run the benchmark and return the report (the dict ``--json`` prints).

    ``kind`` and ``schedule`` choose the drafter and gamma schedule (``specviz.drafters``,
    ``specviz.schedules``); ``prompt_set`` one of PROMPT_SETS; ``tree`` (a TreeSpec) adds a token
    tree with the same drafter to the rotation, reported beside the chain (``specviz.tree.bench``). Tokens/s are per run (prefill
    included); speedups are ratios of medians within this one run.

    Raises:
        PairError, ValueError: as load_pair, make_drafter, make_schedule, held_out_prompts.
    """
    pair = load_pair(pair_name, drafter, target, device=device, allow_custom=True)
    texts = held_out_prompts(prompts, prompt_set)
    prompt_ids = [pair.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    options = dict(kind=kind, schedule=schedule, ngram_max=ngram_max, exit_layer=exit_layer, confidence=confidence, tree=tree)
    methods = [*methods, "speculative_tree"] if tree is not None else list(methods)
    runners = {m: _runner(m, pair, sampling, gamma, max_new_tokens, **options) for m in methods}
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
        alpha = accepted / tested if tested else None
        betas = [d.beta for t in spec for r in t.rounds for d in r.drafts if d.verdict != "discarded" and d.beta is not None]
        drafter_ms, target_ms = theory.drafter_step_ms(*spec), theory.target_step_ms(*base)
        verify_ms = theory.verify_ms_per_round(*spec)
        c = drafter_ms / target_ms if drafter_ms is not None and target_ms else None
        v = verify_ms / target_ms if verify_ms is not None and target_ms else None
        # The theory's predictions assume every round drafts gamma: a constant schedule with a drafter model.
        predictable = schedule == "constant" and kind != "ngram" and alpha is not None and c is not None
        predicted = theory.predicted_speedup(alpha, gamma, c) if predictable else None
        predicted_v = theory.predicted_speedup_with_verify_cost(alpha, gamma, c, v) if predictable else None
        speedup = med["speculative"] / med["autoregressive"]
        report.update(
            alpha=alpha,
            draft_acceptance_rate=accepted / drafted if drafted else None,
            acceptance_rate=accepted / drafted if drafted else None,  # the same, under Trace.acceptance_rate's name
            mean_beta=sum(betas) / len(betas) if betas else None,
            mean_tokens_per_round=sum(len(t.output_ids) for t in spec) / sum(len(t.rounds) for t in spec),
            mean_gamma=theory.mean_gamma(*spec),
            predicted_tokens_per_round=theory.expected_tokens_per_round(alpha, gamma) if predictable else None,
            drafter_step_ms=drafter_ms,
            target_step_ms=target_ms,
            verify_ms_per_round=verify_ms,
            cost_coefficient=c,
            verify_cost=v,
            predicted_speedup=predicted,
            predicted_speedup_verify=predicted_v,
            speedup=speedup,
            efficiency=speedup / predicted if predicted else None,
            efficiency_verify=speedup / predicted_v if predicted_v else None,
        )
        report["speculative"].update(alpha=alpha, draft_acceptance_rate=report["draft_acceptance_rate"],
                                     mean_tokens_per_round=report["mean_tokens_per_round"])
    if "hf_assisted" in med and "speculative" in med:
        report["hf_method"] = hf_counterpart(kind, schedule, pair, gamma, ngram_max, exit_layer, confidence)[0]
        report["speedup_vs_hf"] = report["speedup_vs_hf_assisted"] = med["speculative"] / med["hf_assisted"]
    if "hf_generate" in med and "autoregressive" in med:
        report["autoregressive_vs_hf_generate"] = med["autoregressive"] / med["hf_generate"]
    if "speculative_untraced" in med and "speculative" in med:
        report["trace_overhead"] = med["speculative_untraced"] / med["speculative"] - 1.0
    if tree is not None and traces["speculative_tree"] and spec and base:
        from specviz.tree.bench import tree_report

        report["tree"] = tree_report(pair, spec, traces["speculative_tree"], base, med, prompt_ids[0], tree.label())
    report["settings"] = {
        "pair": pair.name, "gamma": gamma, "drafter_kind": kind, "gamma_schedule": schedule, "prompt_set": prompt_set,
        "sampling": sampling.to_dict(), "max_new_tokens": max_new_tokens, "tree": tree.describe() if tree is not None else None,
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
        ("speedup_vs_hf", "speedup over transformers' counterpart"), ("mean_gamma", "drafts per round"), ("autoregressive_vs_hf_generate", "autoregressive / hf_generate"),
        ("predicted_speedup", "predicted speedup, Thm 3.8"), ("predicted_speedup_verify", "predicted with measured v"),
        ("efficiency", "efficiency (measured / Thm 3.8)"), ("efficiency_verify", "efficiency (measured / with v)"),
        ("trace_overhead", "trace overhead"),
    ]:
        if report.get(key) is not None:
            lines.append(f"{label:<46}{report[key]:.3f}")
    if report.get("hf_method"):
        lines.append(f"transformers' counterpart: {report['hf_method']}")
    if report.get("tree"):
        from specviz.tree.bench import format_tree_report

        lines += format_tree_report(report["tree"])
    lines.append(f"settings: {json.dumps(report['settings'])}")
    return "\n".join(lines)


def run(args) -> int:
    """The ``bench`` subcommand."""
    from specviz.cli import tree_for
    from specviz.pair import PairError

    try:
        sampling = Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, repetition_penalty=args.repetition_penalty)
        if args.batch_sizes:
            if tree_for(args) is not None:
                raise ValueError("--batch-sizes measures batches of chains; token trees run one prompt at a time")
            return _run_batch(args, sampling)
        report = benchmark(args.pair, args.drafter, args.target, args.device, args.gamma, sampling, args.max_new_tokens, args.repeats,
                           args.prompts, kind=args.drafter_kind, schedule=args.gamma_schedule, ngram_max=args.ngram_max,
                           exit_layer=args.exit_layer, confidence=args.confidence, prompt_set=args.prompt_set, tree=tree_for(args))
    except (PairError, ValueError) as err:
        print(f"error: {err}", file=__import__("sys").stderr)
        return 2
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0


def _run_batch(args, sampling: Sampling) -> int:
    from specviz.bench_batch import batch_benchmark, format_batch_report

    try:
        sizes = [int(x) for x in args.batch_sizes.split(",")]
    except ValueError:
        raise ValueError(f"--batch-sizes must be comma-separated whole numbers, got {args.batch_sizes!r}") from None
    report = batch_benchmark(args.pair, args.drafter, args.target, args.device, args.gamma, sampling, args.max_new_tokens, args.repeats,
                             sizes, kind=args.drafter_kind, schedule=args.gamma_schedule, ngram_max=args.ngram_max,
                             exit_layer=args.exit_layer, prompt_set=args.prompt_set)
    print(json.dumps(report, indent=1) if args.json else format_batch_report(report))
    return 0
