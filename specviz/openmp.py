"""How long OpenMP's idle threads spin before they sleep: set by the entry points (``app.py``, ``python -m
specviz``) before torch loads, never by importing specviz.

GNU libgomp (in torch's Linux wheels) reads ``GOMP_SPINCOUNT`` once, when torch loads. specviz's entry points set it
to SPIN_COUNT unless it is already set; docs/benchmarks.md ("The page as fast as its engine") has the measurement
behind the number: as fast as libgomp's own 300,000 on a quiet 2-core CPU, and beside one busy process 17 speculative
tokens/s where 300,000 gave 0.5 (the spinning worker holds the core its partner needs).
"""

from __future__ import annotations

import os
import sys

SPIN_COUNT = 3000  # rounds; libgomp's own default is 300,000


def spin_briefly() -> bool:
    """Set ``GOMP_SPINCOUNT`` to SPIN_COUNT unless it is set; returns whether it takes effect (torch not loaded yet).

    An operator's own setting is kept. Once torch is loaded, setting it would change nothing: then it is left alone.
    """
    if "torch" in sys.modules:
        return False
    os.environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))
    return True
