"""The drafter of a kind on a loaded pair, with the pair's tokenizers, refused where the pair's preset does not
draft with that kind: the pair package's side of ``specviz.drafters`` (which knows no pair)."""

from __future__ import annotations

from specviz.drafters import Drafter, default_kind, make_drafter, with_rule
from specviz.pair.catalogue import check_drafter_kind


def pair_drafter(
    kind: str | None,
    pair,
    ngram_max: int = 3,
    exit_layer: int | None = None,
    scheme: str = "intersection",
    drafts: str = "sampled",
) -> Drafter:
    """The drafter of ``kind`` (None: ``default_kind``) on a loaded ``specviz.pair.Pair``, with the
    pair's tokenizers: the target's, and the drafter's own where it has one; ``drafts`` its draft rule
    (``specviz.drafters.argmax.with_rule``: "sampled" or "argmax").

    Raises:
        ValueError: as ``make_drafter``; "model" asked of a pair whose drafter has its own tokenizer
            (its ids are not the target's: the message names the cross-tokenizer kind); ``PairError`` (a
            ValueError) for a kind a preset pair does not draft with (``specviz.pair.catalogue.check_drafter_kind``:
            the message names the pair, the kind and the kinds it allows); an unknown draft rule.
    """
    check_drafter_kind(getattr(pair, "name", None), kind)
    target_tok = pair.tokenizer
    drafter_tok = getattr(pair, "drafter_tokenizer", None) or target_tok
    return with_rule(
        make_drafter(
            kind or default_kind(pair),
            drafter_model=pair.drafter,
            target=pair.target,
            ngram_max=ngram_max,
            exit_layer=exit_layer,
            drafter_tokenizer=drafter_tok,
            target_tokenizer=target_tok,
            scheme=scheme,
        ),
        drafts,
    )
