"""No visitor input reaches a traceback: a request the app cannot serve is refused before any model
work, with a message naming the field and what it allows, and costs the log one line at most.

- A pair and a drafter kind that do not go together (the cross pair's drafter has its own tokenizer,
  so it drafts as "cross-tokenizer", never as "model") are refused by the pair's catalogue entry on
  every entry point (/run, Generate, Batch, the command line, ``load_pair``, ``pair_drafter``), and
  no pair is loaded or swapped for them.
- An integer too long for Python to parse (5,001 digits) is refused in the app's words, naming the field.
- 200 such calls cost the log at most one line each (within ``specviz.ui.guard.checks.REFUSAL_LOGS``) and no traceback.
"""

from __future__ import annotations

import logging
import os

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from tests.test_abuse import GENERATE, LogCount, raw_call  # noqa: E402

LONG = "9" * 5001  # more digits than Python parses (sys.get_int_max_str_digits(): 4,300)
# /run's arguments, in order: pair, prompt, gamma, temperature, top-k, top-p, max new tokens, seed, chat, drafter kind,
# gamma schedule, repetition penalty, token tree.
RUN = ["embedded", "def f(x):", 4, 0.0, 0, 1.0, 8, 0, True, "model", "constant", 1.0, "chain"]
BATCH = ["embedded", "def f():", 2, 4, 0.0, 0, 1.0, 8, 0, True, "", "", "model", "constant", 1.0]


def body(data: list, raw: dict[int, str] | None = None) -> str:
    """A /gradio_api/call JSON body of ``data``, with the values at ``raw``'s indexes written as given."""
    import json

    raw = raw or {}
    return '{"data": [' + ", ".join(raw[i] if i in raw else json.dumps(v) for i, v in enumerate(data)) + "]}"


def cross(args: list) -> list:
    """``args`` (which draft with "model") with the cross pair."""
    return ["cross", *args[1:]]


# The catalogue and the entry points that load nothing.


def test_every_preset_names_the_drafter_kinds_it_drafts_with():
    from specviz.drafters import KINDS
    from specviz.pair import PRESETS

    for name, preset in PRESETS.items():
        assert preset.kinds and set(preset.kinds) <= set(KINDS), name
        # its drafter model drafts one way: as "cross-tokenizer" where it has its own tokenizer, else as "model"
        assert preset.model_kind in preset.kinds and ({"model", "cross-tokenizer"} - {preset.model_kind}).isdisjoint(
            preset.kinds
        ), name
    assert PRESETS["cross"].model_kind == "cross-tokenizer" and "model" not in PRESETS["cross"].kinds


@pytest.mark.parametrize("name, kind", [("cross", "model"), ("embedded", "cross-tokenizer"), ("embedded", "eagle")])
def test_a_kind_the_pair_does_not_draft_with_is_refused_naming_both(name, kind):
    from specviz.pair import PRESETS, PairError
    from specviz.pair.catalogue import check_drafter_kind

    with pytest.raises(PairError) as err:
        check_drafter_kind(name, kind)
    message = str(err.value)
    assert f"'{name}'" in message and f"'{kind}'" in message and ", ".join(PRESETS[name].kinds) in message
    for allowed in PRESETS[name].kinds:
        check_drafter_kind(name, allowed)
    check_drafter_kind("owner/a -> owner/b", "model")  # custom ids: known once loaded


def test_load_pair_refuses_a_kind_before_anything_loads(monkeypatch):
    from specviz.pair import PairError, load_pair, resident_pairs
    from specviz.pair import cache

    monkeypatch.setattr(cache, "load", lambda *a, **k: pytest.fail("a model was loaded"))
    before = resident_pairs()
    with pytest.raises(PairError, match="'cross'.*'model'.*cross-tokenizer"):
        load_pair("cross", device="cpu", kind="model")
    assert resident_pairs() == before


@pytest.mark.parametrize(
    "command",
    [
        ["generate", "--prompt", "def f():"],
        ["record", "--prompt", "def f():", "--out", "never.json"],
        ["bench", "--prompts", "1"],
    ],
)
def test_the_command_line_refuses_a_kind_before_anything_loads(monkeypatch, capsys, command):
    from specviz import cli
    from specviz.pair import cache

    monkeypatch.setattr(cache, "load", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as exit_:
        cli.main([*command, "--pair", "cross", "--drafter-kind", "model"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--drafter-kind model" in err and "'cross'" in err and "cross-tokenizer" in err and "Traceback" not in err


def test_pair_drafter_refuses_a_kind_the_loaded_preset_does_not_draft_with(embedded):
    from specviz.pair.drafter import pair_drafter

    with pytest.raises(ValueError, match="'embedded'.*'eagle'.*model, argmax, ngram"):
        pair_drafter("eagle", embedded)
    assert pair_drafter("model", embedded).kind == "model"


def test_readable_numbers_stands_in_for_integers_too_long_to_parse_only():
    import json

    from specviz.ui.guard.server import LONG_INTEGER_STANDIN, readable_numbers

    sent = ('{"data": [1, ' + LONG + ', -' + LONG + ', "' + LONG + '", 2.5]}').encode()
    assert json.loads(readable_numbers(sent))["data"] == [1, LONG_INTEGER_STANDIN, -LONG_INTEGER_STANDIN, LONG, 2.5]
    for same in (
        '{"data": ["' + LONG + '"]}',
        '{"data": [' + "1" * 4300 + "]}",
        "not json " + LONG,
        '{"data": [1, 2]}',
    ):
        assert readable_numbers(same.encode()) == same.encode()


# Against the app launched in this process (the ``app`` fixture of tests/conftest.py).


@pytest.mark.slow
def test_run_generate_and_batch_refuse_a_kind_the_pair_does_not_draft_with_and_load_nothing(app):
    from specviz.pair import resident_pairs

    client = Client(app[1], verbose=False)
    before = resident_pairs()
    calls = [(cross(RUN), "/run"), (cross(GENERATE), "/generate"), (cross(BATCH), "/batch")]
    for args, api in calls:
        with pytest.raises(AppError) as err:
            client.predict(*args, api_name=api)
        message = str(err.value)
        assert "'cross'" in message and "'model'" in message and "cross-tokenizer" in message, (api, message)
    assert resident_pairs() == before and "cross" not in resident_pairs()  # nothing loaded, nothing swapped


@pytest.mark.slow
@pytest.mark.parametrize(
    "api, args, index, field",
    [
        ("run", RUN, 6, "max new tokens"),
        ("run", RUN, 7, "seed"),
        ("generate", GENERATE, 6, "max new tokens"),
        ("generate", GENERATE, 7, "seed"),
    ],
)
def test_integers_too_long_to_parse_are_refused_naming_the_field(app, api, args, index, field):
    for sign in ("", "-"):
        text = raw_call(app[1], api, body(args, {index: sign + LONG}))
        assert "event: error" in text, text[-300:]
        message = text.split("event: error", 1)[1]
        assert field in message.lower() and "set_int_max_str_digits" not in message, message[:300]


BAD_CALLS = [  # (endpoint, body, what the message must name)
    ("run", body(cross(RUN)), "drafter kind"),
    ("generate", body(cross(GENERATE)), "drafter kind"),
    ("run", body(RUN, {6: LONG}), "max new tokens"),
    ("generate", body(GENERATE, {7: LONG}), "seed"),
]


@pytest.mark.slow
def test_200_bad_calls_cost_at_most_a_log_line_each_and_no_traceback(app, capfd, monkeypatch):
    """200 /run and Generate calls with a mismatched pair and kind or a 5,001-digit number, from one
    address: each is refused with a message naming the field, before any model work; the log (the app's
    refusals at INFO, uvicorn's, stderr) grows by at most one line a call and no traceback. ``-s`` prints the count."""
    from specviz.ui.guard import checks
    from specviz.ui.guard.budgets import LogBudget

    # this test's own budget, unspent by earlier tests
    monkeypatch.setattr(checks, "REFUSAL_LOGS", LogBudget(), raising=False)
    counter = LogCount()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn"), logging.getLogger("uvicorn.error")]
    app_log = logging.getLogger("specviz")
    level = app_log.level
    app_log.setLevel(logging.INFO)  # as an operator who logs the app's refusals would see them
    for logger in loggers:
        logger.addHandler(counter)
    capfd.readouterr()
    try:
        for i in range(200):
            api, sent, field = BAD_CALLS[i % len(BAD_CALLS)]
            text = raw_call(app[1], api, sent)
            assert "event: error" in text, (api, text[-300:])
            assert field in text.split("event: error", 1)[1].lower(), (api, field, text[-300:])
    finally:
        for logger in loggers:
            logger.removeHandler(counter)
        app_log.setLevel(level)
    err = capfd.readouterr().err
    logged = [counter.format(r) for r in counter.records]
    lines = sum(t.count("\n") + 1 for t in logged) + len(err.splitlines())
    print(f"\n200 bad calls: {len(counter.records)} log records, {lines} log lines in all (stderr included)")
    assert lines <= 200
    assert not any(r.exc_info for r in counter.records)
    assert not any("Traceback" in t for t in logged) and "Traceback" not in err
