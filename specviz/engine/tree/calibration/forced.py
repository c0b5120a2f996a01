"""The teacher-forced calibration (a drafter model, early exit, the int8 target): one forward pass of each model over
the target's own continuation gives every position's acceptance by rank; walks over the positions count it by depth."""

from __future__ import annotations

import math
from dataclasses import dataclass
import torch
from specviz.engine.runner import make_runner
from specviz.engine.sampling import Sampling, contexts
from specviz.engine.stopping import ProgressReport, StopCheck, Stopped, asked, run_steps
from specviz.theory import sequoia
from specviz.engine.tree.calibration.record import Calibration, NS, merged_counts
from specviz.engine.tree.calibration.runs import _Parts, _parts_of, refined_steps
from specviz.engine.tree.calibration.timing import pass_ms_steps


MAX_RANK = 8  # sibling ranks measured at each position (the widest node a chosen tree may have)


MAX_RANK = 8  # sibling ranks measured at each position (the widest node a chosen tree may have)
TREE_LEVEL = 4  # nodes in the drafter pass timed as one tree level (c_tree)


TREE_LEVEL = 4  # nodes in the drafter pass timed as one tree level (c_tree)
WALKS = 4  # walks over the measured positions under sampling (greedy walks are deterministic: one)


WALKS = 4  # walks over the measured positions under sampling (greedy walks are deterministic: one)
# each target pass size timed this many times in turns, the fastest kept (the drafter's, cheaper, 3 times as many)
TIMING_REPEATS = 4


@dataclass(frozen=True)
class PositionAcceptance:
    """What one teacher-forced text says at each of its positions i (the drafter and the target both read
    the text up to i; each row is about the token after it).

    Attributes:
        by_rank: by_rank[i][k - 1], k = 1 .. the children that exist there (at most MAX_RANK): the chance
            that the drafter's k-th candidate (its ranking: q, or under greedy decoding the softmax of its
            logits; only tokens q gives mass) is the one recursive rejection sampling without replacement
            accepts, = p_i(x_k). Greedy: 1 for the candidate equal to the target's argmax, else 0.
        chain: chain[i] = sum_x min(p_i(x), q_i(x)): the chance a draft drawn from q_i is accepted
            (Leviathan et al. 2023, Sec. 3.1); greedy: 1 when the drafter's argmax is the target's.
    """

    by_rank: tuple
    chain: tuple


def position_acceptance(
    p: torch.Tensor, q: torch.Tensor, ranking: torch.Tensor, max_rank: int = MAX_RANK
) -> PositionAcceptance:
    """Per-position acceptance from the target's processed p, the drafter's q and what its children are
    ranked by, each (L, V) float over the same L positions.

    Without replacement (the rule top-k children are judged by, ``specviz.engine.tree.accept``) the k-th
    sibling x_k is tested against p with x_1 .. x_{k-1} removed and renormalised, so it is the accepted one
    with probability prod_{j<k} (1 - p(x_j) / (1 - S_{j-1})) p(x_k) / (1 - S_{k-1}) = p(x_k), S_j the mass
    of x_1 .. x_j: the per-rank acceptance is p at the k-th candidate.

    Raises:
        ValueError: shapes that differ, or max_rank under 1."""
    if p.shape != q.shape or p.shape != ranking.shape or p.dim() != 2:
        raise ValueError("p, q and the ranking must be (positions, vocabulary) tensors of one shape")
    if max_rank < 1:
        raise ValueError("max_rank must be at least 1")
    p, q, ranking = p.float(), q.float(), ranking.float()
    values, ids = ranking.topk(min(max_rank, ranking.shape[-1]), dim=-1)
    exists = values > 0  # the children a node gets: the top-k the ranking gives mass (at least one)
    exists[:, 0] = True
    at = p.gather(1, ids)
    chain = torch.minimum(p, q).sum(-1)
    by_rank = tuple(tuple(float(x) for x, e in zip(row, ok) if e) for row, ok in zip(at.tolist(), exists.tolist()))
    return PositionAcceptance(by_rank=by_rank, chain=tuple(float(x) for x in chain.tolist()))


def _children_of(parents) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for i, par in enumerate(parents):
        kids.setdefault(par, []).append(i)
    return kids


def walk_tree(texts: list[PositionAcceptance], parents, walks: int = 1, seed: int = 0):
    """Rounds of the top-k tree ``parents`` walked over the measured positions: ``sequoia.acceptance_by_rank``'s
    counts, ``sequoia.children_available``'s, and (tokens, rounds).

    A round starts at a text's first position and each next round where the last ended (after its accepted
    drafts and the correction or bonus token), as a run's rounds do. At depth d the round is at position
    t + d - 1; the node's children there are its shape's first k that exist (``PositionAcceptance.by_rank``);
    the accepted one (if any) is drawn from their per-rank chances and the walk goes on below it at the next
    position. Under greedy decoding the chances are 0 or 1 and the walk is the run's own (the accepted token
    is the target's, the text's next token). Otherwise the position after an accepted sibling stands for
    its context (Sequoia's assumption: acceptance depends on depth and rank only). A round the text ends
    is counted as far as it went."""
    import random

    kids = _children_of(parents)
    counts: list[list[list[int]]] = []
    widths: list[int] = []
    tokens = rounds = 0
    rng = random.Random(seed)
    for _ in range(walks):
        for text in texts:
            end, t = len(text.by_rank), 0
            while t < end:
                node, i, depth = -1, t, 1
                while i < end:
                    offered = kids.get(node, [])[: len(text.by_rank[i])]
                    if depth == 1:
                        widths.append(len(offered))
                    if not offered:
                        break
                    row = sequoia.count_row(counts, depth, len(offered))
                    u, mass, chosen = rng.random(), 0.0, None
                    for k in range(len(offered)):
                        row[k][0] += 1
                        mass += text.by_rank[i][k]
                        if chosen is None and u < mass:
                            chosen = k
                    if chosen is None:
                        break
                    row[chosen][1] += 1
                    node, i, depth = offered[chosen], i + 1, depth + 1
                tokens += i - t + 1
                rounds += 1
                t = i + 1
    available = [
        (len([w for w in widths if w]), sum(w >= k for w in widths)) for k in range(1, max(widths, default=0) + 1)
    ]
    return [[(o, a) for o, a in row] for row in counts], available, (tokens, rounds)


def walk_chain(texts: list[PositionAcceptance], gamma: int, walks: int = 1, seed: int = 0) -> list[tuple[int, int]]:
    """``tree_theory.acceptance_by_depth``'s counts of a chain of ``gamma`` drafts walked over the measured
    positions as ``walk_tree`` walks a tree: at depth d a draft is accepted with the chance chain[t + d - 1]."""
    import random

    counts = [[0, 0] for _ in range(gamma)]
    rng = random.Random(seed)
    for _ in range(walks):
        for text in texts:
            end, t = len(text.chain), 0
            while t < end:
                i = t
                while i < end and i - t < gamma:
                    counts[i - t][0] += 1
                    if not rng.random() < text.chain[i]:
                        break
                    counts[i - t][1] += 1
                    i += 1
                t = i + 1
    return [(o, a) for o, a in counts if o]


def teacher_forced(
    drafter_model,
    target,
    prompt: list[int],
    text: list[int],
    sampling: Sampling,
    vocab_size: int,
    max_rank: int = MAX_RANK,
) -> PositionAcceptance:
    """One forward pass of each model over ``prompt`` + ``text`` (no cache): ``position_acceptance`` at the
    positions whose next token is in ``text`` (the prompt's last token first), p and q through ``sampling``'s
    processors (the repetition penalty with each position's context)."""
    device = next(target.parameters()).device
    seq = torch.tensor(list(prompt) + list(text), dtype=torch.long, device=device)
    first, count = len(prompt) - 1, len(text)
    ctx = contexts(seq, range(first + 1, first + 1 + count), vocab_size) if sampling.needs_context else None
    warpers = sampling.warpers()
    with torch.inference_mode():
        p_logits = make_runner(target, vocab_size, "re-fed").logits(seq, len(seq), len(seq))[first : first + count]
        q_logits = (
            make_runner(drafter_model, vocab_size, "re-fed")
            .logits(seq.to(next(drafter_model.parameters()).device), len(seq), len(seq))[first : first + count]
            .to(device)
        )
        p = sampling.probs(p_logits, warpers, ctx)
        q = sampling.probs(q_logits, warpers, ctx)
        ranking = torch.softmax(q_logits.float(), dim=-1) if sampling.greedy else q
    return position_acceptance(p, q, ranking, max_rank)


def teacher_forcible(drafter) -> bool:
    """Whether ``calibrate`` reads this drafter teacher-forced (``calibrate_forced``), not from runs."""
    return _forced_model(drafter) is not None


def _forced_model(drafter):
    """The drafter's model when teacher forcing can read its q in one pass (a drafter model, early exit,
    the int8 target), else None (prompt lookup, EAGLE, a drafter with its own tokenizer)."""
    from specviz.engine.model_drafter import as_drafter

    try:
        return as_drafter(drafter).forced_model
    except TypeError:
        return None


def calibrate_forced(
    drafter,
    target,
    prompts: list[list[int]],
    sampling: Sampling,
    vocab_size: int,
    max_new_tokens: int = 64,
    max_depth: int = 8,
    max_nodes: int = 64,
    seed: int = 0,
    cached="auto",
    refine: int = 2,
    stop: StopCheck | None = None,
    partial: dict | None = None,
    keep=None,
    progress: ProgressReport | None = None,
) -> Calibration:
    """The choice's inputs from teacher-forced passes over the target's own text, and a few timed passes.

    What it measures, in order, each part kept (``keep``) as soon as it is measured:
    1. the text: the target's own continuation of each prompt, ``max_new_tokens`` tokens under ``sampling``
       (greedy: its greedy text; else a sample), the prompts in one batch (``autoregressive_generate_batch``:
       on a CPU a step of 8 rows costs little more than a step of one);
    2. v(n) and the drafter's passes: the fastest of TIMING_REPEATS passes of each size, timed in turns
       (``pass_ms``): v(n) = target pass over n nodes / its one-token pass (the
       unit, ``target_step_ms``); c = the drafter's one-token pass / the target's, c_tree = its pass over
       TREE_LEVEL nodes / the target's;
    3. per position of each text, one forward pass of each model over prompt + text (``teacher_forced``):
       the acceptance of the drafter's k-th ranked candidate (``position_acceptance``).
    From 3 the counts Sequoia's programme needs are walked, not run (``walk_tree``, ``walk_chain``): the
    calibration tree's rounds (``sequoia.prior_tree``), a chain of gamma ``max_depth``, then the chosen shape's
    own rounds (``refined_counts``'s rule, up to ``refine`` times while the choice changes). The programme
    reads them as Sequoia's positional acceptance vector (Chen et al. 2024, Sec. 3.1: the chance that a
    node's k-th child is the one accepted, given its depth and rank only). Under greedy decoding each walk
    is the run's own rounds exactly; under sampling WALKS walks draw each verdict from the measured chances.
    No overhead line is measured (``Calibration.overhead`` None): the prediction's round cost is drafting
    and v(n).

    Args:
        as ``calibrate_by_runs``; ``partial``: what an earlier, stopped calibration of the same key kept
        (``specviz.pair.auto_tree.load_partial``), reused instead of measured again; ``keep``: called with that record
        (plain data) after each part; ``progress``: told (parts done, parts in all) after every TEXT_STEP tokens of the
        texts, every timed repeat and each prompt's teacher-forced passes (None: nobody).

    Raises:
        ValueError: no prompts, no positions, or a drafter that is not a model.
        specviz.engine.stopping.Stopped: ``stop`` asked to end (what was measured has been given to ``keep``).
    """
    return run_steps(
        calibrate_forced_steps(
            drafter,
            target,
            prompts,
            sampling,
            vocab_size,
            max_new_tokens,
            max_depth,
            max_nodes,
            seed,
            cached,
            refine,
            stop,
            partial,
            keep,
        ),
        progress,
    )


TEXT_STEP = 8  # tokens of the texts' batch a step decodes: a step of the device's, short beside a visitor's run


def calibrate_forced_steps(
    drafter,
    target,
    prompts: list[list[int]],
    sampling: Sampling,
    vocab_size: int,
    max_new_tokens: int = 64,
    max_depth: int = 8,
    max_nodes: int = 64,
    seed: int = 0,
    cached="auto",
    refine: int = 2,
    stop: StopCheck | None = None,
    partial: dict | None = None,
    keep=None,
):
    """``calibrate_forced`` as steps (``specviz.engine.stopping.run_steps``): a generator that yields (parts done, parts
    in all) after every TEXT_STEP tokens of the texts, every timed repeat and each prompt's teacher-forced passes, so a
    server's device thread runs other jobs' steps between them, and returns the Calibration. Arguments and errors as
    ``calibrate_forced``."""
    from specviz.engine import batch

    model = _forced_model(drafter)
    if model is None:
        raise ValueError("the teacher-forced calibration needs a drafter model")
    if not prompts:
        raise ValueError("calibration needs at least one prompt")
    record = {"texts": [[] for _ in prompts], "target_ms": None, "drafter_ms": None}
    if partial and len(partial.get("texts") or ()) == len(prompts):
        record.update({k: v for k, v in partial.items() if k in record})
    keep = keep or (lambda r: None)
    sizes = sorted({n for n in NS if n < max_nodes} | {max_nodes})
    parts = _Parts(math.ceil(max_new_tokens / TEXT_STEP) + 2 + len(prompts))
    parts.done = min(len(t) for t in record["texts"]) // TEXT_STEP
    # The texts, TEXT_STEP tokens a batch (each row as far as its text is; the seed moves on with its length).
    while left := [i for i, t in enumerate(record["texts"]) if len(t) < max_new_tokens]:
        at = len(record["texts"][left[0]])
        rows = [i for i in left if len(record["texts"][i]) == at]
        out = batch.autoregressive_generate_batch(
            [list(prompts[i]) + record["texts"][i] for i in rows],
            target,
            sampling=sampling,
            max_new_tokens=min(TEXT_STEP, max_new_tokens - at),
            seed=seed + at,
            vocab_size=vocab_size,
            stop=stop,
        )
        for i, trace in zip(rows, out.traces):
            record["texts"][i] = record["texts"][i] + list(trace.output_ids)
        keep(record)
        if out.stopped:
            raise Stopped
        parts.done = min(len(t) for t in record["texts"]) // TEXT_STEP
        yield parts.now()
    parts.done = math.ceil(max_new_tokens / TEXT_STEP)
    for key, timed_model, timed_sizes, repeats in (
        ("target_ms", target, sizes, TIMING_REPEATS),
        ("drafter_ms", model, [TREE_LEVEL], 3 * TIMING_REPEATS),
    ):
        if record[key] is None:
            try:
                ms = yield from _parts_of(
                    pass_ms_steps(timed_model, prompts[0], timed_sizes, vocab_size, repeats, cached, stop), parts, 0
                )
            except Stopped:
                keep(record)
                raise
            record[key] = {str(n): v for n, v in ms.items()}
            keep(record)
        parts.done += 1
        yield parts.now()
    texts = []
    for ids, text in zip(prompts, record["texts"]):
        if asked(stop):
            raise Stopped
        if text:
            with torch.inference_mode():
                texts.append(teacher_forced(model, target, ids, text, sampling, vocab_size))
        parts.done += 1
        yield parts.now()
    if not any(t.chain for t in texts):
        raise ValueError("the calibration's texts are empty: no acceptance to measure")
    walks = 1 if sampling.greedy else WALKS
    target_ms, drafter_ms = (
        {int(n): v for n, v in record["target_ms"].items()},
        {int(n): v for n, v in record["drafter_ms"].items()},
    )
    step_ms = target_ms[0]
    calib_tree = sequoia.prior_tree(min(40, max_nodes), max_depth)
    rank_counts, available, _ = walk_tree(texts, calib_tree, walks, seed)
    cal = Calibration(
        rank_counts=rank_counts,
        chain_counts=walk_chain(texts, max_depth, walks, seed),
        verify_curve={n: target_ms[n] / target_ms[0] for n in sizes},
        tree_pass_cost=drafter_ms[TREE_LEVEL] / target_ms[0],
        chain_step_cost=drafter_ms[0] / target_ms[0],
        target_step_ms=step_ms,
        calibration_tree=calib_tree,
        prompts=len(texts),
        tokens=max_new_tokens,
        available=tuple(available),
    )

    def walked(cal: Calibration, best: sequoia.Candidate):
        counts = (
            walk_tree(texts, best.parents, walks, seed)[0]
            if best.kind == "tree"
            else walk_chain(texts, best.depth, walks, seed)
        )
        return merged_counts(cal, best, counts)
        yield  # no step of its own: walking the measured positions runs no model

    return (yield from refined_steps(cal, refine, max_nodes, max_depth, walked))
