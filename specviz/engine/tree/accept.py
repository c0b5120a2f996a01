"""The exact acceptance rules for a token tree, each node's siblings judged in order.

Two kinds of children, two rules (p' starts as the target's p at the parent):

Both are recursive rejection sampling (Jeon et al. 2024, "Recursive Speculative Decoding"):

- With replacement ("with-replacement"): children drawn i.i.d. from q, as SpecInfer's multi-step
  speculative sampling (Miao et al. 2024, Algorithm 2 / Theorem 4.2). Child x is accepted when
  u < min(1, p'(x)/q(x)); after a rejection p' <- norm(max(0, p' - q)); when every child is
  rejected the correction comes from the last p'. Exact only for children that are draws from q.
- Without replacement ("without-replacement"): distinct children fixed before the target's draws
  (top-k of q, prompt lookup's branches, as EAGLE and SGLang verify them). Each child is tested as
  a draft whose q is one-hot at it: x is accepted when u < p'(x); a rejected x is removed from p'
  (zeroed, renormalised) before the next sibling; after all, the correction comes from the last
  p'. Exact for any candidate list.
- Greedy decoding is either rule with a one-hot p: the accepted path is the target's argmax path.

The round descends into the accepted child's subtree; the bonus or correction token comes at the
first node where no child is accepted (from p at a leaf, from the last residual elsewhere).

Every node's siblings are judged at once on the device, whether or not the walk reaches the node
(each node has its own u's, so judging unreached ones changes nothing of the law), and the round
comes home in one transfer. ``judge`` takes a ``TreeFault`` (default: none), so the exactness lab
and its tests can run a known fault in their own runs (``specviz.lab.tree_faults``) without
replacing anything another run calls. Greedy decoding has ``judge_greedy``: the same verdicts and
records from each slot's argmax alone (with p one-hot at a, a rejected sibling x != a leaves p' at a,
so every residual stays one-hot and no vocabulary-wide row is needed).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from specviz.engine import rejection
from specviz.trace.tree import WITH_REPLACEMENT


@dataclass(frozen=True)
class TreeFault:
    """Departures from the exact rules, each seen in a public implementation, for the exactness
    lab's controls (``specviz.lab.tree_faults`` names them); all False/None: the exact rules.

    Attributes:
        against_p: test every sibling against the target's p instead of the residual p' its
            earlier siblings left.
        rule: judge the children by this rule whatever they were drafted for (None: their own).
        unnormalised: leave the residual after a rejected sibling unnormalised.
        window_ignored: the target's verify pass ignores its sliding window (its tree mask lets a
            node see prefix positions and ancestors further back than the window; read by the tree
            loop, not by ``judge``).
    """

    against_p: bool = False
    rule: str | None = None
    unnormalised: bool = False
    window_ignored: bool = False


NO_FAULT = TreeFault()


def normalise(r: torch.Tensor, fallback: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(r) row by row, each row's mass before); rows of mass 0 take ``fallback`` (p' == q:
    the next sibling is then accepted with probability 1, and no NaN appears)."""
    mass = r.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(1e-30), fallback), mass[:, 0]


def sibling_levels(parents: list[int], device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Siblings in the order they are judged: for k = 0, 1, ..., the slots with a k-th child and
    those children, as two (rows,) LongTensors; every node's earlier siblings come in earlier levels."""
    kids: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        kids.setdefault(parent + 1, []).append(i)
    for k in range(max((len(v) for v in kids.values()), default=0)):
        slots = [s for s, v in kids.items() if len(v) > k]
        yield (torch.tensor(slots, dtype=torch.long, device=device),
               torch.tensor([kids[s][k] for s in slots], dtype=torch.long, device=device))


def judge(p_all: torch.Tensor, tokens: torch.Tensor, parents: list[int], q: torch.Tensor | None, rule: str,
          greedy: bool, gen: torch.Generator, fault: TreeFault = NO_FAULT) -> dict[str, torch.Tensor]:
    """Judge every node's children and draw each node's final token.

    Slots: 0 is the pending token (the root), node i is slot i + 1.

    Args:
        p_all: (N + 1, V) the target's processed p at every slot (the verify pass).
        tokens: (N,) the nodes' tokens; parents: per node, its parent node (-1: the root).
        q: (N, V) each node's q at its parent, or None (prompt lookup's copies, q one-hot).
        rule: "with-replacement" or "without-replacement" (``specviz.trace.tree``); greedy: finals are argmaxes; gen:
        draws u, then finals.
        fault: a departure from the exact rules (the lab's controls); NO_FAULT in every real run.

    Returns (device tensors, by name):
        u, p, p_residual, q, accept_prob, mass, accepted: (N,) per node, its test as if reached.
        accepted_child: (N + 1,) per slot, the slot of its accepted child, or -1.
        finals, final_probs: (N + 1,) per slot, a token from its last p' and that token's probability.
        residual: (N + 1, V) the last p' of every slot (p where nothing was rejected).
    """
    n, device = tokens.shape[0], p_all.device
    rule = fault.rule or rule
    u = torch.rand(n, generator=gen, device=device)
    residual = p_all.clone()
    accepted_child = torch.full((p_all.shape[0],), -1, dtype=torch.long, device=device)
    open_ = torch.ones(p_all.shape[0], dtype=torch.bool, device=device)  # no child accepted yet
    share = torch.ones(p_all.shape[0], device=device)  # share of p the rejected siblings left
    out = {key: torch.zeros(n, device=device) for key in ("p", "p_residual", "q", "accept_prob", "mass")}
    out["accepted"] = torch.zeros(n, dtype=torch.bool, device=device)
    for rows, nodes in sibling_levels(parents, device):
        x = tokens[nodes]
        p_x = p_all[rows, x]
        pres_x = residual[rows, x]
        ref_x = p_x if fault.against_p else pres_x  # a sibling meets the residual p', not p
        q_rows = q[nodes] if q is not None else None
        q_x = q_rows.gather(1, x[:, None])[:, 0] if q_rows is not None else torch.ones_like(p_x)
        if rule == WITH_REPLACEMENT:
            # u < min(1, p'/q) as u q < p': no division, and the strict "<" never keeps p'(x) = 0.
            ok = rejection.accept(u[nodes], q_x, ref_x)
            prob = torch.where(q_x > 0, (ref_x / q_x.clamp_min(1e-30)).clamp_max(1.0), torch.zeros_like(q_x))
            update = (
                (residual[rows] - q_rows).clamp_min(0.0)
                if q_rows is not None
                else residual[rows].scatter(1, x[:, None], 0.0)
            )
        else:
            ok = u[nodes] < ref_x
            prob = ref_x
            update = residual[rows].scatter(1, x[:, None], 0.0)
        tested = open_[rows]
        ok = ok & tested
        rejected = tested & ~ok
        new, mass = normalise(update, residual[rows])
        if fault.unnormalised:
            new = update
        for key, value in (
            ("p", p_x),
            ("p_residual", pres_x),
            ("q", q_x),
            ("accept_prob", prob),
            ("mass", share[rows]),
        ):
            out[key][nodes] = value.float()
        out["accepted"][nodes] = ok
        residual[rows] = torch.where(rejected[:, None], new, residual[rows])
        share[rows] = torch.where(rejected, share[rows] * mass.clamp(0.0, 1.0), share[rows])
        accepted_child[rows] = torch.where(ok, nodes + 1, accepted_child[rows])
        open_[rows] = open_[rows] & ~ok
    finals = rejection.sample_rows(residual, greedy, gen)
    out.update(
        u=u,
        accepted_child=accepted_child,
        finals=finals,
        final_probs=residual.gather(1, finals[:, None])[:, 0],
        residual=residual,
    )
    return out


def judge_greedy(
    best: torch.Tensor,
    tokens: torch.Tensor,
    parents: list[int],
    q: torch.Tensor | None,
    rule: str,
    gen: torch.Generator,
) -> dict[str, torch.Tensor]:
    """``judge`` for greedy decoding, from each slot's argmax: the same tensors but ``residual``.

    With p one-hot at a (the slot's argmax, ``Sampling.probs``' choice on ties), either rule
    accepts a child x exactly when x == a (u q(x) < 1 and u < 1 always hold; p'(x) = 0 never
    passes), and a rejected x != a leaves p' one-hot at a: without replacement p' - e_x is p',
    with replacement norm(max(0, e_a - q)) is e_a again, of mass 1 - q(a) (the siblings' ``mass``
    record). So no row of the vocabulary is needed: a tree round's judging and its p for every
    node (34 rows of 49,152 for the tree 3-2-2-1, about 12 ms on 2 CPU cores) become gathers of
    N values. tests/test_tree.py checks it against ``judge`` on one-hot p.

    Args:
        best: (N + 1,) the target's argmax at every slot (0: the pending token; node i is slot i + 1).
        tokens, parents, q, rule, gen: as ``judge`` (u is drawn from ``gen`` as there).

    Returns:
        As ``judge`` without ``residual``: u, p, p_residual, q, accept_prob, mass, accepted (N,);
        accepted_child, finals, final_probs (N + 1,).
    """
    n, device = tokens.shape[0], best.device
    u = torch.rand(n, generator=gen, device=device)
    slot_of_parent = torch.tensor(parents, dtype=torch.long, device=device) + 1
    a = best[slot_of_parent]  # each node's parent's argmax
    p_x = (tokens == a).float()
    q_x = q.gather(1, tokens[:, None])[:, 0].float() if q is not None else torch.ones_like(p_x)
    if rule == WITH_REPLACEMENT:
        passes = rejection.accept(u, q_x, p_x)
        prob = torch.where(q_x > 0, (p_x / q_x.clamp_min(1e-30)).clamp_max(1.0), torch.zeros_like(q_x))
        # mass of max(0, e_a - q) after a rejection (1 - p'(x) = 1 when q is one-hot at x, q None)
        left = (1.0 - q.gather(1, a[:, None])[:, 0].float()).clamp(0.0, 1.0) if q is not None else 1.0 - p_x
    else:
        passes, prob, left = u < p_x, p_x, 1.0 - p_x
    slots = best.shape[0]
    accepted_child = torch.full((slots,), -1, dtype=torch.long, device=device)
    open_ = torch.ones(slots, dtype=torch.bool, device=device)
    share = torch.ones(slots, device=device)
    mass = torch.zeros(n, device=device)
    accepted = torch.zeros(n, dtype=torch.bool, device=device)
    for rows, nodes in sibling_levels(parents, device):
        tested = open_[rows]
        ok = passes[nodes] & tested
        mass[nodes] = share[rows]
        accepted[nodes] = ok
        share[rows] = torch.where(tested & ~ok, share[rows] * left[nodes], share[rows])
        accepted_child[rows] = torch.where(ok, nodes + 1, accepted_child[rows])
        open_[rows] = open_[rows] & ~ok
    return dict(
        u=u,
        p=p_x,
        p_residual=p_x,
        q=q_x,
        accept_prob=prob,
        mass=mass,
        accepted=accepted,
        accepted_child=accepted_child,
        finals=best,
        final_probs=torch.ones(slots, device=device),
    )
