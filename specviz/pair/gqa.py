"""Grouped-query attention on a CPU without copying the key/value heads for every masked pass: it lives with
the engine's masked passes, in ``specviz.engine.gqa`` (the pair's CPU form and the EAGLE head both switch a
model to it), and is re-exported here."""

from specviz.engine.gqa import NAME, sdpa_shared_kv, use_shared_kv_heads  # noqa: F401
