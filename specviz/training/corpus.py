"""The training corpus of the embedded pair: the CPython standard library's own source.

Every Python installation ships it (PSF licence), so the pair can be rebuilt on any machine
with no download. Test packages are left out; a fixed hash of each file's path decides
whether it is held out for validation and prompts, so the split does not depend on the
order in which the file system lists files.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Directories whose content is tests, generated data or third-party packages.
_SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "pydoc_data"}
# One file in HELD_OUT_MODULUS is held out (about 5 %).
HELD_OUT_MODULUS = 20


@dataclass(frozen=True)
class SourceFile:
    """One standard-library module: its path relative to the library root and its text."""

    path: str
    text: str

    @property
    def held_out(self) -> bool:
        """True for files kept out of training (validation and held-out prompts)."""
        digest = hashlib.sha1(self.path.encode()).digest()
        return int.from_bytes(digest[:4], "big") % HELD_OUT_MODULUS == 0


def stdlib_root() -> Path:
    """The directory of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[SourceFile]:
    """All standard-library ``.py`` files outside test packages, sorted by path.

    Files that are not valid UTF-8 are skipped.
    """
    root = root or stdlib_root()
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in _SKIPPED_DIRS and not d.startswith("config-")
        )
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            full = Path(dirpath) / name
            try:
                text = full.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            files.append(SourceFile(full.relative_to(root).as_posix(), text))
    files.sort(key=lambda f: f.path)
    return files


def split(files: list[SourceFile]) -> tuple[list[SourceFile], list[SourceFile]]:
    """Split into (training, held-out) by the path hash."""
    train = [f for f in files if not f.held_out]
    held = [f for f in files if f.held_out]
    return train, held


def held_out_prompts(held: list[SourceFile], count: int = 24, lines: int = 4) -> list[dict]:
    """Prompts cut from held-out files: a ``def`` line and the lines before it.

    Returns ``count`` dicts ``{"source": path, "prompt": text}``, taken round-robin over the
    files so that no single module dominates. Each prompt ends at the colon of a ``def`` line,
    without the newline: the BPE merges a newline with the indentation after it, so a prompt
    ending in a bare newline would end on a token boundary the models never saw in training.
    """
    candidates: list[list[dict]] = []
    for f in held:
        text_lines = f.text.splitlines(keepends=True)
        per_file = []
        for i, line in enumerate(text_lines):
            stripped = line.lstrip()
            if stripped.startswith("def ") and line.rstrip().endswith(":") and i >= lines - 1:
                start = i - (lines - 1)
                prompt = "".join(text_lines[start : i + 1]).rstrip("\n")
                if 40 <= len(prompt) <= 400:
                    per_file.append({"source": f.path, "prompt": prompt})
        if per_file:
            candidates.append(per_file)
    prompts: list[dict] = []
    seen: set[str] = set()
    depth = 0
    while len(prompts) < count and any(depth < len(c) for c in candidates):
        for c in candidates:
            # Spread picks over each file rather than taking its first functions.
            if depth < len(c):
                pick = c[(depth * 7) % len(c)]
                if pick["prompt"] not in seen:
                    seen.add(pick["prompt"])
                    prompts.append(pick)
                if len(prompts) == count:
                    break
        depth += 1
    return prompts
