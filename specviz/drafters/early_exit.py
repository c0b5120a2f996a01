"""Early-exit self-speculation: the target's first k layers, its final norm and its output layer draft.

LayerSkip (Elhoushi et al. 2024); transformers' ``assistant_early_exit``. The drafter is no second
model: it is a view of the target that stops after layer k and shares every weight with it (no
copy in memory). Its drafts are sampled from that view's processed q like any drafter model's, so
the same verification keeps the output exactly the target's.

Simplification: the view keeps its own KV cache for its k layers, where LayerSkip reuses the
target's cache of those layers; the drafting is the same, the saving of cache memory and of the
verify pass's first k layers is not modelled.
"""

from __future__ import annotations

import copy

import torch

from specviz.engine.model_drafter import ModelDrafter


def _shallow(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module`` that shares its submodules, parameters and buffers but owns their tables,
    so replacing a child of the copy leaves the original alone."""
    twin = copy.copy(module)
    twin._modules = dict(module._modules)
    twin._parameters = dict(module._parameters)
    twin._buffers = dict(module._buffers)
    return twin


def _layer_list(body: torch.nn.Module) -> str:
    for name in ("layers", "h", "layer", "blocks"):
        if isinstance(getattr(body, name, None), torch.nn.ModuleList):
            return name
    raise ValueError(
        f"{type(body).__name__} has no list of decoder layers this early exit knows (layers, h, layer, blocks)"
    )


def layer_count(model) -> int:
    """Decoder layers of a transformers causal LM."""
    body = getattr(model, model.base_model_prefix)
    return len(getattr(body, _layer_list(body)))


def early_exit_model(target, exit_layer: int):
    """The target cut after ``exit_layer`` decoder layers, sharing its weights: a causal LM whose
    forward runs the embeddings, layers 1..exit_layer, the final norm and the output layer.

    Args:
        target: a transformers causal LM whose body keeps its layers in a ModuleList (GPT-2,
            Llama, Qwen2 and most decoder-only families).
        exit_layer: layers kept, 1 <= exit_layer < the target's layer count.

    Raises:
        ValueError: exit_layer out of range, or a body this function does not know.
    """
    prefix = target.base_model_prefix
    body = getattr(target, prefix)
    name = _layer_list(body)
    layers = getattr(body, name)
    if not (isinstance(exit_layer, int) and 1 <= exit_layer < len(layers)):
        raise ValueError(
            f"exit_layer must be a whole number in 1..{len(layers) - 1} (the target has {len(layers)} layers), got "
            f"{exit_layer!r}"
        )
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = exit_layer
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:exit_layer]
    config.name_or_path = f"{getattr(target.config, 'name_or_path', '') or type(target).__name__}@exit{exit_layer}"
    short_body = _shallow(body)
    short_body._modules[name] = torch.nn.ModuleList(layers[:exit_layer])
    short_body.config = config
    short = _shallow(target)
    short._modules[prefix] = short_body
    short.config = config
    # Its own generation settings: assisted generation writes to an assistant's generation_config.
    short.generation_config = copy.deepcopy(target.generation_config)
    return short


class EarlyExitDrafter(ModelDrafter):
    """Drafts with the target's first ``exit_layer`` layers (see ``early_exit_model``).

    Raises:
        ValueError: exit_layer out of range for the target.
    """

    kind = "early-exit"

    def __init__(self, target, exit_layer: int):
        super().__init__(early_exit_model(target, exit_layer))
        self.exit_layer = exit_layer
        self.layers = layer_count(target)

    def describe(self) -> dict:
        return {"kind": self.kind, "exit_layer": self.exit_layer, "layers": self.layers}
