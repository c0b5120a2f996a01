"""The drafter interface: what the speculative loop asks of any drafter.

In the spirit of transformers' ``CandidateGenerator``: a drafter proposes up to gamma tokens with
the distribution q each was drawn from, and is told, after verification, how much of the sequence
stands (``rollback``). The loop in ``specviz.engine.chain`` knows only this interface, so a drafter
model, prompt lookup and early exit go through the same verification, the same trace and the
same exactness tests.

Batches (``specviz.engine.batch``) ask the same of a drafter, for several sequences at once:
``start_batch``, ``propose_batch`` (one DraftRequest per row, one Proposal back per row),
``rollback_batch`` and ``keep_rows``. By default each row drafts through its own copy of the
drafter (``fork``), one row after the other, with the single-sequence verbs: any drafter
batches, and each row is exactly its single-sequence run. A drafter model overrides them to
draft for every row in one forward pass per draft step.

Exactness needs one thing of a drafter: each draft x_i is a draw from the q_i it reports, given
the sequence before it (a deterministic drafter reports a one-hot q). Then u < min(1, p/q) and the
residual norm(max(0, p - q)) give the target's law (Leviathan et al. 2023, Appendix A.1), whatever
the drafter and however many drafts it proposes.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specviz.engine import rejection
from specviz.engine.sampling import Sampling


@dataclass
class DraftRequest:
    """What a drafter is given each round.

    Attributes:
        seq: 1-D LongTensor on the device holding the sequence; positions < n are settled, the
            drafter writes its drafts at n, n + 1, ...
        n: the settled length (the prompt and the output so far).
        gamma: the most drafts this round may propose (>= 1).
        history: the same n settled token ids on the host (prompt lookup searches them).
        sampling, warpers: the run's sampling settings and their processors.
        gen: the run's torch.Generator (every random draw of the run comes from it).
        vocab: logits columns in use.
        keep_drafting: the gamma schedule's test after each draft, given the drafter's
            distribution there (shape (1, vocab): q, or under greedy decoding, where q is one-hot,
            the softmax of the drafter's logits): False ends the round's drafting (a confidence
            threshold); a model drafter asks it.
        steps: the round's steps (``specviz.engine.rejection.Steps``); a drafter model draws each
            draft with ``steps.draft_token``.
    """

    seq: torch.Tensor
    n: int
    gamma: int
    history: list[int]
    sampling: Sampling
    warpers: object
    gen: torch.Generator
    vocab: int
    keep_drafting: Callable[[torch.Tensor], bool]
    steps: rejection.Steps = rejection.EXACT


@dataclass
class Proposal:
    """A round's drafts, written into ``seq[n : n + count]``.

    Attributes:
        q: (count, vocab) float32 on the device: the distribution each draft was drawn from.
        sources: per draft, the position in the sequence it was copied from (prompt lookup),
            else None.
        features_from: for a drafter that reads the target's features (EAGLE), the sequence
            position whose target feature the drafts grew from, else None.
    """

    q: torch.Tensor
    sources: list[int] | None = None
    features_from: int | None = None

    @property
    def count(self) -> int:
        return int(self.q.shape[0])


class Drafter(ABC):
    """A source of drafts for speculative decoding.

    Subclasses set ``kind`` ("model", "ngram" or "early-exit") and ``models`` (the models whose
    context and device the run must respect; empty for prompt lookup).
    """

    kind: str = ""
    models: tuple = ()
    _forks: list["Drafter"] | None = None  # the rows' drafters under the default batching

    @abstractmethod
    def start(self, seq: torch.Tensor, n: int, vocab: int, cached: bool) -> None:
        """Prepare for a run whose first ``n`` tokens of ``seq`` are settled (the prompt but its last token)."""

    @abstractmethod
    def propose(self, request: DraftRequest) -> Proposal:
        """Propose between 0 and ``request.gamma`` drafts (0: the round verifies no drafts)."""

    def rollback(self, length: int) -> None:
        """The sequence stands to ``length`` tokens; forget anything after it (a KV cache, say)."""

    @property
    def passes(self) -> int:
        """Forward passes of the drafter's models since the last ``start`` or ``start_batch``,
        prefill included (0 for a drafter without a model; under the default batching, the
        rows' passes added up)."""
        return sum(f.passes for f in self._forks) if self._forks else 0

    # ---- batches -------------------------------------------------------------------------

    def fork(self) -> "Drafter":
        """A drafter for one row of a batch under the default batching: a shallow copy, sharing
        models and parameters. Override when a copy must not share some mutable state."""
        twin = copy.copy(self)
        twin._forks = None
        return twin

    def start_batch(self, seqs: list[torch.Tensor], lengths: list[int], vocab: int) -> None:
        """Prepare for a batch: row i's first ``lengths[i]`` tokens of ``seqs[i]`` are settled."""
        self._forks = [self.fork() for _ in seqs]
        for drafter, seq, n in zip(self._forks, seqs, lengths):
            drafter.start(seq, n, vocab, True)

    def propose_batch(self, requests: list[DraftRequest]) -> list[Proposal]:
        """One Proposal per row still in the batch (``requests`` in the rows' order), each as
        ``propose`` would give it for that row alone, its drafts written into the row's seq."""
        return [drafter.propose(request) for drafter, request in zip(self._forks, requests)]

    def rollback_batch(self, lengths: list[int]) -> None:
        """Row i's sequence stands to ``lengths[i]`` tokens; forget anything after it."""
        for drafter, length in zip(self._forks, lengths):
            drafter.rollback(length)

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only these rows (by index among the rows still in the batch): the others finished."""
        self._forks = [self._forks[i] for i in rows]

    def describe(self) -> dict:
        """What the trace records of this drafter (its kind and parameters), JSON-ready."""
        return {"kind": self.kind}

    @staticmethod
    def empty(request: DraftRequest) -> torch.Tensor:
        """A (0, vocab) q: no drafts this round."""
        return torch.zeros(0, request.vocab, dtype=torch.float32, device=request.seq.device)
