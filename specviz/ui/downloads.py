"""Files the page hands out: each finished run's JSON copy for the download button, and HTML
exports, in one folder bounded in count and bytes that does not outlive the app.

Each visitor's files live in a folder of that session, named by a random token
(``secrets.token_urlsafe``, 192 bits), and each file has a random name of its own: nothing in a
path is shared between sessions or sequential, so no visitor can derive another's file (a shared
counter and a timestamp once let a visitor fetch another's recording in a few guesses). The
session's folder is removed when the session ends (``forget_session``, on the page's unload) and is
capped at KEEP_PER_SESSION files of each kind; the whole folder is capped in count and bytes.

The folder lies inside Gradio's cache, so Gradio serves the files from where they are instead of
copying each into its cache (a second copy on disk). A loaded recording needs no copy at all: its
download is the uploaded (or prepared) file itself. The folder is removed at a normal exit and on
SIGTERM and SIGINT (``remove_on_signals``).
"""

from __future__ import annotations

import atexit
import itertools
import os
import secrets
import shutil
import signal
import tempfile
import threading
from pathlib import Path

import gradio as gr
from gradio.utils import get_upload_folder

from specviz.recording import Recording
from specviz.ui.checks import mistake
from specviz.views.export import export_bytes, export_html, export_units

KEEP_DOWNLOADS = 16  # JSON copies kept in all (newest first)
KEEP_EXPORTS = 8  # HTML exports kept in all
KEEP_PER_SESSION = 2  # of each kind, per session: the shown run's and the one before
TOTAL_MAX_BYTES = int(float(os.environ.get("SPECVIZ_DOWNLOADS_MB", "256")) * 1024 * 1024)  # the whole folder
# An export renders each round, draft and tree node (specviz.views.export.export_units). The page's
# largest runs: 256 rounds of 33-node trees with their baseline, 256 + 8,448 + 256 = 8,960 parts
# (about 17 MB exported, at most a minute's work); a chain of 256 rounds x 16 drafts, 4,608.
EXPORT_MAX_UNITS = 10_000
EXPORT_MAX_BYTES = 32 * 1024 * 1024  # the page, estimated before it is built and measured after
_nonce = itertools.count(1)
_folder: Path | None = None
_sessions: dict[str, Path] = {}  # Gradio session hash -> its folder
_lock = threading.Lock()


def folder() -> Path:
    """The download folder (created on first use, again if something removed it)."""
    global _folder
    if _folder is None:
        root = Path(get_upload_folder())
        root.mkdir(parents=True, exist_ok=True)
        _folder = Path(tempfile.mkdtemp(prefix="specviz-", dir=root))
        atexit.register(remove)
    _folder.mkdir(parents=True, exist_ok=True)
    return _folder


def remove() -> None:
    """Delete the download folder and everything in it."""
    if _folder is not None:
        shutil.rmtree(_folder, ignore_errors=True)


def remove_on_signals() -> None:
    """On SIGTERM or SIGINT remove the folder, then let the signal do what it did before (Python
    runs no exit hooks when SIGTERM kills it). Call from the main thread."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        before = signal.getsignal(sig)

        def handler(signum, frame, before=before):
            remove()
            if callable(before):
                return before(signum, frame)
            signal.signal(signum, before if before is not None else signal.SIG_DFL)
            os.kill(os.getpid(), signum)

        signal.signal(sig, handler)


def nonce() -> int:
    """A number never handed out before in this process (file names, the race's restart key)."""
    return next(_nonce)


def session_folder(session: str | None) -> Path:
    """The folder of ``session`` (Gradio's session hash), named by a random token and created on first
    use; a call outside a page session (the API) gets a new folder of its own each time."""
    with _lock:
        path = _sessions.get(session) if session is not None else None
        if path is None:
            path = folder() / secrets.token_urlsafe(24)
            if session is not None:
                _sessions[session] = path
        path.mkdir(parents=True, exist_ok=True)
        return path


def forget_session(session: str | None) -> None:
    """Remove the session's folder and every file in it (the session ended)."""
    with _lock:
        path = _sessions.pop(session, None) if session is not None else None
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def session_ended(request: gr.Request = None) -> None:
    """The page's unload handler: the session's files go with it (Gradio injects ``request``)."""
    forget_session(getattr(request, "session_hash", None))


def _name(session: str | None, suffix: str) -> Path:
    return session_folder(session) / f"specviz-run-{secrets.token_urlsafe(16)}{suffix}"


def prune() -> None:
    """Keep KEEP_PER_SESSION files of each kind per session folder, the newest KEEP_DOWNLOADS JSON copies
    and KEEP_EXPORTS exports in all, and the whole folder under TOTAL_MAX_BYTES, removing the oldest files
    first; folders left empty that belong to no live session go too."""
    files = []
    for sub in folder().iterdir():
        if not sub.is_dir():
            continue
        for p in sub.iterdir():
            try:
                st = p.stat()
            except OSError:
                continue
            files.append((st.st_mtime, st.st_size, p))
    files.sort(reverse=True)  # newest first
    kept = {".json": 0, ".html": 0}
    per: dict[tuple[Path, str], int] = {}
    total = 0
    for _, size, p in files:
        kept[p.suffix] = kept.get(p.suffix, 0) + 1
        per[(p.parent, p.suffix)] = per.get((p.parent, p.suffix), 0) + 1
        total += size
        over = kept[p.suffix] > (KEEP_EXPORTS if p.suffix == ".html" else KEEP_DOWNLOADS) or per[(p.parent, p.suffix)] > KEEP_PER_SESSION
        if over or total > TOTAL_MAX_BYTES:
            p.unlink(missing_ok=True)
            total -= size
    with _lock:
        live = set(_sessions.values())
    for sub in folder().iterdir():
        if sub.is_dir() and sub not in live and not any(sub.iterdir()):
            sub.rmdir()


def save_for_download(rec: Recording, session: str | None = None) -> str:
    """Write ``rec`` as JSON for the download button, in ``session``'s folder; returns its path."""
    path = _name(session, ".json")
    rec.save(path)
    prune()
    return str(path)


def save_export(rec: Recording, session: str | None = None) -> str:
    """Write ``rec`` as one self-contained HTML page (specviz.views.export) in ``session``'s folder; returns its path.

    The work is bounded before it starts: the parts to render (rounds, drafts and tree nodes) and the
    page's estimated size are checked from counts alone, and the built page's size once more.

    Raises:
        gr.Error: the run has more than EXPORT_MAX_UNITS rounds, drafts and tree nodes, or its page
            would be (or, built, is) larger than EXPORT_MAX_BYTES.
    """
    units = export_units(rec)
    if units > EXPORT_MAX_UNITS:
        raise mistake(f"This run is too large to export as one page: it has {units:,} rounds, drafts and tree nodes, and an "
                      f"export takes at most {EXPORT_MAX_UNITS:,}. Download its JSON instead.", title="Too large to export")
    mb = EXPORT_MAX_BYTES // (1024 * 1024)
    if (estimate := export_bytes(rec)) > EXPORT_MAX_BYTES:
        raise mistake(f"This run is too large to export as one page: it would be about {estimate / 2**20:.0f} MB, over {mb} MB. "
                      "Download its JSON instead.", title="Too large to export")
    page = export_html(rec)
    if len(page) > EXPORT_MAX_BYTES:
        raise mistake(f"This run's page would be over {mb} MB: download its JSON instead.", title="Too large to export")
    path = _name(session, ".html")
    path.write_text(page, encoding="utf-8")
    prune()
    return str(path)
