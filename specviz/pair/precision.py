"""The form a pair's models run in: the dtype of their weights and passes, chosen per machine, and why.

Speculative decoding pays off only when a target pass over the gamma + 1 verified tokens costs
about one step (the verify cost v = pass over n tokens / one step stays near 1; Leviathan et al.
2023, Thm 3.8 assumes v = 1). On a CPU that depends on the dtype: fp32 matrix products with a
handful of rows cost two to three times one row's (measured on an AMD EPYC, SmolLM2-135M: v 1.5-2.0
for n = 2..17), while bf16 products on a CPU with bf16 instructions (AVX-512 BF16, AMX, Arm's
BF16) cost about one row's (v 0.97-1.34) and the bf16 step is faster than the fp32 one too.

The choice, per device:
- CUDA: bf16 (``specviz.pair.memory.dtype_for``; halves memory traffic).
- CPU: bf16 where the CPU reports bf16 instructions (``/proc/cpuinfo`` flags ``avx512_bf16`` or
  ``amx_bf16``, Arm's ``bf16`` feature) and a short timing confirms it: a product of 1 and of 9 rows
  with a 576 x 16,384 matrix (the shape of a small model's output layer, cut) in both dtypes,
  median of a few calls each, well under a second; bf16 is kept if its 9-row product is faster
  than fp32's and its 1-row product at most 1.2x fp32's. Else fp32, and the reason says so. The
  result is cached per machine (CPU model, flags, torch version, threads) in the specviz cache.
- A target under MIN_AUTO_PARAMS parameters (the embedded pair's 5 M) keeps fp32 on the CPU: its passes
  are bound by per-call overhead, not by matrix products, and fp32 keeps greedy equality exact in practice.
- ``SPECVIZ_CPU_DTYPE=fp32|bf16|auto`` (default auto) overrides the choice on the CPU, for any size.

Only weights and activations take the form: the engine upcasts logits to float32 before any
softmax (``Sampling.probs``), so acceptance and sampling are exact given the logits a pass gave.
Greedy output in bf16 equals the target's own greedy decoding in bf16 except at near-ties, where
the top-2 logit gap is below bf16's rounding difference between passes of different shapes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specviz.engine.gqa import use_shared_kv_heads

CPU_DTYPE_ENV = "SPECVIZ_CPU_DTYPE"
KERNELS_ENV = "SPECVIZ_CPU_KERNELS"  # auto (default) | on | off: routed fp32 products (specviz.pair.kernels)
CHOICES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86's two; Arm's Features line says "bf16"
PROBE_SHAPE = (576, 16384)  # in, out features of the timed product
PROBE_ROWS = (1, 9)
PROBE_REPEATS = 5
MAX_STEP_RATIO = 1.2  # bf16's 1-row product may cost at most this many fp32 ones
MIN_AUTO_PARAMS = 50_000_000  # smaller targets keep fp32 unless SPECVIZ_CPU_DTYPE says otherwise


@dataclass(frozen=True)
class Form:
    """A dtype and the sentence that says why this machine runs it.

    Attributes:
        dtype: the weights' and activations' dtype (logits are upcast to float32 before softmax).
        reason: one plain sentence, shown on the page, in the trace's settings and in bench's header.
        routed: whether ``apply_form`` routes an fp32 model's products (``specviz.pair.kernels``): a
            pair's drafter and target alike, unless the target is small enough to be bound by
            per-pass overhead (MIN_AUTO_PARAMS).
    """

    dtype: torch.dtype
    reason: str
    routed: bool = True  # fp32 products routed per row count (specviz.pair.kernels); False for small targets

    @property
    def name(self) -> str:
        """"bf16", "fp32" or the dtype's torch name."""
        return {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}.get(
            self.dtype, str(self.dtype).removeprefix("torch.")
        )


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (x86 ``flags``, Arm ``Features``); empty where unreadable."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        text = cpuinfo if cpuinfo is not None else Path("/proc/cpuinfo").read_text(errors="replace")
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "CPU part"):
                return value.strip()[:80]
    except OSError:
        pass
    return (platform.processor() or platform.machine())[:80]


def bf16_instructions(flags: set[str]) -> list[str]:
    """The bf16 instruction sets among ``flags`` (sorted)."""
    return sorted(f for f in BF16_FLAGS if f in flags)


def torch_capability() -> str:
    """The vector instruction set torch's CPU kernels run at ("AVX2", "AVX512", "DEFAULT", ...; Arm's "SVE256" ...).

    ``ATEN_CPU_CAPABILITY=avx2`` lowers it on a CPU that has more (and ``ONEDNN_MAX_CPU_ISA`` lowers
    oneDNN's), which is how a CPU without bf16 instructions is imitated on one that has them.
    """
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        return "unknown"


def usable_bf16(instructions: list[str], capability: str) -> list[str]:
    """The bf16 instruction sets torch can use: on x86 they are AVX-512 instructions, used only when torch
    runs at an AVX-512 capability; elsewhere (Arm) the flags stand as reported."""
    x86 = [i for i in instructions if i in ("avx512_bf16", "amx_bf16")]
    if x86 and not capability.upper().startswith("AVX512"):
        return [i for i in instructions if i not in x86]
    return instructions


def requested() -> str:
    """SPECVIZ_CPU_DTYPE: "fp32", "bf16" or "auto" (default).

    Raises:
        ValueError: any other value.
    """
    raw = os.environ.get(CPU_DTYPE_ENV, "").strip().lower() or "auto"
    if raw not in (*CHOICES, "auto"):
        raise ValueError(f"{CPU_DTYPE_ENV} must be fp32, bf16 or auto, got {raw[:20]!r}")
    return raw


def probe(repeats: int = PROBE_REPEATS) -> dict[str, dict[int, float]]:
    """Median milliseconds of ``x @ W.T`` for 1 and 9 rows of x, W of PROBE_SHAPE, in fp32 and bf16.

    Returns:
        {"fp32": {1: ms, 9: ms}, "bf16": {1: ms, 9: ms}}.
    """
    n_in, n_out = PROBE_SHAPE
    gen = torch.Generator().manual_seed(0)
    w32 = torch.randn(n_out, n_in, generator=gen) * 0.05
    out: dict[str, dict[int, float]] = {}
    with torch.inference_mode():
        for name, dtype in CHOICES.items():
            w = w32.to(dtype)
            out[name] = {}
            for rows in PROBE_ROWS:
                x = torch.randn(rows, n_in, generator=gen).to(dtype)
                torch.nn.functional.linear(x, w)  # first call: kernel selection, packing
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    torch.nn.functional.linear(x, w)
                    times.append((time.perf_counter() - t0) * 1000)
                out[name][rows] = statistics.median(times)
    return out


def choose_form(
    instructions: list[str], timing: dict[str, dict[int, float]] | None, capability: str | None = None
) -> Form:
    """The CPU's form from its bf16 instruction sets, the capability torch runs at (``torch_capability``;
    None: not asked) and ``probe``'s timing (None: not timed)."""
    if capability is not None and instructions and not usable_bf16(instructions, capability):
        return Form(
            torch.float32,
            f"fp32: this CPU reports bf16 instructions ({', '.join(instructions)}) but torch runs at "
            f"{capability[:20]} here (ATEN_CPU_CAPABILITY), so bf16 products would be emulated and slower",
        )
    if not instructions:
        return Form(
            torch.float32,
            "fp32: this CPU reports no bf16 instructions (avx512_bf16, amx_bf16 or Arm bf16), "
            "so bf16 products would be emulated and slower",
        )
    if timing is None:
        return Form(torch.bfloat16, f"bf16: this CPU has bf16 instructions ({', '.join(instructions)})")
    f32, b16 = timing["fp32"], timing["bf16"]
    nine = f"{b16[9]:.1f} ms against fp32's {f32[9]:.1f} ms"
    one = f"{b16[1]:.1f} against {f32[1]:.1f} ms"
    if b16[9] < f32[9] and b16[1] <= MAX_STEP_RATIO * f32[1]:
        return Form(
            torch.bfloat16,
            f"bf16: this CPU has bf16 instructions ({', '.join(instructions)}) and a 9-row product "
            f"of the output layer's shape took {nine} (1 row: {one}), so a verify pass costs about one step",
        )
    return Form(
        torch.float32,
        f"fp32: this CPU has bf16 instructions ({', '.join(instructions)}) but timed at load a 9-row "
        f"bf16 product took {nine} (1 row: {one}), so fp32 stays the faster form",
    )


def _machine_key(flags: set[str]) -> str:
    text = json.dumps(
        [
            cpu_model(),
            sorted(flags),
            torch.__version__,
            torch.get_num_threads(),
            platform.machine(),
            torch_capability(),
            os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
            os.environ.get("MKL_ENABLE_INSTRUCTIONS", ""),
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def machine_key() -> str:
    """A short hash naming this machine's CPU, flags, torch version, threads and instruction-set limits (cache keys)."""
    return _machine_key(cpu_flags())


def _cache_file() -> Path:
    from specviz.pair.settings import cache_dir

    return cache_dir() / "cpu_form.json"


def _cached_timing(key: str) -> dict | None:
    try:
        data = json.loads(_cache_file().read_text())
        entry = data.get(key) if isinstance(data, dict) else None
        if isinstance(entry, dict):
            return {name: {int(r): float(ms) for r, ms in entry[name].items()} for name in CHOICES}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def _store_timing(key: str, timing: dict) -> None:
    path = _cache_file()
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
        data = data if isinstance(data, dict) else {}
        data = dict(list(data.items())[-15:])  # a few machines at most (a shared home directory)
        data[key] = {name: {str(r): ms for r, ms in rows.items()} for name, rows in timing.items()}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except (OSError, ValueError):
        pass  # a read-only home: time again next process


@functools.lru_cache(maxsize=None)
def _auto_cpu_form() -> Form:
    flags = cpu_flags()
    instructions = bf16_instructions(flags)
    capability = torch_capability()
    if not usable_bf16(instructions, capability):
        return choose_form(instructions, None, capability)
    key = _machine_key(flags)
    timing = _cached_timing(key)
    if timing is None:
        timing = probe()
        _store_timing(key, timing)
    return choose_form(instructions, timing, capability)


def cpu_form(target_params: int | None = None) -> Form:
    """The form of a pair on this machine's CPU: SPECVIZ_CPU_DTYPE if set to fp32 or bf16, else
    fp32 for a target under MIN_AUTO_PARAMS parameters, else the automatic choice (bf16
    instructions confirmed by ``probe``; cached per process and per machine).

    Args:
        target_params: the target's parameter count, if known.

    Raises:
        ValueError: SPECVIZ_CPU_DTYPE is neither fp32, bf16 nor auto.
    """
    choice = requested()
    small = target_params is not None and target_params < MIN_AUTO_PARAMS
    if choice != "auto":
        return Form(CHOICES[choice], f"{choice}: set by {CPU_DTYPE_ENV}={choice}", routed=not small)
    if small:
        return Form(
            torch.float32,
            f"fp32: a target this small ({target_params / 1e6:.1f} M parameters) is bound by "
            "per-pass overhead, not by its matrix products, so bf16 would gain nothing",
            routed=False,
        )
    return _auto_cpu_form()


def form_for(device: torch.device | str, target_params: int | None = None) -> Form:
    """The form of a pair on ``device``: ``cpu_form(target_params)`` on the CPU, bf16 on CUDA.

    Raises:
        ValueError: as ``cpu_form``.
    """
    from specviz.pair.memory import dtype_for

    device = torch.device(device)
    if device.type == "cpu":
        return cpu_form(target_params)
    dtype = dtype_for(device)
    return Form(dtype, f"{Form(dtype, '').name}: on {device.type}, bf16 halves the weights' memory traffic")


def model_form(model) -> Form | None:
    """The form a loaded model was given (``apply_form``), or None for a model loaded another way."""
    return getattr(model, "specviz_form", None)


def apply_form(model, form: Form, kernels: bool = True, timing: Callable | None = None):
    """Cast ``model`` to ``form.dtype`` (in place) and remember the form on it; on a CPU, let its masked
    passes share the key/value heads (``specviz.engine.gqa``) and, in fp32, give its linear layers the
    product kernels timed fastest per row count (``specviz.pair.kernels.choose``; ``kernels=False``
    or ``SPECVIZ_CPU_KERNELS=off`` keeps transformers' own), whose sentence is added to the form's
    reason. ``timing``: runs that choice, ``timing(fn, *args)``, where the passes it times will run (a server's
    device thread's ``run``); None: here. Returns the model."""
    if next(model.parameters()).dtype != form.dtype:
        model.to(form.dtype)
    if kernels and form.dtype == torch.float32 and _route_kernels(form):
        from specviz.pair.kernels import choose

        routed = choose(model, machine_key()) if timing is None else timing(choose, model, machine_key())
        if routed is not None:
            form = Form(form.dtype, f"{form.reason}; {routed.summary}", form.routed)
            model.specviz_kernels = routed
    model.specviz_form = form
    use_shared_kv_heads(model)
    return model


def _route_kernels(form: Form) -> bool:
    """SPECVIZ_CPU_KERNELS: "off" never routes, "on" always, "auto" (default) as ``form.routed`` says
    (not for a pair whose target is bound by per-pass overhead rather than by its products).

    Raises:
        ValueError: any other value.
    """
    raw = os.environ.get(KERNELS_ENV, "").strip().lower() or "auto"
    if raw not in ("auto", "on", "off"):
        raise ValueError(f"{KERNELS_ENV} must be auto, on or off, got {raw[:20]!r}")
    if raw != "auto":
        return raw == "on"
    return form.routed


def form_settings(model) -> dict:
    """{"dtype_reason": reason} for a trace's settings, or {} when the model's form is unknown."""
    form = model_form(model)
    return {"dtype_reason": form.reason} if form is not None else {}
