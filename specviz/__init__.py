"""specviz: speculative decoding, exact and shown round by round.

Public API::

    from specviz import speculative_generate, autoregressive_generate, Sampling
    trace = speculative_generate(input_ids, drafter, target, gamma=4, sampling=Sampling(temperature=0.0),
                                 max_new_tokens=64, eos_token_id=None, seed=0)
"""

from specviz.engine.chain import autoregressive_generate, autoregressive_stream, speculative_generate, speculative_stream
from specviz.engine.sampling import Sampling
from specviz.trace import Draft, Round, Trace
from specviz.views import notebook as _notebook  # noqa: F401  (a Trace or Recording shows itself in a notebook)

__all__ = [
    "Draft",
    "Round",
    "Sampling",
    "Trace",
    "autoregressive_generate",
    "autoregressive_stream",
    "speculative_generate",
    "speculative_stream",
]
