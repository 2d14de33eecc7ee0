"""The client–server loop with a global synchronisation and a pluggable trigger (Algorithm 4 of Li & Wang 2022
with its Δt_i · log det ratio > D replaced by any compiled condition).

After each client's local step (:func:`~fedrec.protocols.kernels.client_server.act`), the protocol's trigger decides
whether replicate ``r`` synchronises now; a sync (:func:`sync_all`) uploads every registered client's buffer and
downloads the aggregate to all of them. :func:`compiled_loop` compiles the loop once per trigger, with the trigger
inlined, so a protocol on it runs as fast as a hand-written copy. ``io.event`` and the ledger are as in
:mod:`~fedrec.protocols.kernels.client_server`.
"""
from __future__ import annotations

import functools
import hashlib
import marshal
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from fedrec.federation.ledger import DOWNLOAD, UPLOAD
from fedrec.protocols.kernels.client_server import act
from fedrec.protocols.kernels.ledger import record
from fedrec.protocols.kernels.linalg import cholesky_logdet, inverse_from_cholesky
from fedrec.utils.jit import BOOL, F64, I64, jit, over_replicates, renamed


class SyncState(NamedTuple):
    """The state of a globally synchronised protocol (:class:`fedrec.protocols.TriggeredLinUCB`'s buffers)."""

    buffer: F64[3]  #: (R·cap, d+1, d+1) each client's upload buffer [ΔV_i, Δb_i]: its data since the last sync
    buffer_count: I64[1]  #: observations in each upload buffer
    synced_logdet: F64[1]  #: log det S_i(λ) of each client's copy at the last sync
    registered: BOOL[1]  #: clients that have acted
    steps_since_sync: I64[1]  #: Δt_i, the client's steps since the last sync
    sync_rounds: I64[1]  #: (R,) global synchronisations so far
    server: F64[3]  #: (R, d+1, d+1) the server aggregate [V_g, b_g]
    server_count: I64[1]  #: observations in the server aggregate


class LoopSettings(NamedTuple):
    """The loop's settings (the protocol's attributes of the same names)."""

    num_clients: int
    message_scalars: int  #: scalars in one {ΔV, Δb} message
    bytes_per_scalar: int
    stop_at_comm: bool  #: stop where a sync is due, for the channel to carry it in Python


class Factor(NamedTuple):
    """d × d scratch of a sync: the aggregate's Cholesky factor and its inverse."""

    L: np.ndarray
    inv: np.ndarray


@jit(inline=True)
def sync_all(r, io, p, pol, st, cfg, traffic, work):
    """A global synchronisation of replicate ``r`` (Algorithm 4): every registered client uploads its buffer, then
    downloads the aggregate V_g, factorised once into ``work`` (a :class:`Factor`). The uploads are summed in
    client order (the order of the floating-point sum), whatever the order of the clients' slots."""
    d = pol.inv.shape[1]
    scalars, bps = cfg.message_scalars, cfg.bytes_per_scalar
    base = r * (io.client_of.shape[0] // io.clients.shape[0])
    order = base + np.argsort(io.client_of[base : base + io.allocated[r]])
    for j in order:  # every registered client uploads its buffer ...
        c2 = io.client_of[j]
        if st.registered[j]:
            st.server[r] += st.buffer[j]
            st.server_count[r] += st.buffer_count[j]
            record(traffic.client, c2, traffic.server, 0, r, UPLOAD, scalars, bps)
    ld = cholesky_logdet(st.server[r, :d, :d], p.lam, work.L)
    inverse_from_cholesky(work.L, work.inv)
    for j in range(base, base + io.allocated[r]):  # ... and downloads V_g (in any order: each writes its own row)
        c2 = io.client_of[j]
        if st.registered[j]:
            pol.G[j] = st.server[r]
            pol.count[j] = st.server_count[r]
            pol.inv[j] = work.inv
            pol.logdet[j] = ld
            pol.since_refactor[j] = 0
            pol.stale[j] = False
            st.synced_logdet[j] = ld
            st.buffer[j] = 0.0
            st.buffer_count[j] = 0
            st.steps_since_sync[j] = 0
            record(traffic.server, 0, traffic.client, c2, r, DOWNLOAD, scalars, bps)
    st.sync_rounds[r] += 1


def _replicate(r, io, p, pol, st, cfg, traffic, own):
    """Replicate ``r``'s steps: each client acts on its own statistics, then ``trigger`` (bound by
    :func:`compiled_loop`) says whether all of them synchronise."""
    S = io.clients.shape[1]
    d = pol.inv.shape[1]
    Ax = np.empty(d)
    work = Factor(np.empty((d, d)), np.empty((d, d)))
    s = io.pos[r]
    io.event[r] = 0
    while s < S:
        row = io.row_of[r * cfg.num_clients + io.clients[r, s]]
        st.registered[row] = True
        if not act(r, s, row, io, p, pol, st, Ax):
            io.event[r] = -1
            break
        st.steps_since_sync[row] += 1
        s += 1
        if not trigger(r, row, pol, st, own):  # noqa: F821 - a global of each copy (compiled_loop)
            continue
        if cfg.stop_at_comm:  # the channel transforms payloads: the protocol syncs in Python
            io.event[r] = 1
            break
        sync_all(r, io, p, pol, st, cfg, traffic, work)
    io.pos[r] = s


@functools.cache
def compiled_loop(trigger: Callable[..., bool]) -> tuple[Callable[..., None], Callable[..., None]]:
    """The loop with ``trigger`` (a plain Python function) compiled into it: (serial, parallel over replicates),
    called as ``kernel(replicates, io, p, pol, st, cfg, traffic, own)``.

    The copy's name carries a digest of the trigger's code, so that numba's cache never hands back a loop compiled
    with an older trigger (as everywhere in numba, a change in a function the trigger calls is not seen).
    """
    tag = f"_{trigger.__name__}_{hashlib.sha1(marshal.dumps(trigger.__code__)).hexdigest()[:12]}"
    replicate = jit(renamed(_replicate, tag, trigger=jit(trigger, inline=True)))
    return over_replicates(replicate, name=f"_run{tag}")
