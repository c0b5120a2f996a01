"""One round, replayed: the context, each draft's q and p, the test that judged it, and
where the correction or bonus token came from.

The acceptance test is u < min(1, p(x)/q(x)) (Leviathan et al. 2023, Algorithm 1); a
rejected draft is replaced by a sample from norm(max(0, p - q)) at its position; when every
draft is accepted the bonus token is sampled from p one position further.
"""

from __future__ import annotations

from html import escape

from specviz.theory import round_gamma
from specviz.trace import Draft, Round, Trace
from specviz.views.scroll import scroll_x
from specviz.views.tokens import STYLES, _visible, prompt_details

Q_COLOUR, P_COLOUR, RESIDUAL_COLOUR = "#CC79A7", "#0072B2", "#E69F00"  # Okabe-Ito purple, blue, orange
PASS, FAIL = "#009E73", "#D55E00"
BETA_COLOUR = "#999999"
CONTEXT_CHARS = 360  # the tail of the context shown above the round
_BOX = ("font-family:ui-sans-serif,system-ui,sans-serif;font-size:14px;color:#111;background:#fff;border:1px solid "
        "#ddd;border-radius:8px;padding:12px;")
_MONO = "font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;"


def _chip(text: str, style: str = "") -> str:
    shown = _visible(text) or "\u2400"  # an empty decode (part of a multi-byte character) stays visible
    return f'<code style="{_MONO}background:#f3f3f3;border-radius:3px;padding:0 4px;{style}">{escape(shown)}</code>'


# The page narrows the bars to fit its box (the custom property --sv-bar, set by specviz.ui.page.css); elsewhere (an
# exported file, a notebook) they keep this width.
BAR = "var(--sv-bar,140px)"
SMALL_BAR = "70px"


def _bar(value: float | None, colour: str, marker: float | None = None, width: str = BAR) -> str:
    """A horizontal bar for a probability in [0, 1], its value beside it; ``marker`` draws a line (u). ``width``: a
    CSS length."""
    if value is None:
        return '<span style="color:#999;">—</span>'
    pct = max(0.0, min(1.0, value)) * 100
    line = ""
    if marker is not None:
        line = (
            f'<div title="u = {marker:.4f}" '
            f'style="position:absolute;left:{max(0.0, min(1.0, marker)) * 100:.1f}%;'
            'top:-3px;bottom:-3px;width:2px;background:#111;"></div>'
        )
    return (
        f'<span style="display:inline-flex;align-items:center;gap:6px;">'
        '<span '
        f'style="position:relative;display:inline-block;width:{width};height:12px;background:#eee;border-radius:2px;">'
        '<span '
        f'style="position:absolute;left:0;top:0;bottom:0;width:{pct:.1f}%;background:{colour};border-radius:2px;"></span>{line}</span>'
        f'<span style="{_MONO}font-size:12px;">{value:.3f}</span></span>'
    )


def _context(trace: Trace, index: int) -> str:
    # The text so far: the prompt (folded: the chat template is one click away) and every earlier round's emitted
    # tokens.
    before = "".join(t for r in trace.rounds[:index] for t in r.emitted_texts)
    tail = ("…" + before[-CONTEXT_CHARS:]) if len(before) > CONTEXT_CHARS else before
    return (
        f'<div style="{_MONO}white-space:pre-wrap;font-size:13px;background:#fafafa;border:1px solid '
        '#eee;border-radius:6px;padding:8px;color:#555;overflow-wrap:anywhere;">'
        f'{prompt_details(trace.prompt_text, len(trace.prompt_ids))}{escape(tail)}<span '
        'style="background:#111;color:#fff;border-radius:2px;padding:0 3px;margin-left:1px;">▸ round '
        f'{index + 1}</span></div>'
    )


def _features(trace: Trace, index: int) -> str:
    """For an EAGLE round: which target position's feature the drafts grew from (``Round.features_from``)."""
    r = trace.rounds[index]
    if r.features_from is None:
        return ""
    pos, n_prompt = r.features_from, len(trace.prompt_ids)
    if pos < n_prompt:
        where = f"prompt token {pos + 1}"
    else:
        texts = [t for x in trace.rounds[:index] for t in x.emitted_texts]
        k = pos - n_prompt
        where = f"output token {k + 1}" + (f" {_chip(texts[k])}" if k < len(texts) else "")
    return (
        '<p class="sv-features-from" style="margin:10px 0 0;color:#333;">The drafts grew from the target\'s own '
        'feature '
        f"at <b>position {pos + 1}</b> ({where}): the last position its verify pass scored and kept. The EAGLE head "
        "read that "
        "feature with the next token to predict the feature after it, and each later draft grew from the head's own "
        "predicted features.</p>"
    )


def _verdict(d: Draft) -> str:
    label = {"accepted": "accepted", "rejected": "rejected", "discarded": "not tested"}[d.verdict]
    style = STYLES.get(d.verdict, "color:#888;")
    return f'<span class="sv-verdict-{d.verdict}" style="{style}padding:1px 6px;border-radius:3px;">{label}</span>'


def _test(d, greedy: bool = False) -> str:
    """A tested draft's min(1, p/q) (or a tree node's against its residual) and the u that decided it. Greedy, q and p
    are one-hot: the test is whether the draft is the target's argmax, and no u decides anything."""
    if d.verdict == "discarded" or d.accept_prob is None:
        return '<span style="color:#888;">after a rejection, never tested</span>'
    accepted = d.verdict == "accepted"
    colour = PASS if accepted else FAIL
    # The words after the bar move as one to the next line when the cell is narrow (a space, not a margin, between
    # them).
    words = f"display:inline-block;{_MONO}font-size:12px;"
    if greedy:
        said = "the target's argmax: kept" if accepted else "not the target's argmax"
        return f'{_bar(d.accept_prob, colour)} <span style="{words}">greedy: {said}</span>'
    sign = "<" if accepted else "≥"
    return (
        f'{_bar(d.accept_prob, colour, marker=d.u)} <span style="{words}">u = {d.u:.3f} {sign} '
        f'{d.accept_prob:.3f}</span>'
    )


def _source(d: Draft, n_prompt: int) -> str:
    """Where prompt lookup copied a draft from: a position of the prompt or of the output."""
    if d.source is None:
        return ""
    where = f"prompt token {d.source + 1}" if d.source < n_prompt else f"output token {d.source - n_prompt + 1}"
    return f'<td class="sv-col-kind" style="{_CELL}color:#555;font-size:12px;">{escape(where)}</td>'


def _shared(d: Draft) -> str:
    """A cross-tokenizer draft: the drafter's own id of the token and the mass of its distribution on the shared
    tokens."""
    if d.shared_mass is None:
        return ""
    own = f"drafter's id {d.own_token_id} · " if d.own_token_id is not None else ""
    return f'<td class="sv-col-kind" style="{_CELL}">{escape(own)}{_bar(d.shared_mass, Q_COLOUR, width=SMALL_BAR)}</td>'


# The drafts table's columns, most telling first, each with the class by which the page folds it when its box is
# narrow (specviz.ui.page.css; a switch above the table shows them all): β folds below a wide screen; on a phone q(x)
# and p(x) fold too, the test's min(1, p/q) and u standing for them, and so do the columns of one drafter kind (after
# these: where prompt lookup copied a draft from, a cross-tokenizer drafter's shared mass). The verdict comes right
# after the test, so it is in view at every width. Outside the page (an exported file, a notebook) nothing folds.
COLUMNS = ("sv-col-n", "sv-col-draft", "sv-col-qp", "sv-col-qp", "sv-col-test", "sv-col-verdict", "sv-col-beta")
_CELL = "padding:4px 8px;"


def _row(label: str, d, greedy: bool, extra: str = "", beta: bool = True) -> str:
    """One row of the drafts table: a chain's draft, or a tree's node (``beta`` False: a node records none)."""
    faded = "opacity:0.45;" if d.verdict == "discarded" else ""
    cells = (
        escape(label),
        _chip(d.text),
        _bar(d.q, Q_COLOUR),
        _bar(d.p, P_COLOUR),
        _test(d, greedy),
        _verdict(d),
        _bar(d.beta, BETA_COLOUR, width=SMALL_BAR) if beta else "",
    )
    label_style = "color:#666;white-space:nowrap;"
    return (
        f'<tr class="sv-draft-row" style="border-top:1px solid #eee;{faded}">'
        + "".join(
            f'<td class="{c}" style="{_CELL}{label_style if c == "sv-col-n" else ""}">{x}</td>'
            for c, x in zip(COLUMNS, cells)
        )
        + f"{extra}</tr>"
    )


def _sibling_rows(r: Round, greedy: bool) -> list[str]:
    """A tree round's tested nodes off the accepted path (rejected siblings), each labelled with its depth and its
    parent, beneath the path: their q, p, the residual they were tested against, u and verdict."""
    if r.tree is None:
        return []
    rows = []
    for node in r.tree.nodes:
        if node.verdict != "rejected":
            continue
        parent = "the pending token" if node.parent < 0 else f"“{r.tree.nodes[node.parent].text}”"
        rows.append(_row(f"depth {node.depth}, under {parent}", node, greedy, beta=False))
    return rows


def _drafts_table(r: Round, n_prompt: int = 0, greedy: bool = False) -> str:
    siblings = _sibling_rows(r, greedy)
    if not r.drafts and not siblings:
        return (
            '<div style="margin-top:10px;color:#555;">No drafts this round: prompt lookup found no earlier occurrence '
            'of '
            "the last tokens, so the target's one pass gives one token from p.</div>"
        )
    copied = any(d.source is not None for d in r.drafts)
    test = "test (greedy: the target's argmax)" if greedy else "min(1, p/q) and u"
    heads = [
        "#",
        "draft x",
        f'<span style="color:{Q_COLOUR};">■</span> q(x) drafter',
        f'<span style="color:{P_COLOUR};">■</span> p(x) target',
        test,
        "verdict",
        '<span title="beta = Σ min(p, q) at this position: the chance a draft here is accepted">β = Σ min(p, q)</span>',
    ]
    if copied:
        heads.append(
            '<span title="prompt lookup copies the tokens that followed an earlier occurrence of the last n tokens; q '
            'is 1 at the copy">copied from</span>'
        )
    if any(d.shared_mass is not None for d in r.drafts):
        heads.append(
            '<span title="the drafter has its own tokenizer: q is its distribution on the tokens both vocabularies '
            'share, '
            'renormalised; this is the mass it put there (Timor et al. 2025)">shared-vocabulary mass</span>'
        )
    classes = COLUMNS + ("sv-col-kind",) * (len(heads) - len(COLUMNS))
    head = "".join(
        f'<th class="{c}" style="text-align:left;{_CELL}font-weight:600;color:#444;">{h}</th>'
        for c, h in zip(classes, heads)
    )
    rows = [_row(str(i + 1), d, greedy, _source(d, n_prompt) + _shared(d)) for i, d in enumerate(r.drafts)]
    if siblings:
        path = "the accepted path above" if r.drafts else "no child of the pending token was accepted"
        rows.append(
            f'<tr><td colspan="{len(heads)}" style="padding:6px 8px;color:#555;font-size:13px;">Rejected siblings '
            f'({path}); '
            "each was tested against the residual its earlier siblings left (min(1, p′/q)), and the untested nodes are "
            "not listed:</td></tr>"
        )
        rows += siblings
    # The page fits the table to its box by folding columns; with every column shown on a narrow screen (or in a file
    # with no page around it) the table scrolls inside its box (a shadow at the edge says so) instead of being clipped.
    return scroll_x(
        f'<table class="sv-drafts" style="border-collapse:collapse;width:100%;margin-top:10px;">'
        f'<tr>{head}</tr>{"".join(rows)}</table>'
    )


def _final(r: Round, stop_reason: str | None, greedy: bool = False) -> str:
    if r.final_token_id is None:
        why = (
            "an accepted draft was the end-of-sequence token"
            if stop_reason == "eos"
            else "the run reached its token budget"
        )
        return f'<p style="margin:10px 0 0;color:#555;">The round ended before its final token: {why}.</p>'
    n_acc = r.accepted_count
    correction = r.final_kind == "correction"
    if correction and r.tree is not None:
        where = "the pending token" if not r.tree.path else f"accepted node {_chip(r.drafts[-1].text)}"
        tried = len(r.tree.children(r.tree.path[-1] if r.tree.path else -1))
        intro = (
            f"None of the {tried} children of {where} was accepted (each was tested against the residual its earlier "
            f"siblings left). The <b>correction token</b> is sampled from that last residual. Most likely tokens of it:"
        )
        head = (
            "token",
            f'<span style="color:{P_COLOUR};">■</span> p(x)',
            f'<span style="color:{Q_COLOUR};">■</span> q(x)',
            f'<span style="color:{RESIDUAL_COLOUR};">■</span> residual',
            "",
        )
    elif correction:
        d = r.drafts[n_acc]
        intro = (
            (
                f"Draft {n_acc + 1} {_chip(d.text)} was rejected: it is not the target's argmax (greedy: q and p are "
                "one-hot). "
                if greedy
                else f"Draft {n_acc + 1} {_chip(d.text)} was rejected: u = {d.u:.3f} ≥ min(1, p/q) = "
                f"{d.accept_prob:.3f}. "
            )
            + "The <b>correction token</b> is sampled from the residual <b>norm(max(0, p − q))</b> at that position; "
            "drafts after it are discarded. Most likely tokens of the residual:"
        )
        head = (
            "token",
            f'<span style="color:{P_COLOUR};">■</span> p(x)',
            f'<span style="color:{Q_COLOUR};">■</span> q(x)',
            f'<span style="color:{RESIDUAL_COLOUR};">■</span> residual',
            "",
        )
    else:
        intro = (
            (
                f"{'The one draft was' if len(r.drafts) == 1 else f'All {len(r.drafts)} drafts were'} accepted, so the "
                "target's pass "
                f"gives one more token for free: the "
                f"<b>bonus token</b>, sampled from p at position {len(r.drafts) + 1}. Most likely tokens of p:"
            )
            if r.final_kind == "bonus"
            else "The target samples this token from p (autoregressive baseline). Most likely tokens of p:"
        )
        head = ("token", f'<span style="color:{P_COLOUR};">■</span> p(x)', "")  # p alone: no q, no residual columns
    # A correction's p(x) and q(x) fold on a phone like the drafts' (the residual and the mark stay); p alone never
    # does.
    columns = (
        ("sv-col-token", "sv-col-qp", "sv-col-qp", "sv-col-residual", "sv-col-mark")
        if correction
        else ("sv-col-token", "sv-col-p", "sv-col-mark")
    )
    cell = "padding:3px 8px;"
    rows = []
    shown = [t for t in r.final_top if t.prob > 0]
    for t in shown:
        picked = t.token_id == r.final_token_id
        mark = (
            f'<span style="{STYLES.get(r.final_kind or "target", "")}padding:1px '
            '6px;border-radius:3px;white-space:nowrap;">◀ sampled</span>'
            if picked
            else ""
        )
        cells = [_chip(t.text), _bar(t.p, P_COLOUR)]
        if correction:
            cells += [_bar(t.q, Q_COLOUR), _bar(t.prob, RESIDUAL_COLOUR)]
        weight = "font-weight:600;" if picked else ""
        rows.append(
            f'<tr class="sv-top-row{" sv-picked" if picked else ""}" style="border-top:1px solid #eee;{weight}">'
            + "".join(f'<td class="{c}" style="{cell}">{x}</td>' for c, x in zip(columns, cells + [mark]))
            + "</tr>"
        )
    if r.final_token_id not in {t.token_id for t in shown}:
        # the sampled token's own probability sits in the column of the distribution it was sampled from
        prob = f"{r.final_prob:.4f}" if r.final_prob is not None else "?"
        unknown = '<span style="color:#999;">—</span>'
        cells = [
            _chip(r.final_text or ""),
            *([unknown, unknown] if correction else []),
            f'<span style="color:#555;">outside the top {len(shown)}: probability {prob}</span>',
            '<span style="white-space:nowrap;">◀ sampled</span>',
        ]
        rows.append(
            '<tr class="sv-top-row sv-picked" style="border-top:1px solid #eee;font-weight:600;">'
            + "".join(f'<td class="{c}" style="{cell}">{x}</td>' for c, x in zip(columns, cells))
            + "</tr>"
        )
    heads = "".join(
        f'<th class="{c}" style="text-align:left;{cell}font-weight:600;color:#444;">{h}</th>'
        for c, h in zip(columns, head)
    )
    return f'<p style="margin:12px 0 4px;">{intro}</p>' + scroll_x(
        f'<table class="sv-top" style="border-collapse:collapse;"><tr>{heads}</tr>{"".join(rows)}</table>'
    )


def _greedy(trace: Trace) -> bool:
    """Whether the run sampled at temperature 0 (q and p one-hot)."""
    sampling = (trace.settings or {}).get("sampling") or {}
    return isinstance(sampling, dict) and sampling.get("temperature") == 0


def _fewer_nodes(trace: Trace, index: int) -> str:
    """Why a tree round drafted fewer nodes than its static shape holds ("" when it did not, or for a dynamic tree,
    whose node count is a budget)."""
    r = trace.rounds[index]
    shape = trace.settings.get("tree") or {}
    most, deepest = shape.get("nodes"), shape.get("depth")
    if r.tree is None or shape.get("kind") == "dynamic" or not most or len(r.tree.nodes) >= most:
        return ""
    why = [
        f"{len(r.tree.nodes)} of the shape's {most} nodes: a node gets only as many children as its q gives tokens any "
        "probability, and a confident drafter's q, cut further by top-k and top-p, gives fewer than the shape asks; no "
        "subtree grows under a child that was not drafted"
    ]
    left = (trace.settings.get("max_new_tokens") or 0) - sum(len(x.emitted_ids) for x in trace.rounds[:index])
    if deepest and r.tree.depth < deepest and r.tree.depth == left:
        why.append(
            f"the tree stops at depth {r.tree.depth} of {deepest}: no deeper than the {left} tokens left to generate"
        )
    return (
        f'<div class="sv-fewer-nodes" style="color:#555;font-size:13px;margin:4px 0;">{escape("; ".join(why))}.</div>'
    )


def round_html(trace: Trace, index: int) -> str:
    """Round ``index`` (0-based) of a speculative trace as an HTML panel.

    Shows the context before the round (its last characters), for an EAGLE round the target
    position whose feature the drafts grew from (1-based over prompt and output), each draft with
    bars of q(x) and p(x), min(1, p/q) with the uniform u that decided it, the verdict, and the
    final token with the top tokens of the distribution it was sampled from.

    Raises:
        IndexError: ``index`` is outside 0 .. len(trace.rounds) - 1.
    """
    if not trace.rounds:
        return (
            f'<div class="sv-replay" style="{_BOX}color:#666;">No rounds yet: press Generate, or load a '
            'recording.</div>'
        )
    if not 0 <= index < len(trace.rounds):
        raise IndexError(f"round {index} of a trace with {len(trace.rounds)} rounds")
    r = trace.rounds[index]
    gamma = round_gamma(trace, r)
    emitted = len(r.emitted_ids)
    drafted = (
        f"{len(r.tree.nodes)} tree nodes (depth {r.tree.depth}) · {r.tree.rejected} rejected"
        if r.tree is not None
        else f"{len(r.drafts)} drafted (gamma {escape(str(gamma))})"
    )
    header = (
        f'<div style="display:flex;justify-content:space-between;flex-wrap:wrap;gap:8px;">'
        f'<b class="sv-round-title">Round {index + 1} of {len(trace.rounds)}</b>'
        f'<span style="color:#555;">{drafted} · {r.accepted_count} accepted · '
        f'{emitted} token{"s" if emitted != 1 else ""} emitted · drafting {r.draft_ms:.1f} ms, target pass '
        f'{r.verify_ms:.1f} ms</span></div>'
    )
    header += _fewer_nodes(trace, index)
    return (
        '<div class="sv-replay" '
        f'style="{_BOX}">{header}{_context(trace, index)}{_features(trace, index)}'
        f'{_drafts_table(r, len(trace.prompt_ids), _greedy(trace))}'
        f'{_final(r, trace.stop_reason if index == len(trace.rounds) - 1 else None, _greedy(trace))}</div>'
    )
