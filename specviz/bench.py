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

import copy
import json
import platform

import torch

from specviz import Sampling, autoregressive_generate, metrics, speculative_generate, theory
from specviz.bench_common import benchmark_prompts, hf_kwargs, prompt_set_for, prompt_token_ids, pooled_acceptance, predictions, run_command, spread, timed
from specviz.drafters import default_exit_layer, early_exit_model, make_drafter, quantize_target
from specviz.pair import default_pair, load_pair
from specviz.schedules import make_schedule

METHODS = ["autoregressive", "speculative", "speculative_untraced", "hf_generate", "hf_assisted"]


def _assistant(model):
    """``model`` with a generation config of its own: transformers writes its assistant settings
    (confidence threshold, heuristic gamma) into the assistant's config, and the pair's drafter
    is shared with every other run."""
    twin = copy.copy(model)  # shares the modules and weights
    twin.generation_config = copy.deepcopy(model.generation_config)
    return twin


def hf_counterpart(kind: str, schedule: str, pair, gamma: int, ngram_max: int = 3, exit_layer: int | None = None,
                   confidence: float = 0.4) -> tuple[str, dict]:
    """(name, extra ``generate`` arguments) of transformers' counterpart of a drafter kind and schedule.

    The assistant is a view of the pair's drafter (or an early-exit view of its target) with a
    generation config of its own, so neither this call nor ``generate`` changes the pair's models.
    """
    if kind == "ngram":
        return (f"prompt_lookup_num_tokens={gamma}, max_matching_ngram_size={ngram_max} (constant: transformers has no "
                "other schedule for it)", dict(prompt_lookup_num_tokens=gamma, max_matching_ngram_size=ngram_max))
    hf_schedule = {"constant": "constant", "confidence": "constant", "heuristic": "heuristic", "optimal": "heuristic"}[schedule]
    threshold = confidence if schedule == "confidence" else 0.0
    if kind == "early-exit":
        assistant = early_exit_model(pair.target, exit_layer or default_exit_layer(pair.target))
        name = f"assisted generation, assistant = the target's first {assistant.config.num_hidden_layers} layers"
    elif kind == "quantized":
        assistant, name = quantize_target(pair.target), "assisted generation, assistant = the target's int8 copy"
    elif kind == "eagle":
        assistant = _assistant(pair.drafter)
        name = "assisted generation with the pair's drafter model (transformers has no EAGLE drafter)"
    else:
        assistant, name = _assistant(pair.drafter), "assisted generation with the same drafter"
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
    hf = hf_kwargs(pair, sampling, n)
    if method == "hf_assisted":
        hf.update(hf_counterpart(kind, schedule, pair, gamma, ngram_max, exit_layer, confidence)[1])

    def run(ids, seed):
        torch.manual_seed(seed)
        x = torch.tensor([ids], device=pair.device)
        out = pair.target.generate(x, attention_mask=torch.ones_like(x), **hf)
        return out.shape[1] - len(ids), None

    return run


def benchmark(pair_name=None, drafter=None, target=None, device=None, gamma=4, sampling=Sampling(), max_new_tokens=128,
              repeats=3, prompts=8, methods=METHODS, kind="model", schedule="constant", ngram_max=3, exit_layer=None,
              confidence=0.4, prompt_set="held-out", tree=None) -> dict:
    """Run the benchmark and return the report (the dict ``--json`` prints).

    ``pair_name`` defaults to ``default_pair()`` (the English pair when it loads offline). ``kind``
    and ``schedule`` choose the drafter and gamma schedule (``specviz.drafters``,
    ``specviz.schedules``); ``prompt_set`` one of PROMPT_SETS ("held-out": the pair's own, see
    ``prompt_set_for``). Tokens/s are per run (prefill included); speedups are ratios of medians
    within this one run. ``tree`` (a TreeSpec) adds a token tree with the same drafter to the
    rotation, reported beside the chain (``specviz.tree.bench``).

    Raises:
        PairError, ValueError: as load_pair, make_drafter, make_schedule, benchmark_prompts.
    """
    if pair_name is None and not (drafter or target):
        pair_name = default_pair()
    pair = load_pair(pair_name, drafter, target, device=device, allow_custom=True)
    prompt_set = prompt_set_for(prompt_set, pair.name)
    prompt_ids = prompt_token_ids(pair, benchmark_prompts(prompts, prompt_set), prompt_set)
    options = dict(kind=kind, schedule=schedule, ngram_max=ngram_max, exit_layer=exit_layer, confidence=confidence, tree=tree)
    methods = [*methods, "speculative_tree"] if tree is not None else list(methods)
    runners = {m: _runner(m, pair, sampling, gamma, max_new_tokens, **options) for m in methods}
    tps: dict[str, list[float]] = {m: [] for m in methods}
    traces: dict[str, list] = {m: [] for m in methods}
    with torch.inference_mode():
        for m in methods:  # warm-up: first-call allocations and kernel selection
            timed(runners[m], prompt_ids[0], 0, pair.device)
        for r in range(repeats):
            for i, ids in enumerate(prompt_ids):
                k = (r * len(prompt_ids) + i) % len(methods)
                for m in methods[k:] + methods[:k]:  # rotate the order
                    seconds, trace, tokens = timed(runners[m], ids, 1000 * r + i, pair.device)
                    tps[m].append(tokens / seconds)
                    if trace is not None:
                        traces[m].append(trace)
    report: dict = {m: {"tokens_per_second": spread(tps[m])} for m in methods}
    med = {m: report[m]["tokens_per_second"]["median"] for m in methods}
    spec, base = traces.get("speculative"), traces.get("autoregressive")
    if spec and base:
        acceptance = pooled_acceptance(spec)
        alpha = acceptance["alpha"]
        drafter_ms, target_ms = theory.drafter_step_ms(*spec), theory.target_step_ms(*base)
        verify_ms = theory.verify_ms_per_round(*spec)
        c, v = metrics.cost_coefficient(drafter_ms, target_ms), metrics.verify_cost(verify_ms, target_ms)
        predicted = predictions(alpha, gamma, c, v, schedule, kind)
        speedup = med["speculative"] / med["autoregressive"]
        report.update(
            **acceptance,
            acceptance_rate=acceptance["draft_acceptance_rate"],  # the same, under Trace.acceptance_rate's name
            mean_gamma=theory.mean_gamma(*spec),
            drafter_step_ms=drafter_ms,
            target_step_ms=target_ms,
            verify_ms_per_round=verify_ms,
            cost_coefficient=c,
            verify_cost=v,
            **predicted,
            speedup=speedup,
            efficiency=metrics.ratio(speedup, predicted["predicted_speedup"]),
            efficiency_verify=metrics.ratio(speedup, predicted["predicted_speedup_verify"]),
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
    """The ``bench`` subcommand (one sequence at a time; ``--batch-sizes`` is ``specviz.bench_batch``)."""
    from specviz.tree.spec import TreeSpec

    return run_command(args, lambda a, sampling: benchmark(
        a.pair, a.drafter, a.target, a.device, a.gamma, sampling, a.max_new_tokens, a.repeats, a.prompts, kind=a.drafter_kind,
        schedule=a.gamma_schedule, ngram_max=a.ngram_max, exit_layer=a.exit_layer, confidence=a.confidence, prompt_set=a.prompt_set,
        tree=TreeSpec.from_args(a)), format_report)
