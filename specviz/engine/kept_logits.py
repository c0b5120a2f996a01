"""Which logits a pass keeps: transformers' ``logits_to_keep`` for the last positions a pass feeds."""

from __future__ import annotations

import torch


def logits_kept(n_last: int, fed: int, device: torch.device) -> int | torch.Tensor:
    """transformers' ``logits_to_keep`` for the last ``n_last`` of the ``fed`` positions of a pass: ``n_last`` itself,
    or on a CPU, when it keeps fewer than all, their indices (1-D).

    Sliced by an int, the hidden states the output layer reads are a view (rows, n_last, H) with the strides of all
    ``fed`` columns; for such a view torch's CPU matmul takes a path whose cost grows with the output layer's weight
    when that weight needs no gradient (torch 2.13, the English target in bf16 on a 2-core CPU with AVX-512 BF16: a
    prefill's 1-row output layer 58 ms instead of 4.3 ms, an 8-row batch's prefill 403 ms instead of 5.5 ms).
    Indexed, they are a tensor of their own."""
    if n_last >= fed or device.type != "cpu":
        return n_last
    return torch.arange(fed - n_last, fed, device=device)
