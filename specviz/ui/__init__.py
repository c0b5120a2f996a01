"""The Gradio page: controls in, engine, trace, views out.

Only this package and ``app.py`` know Gradio. Every failure a visitor can cause is turned into a
``gr.Error`` with a clear message, and the app keeps serving the next visitor.

One module per concern: ``limits`` (caps and defaults), ``checks`` (input checks, checked widgets),
``request`` (one checked run), ``pairs`` (pair resolution, error mapping), ``downloads`` (files handed
out), ``device`` (the GPU halves), ``state`` (per-session state), ``outputs`` (a run's outputs by
name), one handler module per tab (``generate``, ``replay``, ``sweep``, ``race``, ``files``,
``compare``, ``batch``, ``lab``, ``api``), ``layout`` (components and wiring only), ``server``
(CSP, launch settings), ``admission`` (who joins the queue), ``share`` (device time between
visitors), ``sessions`` (which sessions are kept), ``disk`` (the app's own folder) and ``css``.
"""

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from specviz.ui.disk import own_cache  # noqa: E402

own_cache()  # before Gradio names its cache: every file the app writes lies in a folder of this process

from specviz.ui.layout import build_demo  # noqa: E402
from specviz.ui.server import launch_kwargs  # noqa: E402

__all__ = ["build_demo", "launch_kwargs"]
