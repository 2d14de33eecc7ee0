"""Step loops of the star-network protocols (Async-LinUCB Algorithms 1–2, Sync-LinUCB Algorithm 4).

One call plays the steps ``pos[r] ≤ s < S`` of every replicate ``r`` (``prange``: replicates are independent),
in place on the protocol's buffers. With ``stop_at_comm`` a replicate stops where a communication is due and
reports it in ``event`` (1: the step at ``pos[r] − 1`` triggered an upload / sync; 2: the client at ``pos[r]``
registers and is due a download), so that the protocol carries it out through its channel in Python; otherwise
communication happens inline and is counted straight into the ledger's arrays. ``event[r] = -1`` reports a
Gram matrix that lost positive definiteness (only a channel that corrupts payloads can cause it).

Ledger arrays are ``(R, endpoints, kinds, 2, 3)``: kind, side (sent, received), unit (messages, scalars, bytes).
"""
from __future__ import annotations

import numpy as np

from fedrec.jit import jit, parallel_variant, prange
from fedrec.protocols.kernels.linalg import cholesky_logdet, inverse_from_cholesky, refactor_row
from fedrec.protocols.kernels.linear import P_LAM, add_outer, choose, update

UPLOAD, DOWNLOAD = 0, 1


@jit
def record(sent: np.ndarray, sender: int, received: np.ndarray, receiver: int, r: int, kind: int, scalars: int,
           bytes_per_scalar: int) -> None:
    """Count one message of ``kind`` from ``sender`` to ``receiver`` in replicate ``r``."""
    sent[r, sender, kind, 0, 0] += 1
    sent[r, sender, kind, 0, 1] += scalars
    sent[r, sender, kind, 0, 2] += scalars * bytes_per_scalar
    received[r, receiver, kind, 1, 0] += 1
    received[r, receiver, kind, 1, 1] += scalars
    received[r, receiver, kind, 1, 2] += scalars * bytes_per_scalar


@jit
def _act(r, s, row, ctx, rew, arms, Ax, kind, params, seed, G, inv, logdet, count, since, stale, draws, buffer,
         buffer_count, pending, pending_count, refresh) -> bool:
    """Client row ``row`` plays step ``s`` of replicate ``r``: decide, update its statistics and upload buffer.

    A stale row is refactorised first (``refresh``: the paper's client) or absorbs its pending downloads with
    this update (the authors' client). Returns False if a Gram matrix lost positive definiteness.
    """
    lam = params[P_LAM]
    if refresh and stale[row] and not refactor_row(G, inv, logdet, since, stale, row, lam):
        return False
    a = choose(kind, params, seed, row, G, inv, logdet, count, draws, ctx[r, s], Ax)
    arms[r, s] = a
    x = ctx[r, s, a]
    y = rew[r, s, a]
    if not refresh and stale[row]:  # absorb the pending downloads with this update, then refactorise
        G[row] += pending[row]
        pending[row] = 0.0
        add_outer(G[row], x, y)
        count[row] += 1 + pending_count[row]
        pending_count[row] = 0
        ok = refactor_row(G, inv, logdet, since, stale, row, lam)
    else:
        ok = update(params, row, x, y, Ax, G, inv, logdet, count, since, stale)
    if not ok:
        return False
    add_outer(buffer[row], x, y)
    buffer_count[row] += 1
    return True


@jit
def _download(r, j, c, refresh, G, count, stale, buffer, synced_logdet, synced_count, pending, pending_count, server,
              server_count, server_logdet, t_client, t_server, scalars, bps):
    """Client ``c`` (row ``j``) takes ΔV_{−j} = V_g − S_j (S_j = V_j − ΔV_j): Eq. (4)'s download."""
    n = G.shape[1]
    for a in range(n):
        for b in range(n):
            if refresh:
                G[j, a, b] += server[r, a, b] - (G[j, a, b] - buffer[j, a, b])
            else:  # the authors' client: the data enters with its next own update
                pending[j, a, b] += server[r, a, b] - (G[j, a, b] + pending[j, a, b] - buffer[j, a, b])
    if refresh:
        count[j] += server_count[r] - synced_count[j]
    else:
        pending_count[j] += server_count[r] - synced_count[j]
    synced_count[j] = server_count[r]
    synced_logdet[j] = server_logdet[r]
    stale[j] = True
    record(t_server, 0, t_client, c, r, DOWNLOAD, scalars, bps)


def _async_run(clients, ctx, rew, arms, pos, event, row_of, N, kind, params, seed,
              G, inv, logdet, count, since, stale, draws,
              buffer, buffer_count, synced_logdet, synced_count, registered, pending, pending_count,
              server, server_count, server_logdet, t_client, t_server, scalars, bps,
              log_gu, log_gd, to_uploader, check_on_register, refresh, stop_at_comm):
    """Async-LinUCB (Algorithm 2 with Algorithm 1 after every step); see the module docstring for the contract."""
    R, S = clients.shape
    d = inv.shape[1]
    lam = params[P_LAM]
    for r in prange(R):
        Ax = np.empty(d)
        L = np.empty((d, d))
        s = pos[r]
        event[r] = 0
        while s < S:
            c = clients[r, s]
            row = row_of[r * N + c]
            if not registered[row]:
                if check_on_register and server_logdet[r] - synced_logdet[row] > log_gd:
                    if stop_at_comm:
                        event[r] = 2
                        break
                    _download(r, row, c, refresh, G, count, stale, buffer, synced_logdet, synced_count, pending,
                              pending_count, server, server_count, server_logdet, t_client, t_server, scalars, bps)
                registered[row] = True
            if not _act(r, s, row, ctx, rew, arms, Ax, kind, params, seed, G, inv, logdet, count, since, stale, draws,
                        buffer, buffer_count, pending, pending_count, refresh):
                event[r] = -1
                break
            s += 1
            if not logdet[row] - synced_logdet[row] > log_gu:  # Eq. (3)
                continue
            if stop_at_comm:
                event[r] = 1
                break
            # upload: V_g += ΔV_i, S_i = V_i
            server[r] += buffer[row]
            server_count[r] += buffer_count[row]
            record(t_client, c, t_server, 0, r, UPLOAD, scalars, bps)
            synced_logdet[row] = logdet[row]
            synced_count[row] += buffer_count[row]
            buffer[row] = 0.0
            buffer_count[row] = 0
            server_logdet[r] = cholesky_logdet(server[r, :d, :d], lam, L)
            for c2 in range(N):  # Eq. (4) for every registered client
                j = row_of[r * N + c2]
                if registered[j] and (to_uploader or j != row) and server_logdet[r] - synced_logdet[j] > log_gd:
                    _download(r, j, c2, refresh, G, count, stale, buffer, synced_logdet, synced_count, pending,
                              pending_count, server, server_count, server_logdet, t_client, t_server, scalars, bps)
        pos[r] = s


def _sync_run(clients, ctx, rew, arms, pos, event, row_of, N, kind, params, seed,
             G, inv, logdet, count, since, stale, draws,
             buffer, buffer_count, synced_logdet, registered, steps_since_sync, sync_rounds,
             server, server_count, t_client, t_server, scalars, bps, threshold, stop_at_comm):
    """Sync-LinUCB (Algorithm 4): a global sync of all registered clients when Δt_i · log det ratio > D."""
    R, S = clients.shape
    d = inv.shape[1]
    lam = params[P_LAM]
    for r in prange(R):
        Ax = np.empty(d)
        L = np.empty((d, d))
        inv_g = np.empty((d, d))
        s = pos[r]
        event[r] = 0
        while s < S:
            c = clients[r, s]
            row = row_of[r * N + c]
            registered[row] = True
            if not _act(r, s, row, ctx, rew, arms, Ax, kind, params, seed, G, inv, logdet, count, since, stale, draws,
                        buffer, buffer_count, buffer, buffer_count, True):
                event[r] = -1
                break
            steps_since_sync[row] += 1
            s += 1
            if not steps_since_sync[row] * (logdet[row] - synced_logdet[row]) > threshold:
                continue
            if stop_at_comm:
                event[r] = 1
                break
            for c2 in range(N):  # every registered client uploads its buffer ...
                j = row_of[r * N + c2]
                if registered[j]:
                    server[r] += buffer[j]
                    server_count[r] += buffer_count[j]
                    record(t_client, c2, t_server, 0, r, UPLOAD, scalars, bps)
            ld = cholesky_logdet(server[r, :d, :d], lam, L)
            inverse_from_cholesky(L, inv_g)
            for c2 in range(N):  # ... and downloads V_g (factorised once)
                j = row_of[r * N + c2]
                if registered[j]:
                    G[j] = server[r]
                    count[j] = server_count[r]
                    inv[j] = inv_g
                    logdet[j] = ld
                    since[j] = 0
                    stale[j] = False
                    synced_logdet[j] = ld
                    buffer[j] = 0.0
                    buffer_count[j] = 0
                    steps_since_sync[j] = 0
                    record(t_server, 0, t_client, c2, r, DOWNLOAD, scalars, bps)
            sync_rounds[r] += 1
        pos[r] = s


#: (serial, parallel over replicates)
ASYNC_RUN = (jit(_async_run), jit(parallel_variant(_async_run), parallel=True))


#: (serial, parallel over replicates)
SYNC_RUN = (jit(_sync_run), jit(parallel_variant(_sync_run), parallel=True))
