"""Files the page hands out: each finished run's JSON copy for the download button, and HTML
exports, in one folder bounded in count and bytes that does not outlive the app.

Each visitor's files live in a folder of that session, named by a random token
(``secrets.token_urlsafe``, 192 bits), and each file has a random name of its own: nothing in a
path is shared between sessions or sequential, so no visitor can derive another's file (a shared
counter and a timestamp once let a visitor fetch another's recording in a few guesses). The
session's folder is removed when the session ends (``forget_session``, on the page's unload) and is
capped at KEEP_PER_SESSION files of each kind. Retention is per session: a write prunes only its own
session's folder, never another's (a global keep-newest-16 once let 16 prepared loads from one
visitor turn another's download into a 403). The whole folder is bounded in bytes by refusal: a
write that would take it past TOTAL_MAX_BYTES is removed again and refused with a message, and a
folder untouched for SESSION_TTL_S (its session expired) or left empty goes at the next write.

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
import time
import weakref
from collections import OrderedDict
from pathlib import Path

import gradio as gr
from gradio.utils import get_upload_folder

from specviz.recording import Recording
from specviz.serving import device_thread
from specviz.serving.device_thread import Owner
from specviz.ui.guard.checks import mistake
from specviz.ui.guard.disk import remove_cache
from specviz.ui.guard.limits import SESSION_TTL_S
from specviz.views.export import export_bytes, export_html, export_units

EMPTY_GRACE_S = 60  # an empty session folder is left this long (its first file may be on its way)
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
    """Delete the download folder and everything in it, and the app's whole cache folder (``specviz.ui.guard.disk``)."""
    if _folder is not None:
        shutil.rmtree(_folder, ignore_errors=True)
    remove_cache()


def remove_on_signals() -> None:
    """On SIGTERM or SIGINT remove the folder (and the app's cache), then let the signal do what it did before (Python
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


def _files(sub: Path) -> list[tuple[float, int, Path]]:
    """(mtime, bytes, path) of each file in ``sub``, newest first."""
    files = []
    for p in sub.iterdir():
        try:
            st = p.stat()
        except OSError:
            continue
        files.append((st.st_mtime, st.st_size, p))
    return sorted(files, reverse=True)


def prune(written: Path) -> None:
    """After ``written`` was written: keep the newest KEEP_PER_SESSION files of each kind in its own
    folder (no other session's), remove other folders left empty for a minute or untouched for
    SESSION_TTL_S (their session has expired), and if the whole folder is then over TOTAL_MAX_BYTES,
    remove ``written`` again.

    Raises:
        gr.Error: the download space is full (``written`` was removed).
    """
    per: dict[str, int] = {}
    for _, _, p in _files(written.parent):
        per[p.suffix] = per.get(p.suffix, 0) + 1
        if per[p.suffix] > KEEP_PER_SESSION:
            p.unlink(missing_ok=True)
    now, total = time.time(), 0
    for sub in folder().iterdir():
        if not sub.is_dir():
            continue
        files = _files(sub)
        try:
            age = now - max([sub.stat().st_mtime] + [mtime for mtime, _, _ in files])
        except OSError:
            continue
        if sub != written.parent and (age > SESSION_TTL_S or (not files and age > EMPTY_GRACE_S)):
            shutil.rmtree(sub, ignore_errors=True)
            with _lock:
                for key in [k for k, v in _sessions.items() if v == sub]:
                    del _sessions[key]
            continue
        total += sum(size for _, size, _ in files)
    if total > TOTAL_MAX_BYTES:
        written.unlink(missing_ok=True)
        raise mistake(
            f"The server's download space is full ({TOTAL_MAX_BYTES // (1024 * 1024)} MB for everyone's files): "
            "try again in a few minutes.",
            title="Busy",
        )


def save_for_download(rec: Recording, session: str | None = None) -> str:
    """Write ``rec`` as JSON for the download button, in ``session``'s folder; returns its path.

    Raises:
        gr.Error: the download space is full (``prune``).
    """
    path = _name(session, ".json")
    rec.save(path)
    prune(path)
    return str(path)


def save_export(rec: Recording, session: str | None = None, owner: Owner | None = None) -> str:
    """Write ``rec`` as one self-contained HTML page (specviz.views.export) in ``session``'s folder; returns its path.

    The page is built in the caller's thread deferring to the device's steps (``device_thread.deferring(owner)``;
    ``owner``: the visitor, None: the server): in slices between other visitors' steps while they run. Built beside
    them (0.1-0.2 s of Python, much of it in calls that never let the interpreter lock go), back-to-back exports made a
    16-token run 4.3x slower (13.8x at Python's switch interval); built as one step of the device thread, a 16-token
    run that met a recording loaded and exported again and again took 1.9x its time alone (median), 5.4x at worst;
    deferring, 1.12x and 1.19x (``python -m specviz.visitors.attack --floods exports``, 2-core CPU with AVX-512 BF16).

    The work is bounded before it starts: the parts to render (rounds, drafts and tree nodes) and the
    page's estimated size are checked from counts alone, and the built page's size once more. The run on screen
    exported again is built once: its page is kept (EXPORTS_KEPT pages), and the session's file handed back while
    it lasts.

    Raises:
        gr.Error: the run has more than EXPORT_MAX_UNITS rounds, drafts and tree nodes, or its page
            would be (or, built, is) larger than EXPORT_MAX_BYTES, or the download space is full (``prune``).
    """
    units = export_units(rec)
    if units > EXPORT_MAX_UNITS:
        raise mistake(
            f"This run is too large to export as one page: it has {units:,} rounds, drafts and tree nodes, and an "
            f"export takes at most {EXPORT_MAX_UNITS:,}. Download its JSON instead.",
            title="Too large to export",
        )
    mb = EXPORT_MAX_BYTES // (1024 * 1024)
    if (estimate := export_bytes(rec)) > EXPORT_MAX_BYTES:
        raise mistake(
            f"This run is too large to export as one page: it would be about {estimate / 2**20:.0f} MB, over {mb} MB. "
            "Download its JSON instead.",
            title="Too large to export",
        )
    kept = _kept_export(rec, session)
    if isinstance(kept, Path):  # this session's file of this run is still there: Gradio serves it again as it is
        kept.touch()
        return str(kept)
    page = kept if kept is not None else device_thread.deferring(owner)(export_html)(rec)
    if len(page) > EXPORT_MAX_BYTES:
        raise mistake(f"This run's page would be over {mb} MB: download its JSON instead.", title="Too large to export")
    path = _name(session, ".html")
    path.write_text(page, encoding="utf-8")
    prune(path)
    _keep_export(rec, session, page, path)
    return str(path)


# The pages last built, by the recording they show: the very object a session's state holds while it shows that run
# (Gradio hands a job the stored object, not a copy), checked through a weak reference so an id reused by another
# object never matches. Exporting the run on screen again (a second click, or a flood of them) reuses the page, and
# the session's file while it lasts, instead of building it again (0.1-0.2 s of Python a page).
EXPORTS_KEPT = 4  # pages kept, each at most EXPORT_MAX_BYTES
_exports: OrderedDict[int, tuple[weakref.ref, str, dict[str | None, Path]]] = OrderedDict()
_exports_lock = threading.Lock()


def _kept_export(rec: Recording, session: str | None) -> Path | str | None:
    """``session``'s file of ``rec``'s page if it is still on disk, else the page if it was built, else None."""
    with _exports_lock:
        entry = _exports.get(id(rec))
        if entry is None or entry[0]() is not rec:
            return None
        _exports.move_to_end(id(rec))
        path = entry[2].get(session)
        return path if path is not None and path.exists() else entry[1]


def _keep_export(rec: Recording, session: str | None, page: str, path: Path) -> None:
    with _exports_lock:
        entry = _exports.get(id(rec))
        if entry is None or entry[0]() is not rec:
            entry = (weakref.ref(rec), page, {})
        entry[2][session] = path
        _exports[id(rec)] = entry
        _exports.move_to_end(id(rec))
        while len(_exports) > EXPORTS_KEPT:
            _exports.popitem(last=False)
