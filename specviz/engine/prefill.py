"""A prompt's prefill in passes of at most PREFILL_CHUNK tokens (``specviz.engine.rounds.prefill_steps``, the batch
runner's ``prefill_passes``), so that on a server each pass is a device step of its own."""

from __future__ import annotations

# Prompt tokens a prefill pass feeds at most (over all rows of a batch): a long prompt's prefill is a few passes, each a
# step of a server's device thread, instead of one. The English target in bf16 on a 2-core CPU with AVX-512 BF16, a
# 460-token chat prompt: one pass 0.5 s, four of 256 tokens at most 0.27 s each (the run 1.0 s against 0.97 s); 8 rows
# of it: one pass 4.0 s, fifteen at most 0.29 s each (3.7 s in all). At 64 tokens a pass each pass's fixed cost (a
# 1-token pass takes 35 ms) made the run 1.5-1.8x as long.
PREFILL_CHUNK = 256


def prefill_ends(end: int, rows: int = 1) -> list[int]:
    """Where each prefill pass of ``end`` tokens (the columns of ``rows`` rows) stops: at most PREFILL_CHUNK tokens a
    pass over all rows, so at least one column; [end] for a prompt that fits one pass."""
    width = max(1, PREFILL_CHUNK // max(1, rows))
    return [*range(width, end, width), end]
