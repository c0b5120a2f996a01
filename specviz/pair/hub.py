"""Asking the model hub about a model before downloading it: existence, revision, access, safetensors weights, size.

A local folder's size comes from its safetensors headers instead.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from specviz.pair.catalogue import ModelRef
from specviz.pair.errors import PairError, explain, is_unreachable

HUB_TIMEOUT_S = 10


@dataclass
class Checked:
    """What the hub said about one model before any weights were downloaded."""

    ref: ModelRef
    params: int | None  # from the safetensors headers; None when unknown (offline preset)
    offline: bool  # load from the local cache only
    revision: str | None  # the commit to download (pinned: the branch cannot move mid-load)


def check_hub_model(ref: ModelRef, custom: bool) -> Checked:
    """Existence, revision, access and safetensors weights, from metadata only.

    A preset whose hub cannot be reached falls back to the local cache; a custom id is refused,
    because its size cannot be checked.
    """
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        info = api.model_info(ref.id, revision=ref.revision, timeout=HUB_TIMEOUT_S)
        meta = api.get_safetensors_metadata(ref.id, revision=info.sha or ref.revision, timeout=HUB_TIMEOUT_S)
    except Exception as err:
        if is_unreachable(err):
            if custom:
                raise PairError(
                    f"the model hub cannot be reached, so '{ref}' cannot be checked; try again later or use a preset "
                    "pair"
                ) from err
            return Checked(ref, None, True, ref.revision)
        raise explain(str(ref), err) from err
    return Checked(ref, int(sum(meta.parameter_count.values())), False, info.sha or ref.revision)


def local_params(folder: str) -> int | None:
    """Parameter count from the headers of a folder's safetensors files (None when there are none)."""
    total, found = 0, False
    for f in sorted(Path(folder).glob("*.safetensors")):
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error):
            return None
        for name, t in header.items():
            if name != "__metadata__":
                count = 1
                for d in t.get("shape", []):
                    count *= d
                total += count
        found = True
    return total if found else None
