"""Step loop of protocols without communication: each step's rows act on their own statistics."""
from __future__ import annotations

import numpy as np

from fedrec.jit import jit, parallel_variant, prange
from fedrec.protocols.kernels.linalg import refactor_row
from fedrec.protocols.kernels.linear import P_LAM, choose, update


def _rows_run(rows, ctx, rew, logged, arms, event, kind, params, seed, G, inv, logdet, count, since, stale, draws):
    """Play ``rows`` (R, S): step s of replicate r is a decision and an update of row ``rows[r, s]``.

    Replay (``logged`` (R, S) ≥ 0): the update happens only when the decision is the logged arm; ``logged`` of
    shape (R, 0) updates every step."""
    R, S = rows.shape
    d = inv.shape[1]
    for r in prange(R):
        Ax = np.empty(d)
        event[r] = 0
        for s in range(S):
            row = rows[r, s]
            if stale[row] and not refactor_row(G, inv, logdet, since, stale, row, params[P_LAM]):
                event[r] = -1
                break
            a = choose(kind, params, seed, row, G, inv, logdet, count, draws, ctx[r, s], Ax)
            arms[r, s] = a
            if logged.shape[1] and a != logged[r, s]:
                continue
            if not update(params, row, ctx[r, s, a], rew[r, s, a], Ax, G, inv, logdet, count, since, stale):
                event[r] = -1
                break


#: (serial, parallel over replicates)
ROWS_RUN = (jit(_rows_run), jit(parallel_variant(_rows_run), parallel=True))
