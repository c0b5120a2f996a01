"""The Explanation tab's measured section, from the files that ship with the page: the prepared
recordings that carry a gamma sweep, and the English drafter's and EAGLE head's training logs.
Read once when the page is built; a file that is missing or refused is left out."""

from __future__ import annotations

import json
import logging

from specviz.assets import ASSETS
from specviz.recording import Recording
from specviz.ui.tabs.files import examples, preset_of
from specviz.ui.page.defaults import RECORDINGS
from specviz.views import explanation_markdown

log = logging.getLogger("specviz")

LOGS = {"English drafter": "smollm2-drafter", "EAGLE head": "smollm2-eagle"}  # label -> folder in assets/models
LOG_MAX_BYTES = 1024 * 1024  # a training log is a few kB


def measured_runs() -> list[tuple[str, str, Recording]]:
    """(pair name, recording name, Recording) for each prepared recording with a gamma sweep; a
    recording of a pair this app does not offer is named by its models only ("recorded pair")."""
    runs = []
    for name in examples():
        try:
            rec = Recording.load(RECORDINGS / f"{name}.json")  # validated and size-capped like any upload
        except (OSError, ValueError) as err:
            log.warning("prepared recording %s not used in the explanation: %s", name, err)
            continue
        if rec.sweep is not None and rec.sweep.points:
            runs.append((preset_of(rec) or "recorded", name, rec))
    return runs


def training_logs() -> dict[str, dict]:
    """The training logs named in LOGS that exist and parse as JSON objects (at most LOG_MAX_BYTES each)."""
    logs = {}
    for label, folder in LOGS.items():
        path = ASSETS / "models" / folder / "training_log.json"
        try:
            if path.stat().st_size > LOG_MAX_BYTES:
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            logs[label] = data
    return logs


def explanation() -> str:
    """The Explanation tab's Markdown with its measured section (``specviz.views.explain``)."""
    return explanation_markdown(measured_runs(), training_logs())
