"""The drafter model: a smaller causal LM sampling each draft from its processed q (Leviathan et al. 2023)."""

from __future__ import annotations

import torch

from specviz import rejection
from specviz.drafters.base import Drafter, DraftRequest, Proposal
from specviz.runner import ModelRunner
from specviz.sampling import contexts


class ModelDrafter(Drafter):
    """Drafts with a causal LM that shares the target's tokenizer, one forward pass per draft.

    Args:
        model: a transformers causal LM on the target's device, in eval mode.

    Each draft is drawn from the model's q after the run's sampling processors (the same ones the
    target's p goes through), through ``rejection.draft_token``, which returns the q it drew from.
    """

    kind = "model"

    def __init__(self, model):
        self.model = model
        self.models = (model,)
        self.runner: ModelRunner | None = None

    def start(self, seq: torch.Tensor, n: int, vocab: int, cached: bool) -> None:
        self.runner = ModelRunner(self.model, vocab, cached)
        self.runner.prefill(seq, n)

    def propose(self, request: DraftRequest) -> Proposal:
        r, seq, n = request, request.seq, request.n
        q_rows = []
        for i in range(r.gamma):
            ctx = contexts(seq, [n + i], r.vocab) if r.sampling.needs_context else None
            logits = self.runner.logits(seq, n + i, 1)
            token, q = rejection.draft_token(logits, r.sampling, r.warpers, r.gen, ctx)
            q_rows.append(q)
            seq[n + i] = token[0]
            # Greedy q is one-hot, which says nothing of confidence: the schedule then reads the
            # drafter's softmax at temperature 1 instead.
            if i + 1 < r.gamma and not r.keep_drafting(torch.softmax(logits.float(), dim=-1) if r.sampling.greedy else q):
                break
        return Proposal(q=torch.cat(q_rows) if q_rows else self.empty(r))

    def rollback(self, length: int) -> None:
        self.runner.rollback(length)
