"""Devices and memory: where a pair goes, in which dtype, how much memory is free there, and giving it back."""

from __future__ import annotations

import ctypes
import gc
import os
from pathlib import Path

import torch

from specviz.engine.zerogpu import on_zerogpu


def default_device() -> torch.device:
    """CUDA when there is a GPU or on a ZeroGPU Space (its GPU appears only inside @spaces.GPU), else the CPU."""
    return torch.device("cuda" if on_zerogpu() or torch.cuda.is_available() else "cpu")


def dtype_for(device: torch.device) -> torch.dtype:
    # bf16 halves memory traffic on the GPU. On the CPU this is fp32, the form a pair falls back to;
    # the form it runs in is chosen per machine by specviz.pair.precision.cpu_form (bf16 where it pays).
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def cgroup_free_bytes(root: str = "/sys/fs/cgroup") -> int | None:
    """Memory left under this process's cgroup limit (v2, else v1), or None without a limit.

    In a container (a Space, say) the limit is the cgroup's, not the host's memory that
    /proc/meminfo reports.
    """
    for limit, used in (
        ("memory.max", "memory.current"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
    ):
        try:
            cap, now = (Path(root) / limit).read_text().strip(), int((Path(root) / used).read_text().strip())
        except (OSError, ValueError):
            continue
        if cap.isdigit() and int(cap) < 2**60:  # "max", or v1's huge number: no limit
            return max(0, int(cap) - now)
        return None
    return None


def available_memory_bytes(device: torch.device) -> int | None:
    """Free memory where the weights will go, or None when it cannot be told (then nothing is refused)."""
    if device.type == "cpu":
        free = []
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    free.append(int(line.split()[1]) * 1024)
        except (OSError, ValueError, IndexError):
            pass
        if (in_cgroup := cgroup_free_bytes()) is not None:
            free.append(in_cgroup)
        return min(free) if free else None
    if device.type == "cuda" and not on_zerogpu():  # ZeroGPU attaches a GPU only inside @spaces.GPU
        try:
            return torch.cuda.mem_get_info(device)[0]
        except Exception:
            return None
    return None


def free_memory(device: torch.device | str | None = None) -> None:
    """Collect garbage and give cached memory back: CUDA's cached blocks, and on Linux the C
    heap's free pages (after an out-of-memory error, an eviction, or a finished run)."""
    gc.collect()
    dev = torch.device(device) if device is not None else None
    if (dev is None or dev.type == "cuda") and torch.cuda.is_available() and not on_zerogpu():
        torch.cuda.empty_cache()
    if dev is None or dev.type == "cpu":
        _trim_c_heap()


def freeze_long_lived(full: bool = True) -> None:
    """Collect garbage, then leave every object alive now out of later collections (``gc.freeze``).

    A server's heap is mostly what never dies: torch, transformers and the web framework's modules, the loaded
    models, the page. A full collection walks all of it: 0.27 s holding the interpreter lock on a 2-core CPU with
    the English pair loaded, paid after every job (``free_memory``), so each short job of a flood stalled the device
    thread and the server's event loop for that long. Frozen, the same collection takes 1-5 ms. Call it once the
    long-lived objects exist (start-up, after a pair loads); ``thaw`` before letting such objects go.

    ``full``: a full collection first (start-up), else only the young generations (after a pair's load, beside
    other visitors' runs): the full one walked the half million objects a load leaves unfrozen, 0.25-0.27 s holding
    the interpreter lock, one C call that no deferral cuts, while the young collection found every cycle there was
    (after the embedded and English pairs' loads, a full collection of the unfrozen heap then found none).
    """
    gc.collect() if full else gc.collect(1)
    gc.freeze()


def thaw() -> None:
    """Put the frozen objects back under the collector (``gc.unfreeze``), so that a pair being let go is collected
    even where its objects hold each other in cycles; the next ``freeze_long_lived`` freezes what stays."""
    gc.unfreeze()


M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


def one_heap() -> bool:
    """Have every thread allocate from glibc's main heap (``mallopt(M_ARENA_MAX, 1)``); True when set.

    glibc gives each new thread a heap of its own at its first allocation (up to 8 per core). A server's
    jobs run on a pool of worker threads (and torch's own), so memory freed after a job is spread over
    many heaps. Measured with ``python -m specviz.visitors.attack --flood-s 30 --victims 3 --ttl-s 60
    --rounds 2`` (2-core CPU): once the floods' sessions had expired, RSS stayed 23-36 MB above its warm
    start with a heap per thread, 8-15 MB with one (the rest: live objects, Python's own arenas; the
    heap's live bytes grew about 4 MB). Threads that already have a heap keep it, so call this before any
    other thread allocates (``specviz.ui.build_demo`` does, first). Not glibc (macOS, musl): False,
    nothing changed.
    """
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, 1))
    except (OSError, AttributeError):
        return False


KERNEL_CACHES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's own; PyTorch's over oneDNN (ideep)
KERNEL_CACHE_CAPACITY = 64  # kernels each cache keeps (both libraries default to 1,024)


def bound_kernel_caches(capacity: int = KERNEL_CACHE_CAPACITY) -> dict[str, str]:
    """Bound the two caches of CPU matrix-product kernels to ``capacity`` entries each, unless the
    operator set them; returns the settings in force {variable: value}.

    A model's products on a CPU go through oneDNN (bf16 products; fp32 ones on its route,
    ``specviz.pair.kernels``), which builds a kernel for every (weight shape, row count) it meets and
    keeps it: oneDNN's primitive cache and PyTorch's cache over it, 1,024 entries each by default and
    kept for the process's life. Every prompt length makes a new row count for every layer shape of
    both models, so a server's RSS climbed with the lengths its visitors sent and never came down:
    measured on a 2-core CPU with AVX-512 BF16, the English pair in bf16, 100 speculative runs on
    prompts of 100 lengths (20 to 218 tokens) left RSS 528 MB higher with the defaults and 16 MB higher
    with 64 entries each, and a fixed run's speed unchanged (30.1 and 31.3 tokens/s before, 27.0 and
    31.5 after). A decoding loop meets a few dozen (shape, rows) pairs (1 row, gamma + 1, a tree's nodes,
    a batch's rows), so ``capacity`` keeps its kernels while the prompt lengths' are evicted.

    The libraries read these variables once, when the first kernel is built: call this before any
    model runs (``specviz.ui.build_demo`` does, first). An operator's own setting is left as it is.
    """
    for var in KERNEL_CACHES:
        os.environ.setdefault(var, str(capacity))
    return {var: os.environ[var] for var in KERNEL_CACHES}


def _trim_c_heap() -> None:
    # glibc keeps freed tensor memory for reuse, so a server's RSS creeps up run after run
    # (measured: +17 MB over 30 runs of the embedded pair, flat with a trim after each).
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        pass
