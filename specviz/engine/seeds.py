"""Seeds: the one number that fixes every random draw of a run.

A run's seed is a whole number in 0..SEED_MAX. torch's CPU generator (a Mersenne Twister) keeps
only the low 32 bits of the seed it is given, so seeds s and s + 2^32 would give the same
draws. ``generator`` therefore seeds torch with the seed itself below 2^32 (runs recorded with
those seeds keep their draws) and with a hash of all 64 bits above it.
"""

from __future__ import annotations

import hashlib
import operator

import torch

SEED_MAX = 2**63 - 1  # the signed 64-bit range: safe for torch, JSON readers and the page


def check_seed(seed, rows: int = 1) -> int:
    """``seed`` as an int, checked so that seeds seed .. seed + rows - 1 (a batch's rows) are in range.

    Raises:
        ValueError: not a whole number, or out of 0..SEED_MAX - (rows - 1).
    """
    try:
        value = operator.index(seed) if not isinstance(seed, bool) else None
    except TypeError:
        value = None
    if value is None or not 0 <= value <= SEED_MAX - (rows - 1):
        batch = f" (a batch of {rows} rows seeds its rows seed .. seed + {rows - 1})" if rows > 1 else ""
        raise ValueError(f"seed must be a whole number from 0 to {SEED_MAX - (rows - 1)}{batch}")
    return value


def torch_seed(seed: int) -> int:
    """The seed given to torch: ``seed`` below 2^32, else a 63-bit hash (BLAKE2b) of its 64 bits."""
    if seed < 2**32:
        return seed
    return int.from_bytes(hashlib.blake2b(seed.to_bytes(8, "little"), digest_size=8).digest(), "little") >> 1


def generator(seed: int, device: torch.device) -> torch.Generator:
    """A torch.Generator on ``device`` seeded from ``seed`` (see the module docstring)."""
    return torch.Generator(device=device).manual_seed(torch_seed(check_seed(seed)))
