"""The JSON API (/run): one speculative run and its baseline, returned as numbers and traces."""

from __future__ import annotations

import gradio as gr

from specviz.pair import default_pair
from specviz.serving.gpu import on_zerogpu
from specviz.ui.running import listening, share
from specviz.ui.page import state
from specviz.ui.guard.checks import mistake
from specviz.ui.running.device import run_on_device
from specviz.ui.running.pairs import ensure_pair
from specviz.ui.guard.request import RunRequest
from specviz.views import summary

GONE = (
    f"Nobody read this job's results (its client hung up, or opened no result stream within {listening.GRACE_S:.0f} s "
    "of joining the queue): the run stopped."
)


def run_api(
    pair_name: str = default_pair(),
    prompt: str = "def is_prime(n):",
    gamma: int = 4,
    temperature: float = 0.7,
    top_k: int = 40,
    top_p: float = 0.9,
    max_new_tokens: int = 128,
    seed: int = 0,
    chat: bool = True,
    drafter_kind: str = "model",
    gamma_schedule: str = "constant",
    repetition_penalty: float = 1.0,
    tree: str = "chain",
    request: gr.Request = None,
) -> dict:
    """Run speculative decoding and its autoregressive baseline (interleaved) and return the results as JSON.

    Arguments are the page's controls: a preset pair name, the prompt, gamma (1-16), temperature
    (0 greedy, or 0.01-2), top-k (0 off), top-p (0-1], max new tokens (1-256), seed (0 to 2^63 - 1),
    whether instruct pairs get their chat template, the drafter kind ("model", "ngram" for prompt
    lookup, "early-exit"), the gamma schedule ("constant", "heuristic", "confidence", "optimal") and the
    repetition penalty (1 off, up to 2; applied to q and p alike), and the token tree (one of the page's
    choices, such as "tree 3-2-2-1 (33 nodes)" or "dynamic tree, 16 nodes"; "chain" drafts gamma tokens
    in a row).

    Returns a dict: "summary" (the numbers the page shows, each named with its denominator:
    draft_acceptance_rate, alpha, mean_beta, mean_tokens_per_round, tokens/s of both runs, speedup (their ratio, prefill
    included), decode_speedup with decode_speedup_low and decode_speedup_high (prefill excluded: the decoding times'
    ratio over the same tokens, and the middle half over the run's stretches), cost_coefficient, verify_cost, predicted
    speedups; a tree run adds nodes_per_round, acceptance_by_depth and predicted_tokens_per_round, and its prediction is
    the tree's), "status", and "trace" and "baseline" (every round, as ``specviz.Trace.to_dict``; ``Trace.from_dict``
    reads them back). Errors come back as messages naming the control and its allowed range; a drafter kind the pair
    does not draft with (its catalogue entry, ``specviz.pair.Preset.kinds``: "cross-tokenizer", not "model", for the
    cross pair) is refused before anything loads, naming both and the kinds the pair allows. The default pair is the
    page's (``default_pair()``), so a default call never switches the pair the page runs. A run that has held the device
    ``specviz.ui.running.share.SHARE_S`` seconds while another visitor waits, or that gives way to a much shorter job of
    another visitor, stops with a message saying so (``specviz.ui.running.share``).
    """
    req = RunRequest.checked(
        pair_name,
        prompt,
        gamma,
        temperature,
        top_k,
        top_p,
        max_new_tokens,
        seed,
        chat,
        "",
        "",
        # every field checked before any load
        drafter_kind,
        gamma_schedule,
        repetition_penalty,
        tree,
    )
    if state.client_gone(request):  # it waited in the queue with nobody reading: the engine never starts
        raise mistake(GONE, title="Stopped")
    owner = state.device_owner(request)
    expected = share.job_size(req, owner)  # its steps go before longer jobs' when short (device_thread)
    ensure_pair(req.pair_name, "", "", lambda *args, **kwargs: None, owner=owner)
    final = None
    with share.Held(request, expected) as held:
        # asked inside a calibration
        check = None if on_zerogpu() else lambda: state.client_gone(request) or held.over()
        for final in filter(None, run_on_device(req, check, device_owner=owner)):
            if final[0] != "done":
                _go_on(final[1], request, held)
        if final is None or final[0] != "done":  # the auto tree's calibration was stopped
            _go_on(None, request, held)
            raise mistake("The run stopped before its first round.", title="Stopped")
    spec, baseline, done = final[1], final[2], final[4]
    return {"summary": summary(spec, baseline), "status": done, "trace": spec.to_dict(), "baseline": baseline.to_dict()}


def _go_on(spec, request, held: share.Held) -> None:
    """Raise the message /run ends with when its client is gone or its device share is spent (``spec``:
    the run so far, None before its first round); return when it goes on."""
    if state.client_gone(request):
        raise mistake(GONE, title="Stopped")
    if held.over():
        kept = (
            f" It had {len(spec.output_ids)} tokens in {len(spec.rounds)} rounds; /run returns finished runs only."
            if spec
            else ""
        )
        raise mistake(held.note() + kept, title="Device shared")
