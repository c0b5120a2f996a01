"""Token trees: several candidates per position, verified in one target pass, exact under sampling.

SpecInfer (Miao et al. 2024), Medusa (Cai et al. 2024), EAGLE-2 (Li et al. 2024): the drafter
proposes a tree of candidates instead of a chain; the target scores every node in one pass under a
tree attention mask (each node sees its ancestors only) with depth-based positions; the round keeps
the path the acceptance rules walk down, and ends with a correction or bonus token at the first
node where no child is accepted.

- ``spec``: what tree to draft (a static shape such as 3,2,2,1, or a dynamic node budget).
- ``record``: the trace's record of a round's tree, and its checks, re-exported from where they live with the
  trace (``specviz.trace.tree``).
- ``draft``: trees from a drafter model (static or EAGLE-2 dynamic) and from prompt lookup.
- ``attention``: the tree attention mask, masked passes through unpatched transformers models,
  and compacting a KV cache to the accepted path.
- ``accept``: the two exact acceptance rules, recursive rejection sampling with replacement for
  children drawn i.i.d. from q (SpecInfer's multi-step rule) and without replacement for distinct
  deterministic children.
- ``loop``: the single-sequence speculative loop over trees.
- ``theory``: expected tokens per round from per-depth acceptance; v(n).
- ``calibration``: the auto tree's calibration on this pair and device (teacher-forced acceptance by depth and
  sibling rank, or short runs; v(n) and the drafter's passes, timed), and its record.
- ``auto``: the auto tree: the choice Sequoia's programme (``specviz.theory.sequoia``) makes from a calibration
  (calibrating a loaded pair, with the calibrations cached for the process and on disk: ``specviz.pair.auto_tree``).

This package's ``__init__`` imports nothing.
"""
