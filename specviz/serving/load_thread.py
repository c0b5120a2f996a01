"""One thread for loading model pairs, beside the device thread: a visitor switching pairs waits for its own load,
and nobody else does.

A pair's load (reading and casting its weights, a GGUF target's first conversion) took 9.5 s of the English pair
on a 2-core CPU; run as one step of the device thread (``specviz.serving.device_thread``), it held every other
visitor's run for that long (a victim's 16-token Generate 3.5x slower). Here loads run one at a time on a thread
of their own, each in a copy of its caller's context variables, and the device thread goes on taking other jobs'
steps meanwhile; the two share the cores as the operating system shares them.

The load thread does its tensor work with one intra-op thread (``torch.set_num_threads(1)`` there): torch's CPU
parallel regions then run inline on it, so libgomp makes no team of worker threads for it (a process holding
more such threads than cores puts every team's workers to sleep between regions: the slowdown
``specviz.serving.device_thread`` was made to avoid). The count new threads start with is set back to the device
thread's (torch keeps it process-wide; the device thread's own count, set when it first ran, is its own). What
must be measured with the device thread's team, the product kernels' timing a fp32 load makes
(``specviz.pair.kernels``), is handed back to it as one step (``load_pair``'s ``timing``: ``device_thread.run``).

The operating system's priority does not keep a load from the runs: a load is mostly Python (transformers building
modules, the tokenizers read), and a run's passes need the interpreter lock back after each torch operation. So a
load's Python runs only where the device thread has no step, or in turns of its own for the visitor who asked for it
(``device_thread.deferring``).

Errors raised on the load thread are raised again in the caller's thread. Nothing here builds a UI object.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import functools
import os
import threading
from collections.abc import Callable
from typing import TypeVar

from specviz.serving import device_thread

T = TypeVar("T")

_lock = threading.Lock()
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_ident: int | None = None


# The load thread's scheduling priority (a Linux thread's nice value, 0 to 19): the lowest, so that a load takes the
# cores only where the device thread's runs leave them idle, and a visitor's run beside another's pair switch keeps its
# pace (the one switching waits for the load, as before).
LOAD_NICE = 19


def _start() -> None:
    """The load thread's start: the lowest priority where the system gives a thread its own (LOAD_NICE), one
    intra-op thread here, the process-wide count left as the device thread has it."""
    import torch

    global _ident
    _ident = threading.get_ident()
    try:  # Linux: a thread is a task of its own, niced by its id; elsewhere the load keeps the process's priority
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOAD_NICE)
    except (AttributeError, OSError):
        pass
    count = device_thread.run(torch.get_num_threads)  # the device thread's, initialised there before any load
    torch.set_num_threads(1)
    device_thread.run(torch.set_num_threads, count)


def on_load_thread() -> bool:
    """Whether the calling thread is the load thread."""
    return _ident is not None and threading.get_ident() == _ident


def run(fn: Callable[..., T], *args, owner: device_thread.Owner | None = None, **kwargs) -> T:
    """``fn(*args, **kwargs)`` on the load thread, after the loads asked before it, its Python deferring to the device
    thread's steps (in turns for ``owner``, default the server's); its result, or its error raised here. A call made on
    the load thread itself runs inline."""
    global _pool
    if on_load_thread():
        return fn(*args, **kwargs)
    with _lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="specviz-load", initializer=_start
            )
    context = contextvars.copy_context()
    return _pool.submit(functools.partial(context.run, device_thread.deferring(owner)(fn), *args, **kwargs)).result()
