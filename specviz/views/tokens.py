"""The generated text, colour-coded by verdict, as HTML.

Colours are from the Okabe-Ito palette, which stays distinguishable under the common forms
of colour blindness; a rejected draft is also struck through, so colour is never the only cue.
Hovering a drafted token shows q, p, min(1, p/q) and u; hovering a correction or bonus token
shows the distribution it was sampled from. Touch screens have no hover: a tapped token (it is
focusable) shows the same details in a box that ``TIP_SCRIPT`` places under it and keeps inside
the window, so a token at the right edge of a phone's screen does not push its details off it.
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
    # A token from p in a round that drafted nothing (prompt lookup with nothing to copy, a confidence schedule that
    # stopped at once), and every token of the autoregressive baseline: grey with a dotted underline, so it is marked
    # and is no verdict colour.
    "target": "background:rgba(0,0,0,0.07);text-decoration:underline dotted #777;text-underline-offset:3px;",
}
LABELS = {
    "accepted": "accepted draft",
    "rejected": "rejected draft",
    "correction": "correction token",
    "bonus": "bonus token",
    "target": "token from the target alone",
}
# The legend: every class a token of the output can have, in the order a round shows them.
LEGEND = (
    ("accepted", "accepted draft"),
    ("rejected", "rejected draft"),
    ("correction", "correction (from the residual)"),
    ("bonus", "bonus (all drafts accepted)"),
    ("target", "from p, no draft (a round that drafted nothing)"),
)
_BOX = (
    "white-space:pre-wrap;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;"
    "font-size:14px;line-height:1.6;padding:12px;border-radius:8px;border:1px solid #ddd;"
    "background:#fff;color:#111;overflow-wrap:anywhere;"
)


# The box a focused (tapped) token's details appear in, and the script that places it: under the
# token, moved left as far as needed to stay inside the window. One box for the whole page, so it
# escapes the scrolling boxes tokens sit in (the Compare columns, the Batch lanes).
TIP_CSS = """
.sv-tokens [data-tip] { cursor: pointer; }
.sv-tokens [data-tip]:focus { outline: 2px solid #333; }
.sv-tip { position: absolute; z-index: 1000; max-width: min(30em, calc(100vw - 16px)); box-sizing: border-box;
  white-space: pre-wrap; overflow-wrap: anywhere; background: #111; color: #fff; border-radius: 4px; padding: 6px 8px;
  font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; pointer-events: none; }
"""
TIP_SCRIPT = """
(() => {
  if (window.svTip) return;
  const tip = document.createElement('div');
  tip.className = 'sv-tip'; tip.setAttribute('role', 'tooltip'); tip.hidden = true;
  window.svTip = tip;
  const owner = (e) => (e.target instanceof Element ? e.target.closest('[data-tip]') : null);
  document.addEventListener('focusin', (e) => {
    const el = owner(e);
    if (!el) return;
    if (!tip.isConnected) document.body.appendChild(tip);
    tip.textContent = el.dataset.tip; tip.hidden = false;
    const r = el.getBoundingClientRect(), page = document.documentElement.clientWidth;
    const left = Math.max(8, Math.min(r.left, page - 8 - tip.offsetWidth));
    tip.style.left = (left + window.scrollX) + 'px';
    tip.style.top = (r.bottom + 4 + window.scrollY) + 'px';
  });
  document.addEventListener('focusout', (e) => { if (owner(e)) tip.hidden = true; });
})();
"""


def _span(text: str, style: str, title: str, cls: str, first_of_round: bool = False) -> str:
    # A thin rule before each round shows where the target's passes fall.
    edge = "border-left:2px solid #999;margin-left:1px;" if first_of_round else ""
    shown = text if text else "\u2400"  # an empty decode (part of a multi-byte char) stays hoverable
    tip = escape(title, quote=True)  # hover shows title; a tap focuses the token and TIP_SCRIPT shows data-tip
    return (f'<span class="sv-{cls}" style="{style}{edge}border-radius:3px;" title="{tip}" data-tip="{tip}" '
            f'tabindex="0">{escape(shown)}</span>')


def _visible(text: str) -> str:
    """A rejected draft is not part of the output: show its whitespace instead of laying it out."""
    return text.replace("\n", "\u23ce").replace("\t", "\u21e5").replace(" ", "\u00b7")


def _draft_title(i: int, d: Draft) -> str:
    return (
        f"draft {i + 1}: {LABELS.get(d.verdict, d.verdict)}\n"
        f"q(x) = {d.q:.4f}   p(x) = {d.p:.4f}\n"
        f"min(1, p/q) = {d.accept_prob:.4f}   u = {d.u:.4f}"
    )


END_MARK = "\u25a0 end"  # an end-of-text token, shown as a mark instead of its marker text (such as <|im_end|>)


def _ending(text: str) -> tuple[str, str]:
    """(what the page shows, the note its details add) for an end-of-text token whose own text is ``text``."""
    return END_MARK, f"\nthe end-of-text token {text}: the run stops here"


def round_spans(index: int, r: Round, one_line: bool = False, eos: frozenset[int] = frozenset()) -> list[str]:
    """One round's tokens as coloured spans: its tested drafts, then its correction or bonus token.

    ``one_line`` shows line breaks as a visible mark instead of breaking the line (a table cell). A kept
    token whose id is in ``eos`` (the run's end-of-text ids) shows as ``END_MARK``; its details name it.
    """
    spans = []
    first = True
    flat = (lambda t: t.replace("\n", "\u23ce")) if one_line else (lambda t: t)
    for i, d in enumerate(r.drafts):
        if d.verdict == "discarded":
            continue
        if d.verdict == "accepted" and i >= len(r.emitted_ids):
            continue  # cut by max_new_tokens
        text, note = _visible(d.text) if d.verdict == "rejected" else flat(d.text), ""
        if d.verdict == "accepted" and d.token_id in eos:
            text, note = _ending(d.text)
        spans.append(
            _span(text, STYLES[d.verdict], f"round {index + 1}, " + _draft_title(i, d) + note, d.verdict, first)
        )
        first = False
    if r.final_token_id is not None:
        kind = r.final_kind or "target"
        source = {
            "correction": "sampled from norm(max(0, p - q))",
            "bonus": "sampled from p after every draft was accepted",
            "target": "sampled from p: no draft this round (the target alone's token)",
        }[kind]
        title = f"round {index + 1}, {LABELS.get(kind, 'target token')}: {source}\nprobability {r.final_prob:.4f}"
        text, note = (flat(r.final_text or ""), "") if r.final_token_id not in eos else _ending(r.final_text or "")
        spans.append(_span(text, STYLES[kind], title + note, kind, first and kind != "target"))
    return spans


def prompt_details(prompt_text: str, n_tokens: int, style: str = "") -> str:
    """The prompt as the target read it (chat template and system prompt included where applied),
    folded away by default and one click from view: an HTML ``<details>`` element, text escaped."""
    if not prompt_text:
        return ""
    return (
        f'<details class="sv-prompt-details" style="margin:0 0 6px;{style}"><summary style="cursor:pointer;color:#555;'
        f'font-family:ui-sans-serif,system-ui,sans-serif;font-size:13px;">prompt as the target read it ({n_tokens} '
        'tokens, '
        f'with the chat template and system prompt where applied): show</summary>'
        f'<span class="sv-prompt" style="{STYLES["prompt"]}">{escape(prompt_text)}</span></details>'
    )


def tokens_html(trace: Trace, show_prompt: bool = True) -> str:
    """The output, one span per token, in a scrolling box; with ``show_prompt`` the prompt (grey) above
    it, folded by default (``prompt_details``).

    Returns an HTML fragment with inline styles (no external CSS needed).
    """
    parts = []
    if show_prompt and trace.prompt_text:
        parts.append(prompt_details(trace.prompt_text, len(trace.prompt_ids)))
    eos = frozenset(trace.settings.get("eos_token_id") or ())
    for i, r in enumerate(trace.rounds):
        parts.extend(round_spans(i, r, eos=eos))
    return f'<div class="sv-tokens" style="{_BOX}">{"".join(parts)}</div>'


def legend_html() -> str:
    """A one-line legend of every token class (``LEGEND``): the four verdict colours and the token from p of a round
    that drafted nothing."""
    items = LEGEND
    chips = "".join(
        f'<span style="{STYLES[k]}padding:1px 6px;border-radius:3px;margin-right:12px;">{escape(label)}</span>'
        for k, label in items
    )
    return (f'<div class="sv-legend" style="font-size:13px;color:#333;">{chips}<span style="color:#666;">hover a token '
            'for p, q, min(1, p/q) and u</span></div>')
