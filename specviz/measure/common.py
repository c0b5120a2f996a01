"""What ``bench`` (one sequence) and ``bench --batch-sizes`` share: the prompt sets, transformers'
settings, the timing of one run, the spread of repeated runs and the pooled acceptance figures.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from specviz import metrics, theory
from specviz.pair import ASSETS
from specviz.engine.sampling import Sampling

# "held-out": prompts from files kept out of the embedded pair's training; "grounded": code
# written so its continuation repeats names and lines of the prompt (prompt lookup has something
# to copy), not drawn from any corpus and not held out from anything.
# "english": chat requests held out from the English drafter's distillation.
PROMPT_SETS = {"held-out": "prompts.json", "grounded": "prompts_grounded.json", "english": "prompts_en.json"}
CHAT_SETS = {"english"}  # sets of chat requests: an instruct pair gets them through its chat template


def prompt_set_for(prompt_set: str, pair_name: str) -> str:
    """The set to run: "held-out" means the pair's own held-out prompts (the English chat prompts
    for the English pair, the code prompts for the others); other names are taken as they are."""
    from specviz.pair import ENGLISH

    return "english" if prompt_set == "held-out" and pair_name == ENGLISH else prompt_set


def prompt_token_ids(pair, texts: list[str], prompt_set: str) -> list[list[int]]:
    """The prompts as token ids: chat sets through the chat template of an instruct pair, others as text."""
    from specviz.pair import encode_prompt

    return [encode_prompt(pair, t, chat=prompt_set in CHAT_SETS and pair.instruct) for t in texts]


def benchmark_prompts(count: int, prompt_set: str = "held-out") -> list[str]:
    """The first ``count`` prompts of a set of PROMPT_SETS: "held-out" (assets/prompts.json, held
    out from the embedded pair's training) or "grounded" (assets/prompts_grounded.json, written
    for prompt lookup).

    Raises:
        ValueError: an unknown set.
    """
    if prompt_set not in PROMPT_SETS:
        raise ValueError(f"prompt set must be one of {', '.join(PROMPT_SETS)}, got {prompt_set!r}")
    prompts = json.loads((ASSETS / PROMPT_SETS[prompt_set]).read_text())
    return [p["prompt"] for p in prompts[:count]]


def hf_kwargs(pair, sampling: Sampling, n: int) -> dict:
    """transformers ``generate`` arguments for exactly ``n`` new tokens under ``sampling``."""
    kw = dict(max_new_tokens=n, min_new_tokens=n, pad_token_id=pair.eos_token_id)
    if sampling.greedy:
        kw.update(do_sample=False)
    else:
        kw.update(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    if sampling.repetition_penalty != 1.0:
        kw.update(repetition_penalty=sampling.repetition_penalty)
    return kw


def timed(fn, ids, seed, device) -> tuple[float, object, int]:
    """(seconds, what ``fn`` returned beside its token count, tokens) of one call ``fn(ids, seed)``,
    which returns a Trace or (tokens, anything); the device is synchronised on both sides."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = fn(ids, seed)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if isinstance(result, tuple):
        tokens, trace = result
    else:
        tokens, trace = len(result.output_ids), result
    return seconds, trace, tokens


def spread(values: list[float]) -> dict:
    """Median, quartiles, extremes and count of repeated measurements."""
    qs = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return {
        "median": statistics.median(values),
        "q1": qs[0],
        "q3": qs[2],
        "min": min(values),
        "max": max(values),
        "runs": len(values),
    }


def pooled_acceptance(specs: list) -> dict:
    """alpha, the draft acceptance rate, mean beta and tokens per round pooled over speculative
    traces (sums of their counts, then ``specviz.metrics``)."""
    accepted = sum(t.accepted for t in specs)
    drafted = sum(t.drafted for t in specs)
    return {
        "alpha": metrics.alpha(accepted, sum(t.rejected for t in specs)),
        "draft_acceptance_rate": metrics.draft_acceptance_rate(accepted, drafted),
        "mean_beta": metrics.mean(b for t in specs for b in t.tested_betas),
        "mean_tokens_per_round": metrics.tokens_per_round(
            sum(len(t.output_ids) for t in specs), sum(len(t.rounds) for t in specs)
        ),
    }


NOISE_NOTE = (
    "Single runs are noisy, as the page says of its own: the same command's speedup has moved by several percent "
    "between runs on an idle machine and by far more on a loaded one; compare the medians of repeated runs "
    "(--repeats, and the command run again) with nothing else running."
)


def run_command(args, work, formatter) -> int:
    """Run a benchmark for the command line: print its report (JSON with ``--json``; else the table,
    then how long it ran and ``NOISE_NOTE``) and return 0, or print the error and return 2."""
    import sys

    from specviz.pair import PairError

    started = time.monotonic()
    try:
        sampling = Sampling(
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, repetition_penalty=args.repetition_penalty
        )
        report = work(args, sampling)
    except (PairError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(formatter(report))
        print(
            f"Ran in {(time.monotonic() - started) / 60:.1f} min (prompts x repeats x methods, each decoding "
            f"--max-new-tokens). {NOISE_NOTE}"
        )
    return 0


def predictions(alpha: float | None, gamma: int, c: float | None, v: float | None, schedule: str, kind: str) -> dict:
    """What Leviathan et al. 2023 predict from the measured alpha, c and v: tokens per round (Eq. 1),
    the speedup (Thm 3.8) and the speedup with a verify pass costing v target steps
    (E[tokens per round] / (gamma c + v)). All None unless every round drafts gamma with a model
    (a constant schedule, not prompt lookup) and alpha and c are known."""
    ok = schedule == "constant" and kind not in metrics.PASSLESS_DRAFTERS and alpha is not None and c is not None
    return {
        "predicted_tokens_per_round": theory.expected_tokens_per_round(alpha, gamma) if ok else None,
        "predicted_speedup": theory.predicted_speedup(alpha, gamma, c) if ok else None,
        "predicted_speedup_verify": theory.predicted_speedup_with_verify_cost(alpha, gamma, c, v)
        if ok and v is not None
        else None,
    }
