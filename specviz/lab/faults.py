"""Teaching faults: bugs seen in public implementations of speculative decoding, planted one at a time.

Each fault is a context manager that replaces one step of the algorithm in ``specviz.engine.rejection``
(the module the engine calls for each step) for the duration of an experiment, then puts it
back. Nothing in the engine's normal path reaches this module: the lab and the tests enter a
fault explicitly, to show that the chi-square test catches it.

Not here: "no bonus token when every draft is accepted", which some tutorials do. It is not a
fault of the law: the next round drafts from the same context, so the output keeps the target's
distribution and only the target's last position is wasted. A lab that made it fail would teach
something false.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import torch

from specviz.engine import rejection
from specviz.engine.sampling import Sampling


@dataclass(frozen=True)
class Fault:
    """A planted fault: its name, where it was seen, and what the lab should show."""

    name: str
    seen: str
    expect: str


FAULTS = {
    "none": Fault("the correct engine", "", "p-values spread over [0, 1]: no evidence against exactness"),
    "raw_q": Fault("q from raw logits while the draft comes from the processed q",
                   "transformers #47932 (q before top-k, total variation up to 0.31)",
                   "fails with top-k, top-p or a temperature other than 1"),
    "residual_is_p": Fault("the correction drawn from p instead of norm(max(0, p - q))",
                           "a common shortcut in small implementations", "fails whenever drafts are rejected"),
    "drafter_only_filters": Fault("top-k and top-p applied to the drafter's q only, not to the target's p",
                                  "vLLM #9834 (the target used default sampling settings)",
                                  "fails with top-k or top-p set: the output follows the unfiltered p"),
    "accept_leq": Fault("acceptance tested with u <= p/q instead of u < p/q",
                        "SGLang #35771 (a draft with p(x) = 0 accepted when u = 0)",
                        "invisible here: u = 0 has probability 2^-24 per float32 draw, so no class-sized sample "
                        "meets it; the unit test that a draft with p(x) = 0 is never accepted catches it"),
}


@contextlib.contextmanager
def planted(name: str):
    """Replace one step of ``specviz.engine.rejection`` with the named fault inside the ``with`` block.

    Only the thread that entered the block gets the fault: a call from any other thread (another
    visitor's run on the same server) goes to the real step. So the block must not span a yield
    that could resume on another thread; the lab enters it once per chunk of samples.

    Raises:
        KeyError: an unknown fault.
    """
    if name not in FAULTS:
        raise KeyError(name)
    saved = {k: getattr(rejection, k) for k in ("draft_token", "target_probs", "accept", "residual")}
    real_draft, real_target = saved["draft_token"], saved["target_probs"]

    def raw_q(logits, sampling, warpers, gen, context=None):
        token, _ = real_draft(logits, sampling, warpers, gen, context)
        return token, torch.softmax(logits.float(), dim=-1)

    def drafter_only_filters(logits, sampling, warpers, context=None):
        unfiltered = Sampling(temperature=sampling.temperature, repetition_penalty=sampling.repetition_penalty)
        return real_target(logits, unfiltered, unfiltered.warpers(), context)

    patches = {
        "none": {},
        "raw_q": {"draft_token": raw_q},
        "residual_is_p": {"residual": lambda p, q: p},
        "drafter_only_filters": {"target_probs": drafter_only_filters},
        "accept_leq": {"accept": lambda u, q_x, p_x: u * q_x <= p_x},
    }[name]
    owner = threading.get_ident()

    def only_here(fault_fn, real_fn):
        def step(*args, **kwargs):
            return (fault_fn if threading.get_ident() == owner else real_fn)(*args, **kwargs)
        return step

    try:
        for key, fn in patches.items():
            setattr(rejection, key, only_here(fn, saved[key]))
        yield FAULTS[name]
    finally:
        for key, fn in saved.items():
            setattr(rejection, key, fn)
