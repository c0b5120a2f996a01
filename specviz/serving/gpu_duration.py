"""How long a ZeroGPU call may hold the GPU, sized from the pair and the requested work.

``generate_duration`` and ``sweep_duration`` are passed to ``specviz.serving.gpu.gpu_task(duration=...)``:
they receive the handler's arguments and return whole seconds, clamped by ``clamp_duration``.
The estimate bounds the worst case, where every draft is rejected.
"""

from __future__ import annotations

from collections.abc import Iterable

from specviz.serving.gpu import clamp_duration
from specviz.pair import EMBEDDED, PRESETS, PairError, loaded_pair

# Time per forward pass of a model with P parameters, one sequence, eager transformers, bf16 on a
# data-centre GPU, as a rough upper estimate: a per-pass cost of the engine's own steps, a launch cost
# that grows with depth (the 24-48 layers of models from 100M parameters up take about 0.5 ms each;
# smaller models have fewer layers, so it shrinks with the square root of the size below 100M), and
# reading the weights (2 bytes per parameter at about 1 TB/s, doubled for margin).
FORWARD_STEP_S = 0.002
FORWARD_LAUNCH_S = 0.023
FORWARD_PER_BILLION_S = 0.004
# Attaching the GPU, the prompt's prefill and the first kernels' compilation.
OVERHEAD_S = 5.0
# A worker's first run captures its CUDA graphs inside the call (``specviz.engine.graphs``: once per worker
# process, kept while it lives): a Generate captures the target twice (its run and its baseline's) and the
# drafter once; measured 3.4 s for a target and its drafter on an H100 (the English pair), so about 6 s.
GRAPH_CAPTURE_S = 6.0
# A custom pair's size is unknown until it is loaded: assume a large one.
UNKNOWN_PARAMS = (1_000_000_000, 8_000_000_000)


def forward_seconds(params: int) -> float:
    """Estimated seconds for one forward pass of a model with ``params`` parameters."""
    return FORWARD_STEP_S + FORWARD_LAUNCH_S * min(1.0, (params / 1e8) ** 0.5) + FORWARD_PER_BILLION_S * params / 1e9


def pair_params(
    pair_name: str | None, custom_drafter: str | None = "", custom_target: str | None = ""
) -> tuple[int, int]:
    """(drafter, target) parameter counts for sizing a GPU call.

    A preset's from the catalogue; a custom pair's from the loaded models when it is resident
    (the duration is computed in the main process, where the pair was loaded), else a large pair's.
    """
    drafter, target = (custom_drafter or "").strip(), (custom_target or "").strip()
    if drafter or target:
        try:
            pair = loaded_pair(drafter=drafter, target=target) if drafter and target else None
        except PairError:
            pair = None
        return pair.param_counts if pair is not None else UNKNOWN_PARAMS
    preset = PRESETS.get(pair_name or EMBEDDED)
    return (preset.drafter_params, preset.target_params) if preset else UNKNOWN_PARAMS


def estimate_seconds(
    pair_name: str | None,
    max_new_tokens: int,
    gammas: int | Iterable[int] = 4,
    baseline_runs: int = 1,
    params: tuple[int, int] | None = None,
) -> float:
    """Seconds of GPU time for speculative runs at each gamma plus autoregressive baseline runs.

    Bounded for the worst case, where every draft is rejected: each round then costs gamma
    drafter passes and one target pass and emits one token. ``gammas`` is one gamma or several
    (a sweep); each runs once with ``max_new_tokens``. ``params`` overrides the pair's sizes.
    """
    d, t = params if params is not None else pair_params(pair_name)
    td, tt = forward_seconds(d), forward_seconds(t)
    n = max(1, int(max_new_tokens))
    gammas = [gammas] if isinstance(gammas, int) else list(gammas)
    speculative = sum(n * (max(1, int(g)) * td + tt) for g in gammas)
    return OVERHEAD_S + GRAPH_CAPTURE_S + speculative + max(0, baseline_runs) * n * tt


def generate_duration(
    pair_name=None,
    prompt=None,
    gamma=4,
    temperature=None,
    top_k=None,
    top_p=None,
    max_new_tokens=128,
    seed=None,
    chat=None,
    custom_drafter="",
    custom_target="",
    *rest,
    **kwargs,
) -> int:
    """``duration`` for a handler taking the /generate endpoint's inputs, in its order.

    pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, then optionally
    chat, custom_drafter, custom_target (a custom pair is sized by its loaded models); further
    arguments are ignored. One speculative run at ``gamma`` and one autoregressive baseline of
    ``max_new_tokens`` tokens. Malformed values (the handler rejects them itself) count as the
    largest request.
    """
    try:
        g, n = int(gamma), int(max_new_tokens)
    except (TypeError, ValueError):
        g, n = 16, 256
    params = pair_params(pair_name, _text(custom_drafter), _text(custom_target))
    return clamp_duration(estimate_seconds(pair_name, n, g, baseline_runs=1, params=params))


def _text(value) -> str:
    return value if isinstance(value, str) else ""


def sweep_duration(
    pair_name: str | None,
    gammas: Iterable[int],
    max_new_tokens: int,
    baseline_runs: int = 1,
    custom_drafter: str | None = "",
    custom_target: str | None = "",
) -> int:
    """``duration`` for a sweep: one speculative run per gamma, plus the baseline runs."""
    params = pair_params(pair_name, custom_drafter, custom_target)
    return clamp_duration(estimate_seconds(pair_name, max_new_tokens, gammas, baseline_runs, params=params))
