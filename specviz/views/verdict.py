"""The verdict of a run: faster or slower than the target alone, and why, in alpha, c and v; as one
plain sentence (the status line, the HTML export) and as the headline at the top of the output
(the measured speedup in large type, one line of why, and a cost bar).

Leviathan et al. (2023, Thm 3.8, with a verify pass of v target steps): a round yields E[tokens]
= (1 - alpha^(gamma+1)) / (1 - alpha) tokens (Eq. 1) and costs (drafter passes) x c + v target
steps, so speculation wins exactly when tokens per round > drafter passes per round x c + v. The
verdict uses the run's measured figures: tokens per round (emitted tokens / rounds), drafter
passes per round, c (drafter step ms / target step ms) and v (verify pass ms per round / target
step ms), both against the baseline run beside it. The speedup is the page's one measured speedup
(``specviz.views.stats.headline_speedup``).
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from specviz.trace import Trace
from specviz.views.stats import summary

# The cost bar's colours: not the text's verdict colours (orange and green are the correction and bonus tokens).
DRAFTING, VERIFYING, GAINED = "#CC79A7", "#555555", "#0072B2"


@dataclass(frozen=True)
class Verdict:
    """A finished run judged against its baseline. Costs are in target steps per round (one
    autoregressive step emits one token, so tokens per round and steps per round compare directly)."""

    speedup: float  # the measured speedup (autoregressive time / speculative time)
    basis: str  # "decoding" (prefill excluded) or "whole run"
    tokens: float  # emitted tokens / rounds
    passes: float  # drafter forward passes / rounds
    drafting: float  # passes x c: a round's drafting, in target steps (0 without drafter passes)
    verify: float | None  # v: a round's verify pass, in target steps
    alpha: float | None
    c: float | None

    @property
    def cost(self) -> float:
        """A round's cost in target steps: drafting + v (v taken as 1 where it is unknown)."""
        return self.drafting + (self.verify if self.verify is not None else 1.0)

    @property
    def faster(self) -> bool:
        return self.speedup >= 1.0

    def why(self) -> str:
        """One line: what a round gained against what it cost, or, for a slower run, its largest cost
        above the ideal round (gamma + 1 tokens for one step)."""
        if self.faster:
            return f"a round gave {self.tokens:.2f} tokens for {self.cost:.2f} target steps of time"
        v = self.verify
        if v is not None and v >= 1.25 and v - 1.0 >= self.drafting:
            return f"the verify pass over several tokens costs {v:.2f} single steps on this machine"
        if self.drafting >= 0.5:
            return f"drafting costs {self.drafting:.2f} target steps a round"
        return "too few drafts are accepted to pay for the round"


def judge(spec: Trace, baseline: Trace | None) -> Verdict | None:
    """The run's Verdict, or None without a baseline, a round to judge or a measured speedup."""
    if baseline is None or not spec.rounds or not baseline.rounds:
        return None
    s = summary(spec, baseline)
    if s["measured_speedup"] is None:
        return None
    c, passes = s["cost_coefficient"], spec.drafter_forward_passes / len(spec.rounds)
    return Verdict(speedup=s["measured_speedup"], basis=s["measured_speedup_basis"], tokens=s["mean_tokens_per_round"] or 0.0,
                   passes=passes, drafting=passes * c if c is not None else 0.0, verify=s["verify_cost"], alpha=s["alpha"], c=c)


def verdict(spec: Trace, baseline: Trace | None) -> str:
    """Whether the speculative run beat its autoregressive baseline, and why, in one sentence (plain text).

    Empty when there is no baseline or no round to judge (``judge``).
    """
    j = judge(spec, baseline)
    if j is None:
        return ""
    a = f"alpha {j.alpha:.2f}" if j.alpha is not None else "no tested drafts"
    c_text = f"c {j.c:.2f}" if j.c is not None else "no drafter passes"
    v_text = f"v {j.verify:.2f}" if j.verify is not None else "v unknown"
    head = (f"{'Faster' if j.faster else 'Slower'} than the target alone (speedup {j.speedup:.2f}×, {j.basis}: autoregressive time / "
            f"speculative time): a round gave {j.tokens:.2f} tokens ({a}) for {j.cost:.2f} target steps "
            f"({j.passes:.1f} drafter passes at {c_text} of a step, plus a verify pass at {v_text} steps)")
    return head + "." if j.faster else head + f", so it lost: {j.why()}."


def headline_html(spec: Trace | None, baseline: Trace | None, pending: bool = False) -> str:
    """The headline above the output: the measured speedup in large type, one line of why, and a cost
    bar (a round's drafting and verify time in target steps against the tokens it gained, on one scale).

    ``pending``: the baseline is still running. Without a verdict (no run, no baseline, no round) it
    says what is missing instead. Every string is the view's own (numbers and fixed words), escaped.
    """
    j = judge(spec, baseline) if spec is not None else None
    if j is None:
        if spec is None or not spec.rounds:
            text = "Press Generate, or load a prepared recording: the speedup over the target alone appears here."
        elif pending:
            text = "Speedup: measuring the target alone next, in turns with this run…"
        else:
            text = "No speedup: this run has no finished autoregressive baseline to compare with."
        return f'<div class="sv-headline sv-headline-empty" style="font-size:16px;color:#555;padding:6px 0;">{escape(text)}</div>'
    colour = "#1a7f37" if j.faster else "#b42318"
    word = "faster" if j.faster else "slower"
    return (
        '<div class="sv-headline" style="display:flex;flex-wrap:wrap;align-items:center;gap:8px 24px;padding:4px 0 8px;">'
        '<div style="flex:1 1 300px;min-width:0;">'
        f'<div class="sv-headline-speedup" style="font-size:clamp(28px, 7vw, 38px);line-height:1.1;font-weight:700;color:{colour};">'
        f'{j.speedup:.2f}× <span style="font-size:20px;font-weight:600;">speedup: {word} than the target alone</span></div>'
        f'<div class="sv-headline-why" style="font-size:17px;color:#222;margin-top:4px;">{escape(_why_line(j))}</div>'
        f'<div style="font-size:12px;color:#666;">speedup = autoregressive time / speculative time, {escape(j.basis)}'
        f'{", prefill excluded" if j.basis == "decoding" else ", prefill included"}</div></div>'
        f'{cost_bar_html(j)}</div>'
    )


def _why_line(j: Verdict) -> str:
    return ("Faster: " if j.faster else "Slower: ") + j.why() + "."


def cost_bar_html(j: Verdict, width: int = 220) -> str:
    """Two bars on one scale of target steps: a round's cost (drafting, then the verify pass) and the
    tokens it gained (one token is worth one target step, the baseline's rate)."""
    verify = j.verify if j.verify is not None else 1.0
    scale = max(j.cost, j.tokens, 1e-9)
    px = lambda x: max(0.0, x) / scale * width  # noqa: E731
    seg = lambda x, colour, tip: (f'<span title="{escape(tip)}" style="display:inline-block;height:14px;width:{px(x):.1f}px;'  # noqa: E731
                                  f'background:{colour};vertical-align:middle;"></span>')
    drafting = f"drafting {j.drafting:.2f} steps ({j.passes:.1f} drafter passes × c {j.c:.2f})" if j.c is not None else "no drafter passes"
    label = "font-size:12px;color:#444;display:inline-block;width:44px;"
    return (
        f'<div class="sv-cost-bar" style="flex:0 0 auto;font-size:12px;color:#333;line-height:1.5;">'
        f'<div style="font-weight:600;">a round, in target steps</div>'
        f'<div><span style="{label}">cost</span>{seg(j.drafting, DRAFTING, drafting)}{seg(verify, VERIFYING, f"verify pass v {verify:.2f} steps")}'
        f' {j.cost:.2f}</div>'
        f'<div><span style="{label}">gain</span>{seg(j.tokens, GAINED, f"{j.tokens:.2f} tokens per round (emitted / rounds)")} '
        f'{j.tokens:.2f} tokens</div>'
        f'<div style="color:#666;"><span style="color:{DRAFTING};">■</span> drafting {j.drafting:.2f} '
        f'<span style="color:{VERIFYING};">■</span> verify v {verify:.2f}{"" if j.verify is not None else " (taken as 1)"}</div></div>'
    )
