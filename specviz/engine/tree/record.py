"""The trace's record of a round's tree: it lives with the trace, in ``specviz.trace.tree``, and is
re-exported here for the loops and for code that imported it from the engine."""

from specviz.trace.tree import (  # noqa: F401
    OLD_RULE_NAMES,
    TOLERANCE,
    WITH_REPLACEMENT,
    WITHOUT_REPLACEMENT,
    Rule,
    TreeNode,
    TreeRecord,
    TreeVerdict,
    check_tree,
    renamed_rules,
)
