"""What measurements make of traces, and the names a trace uses: plain data the views read.

A round's token tree is part of the trace itself (``specviz.trace.tree``).

- ``sweep``: a gamma sweep's points (``Sweep``, ``SweepPoint``); run by ``specviz.measure.sweep``.
- ``batch``: a batch size's measured throughput (``BatchPoint``); measured by ``specviz.measure.throughput``.
- ``speedup``: a measured speedup and its spread, from a speculative trace and its baseline (``estimate``).
- ``lab``: the exactness lab's counts against the exact law (``Result``) and a planted fault's description.
- ``kinds``: the drafter kinds' names, labels and descriptions (the code of each is in ``specviz.drafters``).

This package sits on the bottom floor with the trace it reads (tests/test_layers.py): it imports no engine,
drafter, measuring, UI or view code, and its ``__init__`` imports nothing.
"""
