"""Argmax drafts: any drafter proposing its most likely token instead of a draw from its q.

In a sampled run the drafter usually draws each draft x ~ q (Leviathan et al. 2023, Algorithm 1).
The same round stays exact when the drafter instead proposes d = argmax q: a deterministic
drafter's q is one-hot at d, so the acceptance test u < min(1, p(d) / 1) keeps d with probability
p(d), and the correction comes from norm(max(0, p - onehot(d))), which is p with d removed and
renormalised. The emitted token is then d with probability p(d), and any other x with probability
(1 - p(d)) p(x) / (1 - p(d)) = p(x): the target's law (the same identity as Leviathan et al. 2023,
Appendix A.1, with q one-hot). Nothing of the drafter's q is needed by the judge but d.

Whether it pays is a measurement, not a theorem: per draft it is accepted with probability p(d)
where a sampled draft is accepted with beta = sum_x min(p(x), q(x)) on average (Leviathan et al.
2023, Def. 3.1); p(d) is the larger where the target puts its mass on the drafter's favourite, and
an argmax draft spares the drafter's warpers and its draw.

``ArgmaxDrafts`` wraps any drafter: it hands the wrapped one a greedy request (the run's repetition
penalty kept, so its argmax is the argmax of the processed q: temperature, top-k and top-p never
move the most likely token) and delegates every other verb unchanged. The loops know nothing of it.
Token trees are not offered: a tree's children are judged by the tree's own rule.
"""

from __future__ import annotations

import dataclasses

import torch
from transformers import LogitsProcessorList

from specviz.engine.drafter import Drafter, DraftRequest, Proposal, UnsupportedDrafting
from specviz.engine.sampling import Sampling

RULES = ("sampled", "argmax")


def argmax_request(request: DraftRequest) -> DraftRequest:
    """``request`` with greedy sampling (its repetition penalty kept) and no warpers."""
    sampling = Sampling(temperature=0.0, repetition_penalty=request.sampling.repetition_penalty)
    return dataclasses.replace(request, sampling=sampling, warpers=LogitsProcessorList())


class ArgmaxDrafts(Drafter):
    """``drafter`` proposing argmax q at every draft (module docstring: exact, q one-hot).

    Args:
        drafter: any ``specviz.engine.drafter.Drafter``.
        kind: the kind it is known by (the menu's "argmax" for the drafter model's argmax drafts); None: the
            wrapped drafter's.

    Raises:
        UnsupportedDrafting: from ``propose_tree`` and ``settle_tree`` (chains only; ``drafts_trees`` False).
    """

    drafts_trees = False  # a tree's children are judged by the tree's own rule
    refuses_trees = "argmax drafts are offered for chains; a token tree's children are judged by the tree's own rule"

    def __init__(self, drafter: Drafter, kind: str | None = None):
        self.inner = drafter
        self.kind = kind or drafter.kind
        self.models = drafter.models
        self.reads_target_features = drafter.reads_target_features

    @property
    def passes(self) -> int:
        return self.inner.passes

    @property
    def forced_model(self):
        return None  # a teacher-forced pass gives the drafter's q, not the one-hot q of its argmax drafts

    def fork(self) -> "ArgmaxDrafts":
        return ArgmaxDrafts(self.inner.fork(), self.kind)

    def prepare(self, vocab: int, cached: str) -> None:
        self.inner.prepare(vocab, cached)

    def start(self, seq: torch.Tensor, n: int, vocab: int, cached: str) -> None:
        self.inner.start(seq, n, vocab, cached)

    def propose(self, request: DraftRequest) -> Proposal:
        return self.inner.propose(argmax_request(request))

    def rollback(self, length: int) -> None:
        self.inner.rollback(length)

    def observe_target(self, start: int, hidden: torch.Tensor) -> None:
        self.inner.observe_target(start, hidden)

    def release(self) -> None:
        self.inner.release()

    @property
    def engine_note(self) -> str:
        return self.inner.engine_note

    def propose_tree(self, request, spec, depth):
        raise UnsupportedDrafting(self.refuses_trees)

    def settle_tree(self, seq: torch.Tensor, n: int, fed: list[int], length: int, compaction: str) -> None:
        raise UnsupportedDrafting(self.refuses_trees)

    def start_batch(self, seqs: list[torch.Tensor], lengths: list[int], vocab: int) -> None:
        self.inner.start_batch(seqs, lengths, vocab)

    def propose_batch(self, requests: list[DraftRequest]) -> list[Proposal]:
        return self.inner.propose_batch([argmax_request(r) for r in requests])

    def rollback_batch(self, lengths: list[int]) -> None:
        self.inner.rollback_batch(lengths)

    def keep_rows(self, rows: list[int]) -> None:
        self.inner.keep_rows(rows)

    def observe_target_batch(self, rows: list[tuple[int, torch.Tensor]]) -> None:
        self.inner.observe_target_batch(rows)

    def describe(self) -> dict:
        return {**self.inner.describe(), "kind": self.kind, "drafts": "argmax"}


def with_rule(drafter: Drafter, rule: str) -> Drafter:
    """``drafter`` drafting by ``rule``: "sampled" (as it is) or "argmax" (``ArgmaxDrafts``).

    Raises:
        ValueError: another rule.
    """
    if rule == "sampled":
        return drafter
    if rule == "argmax":
        return drafter if isinstance(drafter, ArgmaxDrafts) else ArgmaxDrafts(drafter)
    raise ValueError(f"the draft rule must be one of {', '.join(RULES)}, got {rule!r}")
