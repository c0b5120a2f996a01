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
the verify pass and other work in steps of the target alone, so that tokens per round over their sum is that
speedup (``Verdict``); the colour says whether its spread over stretches of the run clears 1x.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from specviz.trace import Trace
from specviz.views.stats import summary

# The cost bar's colours: not the text's verdict colours (orange and green are the correction and bonus tokens).
DRAFTING, VERIFYING, OTHER, GAINED = "#CC79A7", "#555555", "#BBBBBB", "#0072B2"


MIN_ROUNDS = 8  # rounds a verdict needs: fewer give one stretch, no spread (specviz.measure.speedup.estimate)


@dataclass(frozen=True)
class Verdict:
    """A finished run judged against its baseline.

    Two sets of costs. ``drafting``, ``verify`` and ``c`` are the theory's (Leviathan et al. 2023, Thm 3.8): in
    target *passes*, a drafter pass as c of a target pass and the verify pass as v. ``draft_steps``,
    ``verify_steps`` and ``other_steps`` split a round's measured time in *steps of the target alone* (the
    baseline's decoding time per token over the same tokens, its own sampling and bookkeeping included), so that
    ``tokens / (draft_steps + verify_steps + other_steps)`` is the measured speedup itself: the headline's
    decomposition adds up to the number it explains."""

    speedup: float  # the measured speedup (autoregressive time / speculative time)
    basis: str  # "decoding" (prefill excluded) or "whole run"
    tokens: float  # emitted tokens / rounds
    passes: float  # drafter forward passes / rounds
    drafting: float  # passes x c: a round's drafting, in target passes (0 without drafter passes)
    verify: float | None  # v: a round's verify pass, in target passes
    alpha: float | None
    c: float | None
    rounds: int = 0
    low: float | None = None  # the middle half of the speedup over stretches of the run (None: no spread)
    high: float | None = None
    draft_steps: float = 0.0  # a round's drafting, in steps of the target alone
    verify_steps: float = 0.0  # a round's verify pass, in steps of the target alone
    other_steps: float = 0.0  # the rest of a round's time (sampling, judging, the host's work between passes)

    @property
    def cost(self) -> float:
        """A round's measured time in steps of the target alone: tokens / speedup."""
        return self.draft_steps + self.verify_steps + self.other_steps

    @property
    def call(self) -> str:
        """"faster" or "slower" when the middle half of the speedup clears 1x on that side; "unclear" when it holds
        1x; "too few rounds" under MIN_ROUNDS (no spread to read)."""
        if self.rounds < MIN_ROUNDS or self.low is None or self.high is None:
            return "too few rounds"
        return "faster" if self.low > 1.0 else "slower" if self.high < 1.0 else "unclear"

    @property
    def faster(self) -> bool:
        return self.call == "faster"

    def decomposition(self) -> str:
        """One line that adds up to the speedup: tokens per round over the round's time in steps of the target alone."""
        return (f"a round gave {self.tokens:.2f} tokens for {self.cost:.2f} steps of the target alone's time "
                f"(drafting {self.draft_steps:.2f} + verify {self.verify_steps:.2f} + other work {self.other_steps:.2f}): "
                f"{self.tokens:.2f} / {self.cost:.2f} = {self.speedup:.2f}×")

    def why(self) -> str:
        """One line: the decomposition, and for a run that lost, the part of the round that cost most."""
        if self.call != "slower":
            return self.decomposition()
        parts = {"the verify pass": self.verify_steps, "drafting": self.draft_steps, "other work between passes": self.other_steps}
        if self.verify_steps >= self.tokens:
            return (f"the verify pass alone costs {self.verify_steps:.2f} steps of the target alone, more than the {self.tokens:.2f} "
                    f"tokens a round gives; {self.decomposition()}")
        largest = max(parts, key=parts.get)
        return f"{largest} costs most ({parts[largest]:.2f} steps a round); {self.decomposition()}"


def _time_shares(spec: Trace) -> tuple[float, float]:
    """Shares of the speculative run's decoding time (prefill left out) spent drafting and in verify passes."""
    decoding = spec.total_ms - spec.prefill_ms
    if decoding <= 0:
        return 0.0, 0.0
    draft, verify = min(1.0, spec.draft_ms / decoding), min(1.0, spec.verify_ms / decoding)
    return (draft, verify) if draft + verify <= 1.0 else (draft / (draft + verify), verify / (draft + verify))


def engines_differ(spec: Trace, baseline: Trace | None) -> str:
    """Why the two runs' times do not compare, when their passes ran on different engines (the settings' "engine":
    CUDA graphs for one, eager passes for the other), else "". Recordings made before engines were recorded have none."""
    if baseline is None:
        return ""
    a, b = spec.settings.get("engine"), baseline.settings.get("engine")
    if a is None or b is None or a == b:
        return ""
    return (f"No speedup: the speculative run's passes ran on {a} and its baseline's on {b} (other runs held the captured "
            "CUDA graphs), so their times do not compare; Generate again")


def engine_sentence(spec, baseline) -> str:
    """What ran the passes, where it is worth saying (a GPU): "Passes: CUDA graphs over a static cache, both runs"
    with the capture time once, or why a run took the dynamic cache; "" on a CPU, where the dynamic cache is the form."""
    runs = [("speculative", spec), ("baseline", baseline)]
    engines = {name: t.settings.get("engine") for name, t in runs if t is not None}
    notes = [f"{name}: {t.settings['engine_note']}" for name, t in runs if t is not None and t.settings.get("engine_note")]
    graphed = [e for e in engines.values() if e and "graphs" in e]
    if not graphed and not notes:
        return ""
    same = len(set(engines.values())) == 1
    kind = "CUDA graphs of inductor-compiled passes" if graphed and graphed[0].startswith("fused") else "CUDA graphs"
    head = (f"Passes: {kind} over a static cache, both runs" if same and graphed
            else "Passes: " + ", ".join(f"{name} {engine}" for name, engine in engines.items()))
    return head + (f" ({'; '.join(notes)})" if notes else "") + "."


def judge(spec: Trace, baseline: Trace | None) -> Verdict | None:
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
    return Verdict(speedup=s["measured_speedup"], basis=s["measured_speedup_basis"], tokens=tokens,
                   passes=passes, drafting=passes * c if c is not None else 0.0, verify=s["verify_cost"], alpha=s["alpha"], c=c,
                   rounds=len(spec.rounds), low=s["decode_speedup_low"] if spread else None,
                   high=s["decode_speedup_high"] if spread else None, draft_steps=cost * draft_share,
                   verify_steps=cost * verify_share, other_steps=cost * (1.0 - draft_share - verify_share))


_CALLS = {"faster": "Faster than the target alone", "slower": "Slower than the target alone",
          "unclear": "No clear difference from the target alone", "too few rounds": "Too few rounds to tell against the target alone"}


def _spread(j: Verdict) -> str:
    if j.call == "too few rounds":
        return f"{j.rounds} round{'s' if j.rounds != 1 else ''}: a verdict needs at least {MIN_ROUNDS}, for a spread to read"
    return f"middle half {j.low:.2f}–{j.high:.2f}× over stretches of the run"


def verdict(spec: Trace, baseline: Trace | None) -> str:
    """Whether the speculative run beat its autoregressive baseline, and why, in one sentence (plain text).

    Empty when there is no baseline or no round to judge (``judge``).
    """
    j = judge(spec, baseline)
    if j is None:
        return engines_differ(spec, baseline) + ("." if engines_differ(spec, baseline) else "")
    a = f"alpha {j.alpha:.2f}" if j.alpha is not None else "no tested drafts"
    c_text = f"c {j.c:.2f}" if j.c is not None else "no drafter passes"
    v_text = f"v {j.verify:.2f}" if j.verify is not None else "v unknown"
    below = (" v is below 1: the target's pass over several tokens took less time than its one-token step, because the two "
             "ran on different matrix-product kernels (on a CPU, several rows run a matrix-matrix product with the weights "
             "packed once, or oneDNN's route that specviz times per row count, where one row runs a matrix-vector product "
             "that streams them), or because the machine was busier during the steps; it is measured, not assumed."
             if j.verify is not None and j.verify < 1.0 else "")
    return (f"{_CALLS[j.call]} (speedup {j.speedup:.2f}×, {j.basis}: autoregressive time / speculative time; {_spread(j)}): "
            f"{j.why()}. In target passes: {j.passes:.1f} drafter passes at {c_text} of a pass, a verify pass at {v_text} ({a}).{below}")


def headline_html(spec: Trace | None, baseline: Trace | None, pending: bool = False) -> str:
    """The headline above the output: the measured speedup in large type with its spread, the line that adds up
    to it (tokens per round over drafting + verify + other work, in steps of the target alone), and a cost bar.

    Coloured by whether the spread clears 1x (green faster, red slower, grey when it holds 1x or the run has too
    few rounds), not by the median. ``pending``: the baseline is still running. Without a verdict (no run, no
    baseline, no round) it says what is missing instead. Every string is the view's own (numbers and fixed
    words), escaped.
    """
    j = judge(spec, baseline) if spec is not None else None
    if j is None:
        if spec is None or not spec.rounds:
            text = "Press Generate, or load a prepared recording: the speedup over the target alone appears here."
        elif pending:
            text = "Speedup: measuring the target alone next, in turns with this run…"
        elif engines_differ(spec, baseline):
            text = engines_differ(spec, baseline) + "."
        else:
            text = "No speedup: this run has no finished autoregressive baseline to compare with."
        return f'<div class="sv-headline sv-headline-empty" style="font-size:16px;color:#555;padding:6px 0;">{escape(text)}</div>'
    colour = {"faster": "#1a7f37", "slower": "#b42318"}.get(j.call, "#555555")
    words = {"faster": "faster than the target alone", "slower": "slower than the target alone",
             "unclear": "no clear difference from the target alone", "too few rounds": "too few rounds to tell"}[j.call]
    return (
        '<div class="sv-headline" style="display:flex;flex-wrap:wrap;align-items:center;gap:8px 24px;padding:4px 0 8px;">'
        '<div style="flex:1 1 300px;min-width:0;">'
        f'<div class="sv-headline-speedup" data-call="{escape(j.call)}" style="font-size:clamp(28px, 7vw, 38px);line-height:1.1;'
        f'font-weight:700;color:{colour};">'
        f'{j.speedup:.2f}× <span style="font-size:20px;font-weight:600;">speedup: {escape(words)}</span></div>'
        f'<div class="sv-headline-spread" style="font-size:14px;color:#444;">{escape(_spread(j))}</div>'
        f'<div class="sv-headline-why" style="font-size:17px;color:#222;margin-top:4px;">{escape(_why_line(j))}</div>'
        f'<div style="font-size:12px;color:#666;">speedup = autoregressive time / speculative time, {escape(j.basis)}'
        f'{", prefill excluded" if j.basis == "decoding" else ", prefill included"}; a step = the target alone\'s time per token</div></div>'
        f'{cost_bar_html(j)}</div>'
    )


def _why_line(j: Verdict) -> str:
    return {"faster": "Faster: ", "slower": "Slower: "}.get(j.call, "") + j.why()[:1].upper() + j.why()[1:] + "."


def cost_bar_html(j: Verdict, width: int = 220) -> str:
    """Two bars on one scale of steps of the target alone: a round's time (drafting, the verify pass, other work) and
    the tokens it gained (one token is worth one step, the target alone's rate); their ratio is the speedup.

    The bars are ``width`` px at most: in a narrower box (a phone) both shrink by one factor, keeping their scale,
    instead of sticking out of the headline. A grid holds the labels, the bars and their values in three columns;
    each bar is a flex row of its segments and a blank rest up to ``width``, so every segment shrinks alike."""
    scale = max(j.cost, j.tokens, 1e-9)
    px = lambda x: max(0.0, x) / scale * width  # noqa: E731
    seg = lambda x, colour, tip: (f'<span title="{escape(tip)}" style="display:inline-block;height:14px;width:{px(x):.1f}px;'  # noqa: E731
                                  f'background:{colour};vertical-align:middle;"></span>')

    def bar(*segments: tuple[float, str, str]) -> str:
        rest = max(0.0, width - sum(px(x) for x, _, _ in segments))
        return (f'<span style="display:flex;min-width:0;">{"".join(seg(*s) for s in segments)}'
                f'<span style="flex:0 1 {rest:.1f}px;"></span></span>')

    label = "font-size:12px;color:#444;"
    return (
        f'<div class="sv-cost-bar" style="flex:0 0 auto;font-size:12px;color:#333;line-height:1.5;max-width:100%;display:grid;'
        f'grid-template-columns:44px minmax(0, {width}px) auto;column-gap:4px;align-items:center;white-space:nowrap;">'
        f'<div style="font-weight:600;grid-column:1 / -1;white-space:normal;">a round, in steps of the target alone</div>'
        f'<div style="display:contents;"><span style="{label}">time</span>'
        f'{bar((j.draft_steps, DRAFTING, f"drafting {j.draft_steps:.2f} steps"), (j.verify_steps, VERIFYING, f"verify pass {j.verify_steps:.2f} steps"), (j.other_steps, OTHER, f"other work {j.other_steps:.2f} steps"))}'
        f' {j.cost:.2f}</div>'
        f'<div style="display:contents;"><span style="{label}">gain</span>{bar((j.tokens, GAINED, f"{j.tokens:.2f} tokens per round (emitted / rounds)"))} '
        f'{j.tokens:.2f} tokens</div>'
        f'<div style="color:#666;grid-column:1 / -1;white-space:normal;"><span style="color:{DRAFTING};">■</span> drafting {j.draft_steps:.2f} '
        f'<span style="color:{VERIFYING};">■</span> verify {j.verify_steps:.2f} '
        f'<span style="color:{OTHER};">■</span> other {j.other_steps:.2f}</div></div>'
    )
