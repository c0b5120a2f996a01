"""The web demo's entry points, kept for code that imports them from here: the page itself lives in
``specviz.ui`` (one module per concern)."""

from specviz.ui import build_demo, launch_kwargs
from specviz.ui.running.device import batch_duration as _batch_duration
from specviz.ui.tabs.files import examples as _examples
from specviz.ui.page.defaults import RECORDINGS

__all__ = ["build_demo", "launch_kwargs", "RECORDINGS", "_examples", "_batch_duration"]
