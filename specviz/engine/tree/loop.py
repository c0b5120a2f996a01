"""The single-sequence speculative loop over token trees.

A round: draft a tree (``specviz.engine.tree.draft``); one target pass over the pending token and every
node under the tree mask with depth positions (``specviz.engine.tree.attention``); judge every node's
children (``specviz.engine.tree.accept``); walk from the pending token into accepted children; emit the
path and the correction or bonus token; compact both caches to the accepted path; record.

The output is distributed as the target's own samples under either rule (see ``accept``); tested
by tests/test_tree_exactness.py against the enumerated law, with planted faults.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import torch

from specviz.engine import rejection
from specviz.engine.drafter import DraftRequest, check_trees
from specviz.engine.rounds import (
    TOP_TOKENS,
    RunOptions,
    Transfer,
    emit,
    extend_trace,
    held,
    open_run,
    set_up,
    start_sequence,
)
from specviz.engine.runner import Cache, make_runner
from specviz.engine.sampling import Sampling
from specviz.trace import Draft, Round, TopToken, Trace
from specviz.engine.tree.accept import NO_FAULT, TreeFault, judge, judge_greedy
from specviz.engine.tree.attention import ancestor_matrix, compact, masked_logits
from specviz.engine.tree.draft import DraftTree
from specviz.trace.tree import TreeNode, TreeRecord
from specviz.engine.tree.spec import TreeSpec


def tree_stream(
    input_ids: list[int],
    drafter,
    target,
    tree: TreeSpec,
    sampling: Sampling = Sampling(),
    max_new_tokens: int = 64,
    eos_token_id: int | Iterable[int] | None = None,
    seed: int = 0,
    tokenizer=None,
    vocab_size: int | None = None,
    record: bool = True,
    cached: Cache = "auto",
    compaction: str = "gather",
    fault: TreeFault = NO_FAULT,
) -> Iterator[Trace]:
    """Speculative decoding with a token tree per round, yielding the growing Trace after every round.

    Arguments as ``specviz.engine.chain.speculative_stream``, with ``tree`` (a TreeSpec) instead of gamma
    and schedule, and ``compaction``: how the caches drop the rejected branches ("gather" or
    "refeed", see ``specviz.engine.tree.attention``), and ``fault``: a departure from the exact rules, for
    the exactness lab's controls only (``specviz.engine.tree.accept.TreeFault``).

    Raises:
        ValueError: as speculative_stream; a repetition penalty (not supported with trees: each
            node would need its own path's context).
        UnsupportedDrafting (a TypeError): a drafter that cannot draft trees (``Drafter.drafts_trees``), before the
            run starts.
    """
    options = RunOptions(sampling=sampling, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, seed=seed,
                         tokenizer=tokenizer, vocab_size=vocab_size, record=record, cached=cached)
    yield from tree_rounds(input_ids, drafter, target, tree, options, compaction=compaction, fault=fault)


def tree_rounds(
    input_ids: list[int],
    drafter,
    target,
    tree: TreeSpec,
    options: RunOptions,
    *,
    compaction: str = "gather",
    fault: TreeFault = NO_FAULT,
) -> Iterator[Trace]:
    """``tree_stream``'s numbered steps, yielding the Trace after each round; arguments and errors as
    ``tree_stream`` (its run-wide ones in ``options``)."""
    if not isinstance(tree, TreeSpec):
        raise TypeError(f"tree must be a specviz.engine.tree.spec.TreeSpec, got {type(tree).__name__}")
    sampling = options.sampling
    if isinstance(sampling, Sampling) and sampling.needs_context:
        raise ValueError("token trees do not support a repetition penalty yet: set it to 1")
    run = set_up(drafter, target, options)
    drafter, device = run.drafter, run.device
    check_trees(drafter)
    # No gamma: a tree's depth is recorded in settings["tree"] and each round's TreeRecord.
    trace, seq, history, gen = start_sequence(run, input_ids, gamma=None, room=options.max_new_tokens + tree.depth + 1,
                                              drafter=drafter.describe(), gamma_schedule={"kind": "constant"},
                                              tree=tree.describe())
    n_prompt = len(input_ids)
    # An EAGLE drafter reads the target's features: the prefill's, then the accepted path's each round.
    reads_features = drafter.reads_target_features
    runner = make_runner(target, run.vocab, options.cached, keep_features=reads_features)
    top_k = min(TOP_TOKENS, run.vocab) if options.record else 0
    with held(runner, drafter):  # given back when the run ends, however it ends
        clock = yield from open_run(runner, run, trace, seq, n_prompt)
        n = n_prompt
        while True:
            with torch.inference_mode():  # per round, left before each yield (``Clock.hand_over``)
                remaining = n_prompt + options.max_new_tokens - n
                depth = min(tree.depth, remaining)
                t0 = clock.mark()
                # 1. Draft a tree no deeper than the tokens still allowed.
                request = DraftRequest(seq=seq, n=n, gamma=depth, history=history, sampling=sampling,
                                       warpers=run.warpers, gen=gen, vocab=run.vocab, keep_drafting=lambda q: True)
                passes_before = _drafter_passes(drafter)
                drafted = drafter.propose_tree(request, tree, depth)
                drafted_passes = _drafter_passes(drafter) - passes_before
                t1 = clock.mark()

                # 2. Verify: the pending token (slot 0) and every node, one pass, each under its own path.
                slot_parents = [-1] + [p + 1 for p in drafted.parents]
                tokens = torch.cat([seq[n - 1 : n], drafted.tokens])
                positions = torch.tensor([n - 1] + [n - 1 + d for d in drafted.depths], dtype=torch.long, device=device)
                logits = masked_logits(runner, seq, n - 1, tokens, positions, ancestor_matrix(slot_parents).to(device),
                                       len(slot_parents), windowed=not fault.window_ignored)

                # 3. Accept: every node's children judged in turn against the residual its earlier siblings left
                # (``specviz.engine.tree.accept``), and each slot's final token, a correction or the bonus.
                host = judge_slots(logits, drafted, sampling, run.warpers, gen, fault, top_k, options.record).fetch()
                t2 = clock.mark()
                if not host["finite"][0]:
                    raise ValueError(
                        "a model produced NaN or infinite probabilities; refusing to sample an invalid token"
                    )

                # 4. Walk: from the pending token into accepted children; emit the path and the final token.
                path, slot = [], 0
                while host["accepted_child"][slot] >= 0:
                    slot = int(host["accepted_child"][slot])
                    path.append(slot - 1)
                node_tokens = [int(t) for t in host["tokens"]]
                final = int(host["finals"][slot])
                kind = "target" if not drafted.size else ("correction" if (slot - 1) in drafted.parents else "bonus")
                emitted, keeps_final = emit([node_tokens[i] for i in path], final, run.eos, remaining)

                # 5. Compact both caches to the accepted path; the newest token is fed next round.
                seq[n : n + len(path)] = torch.tensor([node_tokens[i] for i in path], dtype=torch.long, device=device)
                seq[n + len(path)] = final
                keep = ([0] + [i + 1 for i in path])[: len(emitted)]
                if reads_features:  # before compaction: "refeed" makes a pass of its own
                    _observe_path(drafter, runner.features, n - 1, len(slot_parents), keep)
                compact(runner, seq, n - 1, keep, compaction)
                drafter.settle_tree(seq, n, _fed_path(drafted, path[: len(emitted) - 1]), n + len(emitted), compaction)
                n += len(emitted)
                history.extend(emitted)

                # 6. Record.
                if options.record:
                    trace.rounds.append(_round(host, drafted, node_tokens, path, final, kind, keeps_final, emitted,
                                               slot, run.decode, top_k, clock.ms(t0, t1), clock.ms(t1, t2),
                                               clock.since_start(), drafted_passes))
                extend_trace(trace, emitted, run, clock)
            yield from clock.hand_over(trace)
            if trace.stop_reason:
                return


def judge_slots(
    logits: torch.Tensor,
    drafted: DraftTree,
    sampling: Sampling,
    warpers,
    gen,
    fault: TreeFault,
    top_k: int,
    record: bool = True,
) -> Transfer:
    """Step 3 of a round: every node's verdict by the tree's acceptance rule (``specviz.engine.tree.accept``), each
    slot's final token and, for the records, each slot's ``top_k`` tokens of the p' its final token came from, packed
    for one transfer.

    ``logits``: (N + 1, V) the verify pass's, slot 0 the pending token. Greedy runs (no fault
    planted) judge from each slot's argmax alone (``judge_greedy``); the others through the
    target's processed p at every slot (``judge``). With ``record``, the drafter's entropy
    H(q) = -sum_x q(x) log2 q(x) in bits at each node with children (``q_entropy``: one per parent, in the order
    ``dict.fromkeys(drafted.parents)`` gives, from its first child's q row, which its siblings share; none for prompt
    lookup, whose q is one-hot).
    """
    transfer = Transfer()
    device = logits.device
    greedy = sampling.greedy and fault == NO_FAULT
    if greedy:
        scores = logits.float()
        top = scores.max(dim=-1)  # Sampling.probs' one-hot p: its argmax, the first index on ties
        judged = judge_greedy(top.indices, drafted.tokens, drafted.parents, drafted.q, drafted.rule, gen)
        finite = torch.isfinite(top.values).all()
    else:
        p_all = rejection.target_probs(logits, sampling, warpers)  # (N + 1, V)
        cols = mass_columns(p_all, logits, drafted.tokens, top_k)
        p_rows = p_all if cols is None else p_all[:, cols]  # (N + 1, K)
        tokens = drafted.tokens if cols is None else torch.searchsorted(cols, drafted.tokens)
        q = drafted.q if cols is None or drafted.q is None else drafted.q[:, cols]
        judged = judge(p_rows, tokens, drafted.parents, q, drafted.rule, sampling.greedy, gen, fault)
        if cols is not None:
            judged["finals"] = cols[judged["finals"]]
        finite = torch.isfinite(p_rows).all()
    for key in (
        "u",
        "p",
        "p_residual",
        "q",
        "accept_prob",
        "mass",
        "accepted",
        "accepted_child",
        "finals",
        "final_probs",
    ):
        transfer.add(key, judged[key])
    transfer.add("tokens", drafted.tokens)
    transfer.add("finite", finite)
    if record and drafted.q is not None and drafted.size:
        # one row per parent (siblings share their parent's q): a (V,) pass each, not one per node
        firsts = [drafted.parents.index(p) for p in dict.fromkeys(drafted.parents)]
        q_rows = drafted.q[torch.tensor(firsts, dtype=torch.long, device=drafted.q.device)].float()
        # clamped to [0, log2 V]: float32 sums over V terms stray by their last bits; + 0.0 turns a one-hot row's -0.0
        # (shown "-0.00") into 0.0
        entropy = -(q_rows * q_rows.clamp_min(1e-30).log2()).sum(dim=-1)
        transfer.add("q_entropy", entropy.clamp(0.0, math.log2(q_rows.shape[-1])) + 0.0)
    if not top_k:
        return transfer
    slots = logits.shape[0]
    if greedy:
        # p' is one-hot at the argmax: it first, then the target's runners-up (p' 0 there)
        best = top.indices[:, None]
        rest = scores.scatter_(1, best, float("-inf")).topk(top_k - 1, dim=-1).indices
        top_ids = torch.cat([best, rest], dim=1)
        top_prob = top_p = (top_ids == best).float()
    else:
        top_prob, top_at = judged["residual"].topk(top_k, dim=-1)
        top_p = p_rows.gather(1, top_at)
        top_ids = top_at if cols is None else cols[top_at]
    # q at each slot, where its children came from (siblings share their parent's q)
    top_q = torch.zeros(slots, top_k, device=device)
    if drafted.q is not None and drafted.size:
        child = torch.full((slots,), -1, dtype=torch.long, device=device)
        child[torch.tensor(drafted.parents, dtype=torch.long, device=device) + 1] = torch.arange(
            drafted.size, device=device
        )
        # gathered for every slot and zeroed where none has children: no boolean index, no device synchronisation
        top_q = torch.where((child >= 0)[:, None], drafted.q[child.clamp_min(0)[:, None], top_ids].float(), top_q)
    for key, value in (("top_ids", top_ids), ("top_prob", top_prob), ("top_p", top_p), ("top_q", top_q)):
        transfer.add(key, value)
    return transfer


def mass_columns(p: torch.Tensor, logits: torch.Tensor, tokens: torch.Tensor, top_k: int) -> torch.Tensor | None:
    """The vocabulary columns a sampled tree round needs judged, ascending; None: all of them.

    Every residual p' of a slot is non-zero only where its p is (norm(max(0, p' - q)) and zeroing a
    rejected sibling both keep p' <= p up to normalisation), so the judges' verdicts, residuals and
    final draws over these columns equal those over the whole vocabulary: the columns where some
    slot's p is positive (the top-k / top-p nucleus: tens of tokens at the usual settings) and the
    nodes' tokens (judged even where p is 0); when fewer than ``max(top_k, 1)``, each slot's highest
    logits join them (the records' runners-up; and a column at least, so a NaN row, NaN in every
    column, is still seen). A draw by the inverse distribution function adds the same non-zero terms
    in the same order, so it picks the same token; sums may differ in their last bits (the mass is
    summed over fewer zeros).

    Only on a CPU, where a (rows, vocabulary) operation is the cost (the English pair at T 0.7, top-p
    0.9, a round's step 3 with the judging over these columns, medians of rounds captured from runs:
    2-1-1 5.0-5.7 -> 2.5-2.7 ms, 3-2-2-1 24-28 -> 8.4 ms with top-p's float32 normaliser); a GPU does
    those rows at no cost, and reading the number of columns would make it wait for the device.

    Args:
        p: (rows, V) the processed p; logits: (rows, V) the pass's; tokens: (N,) the nodes' tokens.

    Returns:
        (K,) LongTensor of columns, or None (a GPU, or no saving: K would be the vocabulary).
    """
    if p.device.type != "cpu":
        return None
    cols = torch.cat([(p > 0).any(dim=0).nonzero()[:, 0], tokens]).unique()  # sorted
    if cols.numel() < max(top_k, 1):
        cols = torch.cat([cols, logits.topk(min(max(top_k, 1), p.shape[-1]), dim=-1).indices.flatten()]).unique()
    return None if cols.numel() >= p.shape[-1] else cols


def _round(
    host: dict,
    drafted: DraftTree,
    node_tokens: list[int],
    path: list[int],
    final: int,
    kind: str,
    keeps_final: bool,
    emitted: list[int],
    slot: int,
    decode,
    top_k: int,
    draft_ms: float,
    verify_ms: float,
    end_ms: float,
    drafter_passes: int,
) -> Round:
    """The Round record: the accepted path as its drafts, the whole tree in ``tree``."""
    texts = decode(node_tokens + [final])
    reached = {-1, *path}
    on_path = set(path)
    parent_row = {p: k for k, p in enumerate(dict.fromkeys(drafted.parents))}  # the q_entropy row of each parent
    nodes = []
    for i, parent in enumerate(drafted.parents):
        tested = parent in reached and (host["accepted"][i] or _before_accepted(i, drafted.parents, host))
        verdict = "accepted" if i in on_path else ("rejected" if tested else "discarded")
        nodes.append(
            TreeNode(
                token_id=node_tokens[i],
                text=texts[i],
                parent=parent,
                depth=drafted.depths[i],
                q=min(1.0, host["q"][i]),
                p=min(1.0, host["p"][i]),
                verdict=verdict,
                p_residual=min(1.0, host["p_residual"][i]) if verdict != "discarded" else None,
                accept_prob=min(1.0, host["accept_prob"][i]) if verdict != "discarded" else None,
                u=host["u"][i] if verdict != "discarded" else None,
                mass=min(1.0, host["mass"][i]) if verdict != "discarded" else None,
                source=drafted.sources[i] if drafted.sources else None,
                q_entropy=host["q_entropy"][parent_row[parent]] if "q_entropy" in host else None,
            )
        )
    drafts = [
        Draft(
            token_id=nodes[i].token_id,
            text=nodes[i].text,
            q=nodes[i].q,
            p=nodes[i].p,
            accept_prob=nodes[i].accept_prob,
            u=nodes[i].u,
            verdict="accepted",
            source=nodes[i].source,
        )
        for i in path
    ]
    final_top = []
    if keeps_final and top_k:
        a, b = slot * top_k, (slot + 1) * top_k
        ids = [int(t) for t in host["top_ids"][a:b]]
        final_top = [
            TopToken(token_id=t, text=x, prob=pr, p=pp, q=qq if kind == "correction" else None)
            for t, x, pr, pp, qq in zip(ids, decode(ids), host["top_prob"][a:b], host["top_p"][a:b], host["top_q"][a:b])
        ]
    return Round(
        drafts=drafts,
        emitted_ids=emitted,
        final_token_id=final if keeps_final else None,
        final_text=texts[-1] if keeps_final else None,
        final_kind=kind if keeps_final else None,
        final_prob=host["final_probs"][slot] if keeps_final else None,
        final_top=final_top,
        draft_ms=draft_ms,
        verify_ms=verify_ms,
        end_ms=end_ms,
        gamma=None,  # a tree has a depth, not a gamma
        tree=TreeRecord(nodes=nodes, path=list(path), rule=drafted.rule, drafter_passes=drafter_passes),
        features_from=drafted.features_from,
    )


def _observe_path(drafter, features: tuple[int, torch.Tensor], pending: int, slots: int, keep: list[int]) -> None:
    """Hand an EAGLE drafter the target's features of the verify pass that the round keeps.

    ``features``: the pass's (first position, (k, H)) from ``masked_logits``: rows of re-fed prefix
    positions first (the reference path without a cache), then one per slot (``slots`` of them, slot 0
    the pending token at position ``pending``). ``keep``: the kept slots, the pending token's and the
    accepted path's, which stand at positions pending, pending + 1, ... .
    """
    first, hidden = features
    by_slot = hidden[hidden.shape[0] - slots :]
    if first < pending:
        drafter.observe_target(first, hidden[: pending - first])
    drafter.observe_target(pending, by_slot[torch.tensor(keep, dtype=torch.long, device=hidden.device)])


def _fed_path(drafted: DraftTree, path: list[int]) -> list[int]:
    """The drafter's cache slots of the accepted nodes it fed, in path order, up to the first it did not feed."""
    fed = []
    for i in path:
        if drafted.fed is None or drafted.fed[i] < 0:
            break
        fed.append(drafted.fed[i])
    return fed


def _drafter_passes(drafter) -> int:
    """Forward passes the drafter's model has made so far (0 for prompt lookup, which has none)."""
    return int(getattr(drafter, "passes", 0))


def _before_accepted(i: int, parents: list[int], host: dict) -> bool:
    """Whether node i was tested and rejected: no earlier sibling of it was accepted."""
    siblings = [j for j, p in enumerate(parents) if p == parents[i]]
    for j in siblings:
        if j == i:
            return True
        if host["accepted"][j]:
            return False
    return True


def tree_generate(input_ids, drafter, target, tree: TreeSpec, **kwargs) -> Trace:
    """Run ``tree_stream`` to the end and return the finished Trace (same arguments and errors)."""
    trace = None
    for trace in tree_stream(input_ids, drafter, target, tree, **kwargs):
        pass
    return trace
