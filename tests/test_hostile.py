"""Recordings are data, never markup: hostile files are refused with a message naming the field,
their cost is bounded by design, and every string that reaches the page is escaped.

Work is bounded without timing anything: an oversized count is refused by the structure check
before pydantic builds a single object (asserted by making pydantic fail if it is reached), and
the largest file specviz can write is loaded and rendered once.
"""

from __future__ import annotations

import copy
import json
import math

import pytest

from specviz.demo import RECORDINGS
from specviz.recording import MAX_BYTES, Recording
from specviz.trace import MAX_GAMMA
from specviz.views import (
    acceptance_figure,
    race_html,
    round_html,
    stats_html,
    timeline_figure,
    tokens_html,
)
from specviz.views.text import markdown_literal
from specviz.views.theory import alpha_html

INJECT = '<img src=x onerror="alert(3)"><script>alert(4)</script>'


@pytest.fixture(scope="module")
def good() -> dict:
    return json.loads((RECORDINGS / "sampled-gamma8.json").read_text())


def refused(d, match: str) -> str:
    with pytest.raises(ValueError, match=match) as err:
        Recording.from_json(json.dumps(d) if not isinstance(d, (str, bytes)) else d)
    return str(err.value)


def every_string_path(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from every_string_path(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from every_string_path(v, path + (i,))
    elif isinstance(obj, str):
        yield path


def set_path(obj, path, value):
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


def rendered(rec: Recording) -> list[str]:
    spec, base = rec.speculative, rec.baseline
    pages = [
        tokens_html(spec),
        stats_html(spec, base),
        alpha_html(spec),
        race_html(spec, base, 1.0, 1),
        markdown_literal(rec.title),
    ]
    pages += [round_html(spec, i) for i in range(len(spec.rounds))]
    pages += [json.dumps(f.to_plotly_json()) for f in (acceptance_figure(spec), timeline_figure(spec, base))]
    return pages


def test_injection_in_any_string_field_is_refused_or_escaped(good):
    # one path per kind of field (list indices collapsed): every string field of the format is tried
    kinds = {}
    for path in every_string_path(good):
        kinds.setdefault(tuple("*" if isinstance(k, int) else k for k in path), path)
    paths = list(kinds.values())
    assert len(paths) >= 15
    shown = 0
    for path in paths:
        d = copy.deepcopy(good)
        set_path(d, path, INJECT)
        try:
            rec = Recording.from_json(json.dumps(d))
        except ValueError:
            continue  # refused with a message (a field whose meaning text cannot have)
        shown += 1
        for page in rendered(rec):
            assert "<img" not in page and "<script" not in page, path
    assert shown >= 8  # token texts, titles, the prompt and model names are shown, escaped


def test_gamma_as_markup_is_refused(good):
    d = copy.deepcopy(good)
    d["baseline"] = None
    d["speculative"]["settings"]["gamma"] = '<img src=x onerror="alert(3)">'
    assert "settings.gamma" in refused(d, "whole number from 1 to 16")


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("q", 5.0, r"drafts\.0\.q: must be a finite number in \[0, 1\]"),
        ("p", -0.1, r"drafts\.0\.p"),
        ("u", 1.0, r"drafts\.0\.u: must be a finite number in \[0, 1\)"),
        ("u", float("nan"), r"drafts\.0\.u"),
        ("beta", float("inf"), r"drafts\.0\.beta"),
        ("token_id", 1 << 40, r"drafts\.0\.token_id"),
    ],
)
def test_out_of_range_numbers_are_refused(good, field, value, match):
    d = copy.deepcopy(good)
    d["speculative"]["rounds"][0]["drafts"][0][field] = value
    refused(d, match)


def test_times_seed_and_sampling_must_be_finite(good):
    for where, value in (
        (("speculative", "total_ms"), -1.0),
        (("speculative", "rounds", 0, "verify_ms"), float("inf")),
        (("speculative", "settings", "sampling", "temperature"), float("nan")),
    ):
        d = copy.deepcopy(good)
        set_path(d, where, value)
        refused(d, ".".join(str(w) for w in where[1:]).replace(".", r"\."))


def test_inconsistent_verdicts_are_refused(good):
    d = copy.deepcopy(good)
    r = next(r for r in d["speculative"]["rounds"] if r["final_kind"] == "correction")
    r["drafts"][0]["verdict"], r["drafts"][-1]["verdict"] = r["drafts"][-1]["verdict"], "accepted"
    refused(d, "verdicts|accepted although|emitted_ids")
    d = copy.deepcopy(good)
    r = next(r for r in d["speculative"]["rounds"] if any(x["verdict"] == "accepted" for x in r["drafts"]))
    r["drafts"][0]["u"], r["drafts"][0]["accept_prob"] = 0.99, 0.01
    refused(d, "accept_prob|accepted although")
    d = copy.deepcopy(good)  # a correction with no drafts: nothing was rejected
    d["speculative"]["rounds"][0]["drafts"] = []
    refused(d, "final_kind|emitted_ids")
    d = copy.deepcopy(good)
    d["speculative"]["output_ids"][0] += 1
    refused(d, "output_ids")


def test_oversized_counts_are_refused_before_any_object_is_built(good, monkeypatch):
    import specviz.trace

    def reached(*_):
        raise AssertionError("pydantic was reached: the structure check let an oversized count through")

    monkeypatch.setattr(specviz.trace, "validate", reached)
    r0 = good["speculative"]["rounds"][0]
    for label, change, match in [
        (
            "85,000 drafts in a round",
            lambda d: d["speculative"]["rounds"][0].__setitem__("drafts", [r0["drafts"][0]] * 85_000),
            "drafts",
        ),
        (
            "140,000 top tokens",
            lambda d: d["speculative"]["rounds"][0].__setitem__("final_top", [r0["final_top"][0]] * 140_000),
            "top tokens",
        ),
        ("56,477 rounds", lambda d: d["speculative"].__setitem__("rounds", [r0] * 56_477), "rounds"),
        (
            "a 100 kB token text",
            lambda d: d["speculative"]["rounds"][0]["drafts"][0].__setitem__("text", "x" * 100_000),
            "characters",
        ),
    ]:
        d = copy.deepcopy(good)
        change(d)
        text = json.dumps(d)
        if len(text) > MAX_BYTES:
            refused(text, "MB")
        else:
            refused(text, match)


def test_deep_nesting_and_non_json_get_messages():
    refused("[" * 100_000 + "]" * 100_000, "nested")
    refused('{"format": "specviz-recording", "title": ' + "[" * 50 + "]" * 50 + "}", "nested|title")
    refused(b"\x00\xff", "not JSON")
    refused(
        '{"format": "specviz-recording", "speculative": {"mode": "speculative", "prompt_ids": [], "schema_version": '
        '99}}',
        "schema version",
    )


def test_titles_are_text_never_markdown_or_html(good):
    d = copy.deepcopy(good)
    d["title"] = '![x](http://example.invalid/track.png) <img src="http://example.invalid/x.png">'
    shown = markdown_literal(Recording.from_json(json.dumps(d)).title)
    assert "<img" not in shown and "![" not in shown and "](" not in shown
    d["title"] = "x" * 10_000
    refused(d, "title")


def test_the_largest_recording_specviz_writes_loads(good):
    """A run of 256 tokens at gamma 16 with every draft rejected: the most rounds and drafts the demo can record."""
    spec = good["speculative"]
    r = next(r for r in spec["rounds"] if r["final_kind"] == "correction" and r["drafts"][0]["verdict"] == "rejected")
    one = copy.deepcopy(r)
    one["drafts"] = [copy.deepcopy(one["drafts"][0])] + [
        dict(copy.deepcopy(one["drafts"][0]), verdict="discarded") for _ in range(MAX_GAMMA - 1)
    ]
    one["gamma"] = MAX_GAMMA
    one["emitted_ids"] = [one["final_token_id"]]
    spec["rounds"] = [one] * 256
    spec["output_ids"] = [one["final_token_id"]] * 256
    spec["settings"]["gamma"] = MAX_GAMMA
    text = json.dumps(good)
    assert len(text) < MAX_BYTES
    rec = Recording.from_json(text)
    assert len(rec.speculative.rounds) == 256 and math.isfinite(rec.speculative.total_ms)
    assert all(rendered(rec))
