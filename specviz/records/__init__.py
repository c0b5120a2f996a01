"""What a run leaves beside the trace's rounds: plain data the engine and the measurements write and the views read.

- ``tree``: the trace's record of a round's token tree, and the checks a loaded one must pass.
- ``sweep``: a gamma sweep's points (``Sweep``, ``SweepPoint``); run by ``specviz.measure.sweep``.
- ``batch``: a batch size's measured throughput (``BatchPoint``); measured by ``specviz.measure.throughput``.
- ``speedup``: a measured speedup and its spread, from a speculative trace and its baseline (``estimate``).
- ``lab``: the exactness lab's counts against the exact law (``Result``) and a planted fault's description.
- ``kinds``: the drafter kinds' names, labels and descriptions (the code of each is in ``specviz.drafters``).

This package sits with the trace on the bottom floor (tests/test_layers.py): it imports no engine,
drafter, measuring, UI or view code, and its ``__init__`` imports nothing.
"""
