"""GPU work on Hugging Face ZeroGPU Spaces, and the same code everywhere else.

On a ZeroGPU Space (the platform sets ``SPACES_ZERO_GPU`` and preinstalls the ``spaces``
package) a function decorated with ``@gpu_task(duration=...)`` runs under
``spaces.GPU(duration=...)``: a GPU is attached for that call only, for at most ``duration``
seconds. Anywhere else the function's work runs on the process's device thread
(``specviz.serving.device_thread``: one thread for every model pass, a streaming function's steps
taken there one at a time), and ``spaces`` is never imported.

What the ZeroGPU documentation asks of the app, and where specviz does it:

- ``import spaces`` before anything initialises CUDA: the first lines of ``app.py``.
- Models are moved to ``"cuda"`` at start-up, outside decorated functions (CUDA is emulated
  there and real inside a decorated call): ``specviz.pair.preload()`` before ``launch()``;
  ``specviz.pair.default_device()`` answers "cuda" on ZeroGPU. When the app launches, ZeroGPU
  packs every tensor on "cuda" and moves them to the real GPU in each worker it forks.
- A decorated call runs in a forked worker process: its arguments and results (or yielded
  values) are pickled, so pass the pair's name, not the Pair, and return strings, figures and
  plain data. What it loads or changes stays in that worker; a pair loaded in the main process
  after a worker was forked is missing there (``specviz.pair.loaded_pair`` returns None; loading
  it inside works but repeats in every new worker). Raise ``gr.Error`` inside the call: other
  exceptions reach the visitor only as "ZeroGPU worker error".
- ``duration`` is the most a call may hold the GPU; a shorter one gets a visitor through the
  queue sooner, and a call that runs past it is stopped. ``specviz.serving.gpu_duration`` sizes it to
  the requested work.

Whether this is a ZeroGPU Space is read in ``specviz.engine.zerogpu`` (re-exported here). This module
imports neither torch, ``spaces`` (at import time) nor ``specviz.pair``.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable

from specviz.serving import device_thread
from specviz.engine.zerogpu import ZEROGPU_ENV, on_zerogpu

__all__ = ["ZEROGPU_ENV", "on_zerogpu", "MAX_DURATION_ENV", "DEFAULT_MAX_DURATION_S", "MIN_DURATION_S", "max_duration",
           "clamp_duration", "gpu_task"]

MAX_DURATION_ENV = "SPECVIZ_GPU_MAX_DURATION"
DEFAULT_MAX_DURATION_S = 120  # ZeroGPU's per-call ceiling for most visitors; longer calls wait longer in its queue
MIN_DURATION_S = 10

def max_duration() -> int:
    """The longest GPU call requested, in seconds (SPECVIZ_GPU_MAX_DURATION, default 120)."""
    raw = os.environ.get(MAX_DURATION_ENV, "").strip()
    try:
        return max(MIN_DURATION_S, int(float(raw))) if raw else DEFAULT_MAX_DURATION_S
    except ValueError:
        return DEFAULT_MAX_DURATION_S


def clamp_duration(seconds: float) -> int:
    """Whole seconds between MIN_DURATION_S and ``max_duration()``."""
    return int(min(max_duration(), max(MIN_DURATION_S, -(-seconds // 1))))


def _without_owner(fn: Callable) -> Callable:
    """``fn`` taking (and ignoring) the keyword ``device_owner``, as ``device_thread.steps`` does."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def streamed(*args, device_owner=None, **kwargs):
            yield from fn(*args, **kwargs)

        return streamed

    @functools.wraps(fn)
    def called(*args, device_owner=None, **kwargs):
        return fn(*args, **kwargs)

    return called


def gpu_task(fn: Callable | None = None, *, duration: int | Callable[..., float] | None = None):
    """Run ``fn`` with a GPU attached on ZeroGPU (in a forked worker); anywhere else on the device thread
    (``specviz.serving.device_thread.steps``).

    Use as ``@gpu_task`` or ``@gpu_task(duration=60)`` or ``@gpu_task(duration=generate_duration)``.
    A callable duration receives the same arguments as ``fn`` and returns seconds; it is clamped
    to ``[MIN_DURATION_S, max_duration()]``. Generator functions (streaming handlers) work too. The result
    takes the keyword ``device_owner`` (``specviz.serving.device_thread.Owner``: whose turn its steps take on
    the device thread); on ZeroGPU, where each call has a GPU of its own, it is dropped.
    """

    def decorate(f: Callable) -> Callable:
        if not on_zerogpu():
            return device_thread.steps(f)
        import spaces  # preinstalled on ZeroGPU Spaces; app.py imported it before torch touched CUDA

        if callable(duration):
            size = duration

            @functools.wraps(size)
            def clamped(*args, **kwargs):
                return clamp_duration(size(*args, **kwargs))

            on_gpu = spaces.GPU(duration=clamped)(f)
        else:
            on_gpu = spaces.GPU(duration=clamp_duration(duration) if duration is not None else None)(f)
        return _without_owner(on_gpu)

    return decorate(fn) if fn is not None else decorate
