"""The drafter interface, re-exported where the drafter kinds live.

The interface itself lives beside the loops that call it, in ``specviz.engine.drafter``.
"""

from specviz.engine.drafter import DraftRequest, Drafter, Proposal

__all__ = ["DraftRequest", "Drafter", "Proposal"]
