"""The drafter interface: what the speculative loops ask of any drafter.

In the spirit of transformers' ``CandidateGenerator``: a drafter proposes up to gamma tokens with
the distribution q each was drawn from, and is told, after verification, how much of the sequence
stands (``rollback``). The loops in ``specviz.engine`` know only this interface, so a drafter
model, prompt lookup, early exit and EAGLE go through the same verification, the same trace and
the same exactness tests; the kinds themselves live in ``specviz.drafters``, and no engine module
asks which kind it holds.

Token trees (``specviz.engine.tree.loop``) ask two more verbs: ``propose_tree`` (the round's tree,
grown with the helpers of ``specviz.engine.tree.draft``) and ``settle_tree`` (the accepted path is
known: keep it in the drafter's cache, drop the rest). A drafter that cannot draft trees leaves
``propose_tree`` as it is and raises TypeError.

A drafter that reads the target's features (EAGLE) sets ``reads_target_features``; the loops then
hand it the target's features of every position they keep (``observe_target``,
``observe_target_batch``).

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
from typing import TYPE_CHECKING

import torch

from specviz.engine import rejection
from specviz.engine.sampling import Sampling

if TYPE_CHECKING:
    from specviz.engine.tree.spec import TreeSpec


@dataclass(kw_only=True)
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
        own_tokens, shared_mass: for a drafter with its own tokenizer, per draft its own id of the
            token and the mass its distribution put on the tokens both vocabularies share, else None.
    """

    q: torch.Tensor
    sources: list[int] | None = None
    features_from: int | None = None
    own_tokens: list[int] | None = None
    shared_mass: list[float] | None = None

    @property
    def count(self) -> int:
        return int(self.q.shape[0])


@dataclass
class DraftTree:
    """A drafted tree; nodes in depth order, each parent before its children.

    Attributes:
        tokens: (N,) LongTensor on the device.
        parents: per node, its parent's index, or -1 for the pending token's children.
        depths: per node, 1 for the pending token's children.
        q: (N, vocab) float32: each node's q at its parent (the distribution it was drawn from,
            or for top-k children the one they were ranked by); None for prompt lookup (one-hot).
        rule: "with-replacement" (children i.i.d. from q) or "without-replacement" (distinct, fixed children).
        sources: prompt lookup's copy positions per node, else None.
        fed: per node, its slot in the drafter's cache after the prefix (fed to expand it), else -1.
        features_from: an EAGLE head's tree: the sequence position whose target feature it grew
            from; else None.
    """

    tokens: torch.Tensor
    parents: list[int]
    depths: list[int]
    q: torch.Tensor | None
    rule: str
    sources: list[int] | None = None
    fed: list[int] | None = None
    features_from: int | None = None

    @property
    def size(self) -> int:
        return len(self.parents)


class UnsupportedDrafting(TypeError):
    """A drafter asked for a way of drafting it does not offer (a token tree from a drafter of chains only), refused
    by name before the run starts."""


class Drafter(ABC):
    """A source of drafts for speculative decoding.

    Subclasses set ``kind`` ("model", "ngram" or "early-exit") and ``models`` (the models whose
    context and device the run must respect; empty for prompt lookup), and say what they offer:
    ``drafts_trees`` (``propose_tree`` and ``settle_tree``) and ``reads_target_features``. Every
    drafter drafts chains, and batches (by default one fork per row).
    """

    kind: str = ""
    models: tuple = ()
    reads_target_features: bool = False  # True: the loops hand it the target's features (observe_target)
    drafts_trees: bool = False  # True: it drafts token trees (propose_tree, settle_tree)

    @property
    def forced_model(self):
        """The causal LM whose one pass over a text gives this drafter's q at every position of it (teacher forcing,
        ``specviz.engine.tree.calibration.calibrate_forced``), or None where drafts need a run (prompt lookup, EAGLE,
        a drafter with its own tokenizer)."""
        return None
    _forks: list["Drafter"] | None = None  # the rows' drafters under the default batching

    def prepare(self, vocab: int, cached: str) -> None:
        """Before a run's clock starts: make ready what does not depend on the prompt (a model's captured CUDA graphs,
        ``specviz.engine.graphs.hold``), so that a capture is not timed as the run's prefill. Default: nothing."""

    @abstractmethod
    def start(self, seq: torch.Tensor, n: int, vocab: int, cached: str) -> None:
        """Prepare for a run whose first ``n`` tokens of ``seq`` are settled (the prompt but its last token)."""

    @abstractmethod
    def propose(self, request: DraftRequest) -> Proposal:
        """Propose between 0 and ``request.gamma`` drafts (0: the round verifies no drafts)."""

    def rollback(self, length: int) -> None:
        """The sequence stands to ``length`` tokens; forget anything after it (a KV cache, say)."""

    def release(self) -> None:
        """The run is over: give back what ``start`` took that another run may need (a model's captured
        graphs, ``specviz.engine.graphs.hold``). Default: nothing."""

    @property
    def engine_note(self) -> str:
        """What the run should say of this drafter's passes (its graphs captured now, or why not graphs on a
        GPU), else ""."""
        return ""

    def observe_target(self, start: int, hidden: torch.Tensor) -> None:
        """The target's features f_t for positions start .. start + k - 1, ``hidden`` (k, H); asked
        only of a drafter that sets ``reads_target_features``."""

    # ---- token trees ---------------------------------------------------------------------

    def propose_tree(self, request: DraftRequest, spec: "TreeSpec", depth: int) -> DraftTree:
        """The round's token tree, no deeper than ``depth`` (1 <= depth <= spec.depth), its nodes'
        tokens not written into ``request.seq`` (the loop writes the accepted path).

        Raises:
            UnsupportedDrafting: this drafter cannot draft trees (the default; ``drafts_trees`` False).
        """
        raise UnsupportedDrafting(refuse_trees(self))

    def settle_tree(self, seq: torch.Tensor, n: int, fed: list[int], length: int, compaction: str) -> None:
        """A tree round is judged: ``seq`` now stands to ``length`` tokens (n were settled before
        the round); ``fed`` lists, in path order, the cache slots after the n settled tokens of the
        accepted nodes this drafter fed while drafting (``DraftTree.fed``); ``compaction`` as
        ``specviz.engine.tree.attention.compact``. Keep those, forget the rest. Default: nothing
        (a drafter without a cache)."""

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
            drafter.start(seq, n, vocab, "dynamic")

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

    def observe_target_batch(self, rows: list[tuple[int, torch.Tensor]]) -> None:
        """Per row still in the batch, (start, (k, H)): the target's features of that row's positions
        start .. start + k - 1, handed to the row's drafter (``observe_target``)."""
        for drafter, (start, hidden) in zip(self._forks, rows):
            drafter.observe_target(start, hidden)

    def describe(self) -> dict:
        """What the trace records of this drafter (its kind and parameters), JSON-ready."""
        return {"kind": self.kind}

    @staticmethod
    def empty(request: DraftRequest) -> torch.Tensor:
        """A (0, vocab) q: no drafts this round."""
        return torch.zeros(0, request.vocab, dtype=torch.float32, device=request.seq.device)


def refuse_trees(drafter: Drafter) -> str:
    """Why ``drafter`` cannot draft a token tree, naming it: its own ``refuses_trees`` reason where it has one."""
    reason = getattr(drafter, "refuses_trees", "")
    return reason or ("token trees need a drafter model, early exit, an EAGLE head or prompt lookup, got "
                      f"{type(drafter).__name__}")


def check_trees(drafter: Drafter) -> None:
    """Refuse, before a tree run starts, a drafter that does not draft trees.

    Raises:
        UnsupportedDrafting: ``drafter.drafts_trees`` is False.
    """
    if not drafter.drafts_trees:
        raise UnsupportedDrafting(refuse_trees(drafter))
