"""The JSON API (/run): one speculative run and its baseline, returned as numbers and traces."""

from __future__ import annotations

from specviz.pair import EMBEDDED
from specviz.speedup import estimate
from specviz.ui.device import run_on_device
from specviz.ui.pairs import ensure_pair
from specviz.ui.request import RunRequest
from specviz.views import summary


def run_api(pair_name: str = EMBEDDED, prompt: str = "def is_prime(n):", gamma: int = 4, temperature: float = 0.7, top_k: int = 40,
            top_p: float = 0.95, max_new_tokens: int = 128, seed: int = 0, chat: bool = True, drafter_kind: str = "model",
            gamma_schedule: str = "constant", repetition_penalty: float = 1.0) -> dict:
    """Run speculative decoding and its autoregressive baseline (interleaved) and return the results as JSON.

    Arguments are the page's controls: a preset pair name, the prompt, gamma (1-16), temperature
    (0 greedy, or 0.01-2), top-k (0 off), top-p (0-1], max new tokens (1-256), seed (0 to 2^63 - 1),
    whether instruct pairs get their chat template, the drafter kind ("model", "ngram" for prompt
    lookup, "early-exit"), the gamma schedule ("constant", "heuristic", "confidence", "optimal") and the
    repetition penalty (1 off, up to 2; applied to q and p alike).

    Returns a dict: "summary" (the numbers the page shows, each named with its denominator:
    draft_acceptance_rate, alpha, mean_beta, mean_tokens_per_round, tokens/s of both runs,
    speedup with speedup_low and speedup_high (the middle half of the run's stretches),
    cost_coefficient, verify_cost, predicted speedups), "status", and "trace" and "baseline"
    (every round, as ``specviz.Trace.to_dict``; ``Trace.from_dict`` reads them back).
    Errors come back as messages naming the control and its allowed range.
    """
    ensure_pair(pair_name, "", "", lambda *args, **kwargs: None)
    req = RunRequest.checked(pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat, "", "",
                             drafter_kind, gamma_schedule, repetition_penalty)
    final = None
    for final in run_on_device(req):
        pass
    _, spec, baseline, _title, done = final
    numbers = summary(spec, baseline)
    est = estimate(spec, baseline)
    numbers.update(speedup_low=est.low if est else None, speedup_high=est.high if est else None)
    return {"summary": numbers, "status": done, "trace": spec.to_dict(), "baseline": baseline.to_dict()}
