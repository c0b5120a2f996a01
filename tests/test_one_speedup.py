"""The page a class believes: one speedup under one name, "verify" for v alone, a verdict that names the largest
cause of a loss against what would make it pay, a v below 1 explained in plain words and a v too short to measure
left out. Views are pure: traces built here, no model."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from specviz import theory
from specviz.measure.speedup import TOO_WIDE, estimate
from specviz.trace import Draft, Round, Trace
from specviz.views.stats import (
    BASE_RATE,
    MIN_ROUNDS,
    NOT_DISTINGUISHABLE,
    SPEC_RATE,
    SPEEDUP,
    V_ROW,
    WHOLE_RUN,
    WITH_V,
    spread_words,
    stats_html,
    summary,
    v_below_one,
)
from specviz.views.verdict import _alpha_for, headline_html, kind_note, verdict, weigh


def _draft(accepted: bool, tested: bool = True) -> Draft:
    return Draft(
        token_id=1,
        text="a",
        q=0.5,
        p=0.5 if accepted else 0.1,
        accept_prob=1.0 if accepted else 0.2,
        u=0.1 if accepted else 0.9,
        verdict="accepted" if accepted else "rejected" if tested else "discarded",
    )


def _spec(
    rounds: list[tuple[int, float, float, float]], gamma: int = 4, kind: str = "model", prefill: float = 20.0
) -> Trace:
    """A speculative trace: per round (accepted drafts, drafting ms, verify ms, other ms); every round drafts gamma,
    the first rejection ends its tests (its later drafts discarded), a correction or bonus token ends it."""
    t, out, made = prefill, [], []
    for n_acc, draft_ms, verify_ms, other_ms in rounds:
        drafts = [_draft(True) for _ in range(n_acc)]
        if n_acc < gamma:
            drafts += [_draft(False)] + [_draft(False, tested=False) for _ in range(gamma - n_acc - 1)]
        t += draft_ms + verify_ms + other_ms
        emitted = [1] * (n_acc + 1)
        made.append(
            Round(
                drafts=drafts,
                emitted_ids=emitted,
                final_token_id=1,
                final_text="a",
                final_kind="correction" if n_acc < gamma else "bonus",
                final_prob=0.5,
                draft_ms=draft_ms,
                verify_ms=verify_ms,
                end_ms=t,
                gamma=gamma,
            )
        )
        out += emitted
    return Trace(
        mode="speculative",
        prompt_ids=[1],
        output_ids=out,
        rounds=made,
        stop_reason="max_new_tokens",
        prefill_ms=prefill,
        total_ms=t,
        settings={"gamma": gamma, "drafter": {"kind": kind}},
    )


def _base(tokens: int, step_ms: float | list[float], prefill: float = 10.0) -> Trace:
    steps = step_ms if isinstance(step_ms, list) else [step_ms] * tokens
    t, made = prefill, []
    for ms in steps[:tokens]:
        t += ms
        made.append(
            Round(
                drafts=[],
                emitted_ids=[1],
                final_token_id=1,
                final_text="a",
                final_kind="target",
                final_prob=1.0,
                draft_ms=0.0,
                verify_ms=ms,
                end_ms=t,
            )
        )
    return Trace(
        mode="autoregressive",
        prompt_ids=[1],
        output_ids=[1] * len(made),
        rounds=made,
        stop_reason="max_new_tokens",
        prefill_ms=prefill,
        total_ms=t,
    )


def _cell(html: str, key: str) -> tuple[str, str]:
    m = re.search(rf'data-key="{re.escape(key)}">([^<]*)</td><td[^>]*>([^<]*)<', html)
    return m.group(1), m.group(2).replace("&#x27;", "'")


# ---- item 2: one speedup, one name each ---------------------------------------------------------------------------


def test_the_tables_two_rates_divide_to_the_speedup_it_shows_and_the_whole_run_ratio_is_named_as_that():
    """An argmax run showed 1.11x above "speculative 2.0 tok/s, autoregressive 2.1 tok/s": the rates were the whole
    runs' (prefill included), the speedup the decoding one. The rates shown now are over the same tokens and the same
    decoding time as the speedup, so they divide to it; the whole runs' ratio keeps its own name."""
    spec = _spec([(3, 4.0, 6.0, 0.5)] * 16, prefill=400.0)  # a slow prefill: the whole-run ratio falls below 1
    base = _base(64, 4.0, prefill=20.0)
    s = summary(spec, base)
    html = stats_html(spec, base)
    spec_rate, base_rate = float(_cell(html, SPEC_RATE)[0].split()[0]), float(_cell(html, BASE_RATE)[0].split()[0])
    shown = float(_cell(html, SPEEDUP)[0].rstrip("×"))
    # By hand: 64 tokens in 16 rounds of 10.5 ms = 168 ms of decoding, against 64 steps of 4 ms = 256 ms.
    assert s["speculative_decoding_tokens_per_second"] == pytest.approx(64 / 0.168)
    assert s["autoregressive_decoding_tokens_per_second"] == pytest.approx(64 / 0.256)
    assert s["measured_speedup"] == pytest.approx(256 / 168) and shown == pytest.approx(1.52, abs=0.005)
    assert spec_rate / base_rate == pytest.approx(shown, abs=0.01)
    whole, note = _cell(html, WHOLE_RUN)
    assert float(whole.rstrip("×")) < 1.0 < shown and "prefill included" in note and "not the speedup" in note
    assert "speedup" not in WHOLE_RUN
    assert "381.0 / 250.0 decoding tok/s" in _cell(html, SPEEDUP)[1]  # the rates, in the speedup's own note


def test_verify_names_only_v_and_the_headlines_time_share_is_scoring():
    """ "drafting 0.40 + verify 1.87" beside "a verify pass at v 1.64" called two quantities verify."""
    spec, base = _spec([(3, 4.0, 6.0, 0.5)] * 16), _base(64, 4.0)
    line = re.search(r'class="sv-headline-why"[^>]*>([^<]*)<', headline_html(spec, base)).group(1)
    assert "scoring" in line and "verify" not in line
    bar = re.search(r'class="sv-cost-bar".*', headline_html(spec, base), re.S).group(0)
    assert "scoring" in bar and "verify" not in bar
    sentence = verdict(spec, base)
    assert sentence.count("verify") == sentence.count("verify pass at v")  # the one verify: v, per pass
    j = weigh(spec, base)
    assert j.verify == pytest.approx(summary(spec, base)["verify_cost"]) and f"v {j.verify:.2f}" in sentence


def _spread_run(windows: list[float]) -> tuple[Trace, Trace]:
    """A run of 32 rounds of 4 tokens (gamma 3, all accepted) whose 8 stretches of 4 rounds take ``windows`` ms per
    round, beside a baseline of 4 ms a token."""
    spec = _spec([(3, 1.0, ms - 1.5, 0.5) for ms in windows for _ in range(4)], gamma=3)
    return spec, _base(128, 4.0)


def test_the_headlines_colour_and_words_carry_the_spread_in_the_tables_words():
    """gamma 8: a red "slower than the target alone" over a stats row saying "too spread to read". The spread has one
    wording, the table's and the headline's alike: a wide interquartile range that clears 1x says the figure is rough,
    one that straddles 1x says "not distinguishable from 1x" in grey."""
    spec, base = _spread_run([20.0, 40.0, 20.0, 60.0, 25.0, 45.0, 30.0, 80.0])  # all slower, widely spread
    est = estimate(spec, base)
    assert est.high < 1.0 and est.relative_spread > TOO_WIDE
    words = spread_words(est.low, est.high, len(est.windows), len(spec.rounds), est.decode_speedup)
    assert "interquartile range" in words and "(the middle half" in words and "rough" in words and "below 1x" in words
    head, table = headline_html(spec, base), stats_html(spec, base)
    assert "slower than the target alone" in head and "#b42318" in head
    assert words in head.replace("&#x27;", "'") and words in _cell(table, SPEEDUP)[1]
    assert "too spread to read" not in table and "middle half " + f"{est.low:.2f}" not in table
    spec, base = _spread_run([12.0, 20.0, 14.0, 24.0, 12.0, 18.0, 15.0, 22.0])  # straddles 1x
    est = estimate(spec, base)
    assert est.low < 1.0 < est.high
    head = headline_html(spec, base)
    assert (
        f"speedup: {NOT_DISTINGUISHABLE}" in head
        and "#555555" in head
        and "faster" not in head
        and "slower" not in head
    )
    assert NOT_DISTINGUISHABLE in _cell(stats_html(spec, base), SPEEDUP)[1]


def test_the_auto_trees_note_shows_the_headlines_speedup_with_its_spread():
    from specviz.views.tree_budget import auto_note_markdown, measured_point

    spec, base = _spread_run([12.0, 13.0, 12.0, 14.0, 12.0, 13.0, 12.0, 14.0])
    point = measured_point(spec, base)
    s = summary(spec, base)
    assert point["speedup"] == s["measured_speedup"] and point["speedup"] != pytest.approx(s["speedup"])
    choice = {
        "chosen": "tree 2-1",
        "predicted_tokens_per_round": 3.0,
        "predicted_cost": 2.0,
        "predicted_speedup": 1.5,
        "best_chain": {"gamma": 3, "predicted_speedup": 1.2, "predicted_tokens_per_round": 2.5, "predicted_cost": 2.0},
        "inputs": {},
    }
    note = auto_note_markdown(choice, point)
    assert (
        f"speedup {s['measured_speedup']:.2f}×" in note and "prefill excluded" in note and "interquartile range" in note
    )
    assert "tokens/s / its autoregressive baseline's" not in note
    assert "No shape pays" not in note
    losing = auto_note_markdown({**choice, "predicted_speedup": 0.73}, point)
    assert (
        losing.startswith("**No shape pays here: predicted 0.73x at best** (tree 2-1,")
        and "target alone is faster" in losing
    )


def test_compare_batch_sweep_and_explanation_call_only_the_headlines_quantity_speedup():
    from specviz.measure.throughput import BatchPoint
    from specviz.views.batch import RATIO, batch_figure
    from specviz.views.compare import _numbers
    from specviz.views.explain import EXPLANATION, THEORY_NOTE
    from specviz.views.theory import SWEEP_RATIO

    spec, base = _spread_run([12.0, 13.0, 12.0, 14.0, 12.0, 13.0, 12.0, 14.0])
    rows = {name: (value, note) for name, value, note in _numbers(spec, base)}
    assert (
        rows["speedup"][0] == f"{estimate(spec, base).decode_speedup:.2f}×"
        and "interquartile range" in rows["speedup"][1]
    )
    assert "speedup" not in RATIO and "speedup" not in SWEEP_RATIO
    names = [t.name for t in batch_figure([BatchPoint(1, [10.0, 11.0], [9.0, 9.5])]).data]
    assert not any("speedup" in n for n in names)
    row = re.search(r"\| \*\*speedup\*\* \|([^\n]*)", EXPLANATION).group(1)
    assert (
        "decoding time" in row
        and "prefill excluded" in row
        and "speculative tokens/s / autoregressive tokens/s," not in row
    )
    assert "interquartile range" in EXPLANATION and "whole tok/s ratio" in THEORY_NOTE


# ---- item 3: the cause named right
# ------------------------------------------------------------------------------------


def test_the_verdict_names_the_largest_cause_not_the_verify_pass_whenever_it_exceeds_the_tokens():
    """Early exit, alpha 0.03, c 0.67, drafting 2.55 steps: told "the verify pass alone costs 1.82 steps, more than the
    1.03 tokens". Acceptance lost most (3.97 of a possible 5 tokens), and paying needs alpha of about 0.93 at gamma
    4."""
    spec, base = _spread_run([12.0] * 8)
    j = weigh(spec, base)
    early = replace(
        j,
        tokens=1.03,
        passes=3.8,
        c=0.67,
        drafting=2.55,
        verify=1.82,
        alpha=0.03,
        low=0.2,
        high=0.3,
        rounds=31,
        stretches=7,
        most_tokens=5.0,
        speedup=0.25,
        kind="early-exit",
        tree=False,
    )
    assert early.call == "slower"
    causes = early.causes()
    assert causes == pytest.approx({"acceptance": 3.97, "drafting": 2.55, "verify cost": 0.82})
    why = early.why()
    assert why.startswith("Most of the loss is acceptance") and "alpha 0.03" in why and "4.37" in why
    need = _alpha_for(4.37, 4)
    assert (
        theory.expected_tokens_per_round(need, 4) == pytest.approx(4.37) and f"alpha above {need:.2f} at gamma 4" in why
    )
    assert "verify pass alone costs" not in why
    # Drafting largest: a quantized target's c 0.55 over 4 passes; paying needs c under (3.11 - 1.68) / 4.
    costly = replace(early, tokens=3.11, passes=4.0, c=0.55, drafting=2.21, verify=1.68, alpha=0.76, kind="quantized")
    assert costly.why().startswith("Most of the loss is drafting") and "c under 0.36" in costly.why()
    # The verify cost largest (a compute-bound pass), and where no drafter could make it pay.
    heavy = replace(early, tokens=4.5, passes=4.0, c=0.05, drafting=0.2, verify=4.8, alpha=0.95, kind="model")
    assert heavy.why().startswith("Most of the loss is the verify cost") and "v under 4.30" in heavy.why()
    hopeless = replace(heavy, tokens=1.5, verify=1.8, drafting=2.5, alpha=0.2)
    assert "even every draft accepted" not in hopeless.why() and "Most of the loss is acceptance" in hopeless.why()
    assert "even every draft accepted" in replace(hopeless, drafting=3.5).why()


def test_the_verdict_says_what_is_known_of_early_exit_and_prompt_lookup():
    slow = [(0, 20.0, 8.0, 0.5)] * 16  # nothing accepted, drafting dear: slower than 4 ms a token
    spec, base = _spec(slow, kind="early-exit"), _base(16, 4.0)
    sentence = verdict(spec, base)
    assert sentence.startswith("Slower than the target alone") and "never trained to exit early" in sentence
    assert "LayerSkip" in sentence
    lookup = kind_note("ngram", 40, 28)
    assert "seldom repeats itself or the prompt" in lookup and "28 of the 40 rounds found nothing to copy" in lookup
    assert kind_note("model", 40, 0) == ""
    fast = _spec([(4, 1.0, 5.0, 0.2)] * 16, kind="early-exit")
    assert "never trained" not in verdict(fast, _base(80, 4.0))  # a run that won needs no excuse


# ---- item 5: v below 1, and v too short to measure ----------------------------------------------------------------


def test_a_v_below_one_is_explained_in_plain_words_where_v_is_shown():
    spec = _spec([(0, 0.0, 3.0, 0.2)] * 12, gamma=1)  # verify passes of 3 ms against steps of 4 ms: v 0.75
    # 8 of 12 drafted nothing
    spec = replace(spec, rounds=[replace(r, drafts=[]) if i % 3 else r for i, r in enumerate(spec.rounds)])
    base = _base(12, 4.0)
    s = summary(spec, base)
    assert s["verify_cost"] == pytest.approx(0.75) and s["rounds_without_drafts"] == 8
    words = v_below_one(s)
    assert "below 1" in words and "8 of the 12 rounds drafted nothing" in words and "busy machine" in words
    for jargon in ("oneDNN", "kernel", "matrix-vector", "packed"):
        assert jargon not in words
    assert words in _cell(stats_html(spec, base), V_ROW)[1] and words in verdict(spec, base)
    assert v_below_one(summary(_spec([(3, 1.0, 6.0, 0.2)] * 12), _base(48, 4.0))) == ""  # v 1.5: nothing to explain


def test_a_run_too_short_to_measure_v_says_so_instead_of_a_number():
    spec, base = _spec([(3, 1.0, 6.0, 0.2)] * 5), _base(20, 4.0)
    assert len(spec.rounds) < MIN_ROUNDS and summary(spec, base)["verify_cost"] is not None
    html = stats_html(spec, base)
    value, note = _cell(html, V_ROW)
    assert value == "not measured" and "5 verify passes" in note and f"at least {MIN_ROUNDS}" in note
    assert _cell(html, WITH_V)[0] == "–"
    assert "v not measured (5 verify passes" in verdict(spec, base) and weigh(spec, base).verify is None
    from specviz.views.theory import speedup_figure

    assert not any("verify cost v =" in (t.name or "") for t in speedup_figure(spec, base).data)
    longer = _spec([(3, 1.0, 6.0, 0.2)] * MIN_ROUNDS)
    assert _cell(stats_html(longer, _base(32, 4.0)), V_ROW)[0] == "1.50"
