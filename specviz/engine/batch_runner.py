"""Feeding a causal LM several sequences at once, with one rectangular KV cache and a mask.

``specviz.engine.batch`` runs the target through a ``BatchRunner``, and a drafter model drafts for a
batch through one of its own (``specviz.engine.model_drafter``). Every pass appends the same number
of columns to every row; a per-row 2-D attention mask says which columns hold the row's settled
tokens, and each token's position id is its index in its own row's sequence, so a masked column
(left padding, a rejected draft, a row riding along) shifts nothing. Rows leave the batch
through ``DynamicCache.batch_select_indices``.

The cache is built without the model's config, as ``specviz.engine.runner`` explains; a batch of a
sliding-window model is refused (``check_window``) where masked columns could count against the
window, because the model's own mask measures the window in columns, not in the row's own tokens
(left padding alone shifts nothing: a row's tokens stay contiguous, so columns and positions differ
by a constant).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from transformers import DynamicCache

from specviz.engine.kept_logits import logits_kept
from specviz.engine.prefill import prefill_ends
from specviz.engine.runner import widen
from specviz.engine.window import SLIDING, layer_windows


class BatchRunner:
    """One model's rectangular KV cache over a batch's rows, with a 2-D mask of the valid columns.

    Args:
        model: a transformers causal LM on its device, in eval mode.
        vocab: logits columns kept.
        rows: the batch's rows.
    """

    def __init__(self, model, vocab: int, rows: int, keep_features: bool = False):
        self.model = model
        self.vocab = vocab
        self.cache = DynamicCache()
        self.mask = torch.zeros(rows, 0, dtype=torch.long, device=model.device)
        self.passes = 0
        self.keep_features = keep_features
        # (rows, k, H) the last hidden states of the latest pass's columns, kept when ``keep_features``
        # (an EAGLE drafter reads them)
        self.features: torch.Tensor | None = None

    @property
    def columns(self) -> int:
        return self.mask.shape[1]

    def feed(self, tokens: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor, n_last: int) -> torch.Tensor:
        """Append (rows, k) tokens; return the logits of the last ``n_last`` columns, (rows, n_last, vocab)."""
        self.mask = torch.cat([self.mask, valid.long()], dim=1)
        extra = {"output_hidden_states": True} if self.keep_features else {}
        out = self.model(input_ids=tokens, attention_mask=self.mask, position_ids=positions, past_key_values=self.cache,
                         use_cache=True, logits_to_keep=logits_kept(n_last, tokens.shape[1], tokens.device), **extra)
        self.passes += 1
        if self.keep_features:
            self.features = out.hidden_states[-1]
        return widen(out.logits, self.vocab)

    def prefill(self, seqs: Sequence[torch.Tensor], lengths: Sequence[int]) -> None:
        """Feed each row's first ``lengths[i]`` tokens of ``seqs[i]``, left-padded (nothing when all are empty), in
        ``prefill_passes``' passes."""
        for _ in self.prefill_passes(seqs, lengths):
            pass

    def prefill_passes(self, seqs: Sequence[torch.Tensor], lengths: Sequence[int]) -> Iterator[None]:
        """``prefill`` as a generator: the left-padded columns in passes of at most PREFILL_CHUNK tokens over all rows
        (``specviz.engine.prefill.prefill_ends``), None yielded between them (the caller enters inference mode around
        each ``next``). ``features`` then holds every column's (the passes' joined)."""
        tokens, valid = left_padded([seq[:n] for seq, n in zip(seqs, lengths)], self.mask.device)
        width = tokens.shape[1]
        pos = positions([0] * len(lengths), valid, left=True)
        start, features = 0, []
        for stop in prefill_ends(width, len(lengths)) if width else []:
            self.feed(tokens[:, start:stop], valid[:, start:stop], pos[:, start:stop], 1)
            if self.keep_features:
                features.append(self.features)
            start = stop
            if stop < width:
                yield None
        if len(features) > 1:
            self.features = torch.cat(features, dim=1)

    def forget(self, row: int, columns: Sequence[int]) -> None:
        """Mask out columns of one row (rejected drafts): never attended to again."""
        if columns:
            self.mask[row, list(columns)] = 0

    def keep(self, rows: list[int]) -> None:
        """Keep only these rows (finished rows leave the batch)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        if self.cache.get_seq_length() > 0:
            self.cache.batch_select_indices(index)
        self.mask = self.mask[index]


def left_padded(rows: Sequence[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, valid), both (len(rows), width): each 1-D row of token ids right-aligned, padding 0."""
    width = max((len(r) for r in rows), default=0)
    tokens = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    valid = torch.zeros(len(rows), width, dtype=torch.bool, device=device)
    for i, r in enumerate(rows):
        if len(r):
            tokens[i, width - len(r):] = r
            valid[i, width - len(r):] = True
    return tokens, valid


def positions(starts: list[int], valid: torch.Tensor, left: bool) -> torch.Tensor:
    """Each column's position id: the token's index in its row's sequence (padding: clamped to 0)."""
    width = valid.shape[1]
    offsets = torch.arange(width, device=valid.device)[None, :]
    counts = valid.long().sum(dim=1, keepdim=True)
    start = torch.tensor(starts, device=valid.device)[:, None]
    pos = start + offsets - (width - counts if left else 0)
    return torch.where(valid, pos, 0)  # padding at 0: never past a model's position table


def sliding_window(model) -> int | None:
    """The model's attention window in tokens, or None when every layer attends to the whole context
    (``specviz.engine.window.layer_windows``)."""
    return layer_windows(model.config).get(SLIDING)


def check_window(models, columns: int) -> None:
    """Refuse a batch whose caches may hold more than a model's attention window of columns.

    Args:
        models: the batch's models.
        columns: the most cache columns the batch may fill (prompt, tokens, masked columns).

    Raises:
        ValueError: a model with a sliding window smaller than ``columns``.
    """
    for model in models:
        window = sliding_window(model)
        if window is not None and window < columns:
            raise ValueError(
                f"{type(model).__name__} attends to a sliding window of {window} tokens; a batch's cache may hold up "
                f"to {columns} "
                "columns, and the masked columns of rejected drafts would count against the window, so its rows would "
                "not be "
                "their single runs: decode these prompts one at a time, or ask for fewer tokens"
            )
