"""The Gradio page: controls in, engine, trace, views out.

Only this package and ``app.py`` know Gradio. Every failure a visitor can cause is turned into a
``gr.Error`` with a clear message, and the app keeps serving the next visitor.

Four rooms, one concern a module:

- ``page``: the page itself: ``layout`` (components and wiring only), ``css``, ``defaults`` (starting
  values, menus, example prompts, the introduction), ``outputs`` (a run's outputs by name), ``state``
  (per-session state) and ``evidence`` (the Explanation's measured section).
- ``tabs``: one handler module per tab or endpoint: ``generate``, ``replay``, ``race``, ``sweep``,
  ``whatif``, ``compare``, ``batch``, ``lab``, ``files``, ``tree`` (the tree control) and ``api`` (/run).
- ``running``: running a visitor's job: ``device`` (the device halves), ``jobs`` (slots, caps,
  cancellation), ``share`` (device time between visitors), ``halting`` (why a long job ends),
  ``sizing`` (tokens per long job on a CPU), ``pairs`` (the pair a request names) and ``listening``
  (whether anybody reads a job's stream).
- ``guard``: guarding the server: ``limits`` (caps), ``budgets`` (upload bytes and log lines per
  address), ``checks`` (input checks),
  ``request`` (one checked run), ``admission`` (who joins the queue), ``address``, ``sessions``
  (which sessions are kept), ``disk`` (the app's own folder), ``downloads`` (files handed out) and
  ``server`` (middleware, CSP, launch settings).

Importing it changes nothing outside it: ``build_demo`` makes the app's own cache folder when it
builds the page, before Gradio names its cache.
"""

from __future__ import annotations

__all__ = ["build_demo", "launch_kwargs"]


def build_demo(*args, **kwargs):
    """``specviz.ui.page.layout.build_demo``: the Blocks app (same arguments)."""
    from specviz.ui.page.layout import build_demo as build

    return build(*args, **kwargs)


def launch_kwargs(*args, **kwargs) -> dict:
    """``specviz.ui.guard.server.launch_kwargs``: arguments for ``demo.launch`` (same arguments)."""
    from specviz.ui.guard.server import launch_kwargs as make

    return make(*args, **kwargs)
