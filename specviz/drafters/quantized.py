"""The quantized drafter: the target itself with 8-bit integer weights drafts for its full-precision self.

Self-speculation in the style of the speculative-decoding guides' "quantized drafter": a copy of
the target whose linear layers hold int8 weights agrees with the target often (the same network,
rounded), so alpha is high; but it still runs every layer, so a draft step costs a large fraction
of a target step (c of about 0.6 for SmolLM2-135M on a 2-core CPU, against 0.15 or less for a small
drafter). Shown beside the other drafters, it teaches that a drafter must be both close and cheap:
the speedup (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)) (Leviathan et al. 2023, Thm 3.8)
falls with c as surely as it rises with alpha.

Quantization: ``torch.ao.quantization.quantize_dynamic`` (torch's dynamic int8 quantization, kept
in torch 2.13 although deprecated in favour of torchao, which would be one more dependency): every
``nn.Linear`` gets int8 weights (one scale per tensor, symmetric) and quantizes its input
activations to uint8 on the fly, per call; embeddings, norms and everything else stay fp32. Its
kernels (fbgemm / qnnpack) run on the CPU only.

The drafts are sampled from the quantized model's own processed q like any drafter model's (the
``ModelDrafter`` runner and KV cache are reused as they are), so verification keeps the output
exactly the target's whatever the rounding did.

Memory: the quantized copy of an fp32 target shares the target's embedding table, norms and other
non-linear weights (no copy) and adds only the int8 weights (about a quarter of the linear layers'
fp32 bytes). A target in another form on the CPU (bf16, ``specviz.pair.precision``) is quantized
from an fp32 copy of itself: torch's int8 Linear takes fp32 activations, so the copy's embedding
table and norms stay fp32 (their own bytes, beside the int8 weights). Either way it is built once
per target and kept while the target lives.
"""

from __future__ import annotations

import copy
import threading
import warnings
import weakref

import torch

from specviz.engine.drafter import Drafter
from specviz.engine.model_drafter import ModelDrafter

BITS = 8
METHOD = "torch dynamic int8: per-tensor int8 weights of every Linear, activations quantized per call"

_quantized: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> its quantized copy
_lock = threading.Lock()


def _tree_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module`` and of every submodule that shares all parameters and buffers, so
    swapping a layer anywhere in the copy leaves the original whole."""
    twin = copy.copy(module)
    twin._modules = {
        name: (_tree_copy(child) if child is not None else None) for name, child in module._modules.items()
    }
    twin._parameters = dict(module._parameters)
    twin._buffers = dict(module._buffers)
    return twin


def quantize_target(target) -> torch.nn.Module:
    """An int8 copy of a transformers causal LM, built once per target and cached while it lives.

    Args:
        target: a transformers causal LM on the CPU, in eval mode, fp32 (shared non-linear
            weights) or another float dtype (quantized from an fp32 copy).

    Returns:
        A causal LM with the target's config and forward whose ``nn.Linear`` layers are torch's
        dynamic int8 ``Linear``; every other weight is the target's own tensor.

    Raises:
        ValueError: the target is not on the CPU (torch's int8 kernels are CPU-only).
    """
    param = next(target.parameters())
    if param.device.type != "cpu":
        raise ValueError(
            f"the quantized drafter runs on the CPU only (torch's int8 kernels); the target is on {param.device.type}: "
            "choose another drafter"
        )
    with _lock:
        short = _quantized.get(target)
        if short is None:
            # torch's int8 Linear quantizes from fp32 and takes fp32 activations: a bf16 target gets an fp32 copy.
            short = _tree_copy(target) if param.dtype == torch.float32 else copy.deepcopy(target).float()
            if hasattr(short, "specviz_form"):
                del short.specviz_form  # the copy runs in fp32 and int8, not in the target's form
            with warnings.catch_warnings():  # torch.ao.quantization's deprecation notice
                warnings.simplefilter("ignore")
                torch.ao.quantization.quantize_dynamic(short, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
            short.config = copy.deepcopy(target.config)
            short.config.name_or_path = f"{getattr(target.config, 'name_or_path', '') or type(target).__name__}@int8"
            # Its own generation settings: assisted generation writes to an assistant's generation_config.
            short.generation_config = copy.deepcopy(target.generation_config)
            short.requires_grad_(False)
            _quantized[target] = short
        return short


class QuantizedDrafter(ModelDrafter):
    """Drafts with the target's int8 copy (see ``quantize_target``): self-speculation.

    In a batch each row drafts in its own passes (the Drafter's default batching, one fork per
    row), not in one pass over the rows as a drafter model does: torch's dynamic int8 ``Linear``
    quantizes its input with one activation scale for the whole tensor, so in a shared pass a
    row's q would depend on the other rows' prompts, and row b would not equal its single run.

    Raises:
        ValueError: as ``quantize_target``.
    """

    kind = "quantized"

    def __init__(self, target):
        super().__init__(quantize_target(target))

    def describe(self) -> dict:
        return {"kind": self.kind, "bits": BITS, "method": METHOD}

    @property
    def passes(self) -> int:
        if self._forks:
            return Drafter.passes.fget(self)
        return ModelDrafter.passes.fget(self)

    # Per-row passes: one activation scale per row, as in a single run (see the class docstring).
    start_batch = Drafter.start_batch
    propose_batch = Drafter.propose_batch
    rollback_batch = Drafter.rollback_batch
    keep_rows = Drafter.keep_rows

    def start(self, seq: torch.Tensor, n: int, vocab: int, cached: str) -> None:
        self._forks = None
        super().start(seq, n, vocab, cached)
