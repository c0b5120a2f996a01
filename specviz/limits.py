"""Bounds that the engine, the trace and the checks of files from outside share.

Kept apart from ``specviz.trace`` so that ``specviz.validation`` can read them without importing
the trace it validates (the trace imports the validation to load files).
"""

# The largest gamma specviz drafts with (the demo's range is 1..MAX_GAMMA; every gamma schedule
# is capped at it), so a round holds at most this many drafts.
MAX_GAMMA = 16

# The most nodes a token tree may have (a static shape's product sum, a dynamic tree's budget, a
# loaded tree's nodes): bounds a verify pass's width and the work of checking a file.
MAX_TREE_NODES = 128
