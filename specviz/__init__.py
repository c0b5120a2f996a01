"""specviz: speculative decoding, exact and shown round by round.

Public API::

    from specviz import speculative_generate, autoregressive_generate, Sampling
    trace = speculative_generate(input_ids, drafter, target, gamma=4, sampling=Sampling(temperature=0.0),
                                 max_new_tokens=64, eos_token_id=None, seed=0)
"""

import os as _os
import sys as _sys

# How long OpenMP's waiting threads spin before they sleep (GNU libgomp, in torch's Linux wheels), read once when
# torch loads: 3,000 rounds instead of libgomp's 300,000. Measured on a 2-core CPU with AVX-512 BF16 (the English
# pair, 128 tokens at the page's defaults, every pass on one thread, specviz.serving.device_thread): 53 speculative
# tokens/s quiet with either count; beside one busy process, 17 tokens/s with 3,000 and 0.5 with 300,000 (the spinning
# worker holds the core its partner needs). 1,000 gives 24 there but 45 quiet. A value already set is kept.
if "torch" not in _sys.modules:
    _os.environ.setdefault("GOMP_SPINCOUNT", "3000")

from specviz.engine.chain import (
    autoregressive_generate,
    autoregressive_stream,
    speculative_generate,
    speculative_stream,
)
from specviz.engine.sampling import Sampling
from specviz.recording import Recording as _Recording
from specviz.trace import Draft, Round, Trace
from specviz.views import notebook as _notebook  # a Trace shows itself in a notebook (registered there)

# A Recording too: it sits above the views, which do not import it, and the recording imports no views.
_Recording._repr_html_ = _notebook.recording_html

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
