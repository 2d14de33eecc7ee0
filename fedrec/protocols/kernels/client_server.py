"""Step loop of Async-LinUCB (Algorithms 1–2) and the local step that the star-network loops share.

One call plays the steps ``pos[r] ≤ s < S`` of every replicate ``r`` (``prange``: replicates are independent),
in place on the protocol's buffers, which it receives as named structures (:class:`Steps`, the policy's
:class:`~fedrec.protocols.kernels.linear.LinearParams` and :class:`~fedrec.protocols.kernels.linear.PolicyRows`,
the protocol's state and settings, :class:`Traffic`). With ``stop_at_comm`` a replicate stops where a communication
is due and reports it in ``event`` (1: the step at ``pos[r] − 1`` triggered an upload / sync; 2: the client at
``pos[r]`` registers and is due a download), so that the protocol carries it out through its channel in Python;
otherwise communication happens inline and is counted straight into the ledger's arrays. ``event[r] = -1`` reports a
Gram matrix that lost positive definiteness (only a channel that corrupts payloads can cause it).

Messages are counted by :func:`~fedrec.protocols.kernels.ledger.record` into the ledger's traffic arrays.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedrec.federation.ledger import DOWNLOAD, UPLOAD
from fedrec.protocols.kernels.ledger import record
from fedrec.protocols.kernels.linalg import cholesky_logdet
from fedrec.protocols.kernels.linear import add_outer, choose, refactor, update
from fedrec.utils.jit import BOOL, F64, I64, jit, over_replicates


class Steps(NamedTuple):
    """A block of steps, where each replicate stands in it, and the clients' state rows."""

    clients: I64[2]  #: (R, S) the acting client of each step
    contexts: F64[4]  #: (R, S, K, d)
    rewards: F64[3]  #: (R, S, K)
    arms: I64[2]  #: (R, S) the decisions, written by the kernel
    pos: I64[1]  #: (R,) the next step of each replicate
    event: I64[1]  #: (R,) why a replicate stopped (module docstring)
    row_of: I64[1]  #: (R·N,) replicate × client → state row (its slot)
    client_of: I64[1]  #: (R·cap,) slot → client (replicate r owns slots r·cap … r·cap + cap − 1)
    allocated: I64[1]  #: (R,) slots in use in each replicate


class Traffic(NamedTuple):
    """The ledger's traffic arrays of the star network: (R, endpoints, kinds, sides, units) per role."""

    client: I64[5]
    server: I64[5]


class AsyncState(NamedTuple):
    """Async-LinUCB's own state (:class:`fedrec.protocols.AsyncLinUCB`'s buffers of the same names)."""

    buffer: F64[3]  #: (R·N, d+1, d+1) the upload buffers [ΔV_i, Δb_i]
    buffer_count: I64[1]  #: observations in each upload buffer
    synced_logdet: F64[1]  #: log det S_i(λ) of each client's last synchronised copy S_i = V_i − ΔV_i
    synced_count: I64[1]  #: observations in S_i
    registered: BOOL[1]  #: clients that have acted (Algorithm 1)
    pending: F64[3]  #: downloads waiting for the client's next own update (the authors' client)
    pending_count: I64[1]  #: observations in ``pending``
    server: F64[3]  #: (R, d+1, d+1) the server aggregate [V_g, b_g]
    server_count: I64[1]  #: observations in the server aggregate
    server_logdet: F64[1]  #: log det V_g(λ)


class AsyncSettings(NamedTuple):
    """Async-LinUCB's settings (:class:`fedrec.protocols.AsyncLinUCB`'s attributes of the same names)."""

    num_clients: int
    message_scalars: int  #: scalars in one {ΔV, Δb} message
    bytes_per_scalar: int
    log_gamma_u: float  #: log γ_U of Eq. (3)
    log_gamma_d: float  #: log γ_D of Eq. (4)
    download_to_uploader: bool
    check_on_register: bool
    refresh_on_download: bool
    stop_at_comm: bool  #: stop where a message is due, for the channel to carry it in Python


@jit(inline=True)
def act(r, s, row, io, p, pol, st, Ax) -> bool:
    """Client row ``row`` plays step ``s`` of replicate ``r`` (the paper's client): refactorise the row if a download
    left it stale, decide, update its statistics and its upload buffer (``st.buffer``, ``st.buffer_count``).
    Returns False if a Gram matrix lost positive definiteness."""
    if pol.stale[row] and not refactor(pol, row, p.lam):
        return False
    a = choose(p, pol, row, io.contexts[r, s], Ax)
    io.arms[r, s] = a
    x = io.contexts[r, s, a]
    y = io.rewards[r, s, a]
    if not update(p, pol, row, x, y, Ax):
        return False
    add_outer(st.buffer[row], x, y)
    st.buffer_count[row] += 1
    return True


@jit(inline=True)
def act_absorbing(r, s, row, io, p, pol, st, Ax) -> bool:
    """:func:`act` of the authors' client whose row downloads left stale: it decides on its last factorisation,
    then absorbs the pending downloads (``st.pending``, ``st.pending_count``) with this update and refactorises."""
    a = choose(p, pol, row, io.contexts[r, s], Ax)
    io.arms[r, s] = a
    x = io.contexts[r, s, a]
    y = io.rewards[r, s, a]
    pol.G[row] += st.pending[row]
    st.pending[row] = 0.0
    add_outer(pol.G[row], x, y)
    pol.count[row] += 1 + st.pending_count[row]
    st.pending_count[row] = 0
    if not refactor(pol, row, p.lam):
        return False
    add_outer(st.buffer[row], x, y)
    st.buffer_count[row] += 1
    return True


@jit
def _download(r, j, c, pol, st, cfg, traffic):
    """Client ``c`` (row ``j``) takes ΔV_{−j} = V_g − S_j (S_j = V_j − ΔV_j): Eq. (4)'s download."""
    G, buffer, pending, server = pol.G, st.buffer, st.pending, st.server
    n = G.shape[1]
    for a in range(n):
        for b in range(n):
            if cfg.refresh_on_download:
                G[j, a, b] += server[r, a, b] - (G[j, a, b] - buffer[j, a, b])
            else:  # the authors' client: the data enters with its next own update
                pending[j, a, b] += server[r, a, b] - (G[j, a, b] + pending[j, a, b] - buffer[j, a, b])
    if cfg.refresh_on_download:
        pol.count[j] += st.server_count[r] - st.synced_count[j]
    else:
        st.pending_count[j] += st.server_count[r] - st.synced_count[j]
    st.synced_count[j] = st.server_count[r]
    st.synced_logdet[j] = st.server_logdet[r]
    pol.stale[j] = True
    record(traffic.server, 0, traffic.client, c, r, DOWNLOAD, cfg.message_scalars, cfg.bytes_per_scalar)


@jit
def _async_replicate(r, io, p, pol, st, cfg, traffic):
    """Async-LinUCB (Algorithm 2 with Algorithm 1 after every step) in replicate ``r``; see the module docstring."""
    S = io.clients.shape[1]
    N = cfg.num_clients
    cap = io.client_of.shape[0] // io.clients.shape[0]
    d = pol.inv.shape[1]
    Ax = np.empty(d)
    L = np.empty((d, d))
    s = io.pos[r]
    io.event[r] = 0
    while s < S:
        c = io.clients[r, s]
        row = io.row_of[r * N + c]
        if not st.registered[row]:
            if cfg.check_on_register and st.server_logdet[r] - st.synced_logdet[row] > cfg.log_gamma_d:
                if cfg.stop_at_comm:
                    io.event[r] = 2
                    break
                _download(r, row, c, pol, st, cfg, traffic)
            st.registered[row] = True
        if cfg.refresh_on_download or not pol.stale[row]:
            ok = act(r, s, row, io, p, pol, st, Ax)
        else:  # the authors' client: the downloads enter with this update
            ok = act_absorbing(r, s, row, io, p, pol, st, Ax)
        if not ok:
            io.event[r] = -1
            break
        s += 1
        if not pol.logdet[row] - st.synced_logdet[row] > cfg.log_gamma_u:  # Eq. (3)
            continue
        if cfg.stop_at_comm:
            io.event[r] = 1
            break
        # upload: V_g += ΔV_i, S_i = V_i
        st.server[r] += st.buffer[row]
        st.server_count[r] += st.buffer_count[row]
        record(traffic.client, c, traffic.server, 0, r, UPLOAD, cfg.message_scalars, cfg.bytes_per_scalar)
        st.synced_logdet[row] = pol.logdet[row]
        st.synced_count[row] += st.buffer_count[row]
        st.buffer[row] = 0.0
        st.buffer_count[row] = 0
        st.server_logdet[r] = cholesky_logdet(st.server[r, :d, :d], p.lam, L)
        base = r * cap
        for j in range(base, base + io.allocated[r]):  # Eq. (4) for every registered client
            c2 = io.client_of[j]
            if st.registered[j] and (cfg.download_to_uploader or j != row) \
                    and st.server_logdet[r] - st.synced_logdet[j] > cfg.log_gamma_d:
                _download(r, j, c2, pol, st, cfg, traffic)
    io.pos[r] = s


#: (serial, parallel over replicates), called as ``kernel(replicates, io, p, pol, st, cfg, traffic)``
ASYNC_RUN = over_replicates(_async_replicate)
