"""The tree beside the chain in one benchmark run: tokens per round, nodes, v(n) and speedup.

``python -m specviz bench --tree 3,2,2,1`` (or ``--tree-dynamic NODES``) adds a tree method to the
run's rotation; this module derives its report, with the verify cost v(n) timed as the auto tree's
calibration times it (``verify_cost_curve``, ``specviz.engine.tree.calibration``). ``--tree auto`` adds the
auto tree's choice (``specviz.engine.tree.auto``) and the chain it was weighed against (``bench_methods``,
``bench_run_args``), reported with what the timed runs measured (``bench_report``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from specviz import theory as chain_theory
from specviz.engine.tree.calibration import verify_cost_curve
from specviz.theory import tree as theory

if TYPE_CHECKING:
    from specviz.engine.tree.auto import AutoTree
    from specviz.engine.tree.spec import TreeSpec


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
    ns = sorted(
        {1, 2, 4, 8, 16, 32, 64, round(report["chain"]["nodes_per_round"]), round(report["tree"]["nodes_per_round"])}
    )
    report["verify_cost_by_nodes"] = verify_cost_curve(
        pair.target, prompt_ids, [n for n in ns if 1 <= n <= 128], pair.vocab_size
    )
    report["tree_vs_chain_tokens_per_round"] = report["tree"]["tokens_per_round"] / report["chain"]["tokens_per_round"]
    return report


def format_tree_report(report: dict) -> list[str]:
    """Plain-text lines: chain and tree side by side, then v(n)."""
    rows = [
        ("tokens per round (emitted / rounds)", "tokens_per_round", 2),
        ("drafted nodes per round", "nodes_per_round", 1),
        ("tokens per round from per-depth acceptance", "predicted_tokens_per_round", 2),
        ("drafting per round, target steps", "draft_steps_per_round", 2),
        ("verify cost v (pass / target step)", "verify_cost", 2),
        ("tokens/s (median)", "tokens_per_second", 1),
        ("speedup over autoregressive", "speedup", 2),
        ("predicted speedup E / (drafting + v)", "predicted_speedup", 2),
    ]
    lines = [f"{'':<46}{'chain':>10}{report['tree_label']:>24}"]
    for label, key, digits in rows:
        lines.append(f"{label:<46}{report['chain'][key]:>10.{digits}f}{report['tree'][key]:>24.{digits}f}")
    for side in ("chain", "tree"):
        lines.append(
            f"acceptance by depth, {side}: " + ", ".join(f"{a:.2f}" for a in report[side]["acceptance_by_depth"])
        )
    lines.append(f"tree / chain tokens per round: {report['tree_vs_chain_tokens_per_round']:.2f}")
    lines.append(
        "v(n), target pass over the pending token and n nodes / one-token step: "
        + ", ".join(f"n={n}: {v:.2f}" for n, v in report["verify_cost_by_nodes"].items())
    )
    return lines


# bench: the auto choice, the chain it was weighed against, and what the timed runs measured.
BENCH_METHODS = ("speculative_auto", "speculative_best_chain")


def bench_methods(auto: AutoTree, gamma: int) -> list[str]:
    """The methods ``--tree auto`` adds to bench's rotation: the choice, and the predicted best chain
    where its gamma is not bench's own (bench's ``speculative`` chain is then that chain)."""
    return ["speculative_auto"] + (["speculative_best_chain"] if auto.choice.best_chain.depth != gamma else [])


def bench_run_args(auto: AutoTree, method: str) -> tuple[int, TreeSpec | None]:
    """(gamma, tree) of a method of BENCH_METHODS."""
    if method == "speculative_auto":
        return auto.gamma, auto.tree
    return auto.choice.best_chain.depth, None


def bench_report(auto: AutoTree, traces: dict[str, list], medians: dict[str, float], gamma: int) -> dict:
    """The choice (``AutoTree.describe``) with what the run measured: tokens per round (emitted /
    rounds) and speedup (median tokens/s over the autoregressive median) of the chosen tree and of
    each chain measured (bench's gamma, and the predicted best chain's), and their ratios."""

    def measured(method: str, depth: int) -> dict | None:
        ts = traces.get(method) or []
        rounds = sum(len(t.rounds) for t in ts)
        if not rounds or method not in medians:
            return None
        emitted = sum(len(t.output_ids) for t in ts)
        full = untruncated(ts, depth)
        return {
            "tokens_per_round": emitted / rounds,
            "rounds": rounds,
            "emitted": emitted,
            "nodes_per_round": sum(t.drafted for t in ts) / rounds,
            "speedup": medians[method] / medians["autoregressive"],
            "full_rounds": full and full[1],
            "full_emitted": full and full[0],
            "tokens_per_full_round": full[0] / full[1] if full and full[1] else None,
        }

    out = auto.describe()
    chains = {f"chain of gamma {gamma}": measured("speculative", gamma)}
    best_gamma = auto.choice.best_chain.depth
    if best_gamma != gamma:
        chains[f"chain of gamma {best_gamma}"] = measured("speculative_best_chain", best_gamma)
    out["measured"] = measured("speculative_auto", auto.gamma)
    out["measured_chains"] = {k: v for k, v in chains.items() if v}
    m = out["measured"]
    if m:
        # The prediction is E[tokens] of a whole round: the rounds the token budget cut short are left out of the check.
        measured_tpr = m["tokens_per_full_round"] if m["tokens_per_full_round"] is not None else m["tokens_per_round"]
        out["tokens_per_round_error"] = measured_tpr / out["predicted_tokens_per_round"] - 1.0
        chain = out["measured_chains"].get(f"chain of gamma {best_gamma}")
        if chain and chain["tokens_per_full_round"] is not None:
            out["best_chain_tokens_per_round_error"] = (
                chain["tokens_per_full_round"] / out["best_chain"]["predicted_tokens_per_round"] - 1.0
            )
        if out["measured_chains"]:
            best = max(out["measured_chains"].values(), key=lambda c: c["speedup"])
            out["speedup_vs_best_measured_chain"] = m["speedup"] / best["speedup"]
    return out


def untruncated(traces, depth: int) -> tuple[int, int] | None:
    """(tokens emitted, rounds) over the rounds the token budget did not cut: those that started with at
    least ``depth`` + 1 tokens of ``max_new_tokens`` left (a whole tree or chain of that depth and its
    final token fit). None where a trace does not say its budget."""
    emitted = rounds = 0
    for t in traces:
        budget = (getattr(t, "settings", None) or {}).get("max_new_tokens")
        if not isinstance(budget, int):
            return None
        done = 0
        for r in t.rounds:
            if budget - done >= depth + 1:
                emitted += len(r.emitted_ids)
                rounds += 1
            done += len(r.emitted_ids)
    return emitted, rounds


def format_bench_report(r: dict) -> list[str]:
    """Plain-text lines of ``bench_report``."""
    lines = [r["sentence"]]
    if r.get("nodes_by_depth"):
        shape = "-".join(map(str, r["nodes_by_depth"]))
        lines.append(
            f"auto's shape: {r['nodes']} nodes, depth {r['depth']}, nodes per depth {shape}"
            + (f"; parents {','.join(map(str, r['parents']))}" if r.get("parents") else " (a chain)")
        )
    cand = [("auto: " + r["chosen"], r["predicted_tokens_per_round"], r["predicted_speedup"], r.get("measured"))]
    for label, m in r["measured_chains"].items():
        pred = r["best_chain"] if label.endswith(f"gamma {r['best_chain']['gamma']}") else None
        cand.append((label, pred and pred["predicted_tokens_per_round"], pred and pred["predicted_speedup"], m))
    lines.append(
        f"{'':<40}{'tokens/round pred':>18}{'whole rounds':>14}{'all rounds':>12}{'speedup pred':>14}{'measured':>10}"
    )
    for label, tpr, sp, m in cand:
        def f(x, d=2):
            return f"{x:.{d}f}" if isinstance(x, (int, float)) else "-"

        full, per_round = m and m.get('tokens_per_full_round'), m and m['tokens_per_round']
        lines.append(
            f"{label[:40]:<40}{f(tpr):>18}{f(full):>14}{f(per_round):>12}{f(sp):>14}{f(m and m['speedup']):>10}"
        )
    for label, _, _, m in cand:
        if m and m.get("full_rounds") is not None:
            lines.append(
                f"  {label[:40]}: whole rounds {m['full_emitted']} tokens / {m['full_rounds']}, all rounds "
                f"{m['emitted']} / {m['rounds']}"
            )
    lines.append(
        "tokens/round: emitted / rounds, the correction or bonus token included; 'whole rounds' leaves out the rounds "
        "that began "
        "with fewer than depth + 1 tokens of the budget left (the prediction is a whole round's). Speedup: median "
        "tokens/s / "
        "autoregressive's median"
    )
    if r.get("tokens_per_round_error") is not None:
        lines.append(
            f"auto: measured (whole rounds) / predicted tokens per round - 1: {r['tokens_per_round_error']:+.1%}"
        )
    if r.get("best_chain_tokens_per_round_error") is not None:
        lines.append(
            "best chain: measured (whole rounds) / predicted tokens per round - 1: "
            f"{r['best_chain_tokens_per_round_error']:+.1%}"
        )
    if r.get("speedup_vs_best_measured_chain") is not None:
        lines.append(f"auto / best measured chain speedup: {r['speedup_vs_best_measured_chain']:.2f}")
    inp = r["inputs"]
    lines.append(
        "acceptance by depth and sibling rank (accepted/offered): "
        + "; ".join(
            f"d{d}: " + " ".join(f"{a}/{o}" for o, a in row) for d, row in enumerate(inp["acceptance_by_rank"], 1)
        )
    )
    if inp.get("children_available"):
        lines.append(
            "children that existed at the pending token (rounds with at least k / rounds; q's nucleus may hold fewer "
            "than the shape asks): "
            + " ".join(f"k={k}: {w}/{n}" for k, (n, w) in enumerate(inp["children_available"], 1))
        )
    lines.append(
        "chain acceptance by depth (accepted/offered): "
        + " ".join(f"{a}/{o}" for o, a in inp["chain_acceptance_by_depth"])
    )
    if inp.get("refined_with"):
        lines.append(
            f"counts refined with the own rounds of: {inp['refined_with']} (on the same {inp['calibration_prompts']} "
            "calibration prompts; the wide runs start their rounds elsewhere)"
        )
    lines.append(
        f"c_tree {inp['tree_pass_cost']:.3f}, c {inp['chain_step_cost']:.3f} target steps per drafter pass; v(n): "
        + ", ".join(f"{n}: {v:.2f}" for n, v in inp["verify_cost_by_nodes"].items())
    )
    if inp.get("overhead_by_nodes"):
        lines.append(
            "round time beyond drafting and the bare verify pass v(n) (judging, recording), target steps: "
            + ", ".join(f"{n:.1f} nodes: {v:.2f}" for n, v in inp["overhead_by_nodes"].items())
        )
    return lines


def chains_and_trees(
    pair_name: str = "embedded",
    gammas=(2, 4, 6),
    trees=("3,2,2,1", "dynamic:24"),
    sampling=None,
    max_new_tokens: int = 128,
    prompts: int = 2,
    seed: int = 0,
    children: str = "topk",
) -> list[dict]:
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
        spec = (
            TreeSpec.dynamic(int(t.split(":")[1]))
            if t.startswith("dynamic:")
            else TreeSpec.static(parse_shape(t), children)
        )
        methods.append((spec.label(), 4, spec))
    traces: dict[str, list] = {m[0]: [] for m in methods}
    with torch.inference_mode():
        autoregressive_generate(ids[0], pair.target, **(common | {"max_new_tokens": 8}))  # warm-up
        for prompt in tqdm(ids, desc="prompts", unit="prompt", file=sys.stderr):
            for name, gamma, spec in methods:
                if gamma is None:
                    traces[name].append(autoregressive_generate(prompt, pair.target, **common))
                else:
                    traces[name].append(
                        speculative_generate(prompt, pair.drafter, pair.target, gamma=gamma, tree=spec, **common)
                    )
    base = traces["autoregressive"]
    step = chain_theory.target_step_ms(*base)
    base_ms = sum(t.total_ms for t in base)
    rows = []
    for name, _, _ in methods[1:]:
        ts = traces[name]
        rounds = sum(len(t.rounds) for t in ts)
        rows.append(
            {
                "method": name,
                "tokens_per_round": sum(len(t.output_ids) for t in ts) / rounds,
                "nodes_per_round": sum(t.drafted for t in ts) / rounds,
                "verify_cost": sum(t.verify_ms for t in ts) / rounds / step,
                "draft_steps_per_round": sum(t.draft_ms for t in ts) / rounds / step,
                "speedup": base_ms / sum(t.total_ms for t in ts),
            }
        )
    return rows


if __name__ == "__main__":
    import argparse
    import json

    from specviz.engine.sampling import Sampling

    parser = argparse.ArgumentParser(
        prog="python -m specviz.measure.tree_bench", description="chains and trees on one pair, one run per prompt"
    )
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
        print(
            json.dumps(
                {
                    n: round(v, 2)
                    for n, v in verify_cost_curve(pair.target, ids, [1, 2, 4, 8, 16, 32, 64], pair.vocab_size).items()
                }
            )
        )
    else:
        for row in chains_and_trees(
            a.pair,
            [int(g) for g in a.gammas.split(",")],
            a.trees.split(";"),
            Sampling(temperature=a.temperature),
            a.max_new_tokens,
            a.prompts,
            children=a.children,
        ):
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
