"""specviz web demo: ``python app.py [--port 7860]`` serves on 127.0.0.1."""

import argparse
import os

from specviz.openmp import spin_briefly

spin_briefly()  # before torch loads (specviz.openmp)

# ZeroGPU wants `spaces` imported before torch (the specviz page imports torch), so this
# checks the platform's flag itself; specviz.engine.zerogpu.on_zerogpu() reads the same flag.
if os.environ.get("SPACES_ZERO_GPU", "").strip().lower() in ("1", "true", "yes", "on"):
    import spaces  # noqa: F401

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from specviz.ui import build_demo, launch_kwargs  # noqa: E402
from specviz.ui.guard.downloads import remove_on_signals  # noqa: E402

demo = build_demo()

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=None, help="port (default: $GRADIO_SERVER_PORT or 7860)")
    remove_on_signals()  # the download folder goes on SIGTERM and SIGINT too
    demo.launch(**launch_kwargs(parser.parse_args().port))
