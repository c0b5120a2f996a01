"""The headline numbers of a run, as a dict and as an HTML table."""

from __future__ import annotations

from html import escape

from specviz import metrics, theory
from specviz.measure.speedup import estimate
from specviz.trace import Trace


def summary(spec: Trace, baseline: Trace | None = None) -> dict:
    """The run's headline numbers, each with its denominator in its name or docstring.

    Keys: rounds, generated_tokens, draft_acceptance_rate (accepted / drafted), alpha (accepted /
    (accepted + rejected)), mean_beta (mean of sum_x min(p, q) over the tested drafts), alpha_chance_sd (how far
    alpha falls from mean_beta by chance alone, one standard deviation: ``Trace.alpha_chance_sd``),
    mean_tokens_per_round, gamma (the gamma most rounds were allowed), speculative_tokens_per_second and
    autoregressive_tokens_per_second (tokens/s, prefill included), speedup (their ratio: the whole run,
    prefill included), decode_speedup with decode_speedup_low and decode_speedup_high (autoregressive
    ms / speculative ms over stretches of equal tokens, prefill excluded: the median and the middle
    half, ``specviz.measure.speedup.estimate``: the ratio of the decoding times over the same tokens, its spread over
    stretches of equal tokens), cost_coefficient c, verify_cost v,
    predicted_speedup (Leviathan et al. 2023, Thm 3.8, from alpha, gamma, c) and
    predicted_speedup_verify (the same with the measured verify cost: E[tokens] / (gamma c + v)).
    A token tree run has no gamma and Thm 3.8 is a chain's: its predicted_speedup is None and its
    predicted_speedup_verify is ``specviz.theory.tree.predicted_speedup`` (E[tokens] from the measured
    acceptance by depth / (drafting + v), in target steps); it also has tree = True, nodes_per_round,
    acceptance_by_depth (list of a_d) and predicted_tokens_per_round.
    measured_speedup and measured_speedup_basis: THE speedup the page names "speedup" everywhere
    (status, headline, Theory's measured point, this table): decode_speedup ("decoding") where it
    can be estimated, else the whole-run ratio ("whole run"); ``headline_speedup``.
    Keys whose inputs are missing (no baseline yet) are None.
    """
    alpha = spec.alpha
    gamma = theory.typical_gamma(spec)
    c = theory.cost_coefficient(spec, baseline) if baseline is not None else None
    v = theory.verify_cost(spec, baseline) if baseline is not None else None
    known = alpha is not None and gamma is not None and c is not None
    est = estimate(spec, baseline) if baseline is not None else None
    out = {
        "rounds": len(spec.rounds),
        "generated_tokens": len(spec.output_ids),
        "drafted": spec.drafted,
        "accepted": spec.accepted,
        "rejected": spec.rejected,
        "draft_acceptance_rate": spec.acceptance_rate,
        "alpha": alpha,
        "mean_beta": spec.mean_beta,
        "alpha_chance_sd": spec.alpha_chance_sd,
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
    out["measured_speedup"], out["measured_speedup_basis"] = headline_speedup(out)
    return out | _tree_predictions(spec, baseline, v) if spec.has_tree else out


def headline_speedup(s: dict) -> tuple[float | None, str | None]:
    """The one measured speedup the page shows, from a ``summary`` dict: (value, basis).

    The decoding speedup (autoregressive ms / speculative ms over stretches of equal tokens, prefill
    excluded; ``specviz.measure.speedup.estimate``) with basis "decoding" where it can be estimated,
    else speculative tok/s / autoregressive tok/s over the whole runs with basis "whole run";
    (None, None) without a baseline.
    """
    if s.get("decode_speedup") is not None:
        return s["decode_speedup"], "decoding"
    if s.get("speedup") is not None:
        return s["speedup"], "whole run"
    return None, None


def _tree_predictions(spec: Trace, baseline: Trace | None, v: float | None) -> dict:
    """The keys ``summary`` replaces or adds for a token tree run (see there)."""
    from specviz.theory import tree as tree_theory

    rates = tree_theory.depth_rates(tree_theory.acceptance_by_depth(spec))
    step = theory.target_step_ms(baseline) if baseline is not None else None
    drafting = metrics.ratio(spec.draft_ms, len(spec.rounds) * step) if step else None  # a round's drafting, in target steps
    return {
        "gamma": None, "predicted_speedup": None,
        "predicted_speedup_verify": tree_theory.predicted_speedup(rates, drafting, v) if rates and drafting is not None and v else None,
        "tree": True, "nodes_per_round": tree_theory.nodes_per_round(spec), "acceptance_by_depth": rates,
        "predicted_tokens_per_round": tree_theory.expected_tokens_per_round(rates) if spec.rounds else None,
    }


def _decode_note(spec: Trace, baseline: Trace | None) -> str:
    """What the decoding speedup is, and its spread over stretches of the run (specviz.measure.speedup.estimate)."""
    est = estimate(spec, baseline) if baseline is not None else None
    if est is None or len(est.windows) < 2:
        return "autoregressive ms / speculative ms over the same tokens, prefill excluded"
    note = (f"autoregressive ms / speculative ms over the same tokens, prefill excluded; over {len(est.windows)} stretches of "
            f"equal tokens, middle half {est.low:.2f}–{est.high:.2f}×")
    return note if est.readable else note + ": too spread to read, run again on a quieter machine"


def _speedup_note(s: dict, spec: Trace, baseline: Trace | None) -> str:
    """The formula of the one measured speedup, by its basis (``headline_speedup``)."""
    if s["measured_speedup_basis"] == "whole run":
        return "speculative tok/s / autoregressive tok/s over the whole runs, prefill included (too few rounds for stretches)"
    return _decode_note(spec, baseline)


def _fmt(value, unit: str = "", digits: int = 2, missing: str = "…") -> str:
    if value is None:
        return missing
    return f"{value:.{digits}f}{unit}"


# The rows that need the autoregressive baseline, and what they say when there is none.
SPEEDUP, WHOLE_RUN, THM_38, WITH_V = "speedup", "tok/s ratio, whole run", "Thm 3.8 prediction (v = 1)", "prediction with measured v"
_NEEDS_BASELINE = ("autoregressive", SPEEDUP, WHOLE_RUN, "cost coefficient c", "verify cost v", THM_38, WITH_V)
# Formulas and predictions: labelled with their formula and not bold, so the one measured speedup stands out.
PLAIN = (WHOLE_RUN, THM_38, WITH_V)
NO_BASELINE = "needs the autoregressive baseline, which this run does not have"


def _beta_note(s: dict) -> str:
    """What mean beta is, and how far alpha may sit from it by chance (``Trace.alpha_chance_sd``)."""
    n, sd = s["accepted"] + s["rejected"], s.get("alpha_chance_sd")
    note = f"mean of Σ min(p, q) over the {n} tested drafts: each one's chance of acceptance, so what alpha is expected to be"
    if sd is None:
        return note
    if sd < 5e-4:
        return note + "; alpha equals it here (greedy: each test is certain)"
    return (note + f"; by chance alone alpha falls within ±{sd:.2f} of it two times in three "
            "(one standard deviation, √Σβ(1−β) / N)")


def stats_html(spec: Trace, baseline: Trace | None = None, pending: bool = False) -> str:
    """A compact table of ``summary``.

    ``pending``: the baseline is still running, so its numbers are marked '…' (to come); otherwise a
    run without a baseline (stopped, or a trace on its own in a notebook) shows '–' and says why.
    """
    s = summary(spec, baseline)
    rows = [
        ("draft acceptance rate", _fmt(s["draft_acceptance_rate"]), f"accepted / drafted = {s['accepted']} / {s['drafted']}"),
        ("alpha", _fmt(s["alpha"]), f"accepted / tested = {s['accepted']} / {s['accepted'] + s['rejected']} (discarded drafts were never tested)"),
        ("mean beta", _fmt(s["mean_beta"]), _beta_note(s)),
        ("tokens per round", _fmt(s["mean_tokens_per_round"]), f"emitted tokens / rounds = {s['generated_tokens']} / {s['rounds']}"),
        ("speculative", _fmt(s["speculative_tokens_per_second"], " tok/s", 1), "generated tokens / wall time, prefill included"),
        ("autoregressive", _fmt(s["autoregressive_tokens_per_second"], " tok/s", 1), "same target, same settings, prefill included"),
        (SPEEDUP, _fmt(s["measured_speedup"], "×"), _speedup_note(s, spec, baseline)),
        (WHOLE_RUN, _fmt(s["speedup"], "×"), "speculative tok/s / autoregressive tok/s, prefill included"),
        ("cost coefficient c", _fmt(s["cost_coefficient"], "", 3), "drafter step / target step"),
        ("verify cost v", _fmt(s["verify_cost"]), "target pass over gamma + 1 tokens / target step"),
        (THM_38, _fmt(s["predicted_speedup"], "×"), "(1 − α^(γ+1)) / ((1 − α)(γ c + 1)) from alpha, gamma, c: a verify pass taken as one step"),
        (WITH_V, _fmt(s["predicted_speedup_verify"], "×"), "Eq. (1) tokens / (gamma c + v)"),
    ]
    if s.get("tree"):
        rows = _tree_rows(s, rows)
    if baseline is None and not pending:
        rows = [(k, "–", NO_BASELINE) if k in _NEEDS_BASELINE else (k, v, note) for k, v, note in rows]
    return table_html(rows, "sv-stats", plain=PLAIN)


def _tree_rows(s: dict, rows: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The chain's rows rewritten for a token tree: v is over the tree's nodes, Thm 3.8 does not apply
    (no gamma), the prediction comes from the acceptance by depth; nodes and that acceptance added."""
    notes = {
        "alpha": f"accepted / tested nodes = {s['accepted']} / {s['accepted'] + s['rejected']} (siblings never tested not counted)",
        "verify cost v": "target pass over the tree's nodes and the pending token / target step",
        THM_38: "Thm 3.8 is a chain's (one draft per position); a tree's is the next row",
        WITH_V: "predicted tokens per round / (a round's drafting + v), both in target steps",
    }
    if s["mean_beta"] is None:
        notes["mean beta"] = "not given for a tree: its siblings are tested against the residual p', not p"
    out = []
    for k, v, note in rows:
        out.append((k, "–" if k == THM_38 or (k == "mean beta" and s["mean_beta"] is None) else v, notes.get(k, note)))
        if k == "tokens per round":
            out += [
                ("tokens per round, predicted", _fmt(s["predicted_tokens_per_round"]), "1 + Σ_d Π_{j≤d} a_j from the acceptance by depth"),
                ("nodes per round", _fmt(s["nodes_per_round"], "", 1), f"drafted nodes / rounds = {s['drafted']} / {s['rounds']}"),
                ("acceptance by depth a_d", ", ".join(f"{a:.2f}" for a in s["acceptance_by_depth"]) or "…",
                 "per depth: rounds whose path reached it / rounds offered children there"),
            ]
    return out


def table_html(rows: list[tuple[str, str, str]], css_class: str, plain: tuple[str, ...] = ()) -> str:
    """Rows of (name, value, note) as the page's numbers table, values bold except the rows named in
    ``plain``; every string escaped."""
    cells = "".join(
        f'<tr><td style="padding:3px 10px 3px 0;color:#444;">{escape(k)}</td>'
        f'<td style="padding:3px 10px;font-weight:{400 if k in plain else 600};font-variant-numeric:tabular-nums;" class="sv-stat" '
        f'data-key="{escape(k)}">{escape(v)}</td>'
        f'<td style="padding:3px 0;color:#777;font-size:12px;">{escape(note)}</td></tr>'
        for k, v, note in rows
    )
    return f'<table class="{escape(css_class)}" style="border-collapse:collapse;font-size:14px;">{cells}</table>'
