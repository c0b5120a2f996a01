"""What a run leaves beside the trace's rounds: plain data the engine writes and the views read.

- ``tree``: the trace's record of a round's token tree, and the checks a loaded one must pass.

This package sits with the trace on the bottom floor (tests/test_layers.py): it imports no engine,
drafter, measuring, UI or view code, and its ``__init__`` imports nothing.
"""
