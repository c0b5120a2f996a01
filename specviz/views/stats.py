"""The headline numbers of a run, as a dict and as an HTML table."""

from __future__ import annotations

from html import escape

from specviz import theory
from specviz.trace import Trace


def summary(spec: Trace, baseline: Trace | None = None) -> dict:
    """Acceptance rate, tokens per round, tokens/s, speedup, c and the predicted speedup.

    Keys whose inputs are missing (no baseline yet) are None.
    """
    gamma = spec.settings.get("gamma")
    alpha = spec.acceptance_rate
    c = theory.cost_coefficient(spec, baseline) if baseline is not None else None
    return {
        "rounds": len(spec.rounds),
        "generated_tokens": len(spec.output_ids),
        "acceptance_rate": alpha,
        "mean_tokens_per_round": spec.mean_tokens_per_round,
        "speculative_tokens_per_second": spec.tokens_per_second,
        "autoregressive_tokens_per_second": baseline.tokens_per_second if baseline is not None else None,
        "speedup": theory.measured_speedup(spec, baseline) if baseline is not None else None,
        "cost_coefficient": c,
        "predicted_speedup": theory.predicted_speedup(alpha, gamma, c) if None not in (alpha, gamma, c) else None,
    }


def _fmt(value, unit: str = "", digits: int = 2) -> str:
    if value is None:
        return "…"
    return f"{value:.{digits}f}{unit}"


def stats_html(spec: Trace, baseline: Trace | None = None) -> str:
    """A compact table of ``summary``; '…' marks numbers still to come."""
    s = summary(spec, baseline)
    rows = [
        ("acceptance rate", _fmt(s["acceptance_rate"]), "accepted drafts / drafted tokens"),
        ("tokens per round", _fmt(s["mean_tokens_per_round"]), "emitted tokens / rounds"),
        ("speculative", _fmt(s["speculative_tokens_per_second"], " tok/s", 1), f"{s['generated_tokens']} tokens in {s['rounds']} rounds"),
        ("autoregressive", _fmt(s["autoregressive_tokens_per_second"], " tok/s", 1), "same target, same settings"),
        ("speedup", _fmt(s["speedup"], "×"), "measured"),
        ("cost coefficient c", _fmt(s["cost_coefficient"], "", 3), "drafter step / target step"),
        ("predicted speedup", _fmt(s["predicted_speedup"], "×"), "Leviathan et al. 2023, Thm 3.8"),
    ]
    cells = "".join(
        f'<tr><td style="padding:3px 10px 3px 0;color:#444;">{escape(k)}</td>'
        f'<td style="padding:3px 10px;font-weight:600;font-variant-numeric:tabular-nums;" class="sv-stat" data-key="{escape(k)}">{escape(v)}</td>'
        f'<td style="padding:3px 0;color:#777;font-size:12px;">{escape(note)}</td></tr>'
        for k, v, note in rows
    )
    return f'<table class="sv-stats" style="border-collapse:collapse;font-size:14px;">{cells}</table>'
