"""The Save / load tab: load a recording (uploaded or prepared), set the controls to its settings,
export the shown run as one HTML file."""

from __future__ import annotations

import re
from pathlib import Path

import gradio as gr

from specviz.drafters import KINDS as DRAFTER_KINDS
from specviz.pair import PRESETS, free_memory
from specviz.recording import Recording
from specviz.serving import device_thread
from specviz.engine.schedules import SCHEDULES
from specviz.ui.page import state
from specviz.ui.guard.checks import mistake
from specviz.ui.guard.downloads import save_export, save_for_download
from specviz.ui.running.jobs import background_step, guarded_call
from specviz.ui.guard.limits import PROMPT_CHARS_MAX
from specviz.ui.page.defaults import DEFAULTS, RECORDINGS
from specviz.ui.page.outputs import everything
from specviz.views.text import markdown_literal
from specviz.views.verdict import verdict


def plain_title(text: str) -> str:
    """A recording's title or a model name for the Markdown status line, as plain text: one line in a
    code span (fenced by more backticks than it holds), where Markdown makes no tag, no entity and no
    link of it ("http://3627734734/x" stays text; an apostrophe stays an apostrophe)."""
    text = " ".join(str(text).split())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"

# The controls restore_controls sets, by name (the layout maps them to components).
RESTORED = ("pair_name", "prompt", "chat", "gamma", "temperature", "top_k", "top_p", "max_new_tokens", "seed", "status",
            "drafter_kind", "gamma_schedule", "repetition_penalty", "load_status")


def loading_note(name: str | None = None) -> str:
    """The line beside the load buttons while a recording loads (a prepared one's ``name``, else an uploaded file)."""
    what = f"the prepared recording {plain_title(name)}" if name else "the file"
    return f"Loading {what}…"


def load_failed_note() -> str:
    """The line beside the load buttons when a file was refused."""
    return (
        "Not loaded: the file was refused (its message is in the corner). The page still shows what it showed before."
    )


def load_recording(path, copy: bool = False, session: str | None = None, request: gr.Request = None) -> dict:
    """Show a saved recording without any model. Its download is the uploaded file itself (it lies in
    Gradio's upload folder already); ``copy`` writes a copy to ``session``'s download folder instead (a
    prepared recording, which lies in the package). Parsed and drawn deferring to the device's steps
    (``device_thread.deferring``, for the visitor of ``request``): Python beside other visitors' runs."""
    if not isinstance(path, str) or not path:
        raise mistake("Choose a recording first.", title="No file")
    try:
        # parsing and drawing the largest recording is seconds of Python
        with background_step(), device_thread.deferring(state.device_owner(request) if request else None):
            rec = Recording.load(path)
            return _shown(rec, path, copy, session)
    except (ValueError, OSError) as err:
        raise mistake(f"This file cannot be replayed: {err}", title="Not a specviz recording") from err
    finally:
        # Parsing and drawing a large recording peaks at about 100 MB of short-lived objects; give the
        # heap's free pages back, or each visitor's load leaves RSS a few MB higher (measured: +6 MB per
        # session over 20 sessions loading a 0.8 MB recording, before this).
        free_memory("cpu")


def replaying(rec: Recording, more: str = "") -> str:
    """The status line of a loaded recording (Markdown): what it is, that no model ran (``more`` after
    that), and its verdict: faster or slower than the target alone, and why, as the machine that
    recorded it measured (``specviz.views.verdict``)."""
    why = verdict(rec.speculative, rec.baseline)
    why = f" As recorded: {markdown_literal(why)}" if why else " It holds no autoregressive baseline, so no speedup."
    # The title is a code span (plain text, whatever the file says); the sentences after it start a paragraph of
    # their own, as a period after the span's box read as a stray ". No model was run." at a line's start.
    named = f": {plain_title(rec.title)}\n\n" if rec.title else ". "
    return f"Replaying a recording{named}No model was run.{more}{why}{made_by_note(rec.made_by)}"


def made_by_note(made_by: dict | None) -> str:
    """Which machine and build recorded a run, and whether its engine is older than this build's (Markdown, every
    value from the file a code span)."""
    from specviz.engine import ENGINE_VERSION

    if not made_by:
        return " The file does not say which machine or build recorded it, so its times may be an older engine's."
    parts = [
        f"on {plain_title(made_by['machine'])}" if made_by.get("machine") else "",
        f"by specviz {plain_title(made_by['build'])}" if made_by.get("build") else "",
        f"with torch {plain_title(made_by['torch'])}" if made_by.get("torch") else "",
    ]
    note = " Recorded " + ", ".join(p for p in parts if p) + "." if any(parts) else ""
    version = made_by.get("engine_version")
    if version is None or version < ENGINE_VERSION:
        note += (
            f" Its engine (version {version if version is not None else 'unknown'}) is older than this build's "
            f"({ENGINE_VERSION}): its times are not what this build runs at."
        )
    elif version > ENGINE_VERSION:
        note += f" Its engine (version {version}) is newer than this build's ({ENGINE_VERSION})."
    return note


def _shown(rec: Recording, path: str, copy: bool, session: str | None) -> dict:
    """Every output of a loaded recording; its download is ``path`` itself, or a copy in ``session``'s folder."""
    return everything(rec, replaying(rec), save_for_download(rec, session) if copy else path)


def load_example(name, request: gr.Request = None) -> dict:
    """Load one of the recordings shipped in assets/recordings; its download copy goes in the visitor's session
    folder."""
    if not isinstance(name, str) or name not in examples():
        raise mistake("Pick a prepared recording from the menu.", title="Unknown recording")
    return load_recording(
        str(RECORDINGS / f"{name}.json"), copy=True, session=getattr(request, "session_hash", None), request=request
    )


def examples() -> list[str]:
    """The prepared recordings' names."""
    return sorted(p.stem for p in RECORDINGS.glob("*.json"))


def preset_of(rec: Recording) -> str | None:
    """The preset whose drafter and target the recording names, if this app offers it."""
    models = list(rec.speculative.settings.get("models") or [])
    own_drafter = (rec.speculative.settings.get("drafter") or {"kind": "model"}).get("kind") in (
        "model",
        "argmax",
        "cross-tokenizer",
    )
    for name, preset in PRESETS.items():
        names = []
        for ref in (preset.drafter, preset.target):
            parts = Path(ref).parts
            names.append("/".join(parts[-2:]) if Path(ref).is_absolute() else ref)
        # A packaged GGUF target is recorded as "<distribution>/<file>", the preset names its hub id: both match.
        targets = {names[-1]}
        if preset.gguf is not None:
            targets.add(f"{preset.gguf.distribution}/{preset.gguf.filename}")
        # Prompt lookup and early exit run on the pair's target alone: only the target must match.
        if models[-1:] and models[-1] in targets and (not own_drafter or models[:-1] == names[:-1]):
            return name
    return None


def restore_controls(rec: Recording | None) -> dict:
    """Set every control to what the recording ran with, so Generate reproduces it (same tokens
    for the same seed); says which pair it came from when this app does not offer that pair.

    Returns a dict keyed by the names in RESTORED.
    """
    if rec is None:
        return {}
    s = rec.speculative.settings
    sampling = s.get("sampling") or {}
    drafter = s.get("drafter") or {"kind": "model"}
    schedule = s.get("gamma_schedule") or {"name": "constant"}
    preset = preset_of(rec)
    prompt = rec.prompt or rec.speculative.prompt_text
    models = " -> ".join(plain_title(str(m)) for m in s.get("models") or []) or "unknown models"
    where = (
        "" if preset else f" It was recorded with {models}, which this app does not offer: the pair menu is unchanged."
    )
    status = replaying(rec, f" The controls are set to its settings.{where}")
    value = lambda key, default: s.get(key) if s.get(key) is not None else default  # noqa: E731
    out = dict(
        prompt=gr.update(value=prompt[:PROMPT_CHARS_MAX]),
        gamma=gr.update(value=value("gamma", DEFAULTS["gamma"])),
        temperature=gr.update(value=sampling.get("temperature", DEFAULTS["temperature"])),
        top_k=gr.update(value=sampling.get("top_k", DEFAULTS["top_k"])),
        top_p=gr.update(value=sampling.get("top_p", DEFAULTS["top_p"])),
        max_new_tokens=gr.update(value=value("max_new_tokens", DEFAULTS["max_new_tokens"])),
        seed=gr.update(value=value("seed", DEFAULTS["seed"])),
        status=status,
        repetition_penalty=gr.update(value=sampling.get("repetition_penalty", 1.0)),
        load_status=(
            f"Loaded{': ' + plain_title(rec.title) if rec.title else ''} — {len(rec.speculative.output_ids)} tokens in "
            f"{len(rec.speculative.rounds)} rounds, replayed with no model: the output, stats and every tab show it."
        ),
    )
    if preset:
        out["pair_name"] = gr.update(value=preset)
    if rec.chat is not None:
        out["chat"] = gr.update(value=bool(rec.chat))
    if drafter.get("kind") in DRAFTER_KINDS:
        out["drafter_kind"] = gr.update(value=drafter.get("kind"))
    if schedule.get("name") in SCHEDULES:
        out["gamma_schedule"] = gr.update(value=schedule.get("name"))
    return out


def export_recording(rec: Recording | None, request: gr.Request = None) -> str:
    """Write the shown run as one self-contained HTML file (specviz.views.export) in the session's own
    folder and return its path."""
    if rec is None or not rec.speculative.rounds:
        raise mistake("Run or load something first: there is nothing to export yet.", title="Nothing to export")
    return guarded_call("export", save_export, rec, getattr(request, "session_hash", None), state.device_owner(request))
