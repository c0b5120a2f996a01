"""A saved run: the speculative trace, its baseline and an optional gamma sweep, as JSON.

A teacher can record runs on a GPU and replay them on a laptop with no model: loading
validates the file against the trace schema and a size cap before anything is shown.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from specviz.records.sweep import Sweep, SweepPoint
from specviz.trace import SCHEMA_VERSION, Trace, validate, validation

# A 256-token run with gamma 16 is about 1 MB; anything far larger is not ours.
MAX_BYTES = 8 * 1024 * 1024
FORMAT = "specviz-recording"


# An escaped or raw UTF-16 surrogate: a recording holding one is checked for a lone one.
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\xed[\xa0-\xbf]")


@dataclass
class Recording:
    """What the demo shows for one run.

    Attributes:
        speculative: the speculative trace.
        baseline: the autoregressive trace on the same settings, or None.
        sweep: a gamma sweep on the same prompt, or None.
        title: a label for menus (e.g. the pair and settings).
        prompt: the prompt as the visitor typed it, before any chat template ("" when unknown:
            then the trace's prompt_text stands in).
        chat: whether the chat template was applied (None when unknown).
        auto: the auto tree's record when the run's tree was chosen by it (``specviz.engine.tree.auto.AutoTree.record``:
            the calibration's measurements and bounds; loading checks it and decides again), else None.
        made_by: what recorded it (``made_by_here``: the machine, the build, the engine's version), or None when the
            file does not say (recordings older than this field).
    """

    speculative: Trace
    baseline: Trace | None = None
    sweep: Sweep | None = None
    title: str = ""
    prompt: str = ""
    chat: bool | None = None
    auto: dict | None = None
    made_by: dict | None = None

    def to_json(self) -> str:
        """The recording as JSON text (traces as ``Trace.to_dict``)."""
        return json.dumps(
            {
                "format": FORMAT,
                "schema_version": SCHEMA_VERSION,
                "title": self.title,
                "prompt": self.prompt,
                "chat": self.chat,
                "speculative": self.speculative.to_dict(),
                "baseline": self.baseline.to_dict() if self.baseline is not None else None,
                "sweep": asdict(self.sweep) if self.sweep is not None else None,
                **({"auto": self.auto} if self.auto is not None else {}),
                **({"made_by": self.made_by} if self.made_by is not None else {}),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> "Recording":
        """Parse and validate a recording, or a bare speculative trace.

        Raises:
            ValueError: the text is over ``MAX_BYTES``, not JSON, or not a recording or trace
                (the message names the first bad field).
        """
        if len(text) > MAX_BYTES:
            raise ValueError(
                f"the file is {len(text) / 1e6:.1f} MB; a specviz recording is at most {MAX_BYTES / 1e6:.0f} MB"
            )
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"the file is not JSON ({e})") from None
        except RecursionError:
            raise ValueError(
                f"the file is nested too deeply; a recording nests at most {validation.MAX_DEPTH} levels"
            ) from None
        if not isinstance(d, dict):
            raise ValueError("the file is not a specviz recording: expected a JSON object")
        if _SURROGATE.search(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")):
            # an escaped surrogate: refused unless it is half of a pair (the page's event stream cannot carry a lone
            # one)
            try:
                json.dumps(d, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(
                    "not a specviz recording: a text field holds a lone surrogate (not valid Unicode text)"
                ) from None
        for key in ("speculative", "baseline"):  # counts first: an oversized list is refused before any walk over it
            validation.check_structure(d.get(key), key)
        validation.check_depth(d)
        if d.get("format") != FORMAT:
            if "rounds" in d and "mode" in d:  # a bare trace, as `generate --json` prints it
                d = {"speculative": d}
            else:
                raise ValueError("the file is not a specviz recording (no 'format': 'specviz-recording')")
        else:  # a newer specviz's recording may hold what this code would misread: refused, naming the versions read
            validation.check_schema_version(d.get("schema_version", 1), "schema_version", SCHEMA_VERSION)
        spec = Trace.from_dict(d.get("speculative"), "speculative")
        if spec.mode != "speculative":
            raise ValueError("the recording's 'speculative' trace is an autoregressive one")
        baseline = Trace.from_dict(d["baseline"], "baseline") if d.get("baseline") is not None else None
        if baseline is not None and baseline.mode != "autoregressive":
            raise ValueError("not a specviz recording: baseline: must be an autoregressive trace")
        sweep = None
        if d.get("sweep") is not None:
            points = d["sweep"].get("points") if isinstance(d["sweep"], dict) else None
            if isinstance(points, list) and len(points) > validation.MAX_SWEEP_POINTS:
                raise ValueError(
                    f"not a specviz recording: sweep.points: {len(points)} points; at most "
                    f"{validation.MAX_SWEEP_POINTS}"
                )
            sweep = validation.check_sweep(validate(Sweep, d["sweep"], "sweep"))
        title = d.get("title", "")
        if not isinstance(title, str) or len(title) > validation.MAX_TITLE:
            raise ValueError(
                f"not a specviz recording: title: must be text of at most {validation.MAX_TITLE} characters"
            )
        prompt, chat = d.get("prompt", ""), d.get("chat")
        if not isinstance(prompt, str) or len(prompt) > validation.MAX_TEXT:
            raise ValueError(
                f"not a specviz recording: prompt: must be text of at most {validation.MAX_TEXT} characters"
            )
        if chat is not None and not isinstance(chat, bool):
            raise ValueError("not a specviz recording: chat: must be true, false or null")
        auto = d.get("auto")
        if auto is not None:
            from specviz.engine.tree.auto import from_record

            try:
                from_record(auto)
            except (ValueError, TypeError) as e:
                raise ValueError(f"not a specviz recording: {e}") from None
        made_by = _check_made_by(d.get("made_by"))
        return cls(
            speculative=spec,
            baseline=baseline,
            sweep=sweep,
            title=title,
            prompt=prompt,
            chat=chat,
            auto=auto,
            made_by=made_by,
        )

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_json(), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Recording":
        """Read and validate a recording file; checks the size before reading it.

        Raises:
            ValueError: as ``from_json``; OSError if the file cannot be read.
        """
        path = Path(path)
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise ValueError(
                f"the file is {size / 1e6:.1f} MB; a specviz recording is at most {MAX_BYTES / 1e6:.0f} MB"
            )
        return cls.from_json(path.read_bytes())


MADE_BY_TEXT = ("machine", "build", "torch")  # the text fields of made_by, each at most MADE_BY_CHARS characters
MADE_BY_CHARS = 200


def _check_made_by(value) -> dict | None:
    """A recording's made_by, as read: None, or a dict of the known text fields and an integer engine_version.

    Raises:
        ValueError: naming the field that is not what it must be.
    """
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {*MADE_BY_TEXT, "engine_version"}:
        raise ValueError(
            f"not a specviz recording: made_by: must be an object of {', '.join(MADE_BY_TEXT)} and engine_version"
        )
    for key in MADE_BY_TEXT:
        if key in value and (not isinstance(value[key], str) or len(value[key]) > MADE_BY_CHARS):
            raise ValueError(
                f"not a specviz recording: made_by.{key}: must be text of at most {MADE_BY_CHARS} characters"
            )
    version = value.get("engine_version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= 10**6):
        raise ValueError("not a specviz recording: made_by.engine_version: must be a whole number from 0 to 1000000")
    return dict(value)


@functools.cache
def _build() -> str:
    """specviz's version, and its commit when this package is the top of a git checkout's specviz/ folder."""
    import subprocess
    from importlib import metadata

    try:
        build = metadata.version("specviz")
    except metadata.PackageNotFoundError:
        build = "unknown"
    root = Path(__file__).resolve().parent.parent
    try:  # quick and bounded; an installed copy inside another repository's folder is not that repository's commit
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--show-toplevel", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.split()
        if len(out) == 2 and Path(out[0]).resolve() == root:
            build += f" ({out[1]})"
    except (OSError, subprocess.SubprocessError):
        pass
    return build


def made_by_here(device: str = "cpu") -> dict:
    """What is recording now: the machine (``_machine``), the build (specviz's version, and its commit when it runs
    from a git checkout), torch's version and ``specviz.engine.ENGINE_VERSION``."""
    import torch

    from specviz.engine import ENGINE_VERSION

    return {
        "machine": _machine(str(device))[:MADE_BY_CHARS],
        "build": _build()[:MADE_BY_CHARS],
        "torch": torch.__version__[:MADE_BY_CHARS],
        "engine_version": ENGINE_VERSION,
    }


@functools.cache
def _machine(device: str) -> str:
    """The GPU's name on CUDA; else the CPU's model, its bf16 instructions and torch's threads (read once a process:
    every finished run of the page records it)."""
    import torch

    from specviz.pair.precision import bf16_instructions, cpu_flags, cpu_model

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(torch.device(device))} (CUDA)"
    bf16 = bf16_instructions(cpu_flags())
    return (f"{cpu_model()}, {'with ' + ' and '.join(bf16) if bf16 else 'no bf16 instructions'}, "
            f"{torch.get_num_threads()} threads")


__all__ = ["MAX_BYTES", "Recording", "Sweep", "SweepPoint", "made_by_here"]
