"""A batch size's measured throughput, as the Batch tab draws it (measured by ``specviz.measure.throughput``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BatchPoint:
    """Throughput of one batch size: tokens/s over the batch (all rows' tokens / wall time) per run."""

    batch_size: int
    speculative: list[float] = field(default_factory=list)
    autoregressive: list[float] = field(default_factory=list)

    @property
    def speedups(self) -> list[float]:
        """Speculative / autoregressive tokens/s of each pair of runs made in turns."""
        return [s / a for s, a in zip(self.speculative, self.autoregressive) if a > 0]
