"""How many tokens the long jobs (Compare drafters, Batch, the gamma sweep) decode per run on a CPU,
so that each finishes within its time cap on a 2-core machine instead of ending at it.

The estimate counts a job's work in target steps per token and prices a step pessimistically:

- CPU_STEP_S: one target step of the English pair (SmolLM2-135M, fp32) on a 2-core CPU without bf16
  instructions. The prepared recordings, made on two busy cores, measured 70-120 ms (median steps of
  their baselines: 89, 70 and 118 ms); a class's slow laptop was about twice as slow (issue 38), so 250 ms.
- SPEC_STEPS: a speculative run's time per token in target steps at gamma 3-4 on such a CPU, where the
  verify pass costs 1.5-2 steps: 1.3 (the recordings: 15.0 s against 11.7 s for 128 tokens, 5.2 against 4.1 s).
- ROW_STEPS: what each further row of a batch adds to a step on a CPU (a batched pass is not free there): 0.5.

A job then runs (steps per token) x tokens x CPU_STEP_S seconds, and gets the tokens that fill
FILL of its cap. On a GPU the jobs take the page's max new tokens as they are.
"""

from __future__ import annotations

import dataclasses

from specviz.measure.throughput import batch_sizes_up_to

CPU_STEP_S = 0.25
SPEC_STEPS = 1.3
ROW_STEPS = 0.5
FILL = 0.8  # the share of a cap the estimate may use: the rest is for loading drafters, prefill and noise
MIN_TOKENS = 8  # fewer measure nothing worth showing


def compare_steps(kinds: int) -> float:
    """Target steps per token of Compare: each kind's speculative run and its own baseline."""
    return kinds * (SPEC_STEPS + 1)


def sweep_steps(gammas: int) -> float:
    """Target steps per token of the sweep: the first baseline, then each gamma's run and its baseline."""
    return 1 + gammas * (SPEC_STEPS + 1)


def batch_steps(batch_size: int, repeats: int = 2) -> float:
    """Target steps per token (per row) of the Batch tab: each measured batch size, ``repeats`` times,
    speculative and autoregressive, a step of b rows costing 1 + ROW_STEPS (b - 1)."""
    return repeats * sum((1 + ROW_STEPS * (b - 1)) * (SPEC_STEPS + 1) for b in batch_sizes_up_to(batch_size))


def cpu_tokens(steps_per_token: float, cap_s: float, asked: int) -> int:
    """The tokens per run a job of ``steps_per_token`` decodes on a CPU within ``cap_s`` seconds: at
    most ``asked`` (the page's max new tokens), at least MIN_TOKENS."""
    fits = int(FILL * cap_s / (CPU_STEP_S * steps_per_token))
    return min(asked, max(MIN_TOKENS, fits))


def sized_note(tokens: int, asked: int, cap_s: float) -> str:
    """What a job says when it decodes fewer tokens than asked (empty when it does not)."""
    if tokens >= asked:
        return ""
    return (f" On this CPU each run decodes {tokens} tokens (not {asked}), so it all fits in its {cap_s:.0f} s: "
            "Generate decodes as many as asked.")


def on_cpu(pair) -> bool:
    """Whether ``pair`` (a loaded ``specviz.pair.Pair``; None when unknown) runs on the CPU."""
    device = getattr(pair, "device", None)
    return getattr(device, "type", None) == "cpu"


def sized(req, pair, steps_per_token: float, cap_s: float):
    """(``req`` with the tokens its job decodes here, the note saying so): on a CPU ``cpu_tokens``, elsewhere as
    asked."""
    if not on_cpu(pair):
        return req, ""
    tokens = cpu_tokens(steps_per_token, cap_s, req.max_new_tokens)
    return dataclasses.replace(req, max_new_tokens=tokens), sized_note(tokens, req.max_new_tokens, cap_s)


# ---- a Generate or /run job's size, known before it starts (the device queue's order, specviz.ui.running.share) ----

AUTO_NODES = 32  # the auto tree picks among trees of at most this many nodes (specviz.ui.tabs.tree.resolve_tree)


def drafted_per_round(gamma: int, tree: str = "chain") -> int:
    """Tokens a round drafts and verifies: ``gamma`` for the chain, the tree's nodes for a token tree."""
    from specviz.ui.tabs.tree import AUTO, tree_spec

    if tree == AUTO:
        return AUTO_NODES
    spec = tree_spec(tree) if tree != "chain" else None
    if spec is None:
        return gamma
    if spec.shape:
        nodes, width = 0, 1
        for branching in spec.shape:
            width *= branching
            nodes += width
        return nodes
    return spec.budget or gamma


def calibration_seconds(tree: str = "chain") -> float:
    """The device seconds a job of token tree ``tree`` may spend calibrating before its runs: the auto tree's
    calibration cap (``specviz.ui.guard.limits.CALIBRATION_SECONDS_MAX``, the same seconds ``RunRequest.duration``
    asks of ZeroGPU), 0 for any other tree.

    The queue sizes a job from its controls before its pair loads (and on ZeroGPU the calibration is cached
    in a GPU worker, not here), so it cannot tell whether this pair, drafter and sampling setting has a
    calibration cached: every auto job is priced with one. A cached one is thereby priced long, never short."""
    from specviz.ui.guard.limits import CALIBRATION_SECONDS_MAX
    from specviz.ui.tabs.tree import AUTO

    return CALIBRATION_SECONDS_MAX if tree == AUTO else 0.0


# A job's start, in target steps of the English pair: its two prefills (the speculative run's and the baseline's) and
# the page's updates. Measured on a 2-core CPU with AVX-512 BF16: a 1-token Generate of the English pair held the device
# 0.6 s (0.4 s of passes, 0.2 s of the page's views), about 15 of its steps.
START_STEPS = 10
# The step price of a preset, relative to the English pair's target (CPU_STEP_S): its target's parameters over the
# English target's, at least PAIR_SCALE_MIN (a tiny pair's step is mostly Python: the embedded pair's 16-token run
# took 0.19 s of passes against 0.04 s a token for the English target's steps alone, about 0.3 of them a token).
PAIR_SCALE_MIN = 0.25


def pair_scale(pair_name=None, custom_drafter="", custom_target="") -> float:
    """A job's step price relative to the English pair's (``run_seconds``' ``scale``), from its controls as sent: a
    preset's target parameters over the English target's (at least PAIR_SCALE_MIN); 1.0 for custom ids (their size is
    read only when they load) and for a name that is no preset."""
    from specviz.pair.catalogue import ENGLISH, PRESETS

    preset = PRESETS.get(pair_name) if isinstance(pair_name, str) else None
    custom = any(isinstance(c, str) and c.strip() for c in (custom_drafter, custom_target))
    if custom or preset is None:
        return 1.0
    return max(PAIR_SCALE_MIN, preset.target_params / PRESETS[ENGLISH].target_params)


def run_seconds(max_new_tokens: int, gamma: int = 4, tree: str = "chain", scale: float = 1.0) -> float:
    """Expected device seconds of a Generate or /run job on a CPU, priced as the long jobs are: per token its
    baseline's step and the speculative run's SPEC_STEPS (measured at gamma 3-4), that part growing with the tokens a
    round drafts past 4 (a longer chain or a tree), plus START_STEPS for its prefills and page, all at CPU_STEP_S times
    ``scale`` (the pair's step price, ``pair_scale``); plus the auto tree's calibration (``calibration_seconds``). A
    size to order jobs by, not a promise. The queue's order (``specviz.ui.running.share.place``), the rule for giving
    way (``specviz.ui.running.share.Held``) and the device thread's order of short jobs' steps
    (``specviz.ui.running.share.short_size``) read it, through ``specviz.ui.running.share.sized``."""
    drafted = drafted_per_round(gamma, tree)
    steps = max_new_tokens * (1 + SPEC_STEPS * max(1.0, drafted / 4)) + START_STEPS
    return steps * CPU_STEP_S * scale + calibration_seconds(tree)
