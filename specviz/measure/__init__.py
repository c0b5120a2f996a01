"""Measuring: benchmarks, sweeps, speedups and evaluation, each a ratio within one run."""
