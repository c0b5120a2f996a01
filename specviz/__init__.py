"""specviz: speculative decoding, exact and shown round by round.

Public API::

    from specviz import speculative_generate, autoregressive_generate, Sampling
    trace = speculative_generate(input_ids, drafter, target, gamma=4, sampling=Sampling(temperature=0.0),
                                 max_new_tokens=64, eos_token_id=None, seed=0)

Importing specviz changes nothing outside it (no environment variable, no file): the names above load on first use
(PEP 562), so an entry point can still tune the process before torch loads (``specviz.openmp``). On first use a Trace
and a Recording also learn to show themselves in a notebook (``specviz.views.notebook``).
"""

from __future__ import annotations

import importlib

_API = {
    "autoregressive_generate": "specviz.engine.chain",
    "autoregressive_stream": "specviz.engine.chain",
    "speculative_generate": "specviz.engine.chain",
    "speculative_stream": "specviz.engine.chain",
    "Sampling": "specviz.engine.sampling",
    "Draft": "specviz.trace",
    "Round": "specviz.trace",
    "Trace": "specviz.trace",
}

__all__ = sorted(_API)


def _show_in_notebooks() -> None:
    """A Trace and a Recording show themselves in a notebook (``_repr_html_``); the recording sits above the views,
    which do not import it, and imports no views, so both are given their view here."""
    from specviz.recording import Recording
    from specviz.views import notebook

    notebook.register()
    Recording._repr_html_ = notebook.recording_html


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'specviz' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    _show_in_notebooks()
    globals()[name] = value  # later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
