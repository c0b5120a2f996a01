"""The EAGLE trainer's checkpoint: everything a later session needs to go on exactly where a chunk stopped.

A checkpoint is a folder (default ``assets/training/eagle``, a file in the repository, since only the repository
outlives a session) holding:

- ``checkpoint.json``: the step, the chunk count, the head's shape (``EagleConfig``), the optimiser's settings and
  its param groups (the learning rate where the schedule left it), the schedule's own state
  (``LambdaLR.state_dict()``: the position is the step), the data order's state (the pass over the data, the
  position in it and the corpus's fingerprint), the training settings, where the weights started from, and the
  names of its parts;
- its parts, ``eagle-step0001234-00001-of-00003.safetensors`` ...: the trainable weights in float32 (the master
  copy, 4.2 M parameters for the English pair: 16.8 MB), AdamW's two moments per weight in ``moments_dtype``
  (bfloat16 by default: 16.8 MB for both; float32 doubles that), the head's token ids and the torch random number
  generators' states. Split by ``huggingface_hub.split_torch_state_dict_into_shards`` into parts of at most
  ``max_part_bytes`` (15 MB), since a lent GPU's machine returns files of at most 16 MiB.

English pair, bfloat16 moments: 33.7 MB in three parts. Read with ``safetensors`` alone (``safe_open``): no pickle
anywhere. Saving writes the new parts, then replaces ``checkpoint.json`` in one rename, then removes the old parts:
a save stopped anywhere leaves the previous checkpoint whole.

Rounding the moments to bfloat16 is the one inexactness of a resume: a resumed run then differs from an
uninterrupted one by the moments' rounding (a relative 2^-9 at most), which moves the next steps' updates by about
that fraction; with ``moments_dtype="float32"`` a resume on the same device is exact to the bit.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from specviz.assets import ASSETS

FORMAT = 1
INDEX = "checkpoint.json"
CHECKPOINT_DIR = ASSETS / "training" / "eagle"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class CheckpointError(ValueError):
    """A checkpoint folder whose index and parts do not agree."""


def exists(folder: Path) -> bool:
    """Whether ``folder`` holds a checkpoint (its index)."""
    return (Path(folder) / INDEX).is_file()


def _rng_tensors() -> dict[str, torch.Tensor]:
    out = {"rng.cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng.cuda.{i}"] = state
    return out


def save(folder: Path, params: dict[str, torch.nn.Parameter], optimizer: torch.optim.Optimizer,
         head_ids: torch.Tensor, meta: dict, moments_dtype: str = "bfloat16", max_part_bytes: int = 15_000_000,
         prefix: str = "eagle") -> int:
    """Write a checkpoint of ``params`` (name -> trainable parameter, as given to ``optimizer``) into ``folder``.

    ``meta`` (JSON-able; must hold ``step``) goes into the index beside the optimiser's param groups. ``prefix``
    names the parts (``{prefix}-step0001234-00001-of-00003.safetensors``): any trainer's weights save this way.
    Returns the parts' total size in bytes.

    Raises:
        ValueError: an unknown ``moments_dtype``, or a parameter the optimiser does not hold.
    """
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    if moments_dtype not in DTYPES:
        raise ValueError(f"moments_dtype must be one of {sorted(DTYPES)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    index_of = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    for name, p in params.items():
        if id(p) not in index_of:
            raise ValueError(f"{name} is not among the optimiser's parameters")
        tensors[f"param.{name}"] = p.detach().float().cpu().contiguous()
        state = optimizer.state.get(p, {})
        if state:
            tensors[f"exp_avg.{name}"] = state["exp_avg"].detach().to(DTYPES[moments_dtype]).cpu().contiguous()
            tensors[f"exp_avg_sq.{name}"] = state["exp_avg_sq"].detach().to(DTYPES[moments_dtype]).cpu().contiguous()
    tensors["head_ids"] = head_ids.detach().to(torch.int64).cpu().contiguous()
    tensors.update({k: v.cpu().contiguous() for k, v in _rng_tensors().items()})
    step = int(meta["step"])
    split = split_torch_state_dict_into_shards(
        tensors, filename_pattern=f"{prefix}-step{step:07d}{{suffix}}.safetensors", max_shard_size=max_part_bytes
    )
    total = 0
    for filename, names in split.filename_to_tensors.items():
        tmp = folder / (filename + ".partial")
        save_file({n: tensors[n] for n in names}, str(tmp), metadata={"format": "specviz-eagle-checkpoint"})
        os.replace(tmp, folder / filename)
        total += (folder / filename).stat().st_size
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.state_dict()["param_groups"]]
    order = [name for name, p in sorted(params.items(), key=lambda kv: index_of[id(kv[1])])]
    index = {
        "format": FORMAT,
        **meta,
        "moments_dtype": moments_dtype,
        "param_order": order,
        "param_groups": groups,
        "parts": sorted(split.filename_to_tensors),
        "bytes": total,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    tmp = folder / (INDEX + ".partial")
    tmp.write_text(json.dumps(index, indent=1) + "\n")
    old = set()
    if exists(folder):
        try:
            old = set(json.loads((folder / INDEX).read_text()).get("parts", []))
        except (OSError, ValueError):
            pass
    os.replace(tmp, folder / INDEX)
    for name in old - set(index["parts"]):
        (folder / name).unlink(missing_ok=True)
    return total


def load(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(index, tensors) of the checkpoint in ``folder``; tensors on the CPU, read with safetensors only.

    Raises:
        FileNotFoundError: no checkpoint there.
        CheckpointError: a part missing, a format this code does not read, or tensors that do not match the index.
    """
    from safetensors import safe_open

    folder = Path(folder)
    index = json.loads((folder / INDEX).read_text())
    if not isinstance(index, dict) or index.get("format") != FORMAT or not isinstance(index.get("parts"), list):
        raise CheckpointError(f"{folder / INDEX}: not a checkpoint of format {FORMAT}")
    tensors: dict[str, torch.Tensor] = {}
    for name in index["parts"]:
        if not isinstance(name, str) or "/" in name or not (folder / name).is_file():
            raise CheckpointError(f"{folder}: part {name!r} missing")
        with safe_open(str(folder / name), framework="pt") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
    order = index.get("param_order")
    if not isinstance(order, list) or any(f"param.{n}" not in tensors for n in order) or "head_ids" not in tensors:
        raise CheckpointError(f"{folder}: the parts do not hold the weights the index names")
    if index.get("moments_dtype") not in DTYPES:
        raise CheckpointError(f"{folder}: unknown moments dtype {index.get('moments_dtype')!r}")
    return index, tensors


def restore(
    index: dict,
    tensors: dict[str, torch.Tensor],
    params: dict[str, torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
) -> None:
    """Load the weights into ``params`` and the moments, step and param groups into ``optimizer`` (built over
    ``params`` in their order, which must be ``index["param_order"]``), and the CPU random generator's state (and
    CUDA's, when both exist).

    Raises:
        CheckpointError: the parameters' names or shapes differ from the checkpoint's.
    """
    order = index["param_order"]
    if order != list(params):
        raise CheckpointError("the checkpoint's parameters (names and order) are not this head's")
    with torch.no_grad():
        for name in order:
            if params[name].shape != tensors[f"param.{name}"].shape:
                raise CheckpointError(
                    f"{name}: shape {tuple(tensors[f'param.{name}'].shape)} in the checkpoint, "
                    f"{tuple(params[name].shape)} here"
                )
            params[name].copy_(tensors[f"param.{name}"])
    state = {}
    step = float(index["step"])
    for i, name in enumerate(order):
        if f"exp_avg.{name}" in tensors:
            state[i] = {
                "step": torch.tensor(step),
                "exp_avg": tensors[f"exp_avg.{name}"],
                "exp_avg_sq": tensors[f"exp_avg_sq.{name}"],
            }
    groups = optimizer.state_dict()["param_groups"]
    if len(groups) != len(index["param_groups"]):
        raise CheckpointError("the optimiser's param groups differ from the checkpoint's")
    saved_groups = [{**saved, "params": g["params"]} for g, saved in zip(groups, index["param_groups"])]
    # load_state_dict casts the moments to each parameter's dtype and device (float32 master weights)
    optimizer.load_state_dict({"state": state, "param_groups": saved_groups})
    torch.set_rng_state(tensors["rng.cpu"])
    cuda = sorted(k for k in tensors if k.startswith("rng.cuda."))
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda])


def main(argv: list[str] | None = None) -> None:
    """``python -m specviz.training.eagle_checkpoint [DIR]``: load a checkpoint (safetensors only) and summarise it."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    folder = Path(argv[0]) if argv else CHECKPOINT_DIR
    index, tensors = load(folder)
    weights = sum(t.numel() for k, t in tensors.items() if k.startswith("param."))
    moments = sum(1 for k in tensors if k.startswith("exp_avg."))
    print(
        json.dumps(
            {
                "folder": str(folder),
                "step": index["step"],
                "chunk": index["chunk"],
                "parameters": weights,
                "weights_with_moments": moments,
                "moments_dtype": index["moments_dtype"],
                "bytes": index["bytes"],
                "parts": index["parts"],
                "data": index["data"],
                "started_from": index["started_from"],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
