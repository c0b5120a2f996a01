"""A recording's schema version is checked on load: one newer than this code reads (or not a whole number) is
refused naming the field and the versions read, never echoing the value."""

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
