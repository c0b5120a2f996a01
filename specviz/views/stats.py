"""The headline numbers of a run, as a dict and as an HTML table."""

from __future__ import annotations

from html import escape

from specviz import theory
from specviz.speedup import estimate
from specviz.trace import Trace


def summary(spec: Trace, baseline: Trace | None = None) -> dict:
    """The run's headline numbers, each with its denominator in its name or docstring.

    Keys: rounds, generated_tokens, draft_acceptance_rate (accepted / drafted), alpha (accepted /
    (accepted + rejected)), mean_beta (mean of sum_x min(p, q) over the tested drafts),
    mean_tokens_per_round, gamma (the gamma most rounds were allowed), speculative_tokens_per_second and
    autoregressive_tokens_per_second (tokens/s, prefill included), speedup (their ratio: the whole run,
    prefill included), decode_speedup with decode_speedup_low and decode_speedup_high (autoregressive
    ms / speculative ms over stretches of equal tokens, prefill excluded: the median and the middle
    half, ``specviz.speedup.estimate``), cost_coefficient c, verify_cost v,
    predicted_speedup (Leviathan et al. 2023, Thm 3.8, from alpha, gamma, c) and
    predicted_speedup_verify (the same with the measured verify cost: E[tokens] / (gamma c + v)).
    Keys whose inputs are missing (no baseline yet) are None.
    """
    alpha = spec.alpha
    gamma = theory.typical_gamma(spec)
    c = theory.cost_coefficient(spec, baseline) if baseline is not None else None
    v = theory.verify_cost(spec, baseline) if baseline is not None else None
    known = alpha is not None and gamma is not None and c is not None
    est = estimate(spec, baseline) if baseline is not None else None
    return {
        "rounds": len(spec.rounds),
        "generated_tokens": len(spec.output_ids),
        "drafted": spec.drafted,
        "accepted": spec.accepted,
        "rejected": spec.rejected,
        "draft_acceptance_rate": spec.acceptance_rate,
        "alpha": alpha,
        "mean_beta": spec.mean_beta,
        "mean_tokens_per_round": spec.mean_tokens_per_round,
        "gamma": gamma,
        "speculative_tokens_per_second": spec.tokens_per_second,
        "autoregressive_tokens_per_second": baseline.tokens_per_second if baseline is not None else None,
        "speedup": theory.measured_speedup(spec, baseline) if baseline is not None else None,
        "decode_speedup": est.decode_speedup if est is not None else None,
        "decode_speedup_low": est.low if est is not None else None,
        "decode_speedup_high": est.high if est is not None else None,
        "cost_coefficient": c,
        "verify_cost": v,
        "predicted_speedup": theory.predicted_speedup(alpha, gamma, c) if known else None,
        "predicted_speedup_verify": theory.predicted_speedup_with_verify_cost(alpha, gamma, c, v) if known and v is not None else None,
    }


def _decode_note(spec: Trace, baseline: Trace | None) -> str:
    """What the decoding speedup is, and its spread over stretches of the run (specviz.speedup.estimate)."""
    est = estimate(spec, baseline) if baseline is not None else None
    if est is None or len(est.windows) < 2:
        return "autoregressive ms / speculative ms over the same tokens, prefill excluded"
    note = (f"autoregressive ms / speculative ms, prefill excluded: the median of {len(est.windows)} stretches of equal tokens; "
            f"middle half {est.low:.2f}–{est.high:.2f}×")
    return note if est.readable else note + ": too spread to read, run again on a quieter machine"


def _fmt(value, unit: str = "", digits: int = 2, missing: str = "…") -> str:
    if value is None:
        return missing
    return f"{value:.{digits}f}{unit}"


# The rows that need the autoregressive baseline, and what they say when there is none.
_NEEDS_BASELINE = ("autoregressive", "speedup (decoding)", "speedup (whole run)", "cost coefficient c", "verify cost v",
                   "predicted speedup", "predicted, measured v")
NO_BASELINE = "needs the autoregressive baseline, which this run does not have"


def stats_html(spec: Trace, baseline: Trace | None = None, pending: bool = False) -> str:
    """A compact table of ``summary``.

    ``pending``: the baseline is still running, so its numbers are marked '…' (to come); otherwise a
    run without a baseline (stopped, or a trace on its own in a notebook) shows '–' and says why.
    """
    s = summary(spec, baseline)
    rows = [
        ("draft acceptance rate", _fmt(s["draft_acceptance_rate"]), f"accepted / drafted = {s['accepted']} / {s['drafted']}"),
        ("alpha", _fmt(s["alpha"]), f"accepted / tested = {s['accepted']} / {s['accepted'] + s['rejected']} (discarded drafts were never tested)"),
        ("mean beta", _fmt(s["mean_beta"]), f"mean of Σ min(p, q) over the {s['accepted'] + s['rejected']} tested drafts: alpha with less noise"),
        ("tokens per round", _fmt(s["mean_tokens_per_round"]), f"emitted tokens / rounds = {s['generated_tokens']} / {s['rounds']}"),
        ("speculative", _fmt(s["speculative_tokens_per_second"], " tok/s", 1), "generated tokens / wall time, prefill included"),
        ("autoregressive", _fmt(s["autoregressive_tokens_per_second"], " tok/s", 1), "same target, same settings, prefill included"),
        ("speedup (decoding)", _fmt(s["decode_speedup"], "×"), _decode_note(spec, baseline)),
        ("speedup (whole run)", _fmt(s["speedup"], "×"), "speculative tok/s / autoregressive tok/s, prefill included"),
        ("cost coefficient c", _fmt(s["cost_coefficient"], "", 3), "drafter step / target step"),
        ("verify cost v", _fmt(s["verify_cost"]), "target pass over gamma + 1 tokens / target step"),
        ("predicted speedup", _fmt(s["predicted_speedup"], "×"), "Thm 3.8 from alpha, gamma, c (assumes v = 1)"),
        ("predicted, measured v", _fmt(s["predicted_speedup_verify"], "×"), "Eq. (1) tokens / (gamma c + v)"),
    ]
    if baseline is None and not pending:
        rows = [(k, "–", NO_BASELINE) if k in _NEEDS_BASELINE else (k, v, note) for k, v, note in rows]
    cells = "".join(
        f'<tr><td style="padding:3px 10px 3px 0;color:#444;">{escape(k)}</td>'
        f'<td style="padding:3px 10px;font-weight:600;font-variant-numeric:tabular-nums;" class="sv-stat" data-key="{escape(k)}">{escape(v)}</td>'
        f'<td style="padding:3px 0;color:#777;font-size:12px;">{escape(note)}</td></tr>'
        for k, v, note in rows
    )
    return f'<table class="sv-stats" style="border-collapse:collapse;font-size:14px;">{cells}</table>'
