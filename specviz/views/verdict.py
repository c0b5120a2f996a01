"""The verdict of a run: faster or slower than the target alone, and why, in alpha, c and v; as one
plain sentence (the status line, the HTML export) and as the headline at the top of the output
(the measured speedup in large type, one line of why, and a cost bar).

Leviathan et al. (2023, Thm 3.8, with a verify pass of v target steps): a round yields E[tokens]
= (1 - alpha^(gamma+1)) / (1 - alpha) tokens (Eq. 1) and costs (drafter passes) x c + v target
steps, so speculation wins exactly when tokens per round > drafter passes per round x c + v. The
verdict uses the run's measured figures: tokens per round (emitted tokens / rounds), drafter
passes per round, c (drafter step ms / target step ms) and v (verify pass ms per round / target
step ms), both against the baseline run beside it. The speedup is the page's one measured speedup
(``specviz.views.stats.headline_speedup``), and the line under it splits a round's measured time into drafting,
the target's pass (named "scoring": "verify" names only the per-pass cost v) and other work in steps of the target
alone, so that tokens per round over their sum is that speedup (``Verdict``); the colour and the words say whether
its spread over stretches of the run (the interquartile range, ``specviz.views.stats.spread_words``) clears 1x.

A run that lost, or that cannot be told from 1x, names its largest cause (``Verdict.causes``) from the decomposition
speedup = E[tokens per round] / (gamma c + v): acceptance (the tokens a round could give but did not), drafting
(gamma c, a round's drafter passes in target passes) or verify cost (v beyond the one step Thm 3.8 takes), each in
steps a round, against what would make the run pay; and what is known of the drafter kind (``kind_note``).
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from specviz import theory
from specviz.trace import Trace
from specviz.views.stats import (MIN_ROUNDS, NOT_DISTINGUISHABLE, speedup_formula, spread_words, summary, v_below_one,
                                 verify_cost_shown)

# The cost bar's colours: not the text's verdict colours (orange and green are the correction and bonus tokens).
DRAFTING, VERIFYING, OTHER, GAINED = "#CC79A7", "#555555", "#BBBBBB", "#0072B2"


@dataclass(frozen=True)
class Verdict:
    """A finished run judged against its baseline.

    Two sets of costs. ``drafting``, ``verify`` and ``c`` are the theory's (Leviathan et al. 2023, Thm 3.8): in
    target *passes*, a drafter pass as c of a target pass and the verify pass as v (the only quantity the page calls
    "verify"). ``draft_steps``, ``scoring_steps`` and ``other_steps`` split a round's measured time in *steps of
    the target alone* (the baseline's decoding time per token over the same tokens, its own sampling and
    bookkeeping included), so that ``tokens / (draft_steps + scoring_steps + other_steps)`` is the measured speedup
    itself: the headline's decomposition adds up to the number it explains. Scoring is the same pass as v's, in
    those steps, over the whole run: it differs from v by the target alone's bookkeeping per step and by noise."""

    speedup: float  # the measured speedup (autoregressive time / speculative time)
    basis: str  # "decoding" (prefill excluded) or "whole run"
    tokens: float  # emitted tokens / rounds
    passes: float  # drafter forward passes / rounds
    drafting: float  # passes x c: a round's drafting, in target passes (0 without drafter passes)
    verify: float | None  # v: a round's verify pass, in target passes (None: too few passes to measure it)
    alpha: float | None
    c: float | None
    rounds: int = 0
    low: float | None = None  # the interquartile range of the speedup over stretches of the run (None: no spread)
    high: float | None = None
    draft_steps: float = 0.0  # a round's drafting, in steps of the target alone
    scoring_steps: float = 0.0  # a round's target pass over its drafts, in steps of the target alone
    other_steps: float = 0.0  # the rest of a round's time (sampling, judging, the host's work between passes)
    stretches: int = 0  # the stretches of equal tokens the spread is taken over
    most_tokens: float | None = None  # the most tokens a round could give: gamma + 1 (a tree: its depth + 1)
    kind: str | None = None  # the drafter kind ("model", "ngram", "early-exit", ...)
    empty_rounds: int = 0  # rounds that drafted nothing (one target pass, one token)
    # a token tree run: most_tokens is its depth + 1, and Eq. (1) (a chain's) gives no alpha to aim at
    tree: bool = False

    @property
    def cost(self) -> float:
        """A round's measured time in steps of the target alone: tokens / speedup."""
        return self.draft_steps + self.scoring_steps + self.other_steps

    @property
    def call(self) -> str:
        """"faster" or "slower" when the interquartile range of the speedup clears 1x on that side; "unclear" when it
        holds 1x (not distinguishable from 1x); "too few rounds" under MIN_ROUNDS (no spread to read)."""
        if self.rounds < MIN_ROUNDS or self.low is None or self.high is None:
            return "too few rounds"
        return "faster" if self.low > 1.0 else "slower" if self.high < 1.0 else "unclear"

    @property
    def faster(self) -> bool:
        return self.call == "faster"

    def decomposition(self) -> str:
        """One line that adds up to the speedup: tokens per round over the round's time in steps of the target alone."""
        return (
            f"a round gave {self.tokens:.2f} tokens for {self.cost:.2f} steps of the target alone's time "
            f"(drafting {self.draft_steps:.2f} + scoring {self.scoring_steps:.2f} + other work "
            f"{self.other_steps:.2f}): "
            f"{self.tokens:.2f} / {self.cost:.2f} = {self.speedup:.2f}×"
        )

    def causes(self) -> dict[str, float] | None:
        """What a round lost against the ideal one (every draft accepted, free drafting, a verify pass of one step),
        in steps of the target alone a round, from speedup = E[tokens per round] / (gamma c + v) (Leviathan et al.
        2023, Thm 3.8 with the verify cost v): "acceptance" the tokens it could give but did not (most_tokens -
        tokens, each worth a step), "drafting" gamma c (drafter passes x c), "verify cost" v - 1. None where v or
        the most tokens a round could give is unknown."""
        if self.verify is None or self.most_tokens is None:
            return None
        return {
            "acceptance": max(0.0, self.most_tokens - self.tokens),
            "drafting": self.drafting,
            "verify cost": max(0.0, self.verify - 1.0),
        }

    def cause(self) -> str:
        """The largest cause (``causes``) named, beside the other two, and what alone would make the run pay: a round
        pays when it gives more tokens than gamma c + v. "" where the causes are unknown."""
        losses = self.causes()
        if not losses:
            return ""
        largest = max(losses, key=losses.get)
        cost = self.drafting + self.verify
        gamma = round(self.most_tokens - 1)
        others = {k: v for k, v in losses.items() if k != largest}
        words = {
            "acceptance": (
                f"acceptance: a round gave {self.tokens:.2f} of the {self.most_tokens:g} tokens "
                + ("its tree's depth allows" if self.tree else f"gamma {gamma} allows")
                + (f" (alpha {self.alpha:.2f})" if self.alpha is not None else "")
                + f", {losses['acceptance']:.2f} steps' worth lost"
            ),
            "drafting": f"drafting: {self.passes:.1f} drafter passes at c {self.c or 0.0:.2f} cost {self.drafting:.2f} "
            "steps a round",
            "verify "
            "cost": f"the verify cost: v {self.verify:.2f}, {losses['verify cost']:.2f} steps over the one step Thm "
                    "3.8 takes",
        }
        short = {
            "acceptance": f"acceptance lost {losses['acceptance']:.2f}",
            "drafting": f"drafting {losses['drafting']:.2f}",
            "verify cost": f"the verify cost {losses['verify cost']:.2f}",
        }
        head = (
            f"Most of the loss is {words[largest]} (against {' and '.join(short[k] for k in others)}, in steps a "
            "round). "
            f"A round pays when it gives more tokens than gamma c + v = {self.drafting:.2f} + {self.verify:.2f} = "
            f"{cost:.2f} "
            f"(Leviathan et al. 2023, Thm 3.8 with v); it gave {self.tokens:.2f}"
        )
        if self.tokens > cost:
            if self.call == "slower":
                return (
                    head + f": by these per-pass figures it pays, so what lost is the other work between passes "
                    f"({self.other_steps:.2f} steps a round)"
                )
            return head + ": by these per-pass figures it pays, too narrowly for this run's spread to tell from 1x"
        return head + "; " + self._to_pay(largest)

    def short_cause(self) -> str:
        """The largest cause in a few words, for the headline ("" where unknown)."""
        losses = self.causes()
        if not losses:
            return ""
        largest = max(losses, key=losses.get)
        return {
            "acceptance": f"most lost to acceptance ({self.tokens:.2f} of {self.most_tokens:g} tokens a round"
            + (f", alpha {self.alpha:.2f}" if self.alpha is not None else "")
            + ")",
            "drafting": f"most lost to drafting ({self.drafting:.2f} steps a round, c {self.c or 0.0:.2f})",
            "verify cost": f"most lost to the verify cost (v {self.verify:.2f})",
        }[largest]

    def _to_pay(self, cause: str) -> str:
        """What would make the run pay through ``cause`` alone, the other two as measured."""
        cost = self.drafting + self.verify
        if cause == "acceptance":
            if cost >= self.most_tokens:
                return (
                    f"even every draft accepted ({self.most_tokens:g} tokens a round) would not pay at this drafting "
                    "and "
                    "verify cost"
                )
            need = None if self.tree else _alpha_for(cost, round(self.most_tokens - 1))
            at = f" at gamma {round(self.most_tokens - 1)} (Eq. 1)" if need is not None else ""
            return f"paying takes more than {cost:.2f} tokens a round" + (
                f", alpha above {need:.2f}{at}" if need is not None else ""
            )
        if cause == "drafting":
            room = self.tokens - self.verify
            if room <= 0:
                return ("no drafter, however cheap, would make it pay: the verify pass alone costs more than the "
                        "tokens a round gives")
            per = f", c under {room / self.passes:.2f}" if self.passes else ""
            return f"paying takes drafting under {room:.2f} steps a round{per}"
        room = self.tokens - self.drafting
        if room <= 0:
            return ("no verify pass, however cheap, would make it pay: drafting alone costs more than the tokens a "
                    "round gives")
        return f"paying takes v under {room:.2f}"

    def why(self) -> str:
        """One line: the decomposition; for a run that lost or cannot be told from 1x, its largest cause first."""
        if self.call not in ("slower", "unclear"):
            return self.decomposition()
        cause = self.cause()
        return f"{cause}. The measured round: {self.decomposition()}" if cause else self.decomposition()


def _alpha_for(tokens: float, gamma: int) -> float | None:
    """The alpha at which Eq. (1) gives ``tokens`` per round at ``gamma`` (bisection); None past gamma + 1."""
    if gamma < 1 or tokens >= gamma + 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if theory.expected_tokens_per_round(mid, gamma) < tokens else (lo, mid)
    return hi


def kind_note(kind: str | None, rounds: int, empty: int) -> str:
    """What is known of the drafter kind that explains its acceptance, in one sentence ("" for the others)."""
    if kind == "early-exit":
        return (
            "Early exit drafts with the target's own first layers and its output layer: a target never trained to exit "
            "early, as none of the page's targets was (LayerSkip, Elhoushi et al. 2024, trains a model for it), seldom "
            "has its next token settled that early, so its drafts are seldom accepted."
        )
    if kind == "ngram":
        found = f" {empty} of the {rounds} rounds found nothing to copy and drafted nothing." if empty else ""
        return (
            "Prompt lookup drafts only by copying what followed an earlier occurrence of the last tokens: text that "
            f"seldom repeats itself or the prompt, as a chat answer seldom does, gives it little to copy.{found}"
        )
    return ""


def _time_shares(spec: Trace) -> tuple[float, float]:
    """Shares of the speculative run's decoding time (prefill left out) spent drafting and in verify passes."""
    decoding = spec.total_ms - spec.prefill_ms
    if decoding <= 0:
        return 0.0, 0.0
    draft, verify = min(1.0, spec.draft_ms / decoding), min(1.0, spec.verify_ms / decoding)
    return (draft, verify) if draft + verify <= 1.0 else (draft / (draft + verify), verify / (draft + verify))


def engines_differ(spec: Trace, baseline: Trace | None) -> str:
    """Why the two runs' times do not compare, when their passes ran on different engines (the settings' "engine":
    CUDA graphs for one, eager passes for the other), else "". Recordings made before engines were recorded have
    none."""
    if baseline is None:
        return ""
    a, b = spec.settings.get("engine"), baseline.settings.get("engine")
    if a is None or b is None or a == b:
        return ""
    return (
        f"No speedup: the speculative run's passes ran on {a} and its baseline's on {b} (other runs held the captured "
        "CUDA graphs), so their times do not compare; Generate again"
    )


def engine_sentence(spec, baseline) -> str:
    """What ran the passes, where it is worth saying (a GPU): "Passes: CUDA graphs over a static cache, both runs"
    with the capture time once, or why a run took the dynamic cache; "" on a CPU, where the dynamic cache is the
    form."""
    runs = [("speculative", spec), ("baseline", baseline)]
    engines = {name: t.settings.get("engine") for name, t in runs if t is not None}
    notes = [
        f"{name}: {t.settings['engine_note']}" for name, t in runs if t is not None and t.settings.get("engine_note")
    ]
    graphed = [e for e in engines.values() if e and "graphs" in e]
    if not graphed and not notes:
        return ""
    same = len(set(engines.values())) == 1
    kind = "CUDA graphs of inductor-compiled passes" if graphed and graphed[0].startswith("fused") else "CUDA graphs"
    head = (
        f"Passes: {kind} over a static cache, both runs"
        if same and graphed
        else "Passes: " + ", ".join(f"{name} {engine}" for name, engine in engines.items())
    )
    return head + (f" ({'; '.join(notes)})" if notes else "") + "."


def weigh(spec: Trace, baseline: Trace | None) -> Verdict | None:
    """The run's Verdict, or None without a baseline, a round to judge or a measured speedup, or with the two runs on
    different engines (``engines_differ``)."""
    if baseline is None or not spec.rounds or not baseline.rounds or engines_differ(spec, baseline):
        return None
    s = summary(spec, baseline)
    if s["measured_speedup"] is None:
        return None
    c, passes = s["cost_coefficient"], spec.drafter_forward_passes / len(spec.rounds)
    tokens = s["mean_tokens_per_round"] or 0.0
    cost = tokens / s["measured_speedup"]
    draft_share, verify_share = _time_shares(spec)
    spread = s["measured_speedup_basis"] == "decoding" and s["decode_speedup_low"] is not None
    return Verdict(
        speedup=s["measured_speedup"],
        basis=s["measured_speedup_basis"],
        tokens=tokens,
        passes=passes,
        drafting=passes * c if c is not None else 0.0,
        verify=verify_cost_shown(s),
        alpha=s["alpha"],
        c=c,
        rounds=len(spec.rounds),
        low=s["decode_speedup_low"] if spread else None,
        high=s["decode_speedup_high"] if spread else None,
        draft_steps=cost * draft_share,
        scoring_steps=cost * verify_share,
        other_steps=cost * (1.0 - draft_share - verify_share),
        stretches=s["decode_stretches"] if spread else 0,
        most_tokens=_most_tokens(spec),
        kind=(spec.settings.get("drafter") or {"kind": "model"}).get("kind"),
        empty_rounds=s["rounds_without_drafts"],
        tree=spec.has_tree,
    )


def _most_tokens(spec: Trace) -> float | None:
    """The most tokens a round could give: the gamma most rounds were allowed, plus one (a tree: its depth + 1)."""
    if spec.has_tree:
        from specviz.theory.tree import typical_depth

        depth = typical_depth(spec)
        return depth + 1.0 if depth else None
    gamma = theory.typical_gamma(spec)
    return gamma + 1.0 if gamma else None


_CALLS = {
    "faster": "Faster than the target alone",
    "slower": "Slower than the target alone",
    "unclear": "No clear difference from the target alone",
    "too few rounds": "Too few rounds to tell against the target alone",
}
# The headline's words, by call: the spread's verdict, in the same words as the spread line and the stats table.
WORDS = {
    "faster": "faster than the target alone",
    "slower": "slower than the target alone",
    "unclear": NOT_DISTINGUISHABLE,
    "too few rounds": "too few rounds to tell",
}


def _spread(j: Verdict) -> str:
    """The spread in the words the stats table uses (``specviz.views.stats.spread_words``)."""
    return spread_words(j.low, j.high, j.stretches if j.call != "too few rounds" else 0, j.rounds, j.speedup)


def verdict(spec: Trace, baseline: Trace | None) -> str:
    """Whether the speculative run beat its autoregressive baseline, and why, in one sentence (plain text).

    Empty when there is no baseline or no round to judge (``weigh``). A run that lost, or that cannot be told from
    1x, names its largest cause and what would make it pay (``Verdict.cause``), and what is known of its drafter
    kind (``kind_note``); a v below 1 says why in plain words (``specviz.views.stats.v_below_one``).
    """
    j = weigh(spec, baseline)
    if j is None:
        return engines_differ(spec, baseline) + ("." if engines_differ(spec, baseline) else "")
    s = summary(spec, baseline)
    a = f"alpha {j.alpha:.2f}" if j.alpha is not None else "no tested drafts"
    c_text = f"c {j.c:.2f}" if j.c is not None else "no drafter passes"
    v_text = (
        f"v {j.verify:.2f}"
        if j.verify is not None
        else f"v not measured ({s['verify_passes']} verify passes: it needs at least {MIN_ROUNDS})"
    )
    below = v_below_one(s) if j.verify is not None else ""
    known = kind_note(j.kind, j.rounds, j.empty_rounds) if j.call in ("slower", "unclear") else ""
    return (
        f"{_CALLS[j.call]} (speedup {j.speedup:.2f}×: {speedup_formula(j.basis)}; {_spread(j)}): "
        f"{j.why()}. Per pass (Leviathan et al. 2023, Thm 3.8): {j.passes:.1f} drafter passes at {c_text} of a target "
        "pass, "
        f"a verify pass at {v_text} target passes ({a})."
        + (f" {known}" if known else "")
        + (f" {below}." if below else "")
    )


def headline_html(spec: Trace | None, baseline: Trace | None, pending: bool = False) -> str:
    """The headline above the output: the measured speedup in large type with its spread, the line that adds up
    to it (tokens per round over drafting + scoring + other work, in steps of the target alone), and a cost bar.

    Coloured by whether the spread clears 1x (green faster, red slower, grey when it holds 1x, "not distinguishable from
    1x", or the run has too few rounds), not by the median; the spread line's words are the stats table's (a wide spread
    that clears 1x says the figure is rough). ``pending``: the baseline is still running. Without a verdict (no run, no
    baseline, no round) it says what is missing instead. Every string is the view's own (numbers and fixed words),
    escaped.
    """
    j = weigh(spec, baseline) if spec is not None else None
    if j is None:
        if spec is None or not spec.rounds:
            text = "Press Generate, or load a prepared recording: the speedup over the target alone appears here."
        elif pending:
            text = "Speedup: measuring the target alone next, in turns with this run…"
        elif engines_differ(spec, baseline):
            text = engines_differ(spec, baseline) + "."
        else:
            text = "No speedup: this run has no finished autoregressive baseline to compare with."
        return ('<div class="sv-headline sv-headline-empty" style="font-size:16px;color:#555;padding:6px '
                f'0;">{escape(text)}</div>')
    colour = {"faster": "#1a7f37", "slower": "#b42318"}.get(j.call, "#555555")
    words = WORDS[j.call]
    return (
        '<div class="sv-headline" style="display:flex;flex-wrap:wrap;align-items:center;gap:8px 24px;padding:4px 0 '
        '8px;">'
        '<div style="flex:1 1 300px;min-width:0;">'
        f'<div class="sv-headline-speedup" data-call="{escape(j.call)}" style="font-size:clamp(28px, 7vw, '
        '38px);line-height:1.1;'
        f'font-weight:700;color:{colour};">'
        f'{j.speedup:.2f}× <span style="font-size:20px;font-weight:600;">speedup: {escape(words)}</span></div>'
        '<div class="sv-headline-spread" '
        f'style="font-size:14px;color:#444;">{escape(_spread(j).removesuffix(": " + NOT_DISTINGUISHABLE))}</div>'
        f'<div class="sv-headline-why" style="font-size:17px;color:#222;margin-top:4px;">{escape(_why_line(j))}</div>'
        '<div class="sv-headline-formula" style="font-size:12px;color:#666;">speedup = '
        f'{escape(speedup_formula(j.basis))}; '
        f'a step = the target alone\'s time per token</div></div>'
        f'{cost_bar_html(j)}</div>'
    )


def _why_line(j: Verdict) -> str:
    """The headline's line of why: the decomposition, after the largest cause in a few words for a run that lost or
    cannot be told from 1x (the status sentence gives it in full)."""
    cause = j.short_cause() if j.call in ("slower", "unclear") else ""
    line = f"{cause}; {j.decomposition()}" if cause else j.decomposition()
    return {"faster": "Faster: ", "slower": "Slower: "}.get(j.call, "") + line[:1].upper() + line[1:] + "."


def cost_bar_html(j: Verdict, width: int = 220) -> str:
    """Two bars on one scale of steps of the target alone: a round's time (drafting, scoring, other work) and
    the tokens it gained (one token is worth one step, the target alone's rate); their ratio is the speedup.

    The bars are ``width`` px at most: in a narrower box (a phone) both shrink by one factor, keeping their scale,
    instead of sticking out of the headline. A grid holds the labels, the bars and their values in three columns;
    each bar is a flex row of its segments and a blank rest up to ``width``, so every segment shrinks alike."""
    scale = max(j.cost, j.tokens, 1e-9)

    def px(x: float) -> float:
        return max(0.0, x) / scale * width

    def seg(x: float, colour: str, tip: str) -> str:
        return (f'<span title="{escape(tip)}" style="display:inline-block;height:14px;width:{px(x):.1f}px;'
                f'background:{colour};vertical-align:middle;"></span>')

    def bar(*segments: tuple[float, str, str]) -> str:
        rest = max(0.0, width - sum(px(x) for x, _, _ in segments))
        return (
            f'<span style="display:flex;min-width:0;">{"".join(seg(*s) for s in segments)}'
            f'<span style="flex:0 1 {rest:.1f}px;"></span></span>'
        )

    label = "font-size:12px;color:#444;"
    time_segments = (
        (j.draft_steps, DRAFTING, f"drafting {j.draft_steps:.2f} steps"),
        (j.scoring_steps, VERIFYING, f"scoring (the target pass over the drafts) {j.scoring_steps:.2f} steps"),
        (j.other_steps, OTHER, f"other work {j.other_steps:.2f} steps"),
    )
    return (
        '<div class="sv-cost-bar" style="flex:0 0 '
        'auto;font-size:12px;color:#333;line-height:1.5;max-width:100%;display:grid;'
        f'grid-template-columns:44px minmax(0, {width}px) auto;column-gap:4px;align-items:center;white-space:nowrap;">'
        '<div style="font-weight:600;grid-column:1 / -1;white-space:normal;">a round, in steps of the target '
        'alone</div>'
        f'<div style="display:contents;"><span style="{label}">time</span>'
        f'{bar(*time_segments)}'
        f' {j.cost:.2f}</div>'
        '<div style="display:contents;"><span '
        f'style="{label}">gain</span>{bar((j.tokens, GAINED, f"{j.tokens:.2f} tokens per round (emitted / rounds)"))} '
        f'{j.tokens:.2f} tokens</div>'
        f'<div style="color:#666;grid-column:1 / -1;white-space:normal;"><span style="color:{DRAFTING};">■</span> '
        f'drafting {j.draft_steps:.2f} '
        f'<span style="color:{VERIFYING};">■</span> scoring {j.scoring_steps:.2f} '
        f'<span style="color:{OTHER};">■</span> other {j.other_steps:.2f}</div></div>'
    )
