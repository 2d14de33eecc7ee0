"""Step loop of protocols without communication: each step's rows act on their own statistics."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedrec.protocols.kernels.linear import choose, refactor, update
from fedrec.utils.jit import F64, I64, jit, over_replicates


class RowSteps(NamedTuple):
    """A block of steps addressed by state row."""

    rows: I64[2]  #: (R, S) the row that acts in each step
    contexts: F64[4]  #: (R, S, K, d)
    rewards: F64[3]  #: (R, S, K)
    logged: I64[2]  #: (R, S) replay: the logged arms (a step updates its row only if it picked it); (R, 0): none
    arms: I64[2]  #: (R, S) the decisions, written by the kernel
    event: I64[1]  #: (R,) −1 where a Gram matrix lost positive definiteness


@jit
def _rows_replicate(r, io, p, pol):
    """Replicate ``r``'s steps: step s is a decision and an update of row ``io.rows[r, s]``."""
    d = pol.inv.shape[1]
    replay = io.logged.shape[1] > 0
    Ax = np.empty(d)
    io.event[r] = 0
    for s in range(io.rows.shape[1]):
        row = io.rows[r, s]
        if pol.stale[row] and not refactor(pol, row, p.lam):
            io.event[r] = -1
            return
        a = choose(p, pol, row, io.contexts[r, s], Ax)
        io.arms[r, s] = a
        if replay and a != io.logged[r, s]:
            continue
        if not update(p, pol, row, io.contexts[r, s, a], io.rewards[r, s, a], Ax):
            io.event[r] = -1
            return


#: (serial, parallel over replicates), called as ``kernel(replicates, io, p, pol)``
ROWS_RUN = over_replicates(_rows_replicate)
