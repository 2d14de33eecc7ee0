"""Input guards the compiled kernels need (numba does not bounds-check), run over a whole block before any step."""
from __future__ import annotations

import numpy as np

from fedrec.utils.jit import jit

VALID, BAD_CLIENT, BAD_CONTEXT, BAD_REWARD = 0, 1, 2, 3


@jit
def first_invalid(clients: np.ndarray, ctx: np.ndarray, rew: np.ndarray, num_clients: int) -> int:
    """Which input is invalid first: a client id outside [0, num_clients), a non-finite context or reward."""
    for c in clients.flat:
        if c < 0 or c >= num_clients:
            return BAD_CLIENT
    for v in ctx.flat:
        if not np.isfinite(v):
            return BAD_CONTEXT
    for v in rew.flat:
        if not np.isfinite(v):
            return BAD_REWARD
    return VALID
