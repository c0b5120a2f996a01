"""Whether this process runs on a Hugging Face ZeroGPU Space: read in ``specviz.engine.zerogpu`` (the engine's
graphs, the pair's device and the GPU decorator all ask it), re-exported here."""

from specviz.engine.zerogpu import ZEROGPU_ENV, on_zerogpu, truthy  # noqa: F401
