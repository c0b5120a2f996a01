"""A recording's schema version is checked on load: one newer than this code reads (or not a whole number) is
refused naming the field and the versions read, never echoing the value; the upload budget's message says seconds
under a minute, rounds minutes up, and never says 0 MB."""

from __future__ import annotations

import json

import pytest

INJECT = '<img src=x onerror="alert(3)">'


@pytest.mark.parametrize("where", ["top", "speculative", "baseline"])
def test_a_recording_of_a_newer_schema_version_is_refused_naming_the_field(where):
    from specviz.demo import RECORDINGS
    from specviz.recording import Recording
    from specviz.trace import SCHEMA_VERSION

    good = json.loads((RECORDINGS / "sampled-gamma8.json").read_text())
    Recording.from_json(json.dumps(good))
    field = "schema_version" if where == "top" else f"{where}.schema_version"
    for version, why in ((999, "newer than this specviz reads"), (SCHEMA_VERSION + 1, "newer than this specviz reads"),
                         (0, "whole number"), (INJECT, "whole number"), (True, "whole number"), (2.5, "whole number")):
        d = json.loads(json.dumps(good))
        (d if where == "top" else d[where])["schema_version"] = version
        with pytest.raises(ValueError) as refused:
            Recording.from_json(json.dumps(d))
        message = str(refused.value)
        assert f"{field}: " in message and why in message and f"1 to {SCHEMA_VERSION}" in message, message
        assert "schema version" in message and "<" not in message and "999" not in message, message


def test_the_upload_budget_says_seconds_under_a_minute_and_rounds_up():
    from specviz.ui.server import UploadBudget, megabytes, span

    assert UploadBudget(per_client=48 * 2**20, total=2**30, window_s=30).take("a", 49 * 2**20) == \
        "at most 48 MB of uploads per visitor in 30 seconds"
    assert UploadBudget(per_client=2**19, total=2**30, window_s=90).take("a", 2**20) == \
        "at most 0.5 MB of uploads per visitor in 2 minutes"
    assert UploadBudget(per_client=2**30, total=2**20, window_s=300).take("a", 2**21) == \
        "the server takes at most 1 MB of uploads in 5 minutes"
    assert [span(s) for s in (0.2, 1, 59.5, 60, 61, 600)] == ["1 second", "1 second", "1 minute", "1 minute", "2 minutes", "10 minutes"]
    assert [megabytes(n) for n in (1, 2**19, 2**20, 48 * 2**20)] == ["0.1", "0.5", "1", "48"]
