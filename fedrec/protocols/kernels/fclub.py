"""Step loop of the FCLUB family within one phase (spec fclub.md §2.2, Algorithms 1, 3–5).

Every replicate plays its steps in order: the arriving user's local cluster recommends from its synchronised
statistics (S, u), the user's own statistics and the cluster's upload buffer take the observation, and the
upload (eq. 5) and download (eq. 6) triggers move buffers to the global cluster and back. Phase starts (Alg. 2)
run in Python between calls. Messages are counted straight into the ledger's traffic arrays.
"""
from __future__ import annotations

import numpy as np

from fedrec.jit import jit, parallel_variant, prange
from fedrec.protocols.kernels.clustering import (
    P_LOG_D, P_LOG_U, P_PRIVATE, P_RHO, P_SCALARS, P_SIGMA_NODE, P_SQUARED, beta, ucb_pick,
)
from fedrec.privacy.tree_noise import SYMMETRIC, prefix_noise
from fedrec.protocols.kernels.linalg import cholesky_logdet, inverse_from_cholesky


@jit
def release(key: np.uint64, uid: int, calls: int, sigma: float, d: int, N: np.ndarray, Z: np.ndarray) -> None:
    """Alg. 5's release number ``calls`` of privatiser ``uid`` (its tree stream under ``key``) into N ((d+1) ×
    (d+1), ``Z`` scratch of that shape): the binary mechanism's prefix noise with symmetric Gaussian nodes
    σ(Z + Zᵀ)/√2, regenerated from the key (:func:`fedrec.privacy.tree_noise.prefix_noise`)."""
    width = (d + 1) * (d + 1)
    prefix_noise(np.uint64(key), uid, calls, SYMMETRIC, sigma, N.reshape(width), Z.reshape(width))


@jit
def refresh(S: np.ndarray, inv: np.ndarray, logdet: np.ndarray, c: int, L: np.ndarray) -> None:
    """Cache S[c]'s inverse and log-determinant (NaN log-det and a zero inverse while S[c] is singular)."""
    ld = cholesky_logdet(S[c], 0.0, L)
    logdet[c] = ld
    if np.isnan(ld):
        inv[c] = 0.0
    else:
        inverse_from_cholesky(L, inv[c])


@jit
def count(traffic_server: np.ndarray, traffic_global: np.ndarray, r: int, server: int, kind: int,
          scalars: float) -> None:
    """One message between local server ``server`` and the global server: kind 0 uploads, 1 downloads."""
    n = int(scalars)
    side_server = 0 if kind == 0 else 1  # an upload is sent by the local server, a download received
    for unit, amount in ((0, 1), (1, n), (2, 8 * n)):
        traffic_server[r, server, kind, side_server, unit] += amount
        traffic_global[r, 0, kind, 1 - side_server, unit] += amount


@jit
def next_buffer(params: np.ndarray, key: np.uint64, r: int, c: int, puid: np.ndarray, pcalls: np.ndarray, H: np.ndarray,
                h: np.ndarray, Hbar: np.ndarray, hbar: np.ndarray, dS: np.ndarray, du: np.ndarray,
                N: np.ndarray, Z: np.ndarray) -> None:
    """Restart local cluster c's upload buffer: 0, or 3ρI + H − H̄ with the privatiser's next release (Alg. 3 l.9–10)."""
    d = dS.shape[-1]
    if params[P_PRIVATE] == 0.0:
        dS[r, c] = 0.0
        du[r, c] = 0.0
        return
    Hbar[r, c] = H[r, c]
    hbar[r, c] = h[r, c]
    pcalls[r, c] += 1
    release(key, puid[r, c], pcalls[r, c], params[P_SIGMA_NODE], d, N, Z)
    for i in range(d):
        h[r, c, i] = N[i, d]
        for j in range(d):
            H[r, c, i, j] = N[i, j]
    for i in range(d):
        du[r, c, i] = h[r, c, i] - hbar[r, c, i]
        for j in range(d):
            dS[r, c, i, j] = H[r, c, i, j] - Hbar[r, c, i, j] + (3.0 * params[P_RHO] if i == j else 0.0)


def _phase_run(users, ctx, rew, arms, params, t0, key, server, lc, gk, mem, nmem, V, bu, Tu,
               S, u, Tc, Sinv, Slogdet, dS, du, dT, dSm, dum, dTm, Sg, ug, Tg, Sglogdet,
               H, h, Hbar, hbar, puid, pcalls, traffic_server, traffic_global):
    """Play ``users`` (R, S) within one phase, from round ``t0`` + 1 (Alg. 1 l.9–15 with Algorithms 3 and 4)."""
    R, St = users.shape
    K, d = ctx.shape[2], ctx.shape[3]
    for r in prange(R):
        L = np.zeros((d, d))
        M = np.zeros((d, d))
        N = np.zeros((d + 1, d + 1))
        Z = np.zeros((d + 1, d + 1))
        theta = np.zeros(d)
        scores = np.zeros(K)
        for s in range(St):
            i = users[r, s]
            c = lc[r, i]
            k = gk[r, c]
            members = nmem[r, k]
            b = beta(params, Tc[r, c], members, d, t0 + s + 1)
            a = ucb_pick(ctx[r, s], Sinv[r, c], u[r, c], b, params[P_SQUARED] != 0.0, theta, scores)
            arms[r, s] = a
            y = rew[r, s, a]
            x = ctx[r, s, a]
            # the user's own statistics (Alg. 1 l.13) and the cluster's upload buffer (Alg. 3 l.1)
            for p in range(d):
                bu[r, i, p] += y * x[p]
                du[r, c, p] += y * x[p]
                for q in range(d):
                    V[r, i, p, q] += x[p] * x[q]
                    dS[r, c, p, q] += x[p] * x[q]
            Tu[r, i] += 1.0
            dT[r, c] += 1.0
            # Alg. 3: upload when det(S + ΔS) / det(S) ≥ U
            fire = params[P_LOG_U] <= 0.0
            if not fire and not np.isnan(Slogdet[r, c]):
                for p in range(d):
                    for q in range(d):
                        M[p, q] = S[r, c, p, q] + dS[r, c, p, q]
                ld = cholesky_logdet(M, 0.0, L)
                fire = (not np.isnan(ld)) and ld - Slogdet[r, c] >= params[P_LOG_U]
            if fire:
                count(traffic_server, traffic_global, r, server[i], 0, params[P_SCALARS])
                for m in range(nmem[r, k]):
                    o = mem[r, k, m]
                    if o != c:
                        dSm[r, o] += dS[r, c]
                        dum[r, o] += du[r, c]
                        dTm[r, o] += dT[r, c]
                Sg[r, k] += dS[r, c]
                ug[r, k] += du[r, c]
                Tg[r, k] += dT[r, c]
                S[r, c] += dS[r, c]
                u[r, c] += du[r, c]
                Tc[r, c] += dT[r, c]
                dT[r, c] = 0.0
                next_buffer(params, key, r, c, puid, pcalls, H, h, Hbar, hbar, dS, du, N, Z)
                refresh(S[r], Sinv[r], Slogdet[r], c, L)
                Sglogdet[r, k] = cholesky_logdet(Sg[r, k], 0.0, L)
            # Alg. 4: every member lagging the global cluster by det ratio ≥ D downloads its queue
            for m in range(nmem[r, k]):
                o = mem[r, k, m]
                fire = params[P_LOG_D] <= 0.0
                if not fire and not (np.isnan(Slogdet[r, o]) or np.isnan(Sglogdet[r, k])):
                    fire = Sglogdet[r, k] - Slogdet[r, o] >= params[P_LOG_D]
                if fire:
                    count(traffic_server, traffic_global, r, server[o], 1, params[P_SCALARS])  # slot o = its smallest user
                    S[r, o] += dSm[r, o]
                    u[r, o] += dum[r, o]
                    Tc[r, o] += dTm[r, o]
                    dSm[r, o] = 0.0
                    dum[r, o] = 0.0
                    dTm[r, o] = 0.0
                    refresh(S[r], Sinv[r], Slogdet[r], o, L)


#: (serial, parallel over replicates)
PHASE_RUN = (jit(_phase_run), jit(parallel_variant(_phase_run), parallel=True))
