"""The generated text, colour-coded by verdict, as HTML.

Colours are from the Okabe-Ito palette, which stays distinguishable under the common forms
of colour blindness; a rejected draft is also struck through, so colour is never the only cue.
Hovering a drafted token shows q, p, min(1, p/q) and u; hovering a correction or bonus token
shows the distribution it was sampled from.
"""

from __future__ import annotations

from html import escape

from specviz.trace import Draft, Round, Trace

STYLES = {
    "prompt": "color:#6b6b6b;",
    "accepted": "background:rgba(86,180,233,0.35);",  # sky blue
    "rejected": "color:#D55E00;text-decoration:line-through;text-decoration-thickness:2px;",  # vermillion
    "correction": "background:rgba(230,159,0,0.45);",  # orange
    "bonus": "background:rgba(0,158,115,0.35);",  # bluish green
    "target": "",
}
LABELS = {
    "accepted": "accepted draft",
    "rejected": "rejected draft",
    "correction": "correction token",
    "bonus": "bonus token",
}
_BOX = (
    "white-space:pre-wrap;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;"
    "font-size:14px;line-height:1.6;padding:12px;border-radius:8px;border:1px solid #ddd;"
    "background:#fff;color:#111;overflow-wrap:anywhere;"
)


def _span(text: str, style: str, title: str, cls: str, first_of_round: bool = False) -> str:
    # A thin rule before each round shows where the target's passes fall.
    edge = "border-left:2px solid #999;margin-left:1px;" if first_of_round else ""
    shown = text if text else "\u2400"  # an empty decode (part of a multi-byte char) stays hoverable
    tip = escape(title, quote=True)  # hover shows title; a tap focuses the token and the page's CSS shows data-tip
    return f'<span class="sv-{cls}" style="{style}{edge}border-radius:3px;" title="{tip}" data-tip="{tip}" tabindex="0">{escape(shown)}</span>'


def _visible(text: str) -> str:
    """A rejected draft is not part of the output: show its whitespace instead of laying it out."""
    return text.replace("\n", "\u23ce").replace("\t", "\u21e5").replace(" ", "\u00b7")


def _draft_title(i: int, d: Draft) -> str:
    return (
        f"draft {i + 1}: {LABELS.get(d.verdict, d.verdict)}\n"
        f"q(x) = {d.q:.4f}   p(x) = {d.p:.4f}\n"
        f"min(1, p/q) = {d.accept_prob:.4f}   u = {d.u:.4f}"
    )


def round_spans(index: int, r: Round, one_line: bool = False) -> list[str]:
    """One round's tokens as coloured spans: its tested drafts, then its correction or bonus token.

    ``one_line`` shows line breaks as a visible mark instead of breaking the line (a table cell).
    """
    spans = []
    first = True
    flat = (lambda t: t.replace("\n", "\u23ce")) if one_line else (lambda t: t)
    for i, d in enumerate(r.drafts):
        if d.verdict == "discarded":
            continue
        if d.verdict == "accepted" and i >= len(r.emitted_ids):
            continue  # cut by max_new_tokens
        text = _visible(d.text) if d.verdict == "rejected" else flat(d.text)
        spans.append(_span(text, STYLES[d.verdict], f"round {index + 1}, " + _draft_title(i, d), d.verdict, first))
        first = False
    if r.final_token_id is not None:
        kind = r.final_kind or "target"
        source = {
            "correction": "sampled from norm(max(0, p - q))",
            "bonus": "sampled from p after every draft was accepted",
            "target": "sampled from p (autoregressive)",
        }[kind]
        title = f"round {index + 1}, {LABELS.get(kind, 'target token')}: {source}\nprobability {r.final_prob:.4f}"
        spans.append(_span(flat(r.final_text or ""), STYLES[kind], title, kind, first and kind != "target"))
    return spans


def tokens_html(trace: Trace, show_prompt: bool = True) -> str:
    """The prompt (grey) and the output, one span per token, in a scrolling box.

    Returns an HTML fragment with inline styles (no external CSS needed).
    """
    parts = []
    if show_prompt and trace.prompt_text:
        parts.append(f'<span class="sv-prompt" style="{STYLES["prompt"]}">{escape(trace.prompt_text)}</span>')
    for i, r in enumerate(trace.rounds):
        parts.extend(round_spans(i, r))
    return f'<div class="sv-tokens" style="{_BOX}">{"".join(parts)}</div>'


def legend_html() -> str:
    """A one-line legend of the verdict colours."""
    items = [
        ("accepted", "accepted draft"),
        ("rejected", "rejected draft"),
        ("correction", "correction (from the residual)"),
        ("bonus", "bonus (all drafts accepted)"),
    ]
    chips = "".join(
        f'<span style="{STYLES[k]}padding:1px 6px;border-radius:3px;margin-right:12px;">{escape(label)}</span>'
        for k, label in items
    )
    return f'<div class="sv-legend" style="font-size:13px;color:#333;">{chips}<span style="color:#666;">hover a token for p, q, min(1, p/q) and u</span></div>'
