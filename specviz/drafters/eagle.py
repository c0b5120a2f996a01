"""The EAGLE drafter: drafts from the target's own features (Li et al. 2024).

A drafter model sees only tokens; the target's last hidden state f_t (the feature its output
layer reads) already holds most of what the next token depends on. EAGLE's head
(``specviz.drafters.eagle_head``) takes f_t and the embedding of the token after it and predicts
f_{t+1}; the target's own output layer, over a frequency-ranked subset of tokens, turns that into
q. The verify pass computes f_t at every position it scores, so the loop hands those features to
the drafter (``observe_target``) and no extra target pass is made.

A round, with n settled tokens (positions 0..n-1; token n-1, the last correction or bonus, not yet
seen by the target):

- catch up: feed the head (f_t, x_{t+1}) for every settled t <= n - 2 whose input it lacks, with
  the target's true features (the previous round's accepted drafts and the pending token), and
  read f^_{n-1}: q_1 for the first draft. The drafts therefore grow from the target's feature at
  position n - 2, the last the target scored and kept.
- draft: each draft x is fed back with the head's own predicted feature, (f^, x) -> next f^.
- rollback: the head's cache keeps only inputs made of true features.

q is the head's logits over its tokens, -inf elsewhere, through the run's sampling processors:
exactly 0 outside the head, so the residual norm(max(0, p - q)) supplies those tokens and the
output is still exactly the target's (Leviathan et al. 2023, Appendix A.1).

Token trees (EAGLE-2, Li et al. 2024): after the same catch-up, ``tree_features`` feeds a whole
level of tree nodes in one pass under the tree mask, each node with its parent's predicted feature
(the root's children with f^_{n-1}) at position n - 2 + depth, so each sees the true prefix and its
own ancestors only (``_EagleExpander``); ``propose_tree`` grows the tree with
``specviz.engine.tree.draft``, which ranks and keeps the nodes by the head's own confidence. The
target's tree pass returns the features of every node; the loop hands over those
of the accepted path (``observe_target``), and the next round's catch-up feeds them.

Batches: each row drafts through its own copy of the drafter (``fork``: the head shared, the
cache and the features its own), and the batch loop hands each row the target's features of its
own columns (``observe_target_batch``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch
from transformers import DynamicCache

from specviz.assets import ASSETS
from specviz.drafters.eagle_head import CONFIG, EagleHead
from specviz.engine.drafter import Drafter, DraftRequest, Proposal
from specviz.engine.sampling import contexts
from specviz.engine.tree.attention import float_mask
from specviz.engine.tree.draft import DraftTree, Expander, empty_tree, grow_tree
from specviz.engine.tree.spec import TreeSpec
from specviz.engine.gqa import use_shared_kv_heads

# Heads shipped with specviz, found by the target they were trained for (width, vocabulary).
HEAD_FOLDERS = (ASSETS / "models" / "smollm2-eagle",)


class EagleUnsupported(ValueError):
    """EAGLE was asked where it cannot draft (a target without a head)."""


def _fits(folder: Path, target) -> bool:
    import json

    path = folder / CONFIG
    if not path.exists():
        return False
    raw = json.loads(path.read_text())
    c = target.config
    return (
        getattr(c, "model_type", "") == "llama"
        and raw.get("hidden_size") == c.hidden_size
        and raw.get("target_vocab_size") == c.vocab_size
        and raw.get("num_attention_heads") == c.num_attention_heads
    )


def head_folder(target) -> Path | None:
    """The shipped head trained for a target of this shape, or None."""
    return next((f for f in HEAD_FOLDERS if _fits(f, target)), None)


@lru_cache(maxsize=4)
def _load(folder: str, dtype: torch.dtype) -> EagleHead:
    return EagleHead.load(Path(folder), dtype)


class EagleDrafter(Drafter):
    """Drafts with an EAGLE head over the target's features.

    Args:
        head: an ``EagleHead``; it is given the target's input table and output rows here.
        target: the run's target (its features arrive through ``observe_target``).

    Drafts chains (``propose``), token trees (``catch_up``, ``tree_features``, through
    ``specviz.engine.tree.draft``) and batches (each row through its own ``fork``, handed its row's
    features by ``observe_target_batch``).
    """

    kind = "eagle"
    reads_target_features = True

    def __init__(self, head: EagleHead, target):
        dtype = next(target.parameters()).dtype
        self.head = head.to(device=target.device, dtype=dtype).share(target)
        use_shared_kv_heads(self.head.body)  # its tree passes are masked, as the target's (specviz.engine.gqa)
        self.target = target
        self.models = (target,)
        self.cache: DynamicCache | None = None
        self.fed = 0  # head inputs (f_t, x_{t+1}) in its cache made of true features: t < fed
        self.known = 0  # positions whose target feature is in self.feat
        self.feat: torch.Tensor | None = None  # (capacity, H) the target's features by position
        self._passes = 0
        self.grew_from: int | None = None  # the target position the last round's drafts grew from

    @classmethod
    def for_target(cls, target) -> "EagleDrafter":
        """The shipped head for ``target``.

        Raises:
            EagleUnsupported: no shipped head fits the target.
        """
        folder = head_folder(target)
        if folder is None:
            raise EagleUnsupported(
                "no EAGLE head is trained for this target (one ships for SmolLM2-135M-Instruct, "
                "the English pair's target); choose another drafter"
            )
        return cls(_load(str(folder), torch.float32), target)

    @property
    def passes(self) -> int:
        if self._forks is None:
            return self._passes
        return self._left_passes + sum(f.passes for f in self._forks)  # a batch's rows, those that left too

    def describe(self) -> dict:
        return {"kind": self.kind, "head_tokens": int(self.head.head_ids.numel())}

    # ---- the target's features ---------------------------------------------------------------

    def observe_target(self, start: int, hidden: torch.Tensor) -> None:
        """The target's features f_t for positions start .. start + k - 1: ``hidden`` (k, H)."""
        end = start + hidden.shape[0]
        if self.feat is None or self.feat.shape[0] < end:
            grown = torch.zeros(
                max(end, 2 * (0 if self.feat is None else self.feat.shape[0]), 64),
                hidden.shape[-1],
                dtype=hidden.dtype,
                device=hidden.device,
            )
            if self.feat is not None:
                grown[: self.feat.shape[0]] = self.feat
            self.feat = grown
        self.feat[start:end] = hidden
        self.known = end

    # ---- the Drafter verbs ----------------------------------------------------------------------

    def start(self, seq: torch.Tensor, n: int, vocab: int, cached: str) -> None:
        self._forks = None
        self.cache = DynamicCache()
        self.fed = 0
        self.known = 0
        self._passes = 0
        self.vocab = vocab
        self.grew_from = None
        ids = self.head.head_ids.to(self.target.device)
        self._keep = ids < vocab  # the head's tokens inside the run's vocabulary, and their columns
        self._columns = ids[self._keep]

    def _step(self, xs: torch.Tensor, feats: torch.Tensor, first: int) -> torch.Tensor:
        """Feed inputs t = first .. first + k - 1 (tokens x_{t+1} (k,), features (k, H)); the last f^ (1, H)."""
        self._passes += 1
        pos = torch.arange(first, first + xs.shape[0], device=xs.device)[None]
        out = self.head.features(xs[None], feats[None], past_key_values=self.cache, position_ids=pos)
        return out[0, -1:]

    def head_logits(self, f: torch.Tensor) -> torch.Tensor:
        """(k, vocab) float32 logits from predicted features f^ (k, H): the head's tokens scored, -inf
        elsewhere (q exactly 0 there)."""
        small = self.head.head_logits(f).float()
        logits = torch.full((f.shape[0], self.vocab), float("-inf"), device=f.device)
        logits[:, self._columns] = small[:, self._keep]
        return logits

    def catch_up(self, seq: torch.Tensor, n: int) -> torch.Tensor | None:
        """Feed the head every settled input it lacks, with the target's true features, and return
        f^_{n-1} (1, H), from which the round's first drafts are scored; None when no feature is
        settled yet (a one-token prompt, or a first round without a prefill). Sets ``grew_from``."""
        last = n - 2  # the last position whose target feature is settled
        if last < 0 or self.known <= last:
            return None
        t = torch.arange(self.fed, last + 1, device=seq.device)
        f = self._step(seq[t + 1], self.feat[self.fed : last + 1], self.fed)
        self.fed = last + 1
        self.grew_from = last
        return f

    def tree_features(
        self, xs: torch.Tensor, feats: torch.Tensor, positions: torch.Tensor, allow: torch.Tensor, new: int
    ) -> torch.Tensor:
        """One masked pass over a level of tree nodes; their predicted features f^ (new, H).

        Args:
            xs: (new,) long, the nodes' tokens; feats: (new, H) each node's parent's predicted feature
                (f^_{n-1} for the root's children); positions: (new,) each input's position,
                n - 2 + depth.
            allow: (S, S) bool ancestor-or-self matrix of every node fed this round, the new ones
                last (``specviz.engine.tree.attention.ancestor_matrix``), on the device.

        The head's cache must hold the true inputs (``catch_up``) and the round's earlier nodes;
        ``rollback`` drops the nodes after the round.
        """
        self._passes += 1
        mask = float_mask(self.fed, allow[-new:], self.head.fc.weight.dtype)
        out = self.head.features(
            xs[None], feats[None], past_key_values=self.cache, position_ids=positions[None], attention_mask=mask
        )
        return out[0]

    def propose(self, request: DraftRequest) -> Proposal:
        r, seq, n = request, request.seq, request.n
        if r.gamma < 1:
            return Proposal(q=self.empty(r))
        f = self.catch_up(seq, n)
        if f is None:
            return Proposal(q=self.empty(r))  # a one-token prompt: no feature yet
        q_rows = []
        for i in range(r.gamma):
            ctx = contexts(seq, [n + i], r.vocab) if r.sampling.needs_context else None
            logits = self.head_logits(f)
            token, q = r.steps.draft_token(logits, r.sampling, r.warpers, r.gen, ctx)
            q_rows.append(q)
            seq[n + i] = token[0]
            if i + 1 >= r.gamma or not r.keep_drafting(torch.softmax(logits, dim=-1) if r.sampling.greedy else q):
                break
            f = self._step(token, f, n - 1 + i)
        return Proposal(q=torch.cat(q_rows), features_from=self.grew_from)

    drafts_trees = True  # propose_tree and settle_tree below

    def propose_tree(self, request: DraftRequest, spec: TreeSpec, depth: int) -> DraftTree:
        """After the catch-up, a static or EAGLE-2 dynamic tree grown from f^_{n-1} (no nodes when no
        target feature is settled yet); ``features_from`` set to the position it grew from."""
        root = self.catch_up(request.seq, request.n)
        if root is None:  # no target feature settled yet: this round verifies no drafts
            return empty_tree(request)
        tree = grow_tree(_EagleExpander(self, request, root), request, spec, depth)
        if tree.size:
            tree.features_from = self.grew_from
        return tree

    def settle_tree(self, seq: torch.Tensor, n: int, fed: list[int], length: int, compaction: str) -> None:
        """Drop the round's nodes: the loop has handed over the accepted path's true features."""
        self.rollback(length - 1)

    def rollback(self, length: int) -> None:
        # Drop the inputs made of predicted features (every drafting step of the round) and the
        # features of positions the target scored but did not keep.
        held = self.cache.get_seq_length() if self.cache is not None else 0
        if held > self.fed:
            self.cache.crop(self.fed - held)  # a negative count removes that many (transformers 5)
        self.known = min(self.known, length)

    # ---- batches: each row drafts through its own copy (the default batching) -------------------

    def fork(self) -> "EagleDrafter":
        """A row's drafter: the head shared, its cache and the target's features its own."""
        twin = super().fork()
        twin.cache, twin.feat, twin.known, twin.fed = None, None, 0, 0
        return twin

    def start_batch(self, seqs, lengths, vocab) -> None:
        self._left_passes = 0
        super().start_batch(seqs, lengths, vocab)

    def keep_rows(self, rows: list[int]) -> None:
        self._left_passes += sum(f.passes for i, f in enumerate(self._forks) if i not in rows)
        super().keep_rows(rows)


class _EagleExpander(Expander):
    """An EAGLE head's passes over a growing tree (its cache: the true inputs, then fed nodes).

    ``root``: f^_{n-1} (1, H) from the head's catch-up. Node j (token x at sequence position
    n - 1 + depth) is fed as the input (f^ of its parent, x) at position n - 2 + depth, which
    predicts its own feature; its children's q come from that.
    """

    def __init__(self, drafter: EagleDrafter, r: DraftRequest, root: torch.Tensor):
        super().__init__(r)
        self.drafter = drafter
        self.feature: dict[int, torch.Tensor] = {-1: root[0]}  # node (-1: the root) -> its predicted feature (H,)
        self._root(drafter.head_logits(root))

    def expand(self, nodes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One masked pass of the head over ``nodes``: their (q, ranking), each (len(nodes), V)."""
        allow = self.feed(nodes)
        device = self.r.seq.device
        xs = torch.tensor([self.tokens[i] for i in nodes], dtype=torch.long, device=device)
        feats = torch.stack([self.feature[self.parents[i]] for i in nodes])
        positions = torch.tensor([self.r.n - 2 + self.depths[i] for i in nodes], dtype=torch.long, device=device)
        f = self.drafter.tree_features(xs, feats, positions, allow, len(nodes))
        self.feature.update(zip(nodes, f))
        return self.scored(self.drafter.head_logits(f))
