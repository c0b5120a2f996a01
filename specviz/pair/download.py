"""Downloading a model from the hub in the background, with a time limit and a size limit.

A pair whose weights are not on this machine yet is fetched by ``snapshot_download`` (huggingface_hub)
in a thread of its own, never in the caller's. Inside ``in_background()`` (the web page's and /run's
loads, which hold the device's queue slot) the caller waits at most ``wait_s`` seconds (enough for a
model already in the cache to be checked) and is otherwise answered that the model is downloading,
so the queue moves on while the download goes on; asked again once it is done, the model loads from
the local cache. Elsewhere (start-up preloads, the command line, the Python API) the caller waits
for the download, within its time limit.

Limits (read from the environment at each download):

- ``SPECVIZ_HUB_DOWNLOAD_GB`` (default 16): the bytes of one model's files, summed from the hub's
  file list before anything is downloaded (a model over it is refused), and counted again while the
  bytes arrive (the download is stopped past it).
- ``SPECVIZ_HUB_DOWNLOAD_S`` (default 900): seconds one model's download may take; past it the
  download is marked failed (its message names the limit) and told to stop.
- One download at a time: a second model asked for meanwhile is refused until the first ends.

Files are fetched with ``allow_patterns`` (configurations, tokenizer files, safetensors weights):
no pickled weights, no code.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from specviz.pair.errors import PairError, explain

DOWNLOAD_GB_ENV = "SPECVIZ_HUB_DOWNLOAD_GB"
DOWNLOAD_S_ENV = "SPECVIZ_HUB_DOWNLOAD_S"
DEFAULT_DOWNLOAD_GB = 16.0
DEFAULT_DOWNLOAD_S = 900.0
WAIT_S = 3.0  # how long a caller waits for a download before being told it goes on in the background
PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "tokenizer*"]  # weights as safetensors only

# fetch(repo_id, revision, stop) -> the local folder; ``stop()`` is a function that raises once the
# download must end (over its time or size limit), to be called as bytes arrive.
Fetch = Callable[[str, "str | None", Callable[[int], None]], str]
# sizes(repo_id, revision) -> bytes of the files a download would fetch
Sizes = Callable[[str, "str | None"], int]


def download_limit_bytes() -> int:
    """SPECVIZ_HUB_DOWNLOAD_GB in bytes (default 16 GB)."""
    return int(_env_float(DOWNLOAD_GB_ENV, DEFAULT_DOWNLOAD_GB) * 1e9)


def download_limit_s() -> float:
    """SPECVIZ_HUB_DOWNLOAD_S (default 900 s)."""
    return _env_float(DOWNLOAD_S_ENV, DEFAULT_DOWNLOAD_S)


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return max(float(raw), 0.0)
    except ValueError:
        raise PairError(f"{name}={raw!r} is not a number; unset it or give a number (default {default:g})") from None


_here = threading.local()


@contextmanager
def in_background() -> Iterator[None]:
    """Within this block (in this thread), a download under way is left to run in the background:
    ``Downloads.folder`` waits at most its ``wait_s`` and then raises PairError saying so."""
    before = getattr(_here, "background", False)
    _here.background = True
    try:
        yield
    finally:
        _here.background = before


class Stopped(Exception):
    """Raised inside a download that is over its time or size limit."""


def hub_sizes(repo_id: str, revision: str | None) -> int:
    """Bytes of the files ``hub_fetch`` would download (from the hub's file list; nothing is downloaded).

    Raises:
        PairError: the hub's answer, worded by ``explain``.
    """
    from huggingface_hub import snapshot_download

    from specviz.pair.hub import HUB_TIMEOUT_S

    try:
        files = snapshot_download(
            repo_id, revision=revision, allow_patterns=PATTERNS, etag_timeout=HUB_TIMEOUT_S, dry_run=True
        )
    except Exception as err:
        raise explain(repo_id, err) from err
    return sum(f.file_size or 0 for f in files if f.will_download)


def hub_fetch(repo_id: str, revision: str | None, stop: Callable[[int], None]) -> str:
    """Download a model's files into the hub cache; ``stop(n)`` is told of every ``n`` bytes that arrive and may
    raise."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import tqdm as hf_tqdm

    class Watched(hf_tqdm):  # the bytes of every file's download pass through its progress bar
        def update(self, n=1):
            stop(int(n or 0))
            return super().update(n)

    return snapshot_download(repo_id, revision=revision, allow_patterns=PATTERNS, tqdm_class=Watched)


@dataclass
class _Job:
    key: tuple[str, str | None]
    started: float
    limit_s: float
    limit_bytes: int
    done: threading.Event = field(default_factory=threading.Event)
    folder: str | None = None
    error: str | None = None
    received: int = 0
    cancel: threading.Event = field(default_factory=threading.Event)


class Downloads:
    """The hub downloads of this process: one at a time, each in its own thread, within its limits.

    ``fetch`` and ``sizes`` default to huggingface_hub's (``hub_fetch``, ``hub_sizes``); tests pass fakes.
    """

    def __init__(self, fetch: Fetch | None = None, sizes: Sizes | None = None, wait_s: float = WAIT_S):
        self.fetch, self.sizes, self.wait_s = fetch or hub_fetch, sizes or hub_sizes, wait_s
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, str | None], _Job] = {}

    def folder(self, repo_id: str, revision: str | None, say: Callable[[str], None] = lambda m: None) -> str:
        """The local folder of ``repo_id`` at ``revision``, once downloaded.

        Starts the download when nothing is under way, then waits for it: at most ``wait_s`` seconds
        inside ``in_background()``, else until it ends (within its time limit).

        Raises:
            PairError: still downloading (try again), another model downloading, over the size limit
                (SPECVIZ_HUB_DOWNLOAD_GB), over the time limit (SPECVIZ_HUB_DOWNLOAD_S), or what the hub answered.
        """
        key = (repo_id, revision)
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and job.done.is_set() and job.error is not None:
                del self._jobs[key]  # a failure is told once; asking again starts afresh
                raise PairError(job.error)
            if job is None:
                busy = [j for j in self._jobs.values() if not j.done.is_set()]
                if busy:
                    raise PairError(
                        f"another model ({busy[0].key[0]}) is downloading now: one download at a time; try again in a "
                        "few minutes"
                    )
                job = self._start(key, say)
        if not job.done.wait(self.wait_s if getattr(_here, "background", False) else job.limit_s + 5):
            self._check_time(job)
            if not job.done.is_set():
                raise PairError(
                    f"'{repo_id}' is downloading in the background ({job.received / 1e9:.2f} GB so far, "
                    f"{time.monotonic() - job.started:.0f} s "
                    f"of at most {job.limit_s:g} s, {DOWNLOAD_S_ENV}): other visitors' runs go on meanwhile; try again "
                    "when it is done"
                )
        if job.error is not None:
            with self._lock:
                self._jobs.pop(key, None)
            raise PairError(job.error)
        return job.folder  # type: ignore[return-value]

    def _start(self, key: tuple[str, str | None], say: Callable[[str], None]) -> _Job:
        limit_bytes, limit_s = download_limit_bytes(), download_limit_s()
        need = self.sizes(*key)  # metadata only, bounded by the hub's own timeout
        if need > limit_bytes:
            raise PairError(
                f"'{key[0]}' has {need / 1e9:.1f} GB of files to download, over this server's limit of "
                f"{limit_bytes / 1e9:g} GB ({DOWNLOAD_GB_ENV}); pick a smaller model"
            )
        job = _Job(key, time.monotonic(), limit_s, limit_bytes)
        self._jobs[key] = job
        say(f"Downloading {key[0]} ({need / 1e9:.2f} GB) in the background")
        threading.Thread(target=self._run, args=(job,), name=f"download {key[0]}", daemon=True).start()
        timer = threading.Timer(limit_s, self._check_time, args=(job,))
        timer.daemon = True
        timer.start()
        return job

    def _check_time(self, job: _Job) -> None:
        """Fail ``job`` once it is past its time limit (its thread is told to stop at its next bytes)."""
        if not job.done.is_set() and time.monotonic() - job.started > job.limit_s:
            job.error = (
                f"downloading '{job.key[0]}' took longer than this server's limit of {job.limit_s:g} s "
                f"({DOWNLOAD_S_ENV}); "
                "it was stopped"
            )
            job.cancel.set()
            job.done.set()

    def _run(self, job: _Job) -> None:
        def stop(n: int) -> None:
            job.received += n
            if job.cancel.is_set():
                raise Stopped(job.error or "stopped")
            if job.received > job.limit_bytes:
                job.error = (
                    f"'{job.key[0]}' sent more than this server's limit of {job.limit_bytes / 1e9:g} GB "
                    f"({DOWNLOAD_GB_ENV}) "
                    "while downloading; it was stopped"
                )
                job.cancel.set()
                raise Stopped(job.error)

        try:
            folder = self.fetch(job.key[0], job.key[1], stop)
            if not job.cancel.is_set():
                on_disk = sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
                if on_disk > job.limit_bytes:
                    job.error = (
                        f"'{job.key[0]}' holds {on_disk / 1e9:.1f} GB of files, over this server's limit of "
                        f"{job.limit_bytes / 1e9:g} GB ({DOWNLOAD_GB_ENV})"
                    )
                else:
                    job.folder = folder
        except Stopped:
            pass
        except Exception as err:  # noqa: BLE001 - the hub's failure becomes the job's message
            if job.error is None:
                job.error = str(explain(job.key[0], err))
        finally:
            if job.folder is None and job.error is None:
                job.error = f"downloading '{job.key[0]}' stopped"
            job.done.set()


HUB = Downloads()
