"""Step loop of FedLinUCB with a fixed synchronisation period (:mod:`fedrec.protocols.fed_linucb`).

The clients' local step (:func:`~fedrec.protocols.kernels.client_server.act`) and the global synchronisation
(:func:`~fedrec.protocols.kernels.client_server.sync_all`) are Sync-LinUCB's; only the trigger differs: replicate
``r`` synchronises after every ``period``-th of its steps, counted in :class:`Clock`.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedrec.jit import I64, jit, parallel_variant, prange
from fedrec.protocols.kernels.client_server import act, sync_all


class Clock(NamedTuple):
    """The steps each replicate has played (FedLinUCB's buffer ``steps``)."""

    steps: I64[1]


class PeriodicSettings(NamedTuple):
    """FedLinUCB's settings (its attributes of the same names)."""

    num_clients: int
    message_scalars: int
    bytes_per_scalar: int
    period: int  #: steps between two synchronisations
    stop_at_comm: bool


@jit
def _periodic_replicate(r, io, p, pol, st, cfg, traffic, clock):
    """Replicate ``r``'s steps: each client acts on its own statistics; every ``period`` steps, a global sync."""
    S = io.clients.shape[1]
    d = pol.inv.shape[1]
    Ax = np.empty(d)
    L = np.empty((d, d))
    inv_g = np.empty((d, d))
    s = io.pos[r]
    io.event[r] = 0
    while s < S:
        row = io.row_of[r * cfg.num_clients + io.clients[r, s]]
        st.registered[row] = True
        if not act(r, s, row, io, p, pol, Ax, st.buffer, st.buffer_count, st.buffer, st.buffer_count, True):
            io.event[r] = -1
            break
        st.steps_since_sync[row] += 1
        clock.steps[r] += 1
        s += 1
        if clock.steps[r] % cfg.period:
            continue
        if cfg.stop_at_comm:  # the channel transforms payloads: the protocol syncs in Python
            io.event[r] = 1
            break
        sync_all(r, io, p, pol, st, cfg, traffic, L, inv_g)
    io.pos[r] = s


def _periodic_run(io, p, pol, st, cfg, traffic, clock):
    """:func:`_periodic_replicate` of every replicate (its own function: numba issue 7135; an int64 index, else the
    body is compiled once more for the parallel loop's unsigned one)."""
    for r in prange(io.clients.shape[0]):
        _periodic_replicate(np.int64(r), io, p, pol, st, cfg, traffic, clock)


#: (serial, parallel over replicates)
PERIODIC_RUN = (jit(_periodic_run), jit(parallel_variant(_periodic_run), parallel=True))
