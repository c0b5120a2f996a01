"""The ``auto`` tree: measure this pair on this device, then let ``specviz.theory.sequoia`` choose.

A short calibration on held-out prompts (the prompt set's last ones, which a benchmark's first
prompts do not reach) measures every input of the choice:
- the target's one-token step (an autoregressive run), the unit of every cost;
- the chain's acceptance by depth and drafter step, from a chain of gamma ``max_depth``;
- the acceptance by depth and sibling rank and the drafter's pass per tree level, from a wide
  calibration tree (``sequoia.prior_tree``);
- the verify cost v(n), a target pass over the pending token and n nodes
  (``specviz.measure.tree_bench.verify_cost_curve``), measured, never assumed.
The calibration is cached per (pair key, drafter, sampling regime) for the process's life.

``auto_tree(...)`` returns an ``AutoTree``: the TreeSpec to draft (None: the chain won) and the
gamma to run a chain at, with the choice and its inputs to state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from specviz import theory as chain_theory
from specviz.engine.sampling import Sampling
from specviz.engine.tree.spec import TreeSpec
from specviz.theory import sequoia
from specviz.theory import tree as tree_theory

AUTO = "auto"
NS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
CALIBRATION_PROMPTS = 3
_CACHE: dict[tuple, "Calibration"] = {}


@dataclass(frozen=True)
class Calibration:
    """What a calibration measured (costs in target steps: ms / the target's one-token step in ms).

    Attributes:
        rank_counts: ``sequoia.acceptance_by_rank`` of the calibration tree's rounds.
        chain_counts: ``tree_theory.acceptance_by_depth`` of the chain's rounds (offered, accepted).
        verify_curve: {n: v(n)}.
        tree_pass_cost: drafting ms per drafter pass in tree rounds / target step ms (c_tree).
        chain_step_cost: drafting ms per drafter pass in chain rounds / target step ms (c).
        overhead: {mean nodes per round: a round's time outside drafting and verifying / target step ms},
            from the chain's and the tree's runs (judging, recording: it grows with the nodes).
        target_step_ms: the unit.
        calibration_tree: the parents of the tree it drafted.
        prompts, tokens: held-out prompts used, tokens generated per run.
    """

    rank_counts: list
    chain_counts: list
    verify_curve: dict
    tree_pass_cost: float
    chain_step_cost: float
    target_step_ms: float
    calibration_tree: tuple
    prompts: int
    tokens: int
    overhead: dict | None = None

    def rank_acceptance(self) -> sequoia.RankAcceptance:
        return sequoia.RankAcceptance.from_counts(self.rank_counts)

    def chain_rates(self) -> list[float]:
        return tree_theory.depth_rates(self.chain_counts)


@dataclass(frozen=True)
class AutoTree:
    """The auto choice: ``tree`` (None: a chain) and ``gamma`` (the chain's; a tree's depth), the
    sequoia ``choice`` and the ``calibration`` it came from."""

    tree: TreeSpec | None
    gamma: int
    choice: sequoia.AutoChoice
    calibration: Calibration

    def describe(self) -> dict:
        """JSON-ready: the choice, its prediction, the best chain, and the inputs."""
        b, c = self.choice.best, self.choice.best_chain
        cal = self.calibration
        return {
            "chosen": b.label(), "kind": b.kind, "nodes": b.nodes, "depth": b.depth,
            "parents": list(b.parents) if b.parents else None,
            "predicted_tokens_per_round": b.tokens_per_round, "predicted_cost": b.cost, "predicted_speedup": b.speedup,
            "best_chain": {"gamma": c.depth, "predicted_tokens_per_round": c.tokens_per_round, "predicted_cost": c.cost,
                           "predicted_speedup": c.speedup},
            "speedup_by_budget": sequoia.speedup_by_budget(self.choice),
            "inputs": {"acceptance_by_rank": cal.rank_counts, "chain_acceptance_by_depth": cal.chain_counts,
                       "verify_cost_by_nodes": cal.verify_curve, "tree_pass_cost": cal.tree_pass_cost,
                       "chain_step_cost": cal.chain_step_cost, "target_step_ms": cal.target_step_ms,
                       "overhead_by_nodes": cal.overhead,
                       "calibration_prompts": cal.prompts, "calibration_tokens": cal.tokens},
            "sentence": self.choice.sentence(),
        }


def calibration_prompt_ids(tokenize, texts: list[str], reserved: int, count: int = CALIBRATION_PROMPTS) -> list[list[int]]:
    """The last ``count`` of ``texts`` tokenised by ``tokenize`` (text -> ids), held out from the
    first ``reserved`` (a benchmark's prompts).

    Raises:
        ValueError: fewer than ``reserved + count`` prompts."""
    if len(texts) < reserved + count:
        raise ValueError(f"the auto tree calibrates on {count} prompts after the {reserved} measured; the set has {len(texts)}")
    return [tokenize(t) for t in texts[len(texts) - count:]]


def _cost(ms: float | None, step_ms: float) -> float:
    return ms / step_ms if ms else 0.0


def _overhead(chains, trees, step_ms: float) -> dict[float, float] | None:
    """{mean nodes per round: ms per round outside the draft and verify phases / step_ms} for the
    chain's and the tree's runs (two points of a line in n); None when they drafted as many nodes."""
    points = {}
    for ts in (chains, trees):
        rounds = sum(len(t.rounds) for t in ts)
        phases = sum(r.draft_ms + r.verify_ms for t in ts for r in t.rounds)
        walls = sum(t.total_ms - t.prefill_ms for t in ts)
        if rounds:
            points[sum(t.drafted for t in ts) / rounds] = max(0.0, (walls - phases) / rounds) / step_ms
    return points if len(points) == 2 else None


def calibrate(drafter, target, prompts: list[list[int]], sampling: Sampling, vocab_size: int, max_new_tokens: int = 64,
              max_depth: int = 8, max_nodes: int = 64, seed: int = 0, cached=True) -> Calibration:
    """Measure every input of the choice on ``prompts`` (see the module docstring).

    Args:
        drafter: a ``specviz.drafters.Drafter`` that drafts trees (model, early exit, EAGLE, prompt lookup).
        target: the target model; ``vocab_size``: the tokenizer's size.
        max_new_tokens: tokens per calibration run; ``max_depth``: the chain's gamma and the deepest tree weighed;
            ``max_nodes``: the widest verify pass timed (and the calibration tree's size, at most 40).
        cached: the KV cache v(n) is timed over (as ``specviz.engine.cache.make_runner``).

    Raises:
        ValueError: no prompts, or a run that never drafted (no acceptance to measure).
    """
    from specviz.engine.chain import autoregressive_generate, speculative_generate
    from specviz.measure.tree_bench import verify_cost_curve

    if not prompts:
        raise ValueError("calibration needs at least one prompt")
    common = dict(sampling=sampling, max_new_tokens=max_new_tokens, vocab_size=vocab_size, eos_token_id=None)
    calib_tree = sequoia.prior_tree(min(40, max_nodes), max_depth)
    with torch.inference_mode():
        autoregressive_generate(prompts[0], target, **(common | {"max_new_tokens": 4}))  # warm-up
        base = [autoregressive_generate(ids, target, seed=seed + i, **(common | {"max_new_tokens": min(32, max_new_tokens)})) for i, ids in enumerate(prompts)]
        chains = [speculative_generate(ids, drafter, target, gamma=max_depth, seed=seed + i, **common) for i, ids in enumerate(prompts)]
        trees = [speculative_generate(ids, drafter, target, tree=TreeSpec.explicit(calib_tree), seed=seed + i, **common)
                 for i, ids in enumerate(prompts)]
        curve = verify_cost_curve(target, prompts[0], sorted({n for n in NS if n < max_nodes} | {max_nodes}), vocab_size, cached=cached)
    step = chain_theory.target_step_ms(*base)
    chain_counts = tree_theory.acceptance_by_depth(*chains)
    if not chain_counts:
        raise ValueError("the calibration's chain drafted nothing: no acceptance to measure")
    return Calibration(rank_counts=sequoia.acceptance_by_rank(*trees), chain_counts=chain_counts, verify_curve=curve,
                       tree_pass_cost=_cost(chain_theory.drafter_step_ms(*trees), step),
                       chain_step_cost=_cost(chain_theory.drafter_step_ms(*chains), step), target_step_ms=step,
                       calibration_tree=calib_tree, prompts=len(prompts), tokens=max_new_tokens,
                       overhead=_overhead(chains, trees, step))


def decide(cal: Calibration, max_nodes: int = 64, max_depth: int = 8) -> AutoTree:
    """The choice from a calibration (no model runs): ``sequoia.choose``."""
    choice = sequoia.choose(cal.rank_acceptance(), cal.chain_rates(), cal.verify_curve, cal.tree_pass_cost, cal.chain_step_cost,
                            max_nodes=max_nodes, max_depth=max_depth, overhead=cal.overhead)
    best = choice.best
    tree = TreeSpec.explicit(best.parents) if best.kind == "tree" else None
    return AutoTree(tree=tree, gamma=best.depth, choice=choice, calibration=cal)


def auto_tree(drafter, target, prompts: list[list[int]], sampling: Sampling, vocab_size: int, key=None, max_new_tokens: int = 64,
              max_nodes: int = 64, max_depth: int = 8, seed: int = 0, cached=True) -> AutoTree:
    """Calibrate (or reuse this process's calibration for the same ``key``, drafter and sampling) and choose.

    ``key``: what names the pair and device (e.g. (pair name, device)); None: never cached.
    Raises as ``calibrate``."""
    cache_key = None
    if key is not None:
        who = json.dumps(drafter.describe(), sort_keys=True, default=str) if hasattr(drafter, "describe") else id(drafter)
        cache_key = (key, who, json.dumps(sampling.to_dict(), sort_keys=True),
                     max_new_tokens, max_depth, max_nodes, str(cached))
    cal = _CACHE.get(cache_key) if cache_key else None
    if cal is None:
        cal = calibrate(drafter, target, prompts, sampling, vocab_size, max_new_tokens, max_depth, max_nodes, seed, cached)
        if cache_key:
            _CACHE[cache_key] = cal
    return decide(cal, max_nodes, max_depth)


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
    def measured(method: str) -> dict | None:
        ts = traces.get(method) or []
        rounds = sum(len(t.rounds) for t in ts)
        if not rounds or method not in medians:
            return None
        return {"tokens_per_round": sum(len(t.output_ids) for t in ts) / rounds, "rounds": rounds,
                "nodes_per_round": sum(t.drafted for t in ts) / rounds, "speedup": medians[method] / medians["autoregressive"]}

    out = auto.describe()
    chains = {f"chain of gamma {gamma}": measured("speculative")}
    best_gamma = auto.choice.best_chain.depth
    if best_gamma != gamma:
        chains[f"chain of gamma {best_gamma}"] = measured("speculative_best_chain")
    out["measured"] = measured("speculative_auto")
    out["measured_chains"] = {k: v for k, v in chains.items() if v}
    m = out["measured"]
    if m:
        out["tokens_per_round_error"] = m["tokens_per_round"] / out["predicted_tokens_per_round"] - 1.0
        if out["measured_chains"]:
            best = max(out["measured_chains"].values(), key=lambda c: c["speedup"])
            out["speedup_vs_best_measured_chain"] = m["speedup"] / best["speedup"]
    return out


def format_bench_report(r: dict) -> list[str]:
    """Plain-text lines of ``bench_report``."""
    lines = [r["sentence"]]
    cand = [("auto: " + r["chosen"], r["predicted_tokens_per_round"], r["predicted_speedup"], r.get("measured"))]
    for label, m in r["measured_chains"].items():
        pred = r["best_chain"] if label.endswith(f"gamma {r['best_chain']['gamma']}") else None
        cand.append((label, pred and pred["predicted_tokens_per_round"], pred and pred["predicted_speedup"], m))
    lines.append(f"{'':<40}{'tokens/round pred':>18}{'measured':>10}{'speedup pred':>14}{'measured':>10}")
    for label, tpr, sp, m in cand:
        f = lambda x, d=2: f"{x:.{d}f}" if isinstance(x, (int, float)) else "-"  # noqa: E731
        lines.append(f"{label[:40]:<40}{f(tpr):>18}{f(m and m['tokens_per_round']):>10}{f(sp):>14}{f(m and m['speedup']):>10}")
    if r.get("tokens_per_round_error") is not None:
        lines.append(f"auto: measured / predicted tokens per round - 1: {r['tokens_per_round_error']:+.1%}")
    if r.get("speedup_vs_best_measured_chain") is not None:
        lines.append(f"auto / best measured chain speedup: {r['speedup_vs_best_measured_chain']:.2f}")
    inp = r["inputs"]
    lines.append("acceptance by depth and sibling rank (accepted/offered): " + "; ".join(
        f"d{d}: " + " ".join(f"{a}/{o}" for o, a in row) for d, row in enumerate(inp["acceptance_by_rank"], 1)))
    lines.append("chain acceptance by depth (accepted/offered): " + " ".join(f"{a}/{o}" for o, a in inp["chain_acceptance_by_depth"]))
    lines.append(f"c_tree {inp['tree_pass_cost']:.3f}, c {inp['chain_step_cost']:.3f} target steps per drafter pass; v(n): "
                 + ", ".join(f"{n}: {v:.2f}" for n, v in inp["verify_cost_by_nodes"].items()))
    if inp.get("overhead_by_nodes"):
        lines.append("round time outside drafting and verifying, target steps: "
                     + ", ".join(f"{n:.1f} nodes: {v:.2f}" for n, v in inp["overhead_by_nodes"].items()))
    return lines


def auto_for_pair(pair, drafter, sampling: Sampling, max_new_tokens: int = 64, max_nodes: int = 64, cached=True) -> AutoTree:
    """``auto_tree`` for a loaded pair, calibrated on the last held-out prompts (never a visitor's
    or a user's own prompt), cached per (pair, device, drafter, sampling)."""
    from specviz.measure.common import benchmark_prompts, prompt_token_ids

    ids = calibration_prompt_ids(lambda t: prompt_token_ids(pair, [t], "held-out")[0], benchmark_prompts(10**6), 0)
    return auto_tree(drafter, pair.target, ids, sampling, pair.vocab_size, key=(pair.name, str(pair.device)),
                     max_new_tokens=max_new_tokens, max_nodes=max_nodes, cached=cached)
