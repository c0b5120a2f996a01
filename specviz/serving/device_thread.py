"""One thread for every model pass of a serving process.

A web server runs each visitor's job in a thread of its pool. On a CPU, torch's products run in parallel
regions of OpenMP (GNU's libgomp in torch's Linux wheels), and libgomp keeps a team of worker threads for
every thread that ever entered a parallel region. Once a process holds more such threads than cores,
libgomp stops spinning between regions and puts its workers to sleep after each one: a decoding step is
hundreds of short regions, each then paying a wake-up. Measured on a 2-core CPU with AVX-512 BF16, the
English pair at the page's defaults (128 tokens, T 0.7): 52 speculative and 45 plain tokens/s when one
thread ran every pass, 35 and 31 once the main thread had run a pass before a second thread ran them
(OMP_WAIT_POLICY=passive gives the same 34 and 30). The server's /run was at 0.66x bench's rate for that
reason.

So the app hands every model pass to one long-lived thread, the device thread: a job's steps
(``steps``: each ``next`` of a streaming job) and single calls (``run``: a pair's load, the start-up
warm-up) run there one at a time, first come first served, each in a copy of its caller's context
variables (so a web framework's per-request state, such as its progress bar, is still found). Two jobs
streaming at once take turns step by step (a round of one, then a round of the other) instead of
splitting the cores between two teams. A call made on the device thread itself runs inline. On a GPU
the same thread keeps one CUDA stream and one set of captured graphs busy.

Errors raised on the device thread are raised again in the caller's thread. This module imports nothing
of torch.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

_executor: concurrent.futures.ThreadPoolExecutor | None = None
_lock = threading.Lock()
_ident: int | None = None  # the device thread's identity, once it has started


def _mark() -> None:
    global _ident
    _ident = threading.get_ident()


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="specviz-device", initializer=_mark)
        return _executor


def on_device_thread() -> bool:
    """Whether the calling thread is the device thread."""
    return _ident is not None and threading.get_ident() == _ident


def run(fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)`` on the device thread, after the work queued before it; its result, or its error raised here."""
    if on_device_thread():
        return fn(*args, **kwargs)
    context = contextvars.copy_context()
    return _pool().submit(context.run, fn, *args, **kwargs).result()


_DONE = object()


def _next(iterator: Iterator):
    return next(iterator, _DONE)


def stepped(iterator: Iterator[T]) -> Iterator[T]:
    """``iterator``'s items, each computed on the device thread (one ``next`` at a time, in the queue with the
    rest); closing the result closes ``iterator`` there too."""
    try:
        while (item := run(_next, iterator)) is not _DONE:
            yield item
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            run(close)


def steps(fn: Callable) -> Callable:
    """``fn`` (a generator function or a plain one) with its work on the device thread: a generator's steps by
    ``stepped``, a plain function's call by ``run``. The signature stays ``fn``'s."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def streamed(*args, **kwargs):
            yield from stepped(fn(*args, **kwargs))

        return streamed

    @functools.wraps(fn)
    def called(*args, **kwargs):
        return run(fn, *args, **kwargs)

    return called
