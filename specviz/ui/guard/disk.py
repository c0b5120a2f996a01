"""Every file the server writes lies in one folder of its own, bounded and removed when the app stops.

- ``own_cache``: Gradio writes uploads, cached outputs and its temporary files under ``GRADIO_TEMP_DIR``
  (``gradio.utils.get_upload_folder``). At import of ``specviz.ui`` that becomes a new folder of this
  process inside the configured one (or the system's), which ``remove_cache`` deletes whole at exit and
  on SIGTERM and SIGINT (``specviz.ui.guard.downloads.remove_on_signals``): 105 MB of uploads once stayed
  after the app stopped.
- ``UploadSweep``: Gradio's upload route streams each file into a temporary file at the top of that
  folder and renames it into a folder named by its hash once the request is whole. A request cut off
  (or refused by the upload budget) leaves its temporary files behind, and Gradio's cache sweep removes
  old files but not the folders they were in (10 requests of 1,000 tiny files left 10,019 empty
  folders). So when the last upload in flight ends, the top-level temporary files (``tmp*``) are
  removed: no upload is writing one then. Folders left empty for EMPTY_AFTER_S go too, at most once
  every SWEEP_EVERY_S.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

EMPTY_AFTER_S = 60.0  # an empty folder this old is no upload's: one being written is renamed into at once
SWEEP_EVERY_S = 30.0  # the empty-folder sweep at most this often (it lists the whole folder)
_owned: Path | None = None


def own_cache() -> Path:
    """Point ``GRADIO_TEMP_DIR`` at a new folder of this process (once), removed at exit; returns it."""
    global _owned
    if _owned is None:
        parent = Path(os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio")
        parent.mkdir(parents=True, exist_ok=True)
        _owned = Path(tempfile.mkdtemp(prefix="specviz-", dir=parent))
        os.environ["GRADIO_TEMP_DIR"] = str(_owned)
        atexit.register(remove_cache)
    return _owned


def remove_cache() -> None:
    """Delete the process's folder and everything in it."""
    if _owned is not None:
        shutil.rmtree(_owned, ignore_errors=True)


def cache_root() -> Path:
    from gradio.utils import get_upload_folder

    return Path(get_upload_folder())


class UploadSweep:
    """Counts the uploads in flight; the last one to end removes what no upload can be writing (see the module
    docstring)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._in_flight = 0
        self._last_sweep = float("-inf")

    def begin(self) -> None:
        with self._lock:
            self._in_flight += 1

    def end(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight:
                return
            sweep_empty = time.monotonic() - self._last_sweep > SWEEP_EVERY_S
            if sweep_empty:
                self._last_sweep = time.monotonic()
            # Under the lock: no upload begins while its temporary files are told from leftovers.
            sweep(empty=sweep_empty)


def sweep(empty: bool = True, root: Path | None = None, now: float | None = None) -> None:
    """Remove the top-level temporary files of ``root`` (default: the cache) and, with ``empty``, its
    folders left empty for EMPTY_AFTER_S. Call only when no upload is in flight."""
    root = cache_root() if root is None else root
    now = time.time() if now is None else now
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False) and entry.name.startswith("tmp"):
                os.unlink(entry.path)
            elif empty and entry.is_dir(follow_symlinks=False) and now - entry.stat().st_mtime > EMPTY_AFTER_S:
                os.rmdir(entry.path)  # only if empty
        except OSError:
            continue


UPLOADS_IN_FLIGHT = UploadSweep()
