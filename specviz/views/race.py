"""The race: speculative and autoregressive output growing against time, replayed at the
times the traces recorded (or slowed down by a constant factor).

Pure HTML and CSS: every token fades in at its round's end time, so no script and no
server round-trip is needed while it plays.
"""

from __future__ import annotations

from html import escape

from specviz.trace import Trace
from specviz.views.charts import AUTOREGRESSIVE, SPECULATIVE
from specviz.views.tokens import STYLES
from specviz.views.text import run_label

_MONO = "font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;"


def slowdown_for(spec: Trace, baseline: Trace | None, seconds: float = 10.0) -> float:
    """Replay time / recorded time that makes the slower run take ``seconds`` to replay: above 1 for
    a run shorter than that (slow motion), below 1 for a longer one (sped up, so a class is not kept
    waiting 44 s for a run recorded on a slow CPU); 1 for runs with no recorded time."""
    longest = max(spec.total_ms, baseline.total_ms if baseline is not None else 0.0)
    return seconds * 1000.0 / longest if longest > 0 else 1.0


def _pace(slowdown: float) -> str:
    """The replay's pace in words: true timing, slowed down or sped up, with the factor."""
    if abs(slowdown - 1.0) < 1e-9:
        return "true timing"
    factor = slowdown if slowdown > 1.0 else 1.0 / slowdown
    digits = 0 if factor >= 10 else 1
    if slowdown > 1.0:
        return f"slowed down {factor:.{digits}f}× (recorded times × {factor:.{digits}f})"
    return f"sped up {factor:.{digits}f}× (recorded times ÷ {factor:.{digits}f}), so the slower run plays in about 10 s"


def _progress_keyframes(name: str, trace: Trace, longest_ms: float, most_tokens: int) -> str:
    """Bar width = tokens so far / the longer run's tokens, keyed on the common clock (0..longest_ms)."""
    stops, total = ["0%{width:0%}"], 0
    for r in trace.rounds:
        total += len(r.emitted_ids)
        at = 100.0 * r.end_ms / longest_ms if longest_ms > 0 else 100.0
        stops.append(f"{at:.2f}%{{width:{100.0 * total / max(most_tokens, 1):.2f}%}}")
    stops.append(f"100%{{width:{100.0 * total / max(most_tokens, 1):.2f}%}}")
    return f"@keyframes {name}{{{''.join(stops)}}}"


def _lane(trace: Trace, label: str, colour: str, scale: float, longest_ms: float, anim: str, bar: str) -> str:
    spans = []
    for r in trace.rounds:
        delay = r.end_ms * scale
        n_drafts = len(r.emitted_ids) - (r.final_token_id is not None)
        kinds = ["accepted"] * n_drafts + ([r.final_kind or "target"] if r.final_token_id is not None else [])
        for text, kind in zip(r.emitted_texts, kinds):
            style = STYLES.get(kind, "") if trace.mode == "speculative" else ""
            spans.append(
                f'<span class="sv-race-token" style="{style}animation:{anim}f 1ms linear {delay:.0f}ms '
                f'both;">{escape(text)}</span>'
            )
    total = trace.total_ms * scale
    tps = trace.tokens_per_second
    done = f"{len(trace.output_ids)} tokens in {trace.total_ms / 1000:.2f} s" + (
        f" · {tps:.0f} tokens/s" if tps else ""
    )
    return (
        f'<div class="sv-race-lane" style="margin-bottom:14px;">'
        '<div style="display:flex;justify-content:space-between;font-size:14px;margin-bottom:4px;"><b '
        f'style="color:{colour};">{escape(label)}</b>'
        f'<span class="sv-race-done" style="color:#333;animation:{anim}f 1ms linear {total:.0f}ms both;">✓ '
        f'{escape(done)}</span></div>'
        f'<div title="tokens so far" style="height:8px;background:#eee;border-radius:4px;margin-bottom:6px;">'
        f'<div style="height:100%;background:{colour};border-radius:4px;animation:{bar} {longest_ms * scale:.0f}ms '
        'linear both;"></div></div>'
        '<div '
        f'style="{_MONO}white-space:pre-wrap;font-size:13px;line-height:1.5;min-height:7em;max-height:16em;overflow:auto;'
        'border:1px solid '
        f'#ddd;border-radius:6px;padding:8px;background:#fff;color:#111;overflow-wrap:anywhere;">{"".join(spans)}</div></div>'
    )


def race_html(spec: Trace, baseline: Trace | None, slowdown: float = 1.0, nonce: int = 0) -> str:
    """Both runs replayed side by side, each token appearing ``slowdown`` x its recorded time.

    Args:
        spec, baseline: the speculative trace and the autoregressive one (None: spec alone).
        slowdown: replay time / recorded time (1 = true timing).
        nonce: changes the animation names, so showing the same race again restarts it.

    Returns:
        An HTML fragment with its own <style>: a fade-in, and per run a bar of tokens so far.
    """
    anim = f"svrace{nonce}"
    runs = [spec] + ([baseline] if baseline is not None else [])
    longest = max(t.total_ms for t in runs)
    most = max(len(t.output_ids) for t in runs)
    bars = "".join(_progress_keyframes(f"{anim}p{i}", t, longest, most) for i, t in enumerate(runs))
    lanes = _lane(spec, f"speculative ({run_label(spec)})", SPECULATIVE, slowdown, longest, anim, f"{anim}p0")
    if baseline is not None:
        lanes += _lane(baseline, "autoregressive (target alone)", AUTOREGRESSIVE, slowdown, longest, anim, f"{anim}p1")
    pace = _pace(slowdown)
    style = f"<style>@keyframes {anim}f{{from{{opacity:0}}to{{opacity:1}}}}{bars}</style>"
    return (
        f'{style}<div class="sv-race" '
        'style="font-family:ui-sans-serif,system-ui,sans-serif;background:#fff;color:#111;border:1px solid '
        '#ddd;border-radius:8px;padding:12px;">'
        f'<div style="color:#555;font-size:13px;margin-bottom:8px;">Replay of the recorded runs, {escape(pace)}. '
        f'Each token appears when its round ended: speculative tokens arrive in bursts, one burst per target pass. '
        'With sampling the two texts differ (same distribution, different random draws); at temperature 0 they are '
        f'equal.</div>{lanes}</div>'
    )
