"""``python -m specviz bench``: tokens/s of five methods on one pair, interleaved, in one run.

Methods, all on the same pair, held-out prompts, settings and number of new tokens (EOS is
ignored so every run generates exactly max_new_tokens); the pair runs in its form for this machine
(``specviz.pair.precision``: bf16 on a CPU with bf16 instructions, else fp32; said in the header):
  autoregressive        specviz's baseline loop (the one the demo shows), the same target in the same form
  autoregressive_fp32   the same loop with the target loaded again in fp32 with transformers' own products
                        (only where the form is not that): the comparison is not won by slowing the baseline
  speculative           specviz's speculative loop with the full trace
  speculative_untraced  the same loop with recording off (the trace's cost)
  hf_generate           transformers ``target.generate`` (greedy or sampled), the same weights in the same form,
                        with transformers' own products (where specviz routes the target's fp32 products,
                        ``specviz.pair.kernels``, this row runs the unrouted fp32 twin)
  hf_assisted           transformers' counterpart of the drafter kind and schedule (``hf_method``):
                        assisted generation with the same drafter model (``num_assistant_tokens=gamma``,
                        the same schedule where transformers has it), ``prompt_lookup_num_tokens``
                        for prompt lookup, and for early exit assisted generation with the same
                        early-exit view of the target as assistant (transformers' own
                        ``assistant_early_exit`` sets ``config.num_hidden_layers``, which GPT-2's
                        forward ignores: it would draft with every layer)

With ``--cache static`` or ``--cache graphs`` specviz's loops run over the static KV cache
(``specviz.engine.cache``) or CUDA graphs over it (``specviz.engine.graphs``, captured before the timed runs; the
report's ``capture_ms``), and two methods join the rotation:
  autoregressive_eager  specviz's baseline loop over the dynamic cache (graphed / eager)
  hf_generate_static    transformers ``generate`` with its static cache (``cache_implementation="static"``,
                        which compiles the forward on CUDA; CUDA only)

Each repeat runs every method once per prompt, in an order that rotates, after one warm-up
pass. Reported per method: median tokens/s and the interquartile range over all timed runs.
Derived: speedup (speculative / autoregressive), speedup over hf_assisted, alpha (accepted /
(accepted + rejected), Leviathan et al.'s per-draft acceptance probability) beside the draft
acceptance rate (accepted / drafted) and mean beta, the measured cost coefficient c, the verify
cost v (target pass over gamma + 1 tokens / one target step), the speedup Leviathan et al.
(2023, Thm 3.8) predict from alpha, gamma and c, the same with the measured v
(E[tokens per round] / (gamma c + v)), and efficiency = measured / each prediction; the speedup
over the faster of autoregressive_fp32 and hf_generate. Before the timed runs, the v(n) table
(``specviz.measure.pass_cost``): a target pass over n = 1, 2, 3, 5, 9, 17 tokens in target steps, and the
output layer's share of it, in the form and in fp32.
"""

from __future__ import annotations

import copy
import json
import platform
import sys

import torch
from tqdm.auto import tqdm

from specviz import metrics, theory
from specviz.engine.chain import autoregressive_generate, speculative_generate
from specviz.engine.sampling import Sampling
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
from specviz.drafters import default_exit_layer, default_kind, early_exit_model, quantize_target
from specviz.pair import default_pair, load_pair
from specviz.pair.drafter import pair_drafter
from specviz.pair.kernels import unrouted_copy
from specviz.engine.schedules import DEFAULT_THRESHOLDS, make_schedule

METHODS = ["autoregressive", "speculative", "speculative_untraced", "hf_generate", "hf_assisted"]
CACHE_METHODS = ["autoregressive_eager", "hf_generate_static"]  # added with a static cache or graphs
WARM_EVERY_PROMPT = ("hf_generate_static",)  # methods warmed up on every prompt before the timed runs
# --cache: the loops' ``cached`` argument, as named
CACHES = ("dynamic", "static", "graphs", "auto")
# the table's rows, where measured
SHOWN = ["autoregressive", "autoregressive_fp32", *METHODS[1:], "speculative_argmax"]


def _assistant(model):
    """``model`` with a generation config of its own: transformers writes its assistant settings
    (confidence threshold, heuristic gamma) into the assistant's config, and the pair's drafter
    is shared with every other run."""
    twin = copy.copy(model)  # shares the modules and weights
    twin.generation_config = copy.deepcopy(model.generation_config)
    return twin


def hf_counterpart(
    kind: str,
    schedule: str,
    pair,
    gamma: int,
    ngram_max: int = 3,
    exit_layer: int | None = None,
    confidence: float | None = None,
) -> tuple[str, dict]:
    """(name, extra ``generate`` arguments) of transformers' counterpart of a drafter kind and schedule.

    The assistant is a view of the pair's drafter (or an early-exit view of its target) with a
    generation config of its own, so neither this call nor ``generate`` changes the pair's models.
    """
    if kind == "ngram":
        return (
            f"prompt_lookup_num_tokens={gamma}, max_matching_ngram_size={ngram_max} (constant: transformers has no "
            "other schedule for it)",
            dict(prompt_lookup_num_tokens=gamma, max_matching_ngram_size=ngram_max),
        )
    hf_schedule = {"constant": "constant", "confidence": "constant", "path": "constant", "heuristic": "heuristic",
                   "optimal": "heuristic"}[schedule]
    # transformers tests each draft's own probability; for the path schedule its default threshold is the nearest
    threshold = {"confidence": DEFAULT_THRESHOLDS["confidence"] if confidence is None else confidence,
                 "path": DEFAULT_THRESHOLDS["confidence"]}.get(schedule, 0.0)
    if kind == "early-exit":
        assistant = early_exit_model(pair.target, exit_layer or default_exit_layer(pair.target))
        name = f"assisted generation, assistant = the target's first {assistant.config.num_hidden_layers} layers"
    elif kind == "quantized":
        assistant, name = quantize_target(pair.target), "assisted generation, assistant = the target's int8 copy"
    elif kind == "cross-tokenizer":  # a copy: transformers' sampled path prunes the assistant's output layer in place
        # a routed drafter cannot be deep-copied; the copy runs transformers' products
        assistant = unrouted_copy(pair.drafter)
        name = "assisted generation with the same drafter and both tokenizers (assistant_tokenizer)"
        extra = dict(tokenizer=pair.tokenizer, assistant_tokenizer=pair.drafter_tokenizer or pair.tokenizer)
    elif kind == "eagle":
        assistant = _assistant(pair.drafter)
        name = "assisted generation with the pair's drafter model (transformers has no EAGLE drafter)"
    else:
        assistant, name = _assistant(pair.drafter), "assisted generation with the same drafter"
    assistant.generation_config.assistant_confidence_threshold = threshold
    name += f", num_assistant_tokens={gamma}, schedule {hf_schedule}" + (
        f", confidence threshold {threshold}" if threshold else ""
    )
    if schedule == "optimal":
        name += " (transformers has no theory-guided schedule: its heuristic is the nearest)"
    if schedule == "path":
        name += " (transformers has no path-confidence stop: its per-draft threshold at its default is the nearest)"
    return name, dict(
        assistant_model=assistant,
        num_assistant_tokens=gamma,
        num_assistant_tokens_schedule=hf_schedule,
        assistant_confidence_threshold=threshold,
        **(extra if kind == "cross-tokenizer" else {}),
    )


def _runner(
    method: str,
    pair,
    sampling: Sampling,
    gamma: int,
    n: int,
    kind: str = "model",
    schedule: str = "constant",
    ngram_max: int = 3,
    exit_layer: int | None = None,
    confidence: float | None = None,
    tree=None,
    cached="dynamic",
    auto=None,
    drafts: str = "sampled",
):
    """A callable(prompt_ids, seed) -> (tokens generated, trace or None) for one method; ``cached``
    the KV cache of specviz's loops (True, "static", "graphs"); ``auto`` the AutoTree of ``--tree auto``."""
    common = dict(sampling=sampling, max_new_tokens=n, eos_token_id=None)
    if method == "autoregressive_eager":  # the dynamic cache by name: the loops' own default is "auto" (graphs on CUDA)
        return lambda ids, seed: autoregressive_generate(
            ids, pair.target, seed=seed, vocab_size=pair.vocab_size, cached="dynamic", **common
        )
    common["cached"] = cached
    if method == "autoregressive":
        return lambda ids, seed: autoregressive_generate(
            ids, pair.target, seed=seed, vocab_size=pair.vocab_size, **common
        )
    if method == "autoregressive_fp32":
        fp32 = fp32_target(pair)
        return lambda ids, seed: autoregressive_generate(ids, fp32, seed=seed, vocab_size=pair.vocab_size, **common)
    if method == "speculative_tree":
        drafter = pair_drafter(kind, pair, ngram_max=ngram_max, exit_layer=exit_layer)
        return lambda ids, seed: speculative_generate(
            ids, drafter, pair.target, seed=seed, vocab_size=pair.vocab_size, tree=tree, **common
        )
    if auto is not None and method in ("speculative_auto", "speculative_best_chain"):
        from specviz.measure.tree_bench import bench_run_args

        drafter = pair_drafter(kind, pair, ngram_max=ngram_max, exit_layer=exit_layer)
        g, t = bench_run_args(auto, method)
        return lambda ids, seed: speculative_generate(
            ids, drafter, pair.target, gamma=g, tree=t, seed=seed, vocab_size=pair.vocab_size, **common
        )
    if method in ("speculative", "speculative_untraced", "speculative_argmax"):
        record = method != "speculative_untraced"
        rule = "argmax" if method == "speculative_argmax" else "sampled" if drafts == "compare" else drafts
        drafter = pair_drafter(kind, pair, ngram_max=ngram_max, exit_layer=exit_layer, drafts=rule)
        return lambda ids, seed: speculative_generate(
            ids,
            drafter,
            pair.target,
            gamma=gamma,
            seed=seed,
            vocab_size=pair.vocab_size,
            record=record,
            schedule=make_schedule(schedule, gamma, confidence),
            **common,
        )
    hf = hf_kwargs(pair, sampling, n)
    if method == "hf_generate_static":
        hf.update(cache_implementation="static")
    if method == "hf_assisted":
        hf.update(hf_counterpart(kind, schedule, pair, gamma, ngram_max, exit_layer, confidence)[1])

    model = hf_target(pair) if method == "hf_generate" else pair.target

    def run(ids, seed):
        torch.manual_seed(seed)
        x = torch.tensor([ids], device=pair.device)
        out = model.generate(x, attention_mask=torch.ones_like(x), **hf)
        return out.shape[1] - len(ids), None

    return run


def fp32_target(pair):
    """The pair's target with transformers' own fp32 products: the target itself where it already runs
    fp32 through ``torch.nn.functional.linear``, else its weights loaded again in fp32 with no routed
    kernels (``specviz.pair.kernels``), kept while the pair lives.

    Raises:
        PairError: as loading the target.
    """
    plain = (
        next(pair.target.parameters()).dtype == torch.float32 and getattr(pair.target, "specviz_kernels", None) is None
    )
    if plain or pair.target_ref is None:
        return pair.target
    twin = getattr(pair, "_fp32_target", None)
    if twin is None:
        from specviz.pair.loading import _load_model
        from specviz.pair.precision import Form

        twin = _load_model(
            pair.target_ref,
            pair.revisions[1],
            pair.device,
            True,
            Form(torch.float32, "fp32: loaded for comparison"),
            kernels=False,
        )
        pair._fp32_target = twin
    return twin


def hf_target(pair):
    """The model ``hf_generate`` runs: the pair's target in its form where transformers runs that form
    itself (fp32 or bf16 products through ``torch.nn.functional.linear``); where specviz routed the
    target's fp32 products (``specviz.pair.kernels``), the unrouted fp32 twin (``fp32_target``), so that
    row is transformers' own greedy ``generate`` of the same weights."""
    return fp32_target(pair) if getattr(pair.target, "specviz_kernels", None) is not None else pair.target


def memory_floor(model, size_mb: int = 256, repeats: int = 5) -> dict:
    """How far a one-token step is from the machine's limit: the bytes of ``model``'s weights (each read
    once per step) over a measured memory copy rate.

    Returns:
        {"weight_mb": MB, "copy_gb_s": GB/s (bytes read + written per second by ``Tensor.copy_`` of
        ``size_mb`` MB, median of ``repeats``), "floor_ms": weight bytes / (copy rate / 2), the time
        to read the weights once at the rate one side of the copy ran}. CPU only; {} elsewhere.
    """
    device = next(model.parameters()).device
    if device.type != "cpu":
        return {}
    import statistics
    import time

    weight = sum(p.numel() * p.element_size() for p in model.parameters())
    src = torch.ones(size_mb * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    rate = 2 * src.numel() * 4 / statistics.median(times)  # read + written
    return {"weight_mb": weight / 1e6, "copy_gb_s": rate / 1e9, "floor_ms": 1000 * weight / (rate / 2)}


def measure_pass_costs(pair, repeats: int = 9) -> dict:
    """The v(n) table (``specviz.measure.pass_cost``) of the pair's target in its form, and in fp32 where the form is
    not fp32."""
    from specviz.measure.pass_cost import pass_costs

    form = pair.form.name if pair.form is not None else str(pair.target.dtype).removeprefix("torch.")
    costs = {form: pass_costs(pair.target, pair.vocab_size, repeats=repeats)}
    fp32 = fp32_target(pair)
    if fp32 is not pair.target:
        costs["fp32, transformers' own products (for comparison)"] = pass_costs(fp32, pair.vocab_size, repeats=repeats)
    return costs


def benchmark(
    pair_name=None,
    drafter=None,
    target=None,
    device=None,
    gamma=4,
    sampling=Sampling(),
    max_new_tokens=128,
    repeats=3,
    prompts=8,
    methods=METHODS,
    kind="model",
    schedule="constant",
    ngram_max=3,
    exit_layer=None,
    confidence=None,
    prompt_set="held-out",
    tree=None,
    cache="auto",
    pass_costs=True,
    drafts="sampled",
) -> dict:
    """Run the benchmark and return the report (the dict ``--json`` prints).

    ``pair_name`` defaults to ``default_pair()`` (the English pair when it loads offline). ``kind``
    and ``schedule`` choose the drafter and gamma schedule (``specviz.drafters``,
    ``specviz.engine.schedules``); ``prompt_set`` one of PROMPT_SETS ("held-out": the pair's own, see
    ``prompt_set_for``). Tokens/s are per run (prefill included); speedups are ratios of medians
    within this one run. ``tree`` (a TreeSpec) adds a token tree with the same drafter to the
    rotation, reported beside the chain (``specviz.measure.tree_bench``); ``tree="auto"`` first
    calibrates on held-out prompts past the measured ones and adds the auto choice and the predicted
    best chain (``specviz.engine.tree.auto``). ``cache`` (one of CACHES) picks
    specviz's KV cache ("auto", the default: "graphs" on CUDA, else "dynamic", as the page runs); "static" and
    "graphs" add CACHE_METHODS, and "graphs" captures every model's
    graphs before the timed runs (``capture_ms``). ``pass_costs`` adds the v(n)
    table (``measure_pass_costs``). ``drafts`` the chain's draft rule ("sampled" or "argmax",
    ``specviz.drafters.argmax``), or "compare": sampled drafts as "speculative" and argmax drafts as
    "speculative_argmax" in the same rotation, with the argmax run's alpha, tokens per round, c and speedup
    in ``report["argmax_drafts"]``. Progress goes to stderr.

    Raises:
        PairError, ValueError: as load_pair, make_drafter, make_schedule, benchmark_prompts; an unknown
            cache; "graphs" off CUDA.
    """
    if cache not in CACHES:
        raise ValueError(f"cache must be one of {', '.join(CACHES)}, got {cache!r}")
    if pair_name is None and not (drafter or target):
        pair_name = default_pair()
    pair = load_pair(
        pair_name, drafter, target, device=device, allow_custom=True, own_tokenizer=kind == "cross-tokenizer", kind=kind
    )
    kind = kind or default_kind(pair)
    if cache == "auto":  # what the page and the loops run by default (``specviz.engine.runner.choose_cache``)
        from specviz.engine import graphs

        cache = "graphs" if graphs.supported(pair.target) else "dynamic"
    prompt_set = prompt_set_for(prompt_set, pair.name)
    prompt_ids = prompt_token_ids(pair, benchmark_prompts(prompts, prompt_set), prompt_set)
    auto = None
    if tree == "auto":
        from specviz.pair.auto_tree import auto_tree, calibration_prompt_ids

        drafter_for_auto = pair_drafter(kind, pair, ngram_max=ngram_max, exit_layer=exit_layer)
        calibration = calibration_prompt_ids(
            lambda t: prompt_token_ids(pair, [t], prompt_set)[0], benchmark_prompts(10**6, prompt_set), len(prompt_ids)
        )
        auto = auto_tree(
            drafter_for_auto,
            pair.target,
            calibration,
            sampling,
            pair.vocab_size,
            key=(pair.name, str(pair.device), cache),
            max_new_tokens=max_new_tokens,
            cached=cache,
        )
        print(auto.choice.sentence(), file=sys.stderr)
        tree = None
    options = dict(
        kind=kind,
        schedule=schedule,
        ngram_max=ngram_max,
        exit_layer=exit_layer,
        confidence=confidence,
        tree=tree,
        cached=cache,
        auto=auto,
        drafts=drafts,
    )
    methods = [*methods, "speculative_tree"] if tree is not None else list(methods)
    if drafts == "compare":
        methods.append("speculative_argmax")
    if auto is not None:
        from specviz.measure.tree_bench import bench_methods

        methods += bench_methods(auto, gamma)
    capture_ms = None
    if cache != "dynamic":
        methods += [m for m in CACHE_METHODS if m == "autoregressive_eager" or pair.device.type == "cuda"]
    if cache == "graphs":
        from specviz.engine import graphs

        capture_ms = graphs.prepare(pair.target, pair.drafter if kind == "model" else None, vocab_size=pair.vocab_size)
    if "autoregressive" in methods and fp32_target(pair) is not pair.target:
        methods.insert(methods.index("autoregressive") + 1, "autoregressive_fp32")
    pass_table = measure_pass_costs(pair) if pass_costs else None
    floor = memory_floor(pair.target)
    runners = {m: _runner(m, pair, sampling, gamma, max_new_tokens, **options) for m in methods}
    tps: dict[str, list[float]] = {m: [] for m in methods}
    traces: dict[str, list] = {m: [] for m in methods}
    warm_up_s: dict[str, float] = {}
    with (
        torch.inference_mode(),
        tqdm(
            total=len(methods) * (1 + repeats * len(prompt_ids)), desc="bench runs", file=sys.stderr, unit="run"
        ) as bar,
    ):
        for m in methods:  # warm-up: first-call allocations and kernel selection
            # transformers' compiled generate may compile again for a new prompt length: it warms up on every
            # prompt, so no compilation lands in its timed runs; its warm-up time is reported (warm_up_s)
            warm_prompts = prompt_ids if m in WARM_EVERY_PROMPT else prompt_ids[:1]
            warm_up_s[m] = sum(timed(runners[m], ids, 0, pair.device)[0] for ids in warm_prompts)
            bar.update()
        for r in range(repeats):
            for i, ids in enumerate(prompt_ids):
                k = (r * len(prompt_ids) + i) % len(methods)
                for m in methods[k:] + methods[:k]:  # rotate the order
                    seconds, trace, tokens = timed(runners[m], ids, 1000 * r + i, pair.device)
                    tps[m].append(tokens / seconds)
                    if trace is not None:
                        traces[m].append(trace)
                    bar.update()
    report: dict = {m: {"tokens_per_second": spread(tps[m])} for m in methods}
    report["warm_up_s"] = warm_up_s
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
        report["speculative"].update(
            alpha=alpha,
            draft_acceptance_rate=report["draft_acceptance_rate"],
            mean_tokens_per_round=report["mean_tokens_per_round"],
        )
    if traces.get("speculative_argmax") and base:
        report["argmax_drafts"] = _rule_report(
            traces["speculative_argmax"], base, med["speculative_argmax"], med["autoregressive"]
        )
    if "hf_assisted" in med and "speculative" in med:
        report["hf_method"] = hf_counterpart(kind, schedule, pair, gamma, ngram_max, exit_layer, confidence)[0]
        report["speedup_vs_hf"] = report["speedup_vs_hf_assisted"] = med["speculative"] / med["hf_assisted"]
    if "hf_generate" in med and "autoregressive" in med:
        report["autoregressive_vs_hf_generate"] = med["autoregressive"] / med["hf_generate"]
    if "autoregressive_eager" in med:
        report["autoregressive_vs_eager"] = med["autoregressive"] / med["autoregressive_eager"]
    if "hf_generate_static" in med:
        report["autoregressive_vs_hf_generate_static"] = med["autoregressive"] / med["hf_generate_static"]
        if "speculative" in med:
            report["speedup_vs_hf_generate_static"] = med["speculative"] / med["hf_generate_static"]
    if spec:
        # Wall time per round outside the timed draft and verify phases (settling, recording, the host's
        # share of the loop), in ms: the part of a round that no GPU work hides.
        rounds = sum(len(t.rounds) for t in spec)
        phases = sum(r.draft_ms + r.verify_ms for t in spec for r in t.rounds)
        walls = sum(t.total_ms - t.prefill_ms for t in spec)
        report["overhead_ms_per_round"] = (walls - phases) / rounds if rounds else None
    report["capture_ms"] = capture_ms
    if cache != "dynamic":
        from specviz.engine.tree.calibration import verify_cost_curve

        # v(n) over the chosen cache: a pass over the pending token and n drafts / a one-token step.
        report["verify_cost_by_nodes"] = verify_cost_curve(
            pair.target, prompt_ids[0], [1, 2, 4, 8, 16, 32], pair.vocab_size, cached=cache
        )
    others = [m for m in ("autoregressive_fp32", "hf_generate") if m in med]
    if others and "speculative" in med:
        best = max(others, key=med.get)
        report["fastest_other_baseline"] = best
        report["speedup_vs_fastest_other_baseline"] = med["speculative"] / med[best]
    if "autoregressive_fp32" in med and "autoregressive" in med:
        report["autoregressive_vs_fp32"] = med["autoregressive"] / med["autoregressive_fp32"]
    if "speculative_untraced" in med and "speculative" in med:
        report["trace_overhead"] = med["speculative_untraced"] / med["speculative"] - 1.0
    if tree is not None and traces["speculative_tree"] and spec and base:
        from specviz.measure.tree_bench import tree_report

        report["tree"] = tree_report(pair, spec, traces["speculative_tree"], base, med, prompt_ids[0], tree.label())
    if auto is not None:
        from specviz.measure.tree_bench import BENCH_METHODS, bench_report

        report["auto"] = bench_report(auto, traces, med, gamma)
        for m in BENCH_METHODS:
            if m in med:
                report[m]["speedup"] = med[m] / med["autoregressive"]
    report["settings"] = {
        "pair": pair.name,
        "gamma": gamma,
        "drafter_kind": kind,
        "drafts": drafts,
        "gamma_schedule": schedule,
        "prompt_set": prompt_set,
        "sampling": sampling.to_dict(),
        "max_new_tokens": max_new_tokens,
        "tree": tree.describe() if tree is not None else "auto" if auto is not None else None,
        "repeats": repeats,
        "prompts": len(prompt_ids),
        "device": str(pair.device),
        "cache": cache,
        "fused_graphs": cache == "graphs" and _fused(),
        "dtype": str(pair.target.dtype).removeprefix("torch."),
        "dtype_reason": pair.form.reason if pair.form else None,
        "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
    }
    if pass_table is not None:
        report["pass_costs"] = pass_table
    if floor and base:
        floor["step_ms"] = theory.target_step_ms(*base)
        report["memory_floor"] = floor
    return report


def _fused() -> bool:
    from specviz.engine import graphs

    return graphs.fuse_default()


def _rule_report(traces, base, tokens_per_s: float, base_tokens_per_s: float) -> dict:
    """Alpha, tokens per round, c, v and the speedup of one more speculative method's traces (argmax drafts)."""
    acceptance = pooled_acceptance(traces)
    target_ms = theory.target_step_ms(*base)
    return {
        "alpha": acceptance["alpha"],
        "mean_beta": acceptance.get("mean_beta"),
        "mean_tokens_per_round": acceptance["mean_tokens_per_round"],
        "cost_coefficient": metrics.cost_coefficient(theory.drafter_step_ms(*traces), target_ms),
        "verify_cost": metrics.verify_cost(theory.verify_ms_per_round(*traces), target_ms),
        "tokens_per_second": tokens_per_s,
        "speedup": tokens_per_s / base_tokens_per_s,
    }


def format_report(report: dict) -> str:
    """A plain-text table of the report: the form first, then the v(n) table, then the methods."""
    settings = report["settings"]
    lines = [
        f"form: {settings.get('dtype')} on {settings.get('device')}"
        + (f" ({settings['dtype_reason']})" if settings.get("dtype_reason") else "")
    ]
    if report.get("memory_floor"):
        f = report["memory_floor"]
        lines.append(
            f"step: {f['step_ms']:.1f} ms measured; reading the target's {f['weight_mb']:.0f} MB of weights once at "
            "the measured "
            f"memory copy rate ({f['copy_gb_s']:.1f} GB/s read + written) takes {f['floor_ms']:.1f} ms, "
            f"so the step runs at {f['floor_ms'] / f['step_ms']:.0%} of that limit"
        )
    if report.get("pass_costs"):
        from specviz.measure.pass_cost import format_pass_costs

        lines += format_pass_costs(report["pass_costs"])
    lines.append(f"{'method':<22}{'tokens/s (median)':>18}{'IQR':>20}")
    for m in SHOWN + CACHE_METHODS:
        if m in report:
            s = report[m]["tokens_per_second"]
            iqr = f"{s['q1']:.1f}-{s['q3']:.1f}"
            lines.append(f"{m:<22}{s['median']:>18.1f}{iqr:>20}")
    for key, label in [
        ("alpha", "alpha (accepted / tested)"),
        ("draft_acceptance_rate", "draft acceptance rate (accepted / drafted)"),
        ("mean_beta", "mean beta"),
        ("mean_tokens_per_round", "tokens per round"),
        ("predicted_tokens_per_round", "tokens per round, Eq. (1)"),
        ("cost_coefficient", "cost coefficient c"),
        ("verify_cost", "verify cost v"),
        ("speedup", "speedup over autoregressive"),
        ("speedup_vs_fastest_other_baseline", "speedup over max(fp32 AR, hf_generate)"),
        ("autoregressive_vs_fp32", "autoregressive / autoregressive_fp32"),
        ("speedup_vs_hf", "speedup over transformers' counterpart"),
        ("mean_gamma", "drafts per round"),
        ("autoregressive_vs_hf_generate", "autoregressive / hf_generate"),
        ("predicted_speedup", "predicted speedup, Thm 3.8"),
        ("predicted_speedup_verify", "predicted with measured v"),
        ("efficiency", "efficiency (measured / Thm 3.8)"),
        ("efficiency_verify", "efficiency (measured / with v)"),
        ("trace_overhead", "trace overhead"),
        ("autoregressive_vs_eager", "autoregressive / autoregressive_eager"),
        ("autoregressive_vs_hf_generate_static", "autoregressive / hf_generate_static"),
        ("speedup_vs_hf_generate_static", "speculative / hf_generate_static"),
        ("overhead_ms_per_round", "ms per round outside draft and verify"),
        ("capture_ms", "graph capture, ms (before the timed runs)"),
    ]:
        if report.get(key) is not None:
            lines.append(f"{label:<46}{report[key]:.3f}")
    if report.get("verify_cost_by_nodes"):
        lines.append(
            "v(n), pass over 1 + n tokens / one-token step: "
            + ", ".join(f"n={n}: {v:.2f}" for n, v in report["verify_cost_by_nodes"].items())
        )
    if report.get("hf_method"):
        lines.append(f"transformers' counterpart: {report['hf_method']}")
    if report.get("warm_up_s", {}).get("hf_generate_static") is not None:
        lines.append(
            "hf_generate_static's warm-up (compilation, left out of its runs): "
            f"{report['warm_up_s']['hf_generate_static']:.1f} s"
        )
    if report.get("argmax_drafts"):
        a = report["argmax_drafts"]
        lines.append(
            f"argmax drafts (speculative_argmax): alpha {a['alpha']:.3f} (sampled "
            f"{report.get('alpha', float('nan')):.3f}), "
            f"tokens per round {a['mean_tokens_per_round']:.2f}, c {a['cost_coefficient']:.3f}, v "
            f"{a['verify_cost']:.2f}, "
            f"speedup {a['speedup']:.2f}x (sampled {report.get('speedup', float('nan')):.2f}x)"
        )
    if report.get("tree"):
        from specviz.measure.tree_bench import format_tree_report

        lines += format_tree_report(report["tree"])
    if report.get("auto"):
        from specviz.measure.tree_bench import format_bench_report

        lines += format_bench_report(report["auto"])
    lines.append(f"settings: {json.dumps(report['settings'])}")
    return "\n".join(lines)


def run(args) -> int:
    """The ``bench`` subcommand (one sequence at a time; ``--batch-sizes`` is ``specviz.measure.batch_bench``)."""
    from specviz.engine.tree.spec import TreeSpec

    if getattr(args, "fuse", False):  # a process-wide choice, as SPECVIZ_FUSE_GRAPHS is for the page
        import os

        from specviz.engine import graphs

        os.environ[graphs.FUSE_ENV] = "1"
    return run_command(
        args,
        lambda a, sampling: benchmark(
            a.pair,
            a.drafter,
            a.target,
            a.device,
            a.gamma,
            sampling,
            a.max_new_tokens,
            a.repeats,
            a.prompts,
            kind=a.drafter_kind,
            schedule=a.gamma_schedule,
            ngram_max=a.ngram_max,
            exit_layer=a.exit_layer,
            confidence=a.confidence,
            prompt_set=a.prompt_set,
            tree="auto" if a.tree == "auto" else TreeSpec.from_args(a),
            cache=a.cache,
            drafts=a.drafts,
        ),
        format_report,
    )
