"""The headline numbers of a run, as a dict and as an HTML table.

One speedup: ``measured_speedup`` (``headline_speedup``), the decoding speedup (autoregressive decoding time /
speculative decoding time over the same tokens, prefill excluded) wherever it can be estimated. The table's two
tokens/s rows are over those same tokens and that same decoding time, so their ratio is the speedup shown; the
whole runs' tokens/s (prefill included) are a ratio named for what it divides, never "speedup". Its spread is the
interquartile range of the speedups over stretches of equal tokens (``spread_words``, the headline's words too).
"""

from __future__ import annotations

from html import escape

from specviz import metrics, theory
from specviz.records.speedup import TOO_WIDE, _time_at, estimate
from specviz.trace import Trace

# The one speedup's name, word for word wherever it is shown (headline, status, stats, Explanation, Compare, the auto
# tree's note), by its basis (``headline_speedup``): a class reads the same quantity under the same words everywhere.
SPEEDUP_DECODING = "autoregressive decoding time / speculative decoding time over the same tokens, prefill excluded"
SPEEDUP_WHOLE = "speculative tokens/s / autoregressive tokens/s over the whole runs, prefill included"


def speedup_formula(basis: str) -> str:
    """The speedup's formula in words for its basis: "decoding" (SPEEDUP_DECODING) or "whole run" (SPEEDUP_WHOLE)."""
    return SPEEDUP_WHOLE if basis == "whole run" else SPEEDUP_DECODING


# rounds (verify passes) a spread of the speedup and a measured v need: fewer give one stretch, and a few
MIN_ROUNDS = 8
# passes are noise (one slow pass on a busy machine moves their mean by half)


def summary(spec: Trace, baseline: Trace | None = None) -> dict:
    """The run's headline numbers, each with its denominator in its name or docstring.

    Keys: rounds, generated_tokens, draft_acceptance_rate (accepted / drafted), alpha (accepted /
    (accepted + rejected)), mean_beta (mean of sum_x min(p, q) over the tested drafts), alpha_chance_sd (how far
    alpha falls from mean_beta by chance alone, one standard deviation: ``Trace.alpha_chance_sd``),
    mean_tokens_per_round, gamma (the gamma most rounds were allowed), speculative_tokens_per_second and
    autoregressive_tokens_per_second (tokens/s of the whole runs, prefill included), speedup (their ratio: the whole-run
    tok/s ratio, prefill included; the key keeps its old name, the page never calls it a speedup),
    speculative_decoding_tokens_per_second and autoregressive_decoding_tokens_per_second (decoding_tokens, the tokens
    both runs emitted, over each run's decoding time for them, prefill excluded: their ratio is decode_speedup),
    decode_speedup with decode_speedup_low and decode_speedup_high (autoregressive ms / speculative ms over the same
    tokens, prefill excluded, and the interquartile range of that ratio over decode_stretches stretches of equal tokens,
    ``specviz.records.speedup.estimate``), cost_coefficient c, verify_cost v with verify_passes (the speculative run's
    verify passes, one a round) and baseline_steps (the baseline's target steps) it is the mean of, predicted_speedup
    (Leviathan et al. 2023, Thm 3.8, from alpha, gamma, c) and predicted_speedup_verify (the same with the measured
    verify cost: E[tokens] / (gamma c + v)); varying_gamma (an adaptive gamma schedule: rounds of their own lengths)
    and mean_drafts_per_round; where gamma varies, both predictions are
    ``specviz.theory.predicted_speedup_for_rounds`` over each round's drafts (v = 1, and the measured v). A token
    tree run has no gamma and Thm 3.8 is a chain's: its
    predicted_speedup is None and its predicted_speedup_verify is ``specviz.theory.tree.predicted_speedup`` (E[tokens]
    from the measured acceptance by depth / (drafting + v), in target steps); it also has tree = True, nodes_per_round,
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
    spec_tps, base_tps, same_tokens = _decoding_rates(spec, baseline)
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
        "speculative_decoding_tokens_per_second": spec_tps,
        "autoregressive_decoding_tokens_per_second": base_tps,
        "decoding_tokens": same_tokens,
        "speedup": theory.measured_speedup(spec, baseline) if baseline is not None else None,
        "decode_speedup": est.decode_speedup if est is not None else None,
        "decode_speedup_low": est.low if est is not None else None,
        "decode_speedup_high": est.high if est is not None else None,
        "decode_stretches": len(est.windows) if est is not None else 0,
        "cost_coefficient": c,
        "verify_cost": v,
        "verify_passes": len(spec.rounds),
        "rounds_without_drafts": sum(1 for r in spec.rounds if not (r.tree.nodes if r.tree is not None else r.drafts)),
        "baseline_steps": len(baseline.rounds) if baseline is not None else 0,
        "predicted_speedup": theory.predicted_speedup(alpha, gamma, c) if known else None,
        "predicted_speedup_verify": theory.predicted_speedup_with_verify_cost(alpha, gamma, c, v)
        if known and v is not None
        else None,
        "varying_gamma": theory.varying_gamma(spec),
        "mean_drafts_per_round": theory.mean_gamma(spec) if spec.rounds else None,
    }
    if out["varying_gamma"]:  # rounds of their own lengths: Thm 3.8 over each round's drafts
        drafts = theory.round_drafts(spec)
        out["predicted_speedup"] = theory.predicted_speedup_for_rounds(alpha, drafts, c) if known else None
        out["predicted_speedup_verify"] = (
            theory.predicted_speedup_for_rounds(alpha, drafts, c, v) if known and v is not None else None
        )
    out["measured_speedup"], out["measured_speedup_basis"] = headline_speedup(out)
    return out | _tree_predictions(spec, baseline, v) if spec.has_tree else out


def headline_speedup(s: dict) -> tuple[float | None, str | None]:
    """The one measured speedup the page shows, from a ``summary`` dict: (value, basis).

    The decoding speedup (autoregressive ms / speculative ms over stretches of equal tokens, prefill
    excluded; ``specviz.records.speedup.estimate``) with basis "decoding" where it can be estimated,
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
    # a round's drafting, in target steps
    drafting = metrics.ratio(spec.draft_ms, len(spec.rounds) * step) if step else None
    return {
        "gamma": None,
        "predicted_speedup": None,
        "predicted_speedup_verify": tree_theory.predicted_speedup(rates, drafting, v)
        if rates and drafting is not None and v
        else None,
        "tree": True,
        "nodes_per_round": tree_theory.nodes_per_round(spec),
        "acceptance_by_depth": rates,
        "predicted_tokens_per_round": tree_theory.expected_tokens_per_round(rates) if spec.rounds else None,
    }


def _decoding_rates(spec: Trace, baseline: Trace | None) -> tuple[float | None, float | None, int]:
    """(speculative, autoregressive) tokens/s over the tokens both runs emitted, each over its own decoding time for
    them (prefill excluded), and that token count: the ratio of the two rates is the decoding speedup
    (``SpeedupEstimate.decode_ratio``), so the table's rates divide to the speedup it shows."""
    if baseline is None:
        return None, None, 0
    tokens = min(len(spec.output_ids), len(baseline.output_ids))
    spec_ms = _time_at(spec, tokens) - _time_at(spec, 0)
    base_ms = _time_at(baseline, tokens) - _time_at(baseline, 0)
    if tokens == 0 or spec_ms <= 0 or base_ms <= 0:
        return None, None, tokens
    return metrics.tokens_per_second(tokens, spec_ms), metrics.tokens_per_second(tokens, base_ms), tokens


SPREAD_NAME = "interquartile range"
NOT_DISTINGUISHABLE = "not distinguishable from 1x"  # the words for a spread that straddles 1x, the headline's too


def spread_words(low: float | None, high: float | None, stretches: int, rounds: int, speedup: float | None) -> str:
    """The speedup's spread in words, the same in the headline, the status and the stats table: the interquartile
    range (the middle half) of the speedups over the run's stretches of equal tokens, and what it allows one to say:
    "not distinguishable from 1x" when it straddles 1x; "wide" (the figure is rough, its side of 1x is not) when it
    spans more than TOO_WIDE of the speedup; a run of fewer than MIN_ROUNDS rounds has one stretch, so no spread."""
    if stretches < 2 or low is None or high is None:
        return f"{rounds} round{'s' if rounds != 1 else ''}: a spread needs at least {MIN_ROUNDS}"
    text = (
        f"{SPREAD_NAME} {low:.2f}–{high:.2f}× (the middle half of the speedups over {stretches} stretches of "
        "equal tokens)"
    )
    if low <= 1.0 <= high:
        return f"{text}: {NOT_DISTINGUISHABLE}"
    if speedup and (high - low) / speedup > TOO_WIDE:
        side = "above" if low > 1.0 else "below"
        return (
            text + f": wide, so the figure is rough (run again on a quieter machine), though all of it lies {side} 1x"
        )
    return text


def _speedup_note(s: dict) -> str:
    """The formula of the one measured speedup, by its basis (``headline_speedup``), with its spread."""
    if s["measured_speedup_basis"] == "whole run":
        return f"{SPEEDUP_WHOLE} (too few rounds for stretches)"
    rates = ""
    if s["speculative_decoding_tokens_per_second"] and s["autoregressive_decoding_tokens_per_second"]:
        rates = (
            f" = {s['speculative_decoding_tokens_per_second']:.1f} / "
            f"{s['autoregressive_decoding_tokens_per_second']:.1f} "
            "decoding tok/s"
        )
    return f"{SPEEDUP_DECODING} ({s['decoding_tokens']} tokens){rates}; " + spread_words(
        s["decode_speedup_low"], s["decode_speedup_high"], s["decode_stretches"], s["rounds"], s["measured_speedup"]
    )


def verify_cost_shown(s: dict) -> float | None:
    """v where a run made enough verify passes and target steps to measure it (MIN_ROUNDS each), else None."""
    if (
        s.get("verify_cost") is None
        or s.get("verify_passes", 0) < MIN_ROUNDS
        or s.get("baseline_steps", 0) < MIN_ROUNDS
    ):
        return None
    return s["verify_cost"]


def v_below_one(s: dict) -> str:
    """Why a measured v is below 1, in plain words (what the measurement is, not a kernel's name): scoring more tokens
    never makes a pass cheaper, so the two means met different conditions. Where many rounds drafted nothing, their
    verify pass scored one token, the very work of a step, and v sits near 1 on either side; on a busy machine the
    same pass takes half or twice as long from one moment to the next (one run here: one-token steps of 98 to
    1,186 ms), so a slow stretch on the target alone's steps lowers v. "" when v is not below 1."""
    v = s.get("verify_cost")
    if v is None or v >= 1.0:
        return ""
    empty, rounds = s.get("rounds_without_drafts", 0), s.get("rounds", 0)
    one = (
        f"{empty} of the {rounds} rounds drafted nothing, so their verify pass scored one token, the same work as a "
        "step; "
        if empty and rounds and empty * 2 >= rounds
        else ""
    )
    return (
        f"v {v:.2f} is below 1: on average this run's verify passes took less time than the target alone's one-token "
        f"steps. Scoring more tokens does not make a pass cheaper; {one}on a busy machine the same pass can take half "
        "or twice as long from one moment to the next, and a slow stretch that fell on more of the target alone's "
        "steps than of the verify passes lowers v. Read it as about one step: the pass over the drafts cost no more "
        "than a step here"
    )


def verify_note(s: dict, tree: bool = False) -> str:
    """What v divides, and, where it is shown, why it can be below 1; a run too short to measure it says so."""
    what = (
        "target pass over the tree's nodes and the pending token / target step"
        if tree
        else "target pass over a round's drafts + 1 tokens / target step"
        if s.get("varying_gamma")
        else "target pass over gamma + 1 tokens / target step"
    )
    v = s.get("verify_cost")
    if v is None:
        return what
    if verify_cost_shown(s) is None:
        return (
            f"not measured: {s.get('verify_passes', 0)} verify passes and {s.get('baseline_steps', 0)} target steps; "
            f"v needs at least {MIN_ROUNDS} of each, since a few passes on a busy machine are noise ({what})"
        )
    what += f", means over {s['verify_passes']} verify passes and {s['baseline_steps']} steps"
    below = v_below_one(s)
    return what + (f"; {below}" if below else "")


def _fmt(value, unit: str = "", digits: int = 2, missing: str = "…") -> str:
    if value is None:
        return missing
    return f"{value:.{digits}f}{unit}"


# The rows that need the autoregressive baseline, and what they say when there is none.
SPEEDUP, WHOLE_RUN, THM_38, WITH_V = (
    "speedup",
    "whole-run tok/s ratio",
    "Thm 3.8 prediction (v = 1)",
    "prediction with measured v",
)
SPEC_RATE, BASE_RATE, V_ROW = "speculative, decoding", "autoregressive, decoding", "verify cost v"
_NEEDS_BASELINE = (SPEC_RATE, BASE_RATE, SPEEDUP, WHOLE_RUN, "cost coefficient c", V_ROW, THM_38, WITH_V)
# Formulas and predictions: labelled with their formula and not bold, so the one measured speedup stands out.
PLAIN = (WHOLE_RUN, THM_38, WITH_V)
NO_BASELINE = "needs the autoregressive baseline, which this run does not have"


def _beta_note(s: dict) -> str:
    """What mean beta is, and how far alpha may sit from it by chance (``Trace.alpha_chance_sd``)."""
    n, sd = s["accepted"] + s["rejected"], s.get("alpha_chance_sd")
    note = (f"mean of Σ min(p, q) over the {n} tested drafts: each one's chance of acceptance, so what alpha is "
            "expected to be")
    if sd is None:
        return note
    if sd < 5e-4:
        return note + "; alpha equals it here (greedy: each test is certain)"
    return (
        note + f"; by chance alone alpha falls within ±{sd:.2f} of it two times in three "
        "(one standard deviation, √Σβ(1−β) / N)"
    )


def _whole_run_note(s: dict) -> str:
    """The whole runs' tokens/s, prefill included, and why their ratio is not the speedup."""
    a, b = s["speculative_tokens_per_second"], s["autoregressive_tokens_per_second"]
    rates = f"{a:.1f} / {b:.1f} tok/s" if a and b else "speculative tok/s / autoregressive tok/s"
    return (
        f"{rates} over the whole runs, prefill included (generated tokens / wall time): not the speedup, which leaves "
        "out the prefill, a cost both runs pay once"
    )


def stats_html(spec: Trace, baseline: Trace | None = None, pending: bool = False) -> str:
    """A compact table of ``summary``.

    ``pending``: the baseline is still running, so its numbers are marked '…' (to come); otherwise a
    run without a baseline (stopped, or a trace on its own in a notebook) shows '–' and says why.
    """
    s = summary(spec, baseline)
    v_shown = verify_cost_shown(s)
    unmeasured_v = s["verify_cost"] is not None and v_shown is None
    rows = [
        (
            "draft acceptance rate",
            _fmt(s["draft_acceptance_rate"]),
            f"accepted / drafted = {s['accepted']} / {s['drafted']}",
        ),
        (
            "alpha",
            _fmt(s["alpha"]),
            f"accepted / tested = {s['accepted']} / {s['accepted'] + s['rejected']} (discarded drafts were never "
            "tested)",
        ),
        ("mean beta", _fmt(s["mean_beta"]), _beta_note(s)),
        (
            "tokens per round",
            _fmt(s["mean_tokens_per_round"]),
            f"emitted tokens / rounds = {s['generated_tokens']} / {s['rounds']}",
        ),
        (
            SPEC_RATE,
            _fmt(s["speculative_decoding_tokens_per_second"], " tok/s", 1),
            f"the {s['decoding_tokens'] or 'emitted'} tokens both runs emitted / this run's decoding time for them "
            "(prefill excluded)",
        ),
        (
            BASE_RATE,
            _fmt(s["autoregressive_decoding_tokens_per_second"], " tok/s", 1),
            "the same tokens / the target alone's decoding time for them: same target, same settings, in turns with "
            "this run",
        ),
        (SPEEDUP, _fmt(s["measured_speedup"], "×"), _speedup_note(s)),
        (WHOLE_RUN, _fmt(s["speedup"], "×"), _whole_run_note(s)),
        ("cost coefficient c", _fmt(s["cost_coefficient"], "", 3), "drafter step / target step"),
        (V_ROW, "not measured" if unmeasured_v else _fmt(v_shown), verify_note(s)),
        (
            THM_38,
            _fmt(s["predicted_speedup"], "×"),
            "(1 − α^(γ+1)) / ((1 − α)(γ c + 1)) from alpha, gamma, c: a verify pass taken as one step",
        ),
        (
            WITH_V,
            "–" if unmeasured_v else _fmt(s["predicted_speedup_verify"], "×"),
            "Eq. (1) tokens / (gamma c + v)" + ("; needs a measured v" if unmeasured_v else ""),
        ),
    ]
    if s.get("tree"):
        rows = _tree_rows(s, rows)
    elif s.get("varying_gamma"):
        rows = _varying_rows(s, rows)
    if baseline is None and not pending:
        rows = [(k, "–", NO_BASELINE) if k in _NEEDS_BASELINE else (k, v, note) for k, v, note in rows]
    return table_html(rows, "sv-stats", plain=PLAIN)


def _varying_rows(s: dict, rows: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The chain's prediction rows for an adaptive gamma schedule: Eq. (1) at each round's own drafts g."""
    mean = s.get("mean_drafts_per_round")
    each = "mean over the rounds of (1 − α^(g+1)) / (1 − α), g each round's drafts" + (
        f" ({mean:.2f} a round on average)" if mean is not None else ""
    )
    notes = {
        THM_38: f"{each}, over (mean g · c + 1): Thm 3.8 for rounds of varying length, a verify pass taken as one step",
        WITH_V: "the same tokens / (mean g · c + v)" + (
            "; needs a measured v" if s.get("verify_cost") is not None and verify_cost_shown(s) is None else ""
        ),
    }
    return [(k, v, notes.get(k, note)) for k, v, note in rows]


def _tree_rows(s: dict, rows: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The chain's rows rewritten for a token tree: v is over the tree's nodes, Thm 3.8 does not apply
    (no gamma), the prediction comes from the acceptance by depth; nodes and that acceptance added."""
    notes = {
        "alpha": f"accepted / tested nodes = {s['accepted']} / {s['accepted'] + s['rejected']} (siblings never tested "
        "not counted)",
        V_ROW: verify_note(s, tree=True),
        THM_38: "Thm 3.8 is a chain's (one draft per position); a tree's is the next row",
        WITH_V: "predicted tokens per round / (a round's drafting + v), both in target steps"
        + ("; needs a measured v" if s.get("verify_cost") is not None and verify_cost_shown(s) is None else ""),
    }
    if s["mean_beta"] is None:
        notes["mean beta"] = "not given for a tree: its siblings are tested against the residual p', not p"
    out = []
    for k, v, note in rows:
        out.append((k, "–" if k == THM_38 or (k == "mean beta" and s["mean_beta"] is None) else v, notes.get(k, note)))
        if k == "tokens per round":
            out += [
                (
                    "tokens per round, predicted",
                    _fmt(s["predicted_tokens_per_round"]),
                    "1 + Σ_d Π_{j≤d} a_j from the acceptance by depth",
                ),
                (
                    "nodes per round",
                    _fmt(s["nodes_per_round"], "", 1),
                    f"drafted nodes / rounds = {s['drafted']} / {s['rounds']}",
                ),
                (
                    "acceptance by depth a_d",
                    ", ".join(f"{a:.2f}" for a in s["acceptance_by_depth"]) or "…",
                    "per depth: rounds whose path reached it / rounds offered children there",
                ),
            ]
    return out


def table_html(rows: list[tuple[str, str, str]], css_class: str, plain: tuple[str, ...] = ()) -> str:
    """Rows of (name, value, note) as the page's numbers table, values bold except the rows named in
    ``plain``; every string escaped."""
    cells = "".join(
        f'<tr><td style="padding:3px 10px 3px 0;color:#444;">{escape(k)}</td>'
        f'<td style="padding:3px 10px;font-weight:{400 if k in plain else 600};font-variant-numeric:tabular-nums;" '
        'class="sv-stat" '
        f'data-key="{escape(k)}">{escape(v)}</td>'
        f'<td style="padding:3px 0;color:#777;font-size:12px;">{escape(note)}</td></tr>'
        for k, v, note in rows
    )
    return f'<table class="{escape(css_class)}" style="border-collapse:collapse;font-size:14px;">{cells}</table>'
