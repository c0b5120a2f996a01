"""Files the page hands out: each finished or loaded run's JSON copy for the download button,
and HTML exports, in one temporary folder that does not outlive the app.
"""

from __future__ import annotations

import atexit
import itertools
import shutil
import tempfile
import time
from pathlib import Path

from specviz.recording import Recording
from specviz.views.export import export_html

# Each finished run is written here for the download button; only the newest few are kept.
FOLDER = Path(tempfile.mkdtemp(prefix="specviz-"))
atexit.register(shutil.rmtree, FOLDER, ignore_errors=True)  # the folder does not outlive the app
KEEP_DOWNLOADS = 16
_nonce = itertools.count(1)


def nonce() -> int:
    """A number never handed out before in this process (file names, the race's restart key)."""
    return next(_nonce)


def _name(suffix: str) -> Path:
    return FOLDER / f"specviz-run-{time.strftime('%Y%m%d-%H%M%S')}-{nonce()}{suffix}"


def save_for_download(rec: Recording) -> str:
    """Write ``rec`` as JSON for the download button; keep the newest KEEP_DOWNLOADS copies. Returns its path."""
    path = _name(".json")
    rec.save(path)
    for old in sorted(FOLDER.glob("*.json"), key=lambda p: p.stat().st_mtime)[:-KEEP_DOWNLOADS]:
        old.unlink(missing_ok=True)
    return str(path)


def save_export(rec: Recording) -> str:
    """Write ``rec`` as one self-contained HTML page (specviz.views.export); returns its path."""
    path = _name(".html")
    path.write_text(export_html(rec), encoding="utf-8")
    return str(path)
