"""One plain sentence after a run: faster or slower than the target alone, and why, in alpha, c and v.

Leviathan et al. (2023, Thm 3.8, with a verify pass of v target steps): a round yields E[tokens]
= (1 - alpha^(gamma+1)) / (1 - alpha) tokens (Eq. 1) and costs (drafter passes) x c + v target
steps, so speculation wins exactly when tokens per round > drafter passes per round x c + v. The
sentence uses the run's measured figures: tokens per round (emitted tokens / rounds), drafter
passes per round, c (drafter step ms / target step ms) and v (verify pass ms per round / target
step ms), both against the baseline run beside it.
"""

from __future__ import annotations

from specviz.trace import Trace
from specviz.views.stats import summary


def verdict(spec: Trace, baseline: Trace | None) -> str:
    """Whether the speculative run beat its autoregressive baseline, and why, in one sentence (plain text).

    The speedup is the decoding speedup (autoregressive ms / speculative ms over stretches of equal
    tokens, prefill excluded) where it can be estimated, else tokens/s over tokens/s of the whole
    runs. Empty when there is no baseline or no round to judge.
    """
    if baseline is None or not spec.rounds or not baseline.rounds:
        return ""
    s = summary(spec, baseline)
    speedup, what = s["decode_speedup"], "decoding"
    if speedup is None:
        speedup, what = s["speedup"], "whole run"
    if speedup is None:
        return ""
    alpha, c, v = s["alpha"], s["cost_coefficient"], s["verify_cost"]
    tokens = s["mean_tokens_per_round"] or 0.0
    passes = spec.drafter_forward_passes / len(spec.rounds)
    draft_cost = passes * c if c is not None else 0.0
    cost = draft_cost + (v if v is not None else 1.0)
    a = f"alpha {alpha:.2f}" if alpha is not None else "no tested drafts"
    c_text = f"c {c:.2f}" if c is not None else "no drafter passes"
    v_text = f"v {v:.2f}" if v is not None else "v unknown"
    head = (f"{'Faster' if speedup >= 1.0 else 'Slower'} than the target alone ({speedup:.2f}× {what}, autoregressive time / "
            f"speculative time): a round gave {tokens:.2f} tokens ({a}) for {cost:.2f} target steps "
            f"({passes:.1f} drafter passes at {c_text} of a step, plus a verify pass at {v_text} steps)")
    if speedup >= 1.0:
        return head + "."
    # Name the largest cost above the ideal round (gamma + 1 tokens for one step).
    if v is not None and v >= 1.25 and v - 1.0 >= draft_cost:
        why = f"the verify pass over several tokens costs {v:.2f} single steps on this machine"
    elif draft_cost >= 0.5:
        why = f"drafting costs {draft_cost:.2f} target steps a round"
    else:
        why = "too few drafts are accepted to pay for the round"
    return head + f", so it lost: {why}."

