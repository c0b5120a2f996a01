"""The drafter model: a smaller causal LM sampling each draft from its processed q (Leviathan et al. 2023).

It lives in the engine because the loops take a plain causal LM as the drafter too (``as_drafter`` wraps it);
``specviz.drafters`` re-exports both beside the other kinds.
"""

from __future__ import annotations

import torch

from specviz.engine.batch_runner import BatchRunner, left_padded, positions
from specviz.engine.drafter import Drafter, DraftRequest, Proposal
from specviz.engine.runner import ModelRunner, make_runner
from specviz.engine.sampling import contexts, row_contexts
from specviz.engine.tree.attention import compact
from specviz.engine.tree.draft import DraftTree, ModelExpander, grow_tree
from specviz.engine.tree.spec import TreeSpec


class ModelDrafter(Drafter):
    """Drafts with a causal LM that shares the target's tokenizer, one forward pass per draft.

    Args:
        model: a transformers causal LM on the target's device, in eval mode.

    Each draft is drawn from the model's q after the run's sampling processors (the same ones the
    target's p goes through), through ``rejection.draft_token`` (via the request's ``steps``), which returns
    the q it drew from.
    In a batch, every row drafts in the same passes (``propose_batch``). A token tree grows one
    masked pass per level (``specviz.engine.tree.draft.ModelExpander``).
    """

    kind = "model"

    def __init__(self, model):
        self.model = model
        self.models = (model,)
        self.runner: ModelRunner | None = None
        self.batch: BatchRunner | None = None
        self.fed: list[int] = []  # per row of a batch: tokens of its sequence in the drafter's cache
        # per row: (cache column, position) of this round's drafts fed
        self.fed_columns: list[list[tuple[int, int]]] = []

    @property
    def forced_model(self):
        """The drafter's model: its one pass over a text gives q at every position (early exit and the int8 target
        too)."""
        return self.model

    @property
    def passes(self) -> int:
        runner = self.batch or self.runner
        return runner.passes if runner is not None else 0

    def prepare(self, vocab: int, cached: str) -> None:
        self.runner = make_runner(self.model, vocab, cached, role="drafter")
        self._prepared = (vocab, cached)

    def start(self, seq: torch.Tensor, n: int, vocab: int, cached: str) -> None:
        self.batch = None
        if getattr(self, "_prepared", None) != (vocab, cached):  # not prepared for this run: its runner now
            self.prepare(vocab, cached)
        self._prepared = None  # a later run prepares its own
        self.runner.prefill(seq, n)

    def propose(self, request: DraftRequest) -> Proposal:
        r, seq, n = request, request.seq, request.n
        q_rows = []
        for i in range(r.gamma):
            ctx = contexts(seq, [n + i], r.vocab) if r.sampling.needs_context else None
            logits = self.runner.logits(seq, n + i, 1)
            token, q = r.steps.draft_token(logits, r.sampling, r.warpers, r.gen, ctx)
            q_rows.append(q)
            seq[n + i] = token[0]
            # Greedy q is one-hot, which says nothing of confidence: the schedule then reads the
            # drafter's softmax at temperature 1 instead.
            if i + 1 < r.gamma and not r.keep_drafting(
                torch.softmax(logits.float(), dim=-1) if r.sampling.greedy else q
            ):
                break
        return Proposal(q=torch.cat(q_rows) if q_rows else self.empty(r))

    def rollback(self, length: int) -> None:
        self.runner.rollback(length)

    def release(self) -> None:
        if self.runner is not None:
            self.runner.release()

    @property
    def engine_note(self) -> str:
        return self.runner.note if self.runner is not None else ""

    # ---- token trees: one masked pass per level --------------------------------------------

    drafts_trees = True  # propose_tree and settle_tree below

    def propose_tree(self, request: DraftRequest, spec: TreeSpec, depth: int) -> DraftTree:
        return grow_tree(ModelExpander(self.runner, request), request, spec, depth)

    def settle_tree(self, seq: torch.Tensor, n: int, fed: list[int], length: int, compaction: str) -> None:
        """Compact the cache to the prefix and the accepted nodes it fed (``specviz.engine.tree.attention.compact``)."""
        compact(self.runner, seq, n, fed, compaction)

    # ---- batches: one pass per draft step for every row ------------------------------------

    def start_batch(self, seqs: list[torch.Tensor], lengths: list[int], vocab: int) -> None:
        self.runner = None
        self.batch = BatchRunner(self.model, vocab, len(seqs))
        self.batch.prefill(seqs, lengths)
        self.fed = list(lengths)
        self.fed_columns = [[] for _ in seqs]

    def propose_batch(self, requests: list[DraftRequest]) -> list[Proposal]:
        """Draft for every row, one pass per draft step.

        The first pass feeds each row what the drafter's cache lacks (the pending token, and the
        last draft of a round whose drafts were all accepted), left-padded; each later pass feeds
        every row's newest draft. A row whose gamma is reached, or whose schedule says stop,
        rides along masked. Row i draws from its own ``requests[i].gen`` in the order
        ``propose`` draws, so each row drafts as it would alone.
        """
        device = self.batch.mask.device
        first = requests[0]
        sampling, warpers, vocab = first.sampling, first.warpers, first.vocab
        missing, valid = left_padded([r.seq[f : r.n] for r, f in zip(requests, self.fed)], device)
        logits = self.batch.feed(missing, valid, positions(self.fed, valid, left=True), 1)[:, -1]
        self.fed = [r.n for r in requests]
        self.fed_columns = [[] for _ in requests]
        q_rows: list[list[torch.Tensor]] = [[] for _ in requests]
        drafting = [r.gamma > 0 for r in requests]
        step = 0
        while any(drafting):
            rows = [i for i, d in enumerate(drafting) if d]
            sub = logits[rows]
            ctx = (
                row_contexts([(requests[i].seq, requests[i].n + step) for i in rows], vocab)
                if sampling.needs_context
                else None
            )
            tokens, q = first.steps.draft_token(sub, sampling, warpers, [requests[i].gen for i in rows], ctx)
            # Greedy q is one-hot, which says nothing of confidence: the schedule reads the softmax then.
            sure = torch.softmax(sub.float(), dim=-1) if sampling.greedy else q
            for j, i in enumerate(rows):
                r = requests[i]
                q_rows[i].append(q[j : j + 1])
                r.seq[r.n + step] = tokens[j]
                if step + 1 >= r.gamma or not r.keep_drafting(sure[j : j + 1]):
                    drafting[i] = False
            if not any(drafting):
                break
            feeding = torch.tensor([[d] for d in drafting], device=device)
            last = torch.stack([r.seq[r.n + step] for r in requests])[:, None]
            column = self.batch.columns
            for i, r in enumerate(requests):
                if drafting[i]:
                    self.fed_columns[i].append((column, r.n + step))
                    self.fed[i] = r.n + step + 1
            at = torch.tensor([[r.n + step if d else 0] for r, d in zip(requests, drafting)], device=device)
            logits = self.batch.feed(last * feeding, feeding, at, 1)[:, -1]
            step += 1
        return [Proposal(q=torch.cat(rows) if rows else self.empty(r)) for rows, r in zip(q_rows, requests)]

    def rollback_batch(self, lengths: list[int]) -> None:
        """Mask the columns of drafts past each row's length (``DynamicCache.crop`` would cut every row)."""
        for i, length in enumerate(lengths):
            self.batch.forget(i, [column for column, position in self.fed_columns[i] if position >= length])
            self.fed[i] = min(self.fed[i], length)

    def keep_rows(self, rows: list[int]) -> None:
        self.batch.keep(rows)
        self.fed = [self.fed[i] for i in rows]
        self.fed_columns = [self.fed_columns[i] for i in rows]


def as_drafter(drafter) -> Drafter:
    """A Drafter as is; a transformers causal LM as a ``ModelDrafter``.

    Raises:
        TypeError: neither.
    """
    if isinstance(drafter, Drafter):
        return drafter
    if hasattr(drafter, "config") and callable(drafter):
        return ModelDrafter(drafter)
    raise TypeError(f"drafter must be a specviz Drafter or a transformers causal LM, got {type(drafter).__name__}")
