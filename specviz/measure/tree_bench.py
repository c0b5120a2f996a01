"""The tree beside the chain in one benchmark run: tokens per round, nodes, v(n) and speedup.

``python -m specviz bench --tree 3,2,2,1`` (or ``--tree-dynamic NODES``) adds a tree method to the
run's rotation; this module derives its report and measures the verify cost v(n) directly:
the time of one target pass over a prefix's pending token and n tree nodes under the tree mask,
over the time of a one-token step (the same prefix), the fastest of several passes timed in turns.
"""

from __future__ import annotations

import sys
import time

import torch
from tqdm.auto import tqdm

from specviz import theory as chain_theory
from specviz.engine.runner import make_runner
from specviz.engine.stopping import StopCheck, Stopped, asked
from specviz.theory import tree as theory
from specviz.engine.tree.attention import ancestor_matrix, masked_logits


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def pass_ms(model, prompt_ids: list[int], nodes: list[int], vocab: int, repeats: int = 7,
            cached: bool | str = True, stop: StopCheck | None = None) -> dict[int, float]:
    """{n: ms} of ``model``'s fastest masked pass over the pending token and n nodes after ``prompt_ids``,
    for 0 (a one-token cached step) and each n in ``nodes``, timed in turns as ``verify_cost_curve``
    says; ``stop`` as there.

    Raises:
        specviz.engine.stopping.Stopped: ``stop`` asked to end."""
    device = model.device
    seq = torch.tensor(list(prompt_ids) + [0] * 130, dtype=torch.long, device=device)
    prefix = len(prompt_ids) - 1
    runner = make_runner(model, vocab, cached)
    sizes = [0, *nodes]
    times: dict[int, list[float]] = {n: [] for n in sizes}
    with torch.inference_mode():
        runner.prefill(seq, prefix)

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

        for n in sizes:  # a warm-up pass of each size, not counted
            timed(n)
        for r in range(repeats):
            for n in sizes[r % len(sizes):] + sizes[: r % len(sizes)]:
                times[n].append(timed(n))
    return {n: min(t) * 1000.0 for n, t in times.items()}


def verify_cost_curve(target, prompt_ids: list[int], nodes: list[int], vocab: int, repeats: int = 7,
                      cached: bool | str = True, stop: StopCheck | None = None) -> dict[int, float]:
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


def _side(traces, baseline_traces, tokens_per_second: float, baseline_tps: float) -> dict:
    target_ms = chain_theory.target_step_ms(*baseline_traces)
    rounds = sum(len(t.rounds) for t in traces)
    draft_ms = sum(t.draft_ms for t in traces) / rounds
    verify_ms = sum(t.verify_ms for t in traces) / rounds
    rates = theory.depth_rates(theory.acceptance_by_depth(*traces))
    draft_steps, v = draft_ms / target_ms, verify_ms / target_ms
    return {
        "tokens_per_round": sum(len(t.output_ids) for t in traces) / rounds,
        "nodes_per_round": sum(t.drafted for t in traces) / rounds,
        "acceptance_by_depth": rates,
        "predicted_tokens_per_round": theory.expected_tokens_per_round(rates),
        "draft_steps_per_round": draft_steps,
        "verify_cost": v,
        "predicted_speedup": theory.predicted_speedup(rates, draft_steps, v),
        "tokens_per_second": tokens_per_second,
        "speedup": tokens_per_second / baseline_tps,
    }


def tree_report(pair, chain, tree, baseline, medians: dict, prompt_ids: list[int], tree_label: str) -> dict:
    """The chain's and the tree's numbers from one run's traces, and v(n) measured directly.

    ``chain``, ``tree``, ``baseline``: the traces of the speculative chain, the tree and the
    autoregressive baseline; ``medians``: tokens/s medians by method.
    """
    base = medians["autoregressive"]
    report = {"chain": _side(chain, baseline, medians["speculative"], base),
              "tree": _side(tree, baseline, medians["speculative_tree"], base), "tree_label": tree_label}
    ns = sorted({1, 2, 4, 8, 16, 32, 64, round(report["chain"]["nodes_per_round"]), round(report["tree"]["nodes_per_round"])})
    report["verify_cost_by_nodes"] = verify_cost_curve(pair.target, prompt_ids, [n for n in ns if 1 <= n <= 128], pair.vocab_size)
    report["tree_vs_chain_tokens_per_round"] = report["tree"]["tokens_per_round"] / report["chain"]["tokens_per_round"]
    return report


def format_tree_report(report: dict) -> list[str]:
    """Plain-text lines: chain and tree side by side, then v(n)."""
    rows = [("tokens per round (emitted / rounds)", "tokens_per_round", 2), ("drafted nodes per round", "nodes_per_round", 1),
            ("tokens per round from per-depth acceptance", "predicted_tokens_per_round", 2),
            ("drafting per round, target steps", "draft_steps_per_round", 2), ("verify cost v (pass / target step)", "verify_cost", 2),
            ("tokens/s (median)", "tokens_per_second", 1), ("speedup over autoregressive", "speedup", 2),
            ("predicted speedup E / (drafting + v)", "predicted_speedup", 2)]
    lines = [f"{'':<46}{'chain':>10}{report['tree_label']:>24}"]
    for label, key, digits in rows:
        lines.append(f"{label:<46}{report['chain'][key]:>10.{digits}f}{report['tree'][key]:>24.{digits}f}")
    for side in ("chain", "tree"):
        lines.append(f"acceptance by depth, {side}: " + ", ".join(f"{a:.2f}" for a in report[side]["acceptance_by_depth"]))
    lines.append(f"tree / chain tokens per round: {report['tree_vs_chain_tokens_per_round']:.2f}")
    lines.append("v(n), target pass over the pending token and n nodes / one-token step: "
                 + ", ".join(f"n={n}: {v:.2f}" for n, v in report["verify_cost_by_nodes"].items()))
    return lines


def chains_and_trees(pair_name: str = "embedded", gammas=(2, 4, 6), trees=("3,2,2,1", "dynamic:24"), sampling=None,
                     max_new_tokens: int = 128, prompts: int = 2, seed: int = 0, children: str = "topk") -> list[dict]:
    """One run per prompt of the baseline, each chain gamma and each tree, in that order per prompt
    (the same drafter model): per method, tokens per round, nodes per round, v (verify per round /
    target step), c_round (drafting per round / target step) and speedup (baseline time / its time,
    summed over the prompts). Trees are "a,b,c" shapes or "dynamic:N".
    """
    from specviz.engine.chain import autoregressive_generate, speculative_generate
    from specviz.engine.sampling import Sampling
    from specviz.measure.common import benchmark_prompts
    from specviz.pair import load_pair
    from specviz.engine.tree.spec import TreeSpec, parse_shape

    sampling = sampling or Sampling()
    pair = load_pair(pair_name)
    ids = [pair.tokenizer(t, add_special_tokens=False)["input_ids"] for t in benchmark_prompts(prompts)]
    common = dict(sampling=sampling, max_new_tokens=max_new_tokens, vocab_size=pair.vocab_size, seed=seed)
    methods = [("autoregressive", None, None)] + [(f"chain gamma {g}", g, None) for g in gammas]
    for t in trees:
        spec = TreeSpec.dynamic(int(t.split(":")[1])) if t.startswith("dynamic:") else TreeSpec.static(parse_shape(t), children)
        methods.append((spec.label(), 4, spec))
    traces: dict[str, list] = {m[0]: [] for m in methods}
    with torch.inference_mode():
        autoregressive_generate(ids[0], pair.target, **(common | {"max_new_tokens": 8}))  # warm-up
        for prompt in tqdm(ids, desc="prompts", unit="prompt", file=sys.stderr):
            for name, gamma, spec in methods:
                if gamma is None:
                    traces[name].append(autoregressive_generate(prompt, pair.target, **common))
                else:
                    traces[name].append(speculative_generate(prompt, pair.drafter, pair.target, gamma=gamma, tree=spec, **common))
    base = traces["autoregressive"]
    step = chain_theory.target_step_ms(*base)
    base_ms = sum(t.total_ms for t in base)
    rows = []
    for name, _, _ in methods[1:]:
        ts = traces[name]
        rounds = sum(len(t.rounds) for t in ts)
        rows.append({"method": name, "tokens_per_round": sum(len(t.output_ids) for t in ts) / rounds,
                     "nodes_per_round": sum(t.drafted for t in ts) / rounds,
                     "verify_cost": sum(t.verify_ms for t in ts) / rounds / step,
                     "draft_steps_per_round": sum(t.draft_ms for t in ts) / rounds / step,
                     "speedup": base_ms / sum(t.total_ms for t in ts)})
    return rows


if __name__ == "__main__":
    import argparse
    import json

    from specviz.engine.sampling import Sampling

    parser = argparse.ArgumentParser(prog="python -m specviz.measure.tree_bench", description="chains and trees on one pair, one run per prompt")
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--gammas", default="2,4,6")
    parser.add_argument("--trees", default="3,2,2,1;dynamic:24", help="';'-separated shapes or dynamic:N")
    parser.add_argument("--children", choices=["topk", "sampled"], default="topk")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--verify-curve", action="store_true", help="only measure v(n) for n = 1, 2, 4, ..., 64")
    a = parser.parse_args()
    if a.verify_curve:
        from specviz.measure.common import benchmark_prompts
        from specviz.pair import load_pair

        pair = load_pair(a.pair)
        ids = pair.tokenizer(benchmark_prompts(1)[0], add_special_tokens=False)["input_ids"]
        print(json.dumps({n: round(v, 2) for n, v in verify_cost_curve(pair.target, ids, [1, 2, 4, 8, 16, 32, 64], pair.vocab_size).items()}))
    else:
        for row in chains_and_trees(a.pair, [int(g) for g in a.gammas.split(",")], a.trees.split(";"), Sampling(temperature=a.temperature),
                                    a.max_new_tokens, a.prompts, children=a.children):
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
