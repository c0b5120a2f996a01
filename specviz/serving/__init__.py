"""Serving on a GPU: device placement and ZeroGPU durations."""
