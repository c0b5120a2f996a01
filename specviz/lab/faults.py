"""Teaching faults: bugs seen in public implementations of speculative decoding, planted one at a time.

Each fault is a variant of one step of the algorithm (``fault_steps``: a ``specviz.engine.rejection.Steps``
with that step replaced), passed to an experiment's runs as their ``steps`` argument. Nothing in
the engine's normal path reaches this module, and nothing of ``specviz.engine.rejection`` is replaced:
a run with a fault cannot leak it into another visitor's run.

Not here: "no bonus token when every draft is accepted", which some tutorials do. It is not a
fault of the law: the next round drafts from the same context, so the output keeps the target's
distribution and only the target's last position is wasted. A lab that made it fail would teach
something false.
"""

from __future__ import annotations

import dataclasses

import torch

from specviz.engine import rejection
from specviz.engine.sampling import Sampling
from specviz.records.lab import Fault  # a fault's description lives with the lab's record (the views read it)

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


def fault_steps(name: str) -> rejection.Steps:
    """The round's steps with the named fault in place of one of them (``specviz.engine.rejection.Steps``),
    to pass to a run as its ``steps``: only that run has the fault; nothing global changes, so
    other visitors' runs on the same server are untouched. "none" gives the exact steps.

    Raises:
        KeyError: an unknown fault.
    """
    if name not in FAULTS:
        raise KeyError(name)
    exact = rejection.EXACT

    def raw_q(logits, sampling, warpers, gen, context=None):
        token, _ = exact.draft_token(logits, sampling, warpers, gen, context)
        return token, torch.softmax(logits.float(), dim=-1)

    def drafter_only_filters(logits, sampling, warpers, context=None):
        unfiltered = Sampling(temperature=sampling.temperature, repetition_penalty=sampling.repetition_penalty)
        return exact.target_probs(logits, unfiltered, unfiltered.warpers(), context)

    replaced = {
        "none": {},
        "raw_q": {"draft_token": raw_q},
        "residual_is_p": {"residual": lambda p, q: p},
        "drafter_only_filters": {"target_probs": drafter_only_filters},
        "accept_leq": {"accept": lambda u, q_x, p_x: u * q_x <= p_x},
    }[name]
    return dataclasses.replace(exact, **replaced)  # "none": the exact steps themselves
