"""One seed derives every generator (SeedSequence-style spawning), so runs are reproducible and resumable.

Streams are *counter based*: the generator for (component, replicate, chunk) is derived from the run seed and
those indices alone, so a resumed run regenerates exactly the numbers the uninterrupted run would have drawn
without having to store generator state.
"""
from __future__ import annotations

import zlib

import numpy as np
import torch


def _key(name: str) -> int:
    return zlib.crc32(name.encode())


def numpy_generator(seed: int, name: str, *indices: int) -> np.random.Generator:
    """A numpy Generator for component ``name`` at the given indices (e.g. replicate, chunk)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), _key(name), *map(int, indices)])))


def torch_generator(seed: int, name: str, *indices: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch.Generator seeded from the same derivation as :func:`numpy_generator`."""
    state = np.random.SeedSequence([int(seed), _key(name), *map(int, indices)]).generate_state(2, np.uint64)
    g = torch.Generator(device=device)
    g.manual_seed(int(state[0] >> np.uint64(1)))
    return g
