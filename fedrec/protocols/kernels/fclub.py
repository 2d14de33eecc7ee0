"""Step loop of the FCLUB family within one phase (Liu et al., UAI 2022, Algorithms 1, 3–5).

Every replicate plays its steps in order: the arriving user's local cluster recommends from its synchronised
statistics (S, u), the user's own statistics and the cluster's upload buffer take the observation, and the
upload (eq. 5) and download (eq. 6) triggers move buffers to the global cluster and back. Under CDP every upload
draws the privatiser's next release, which restarts the buffer (Alg. 3) or, with ``trigger_noise`` (the authors'
code), only enters the next upload test. Phase starts (Alg. 2) run in Python between calls. Messages are
counted straight into the ledger's traffic arrays (:func:`~fedrec.protocols.kernels.ledger.record`).

The loop takes the protocol's buffers as named structures (:class:`fedrec.protocols.FederatedClustering`'s
buffers of the same names): :class:`Partition`, :class:`Users`, :class:`Clusters` (with each local cluster's
privatiser), and its settings (:class:`PhaseSettings`, :class:`~fedrec.protocols.kernels.clustering.ClusterParams`) and
:class:`Traffic`. Local cluster slots are their smallest user's id, global cluster slots their smallest local slot.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedrec.federation.ledger import DOWNLOAD, UPLOAD
from fedrec.privacy.tree_noise import SYMMETRIC, prefix_noise
from fedrec.protocols.kernels.clustering import beta, ucb_pick
from fedrec.protocols.kernels.ledger import record
from fedrec.protocols.kernels.linalg import cholesky_logdet, inverse_from_cholesky
from fedrec.utils.jit import F64, I64, jit, over_replicates


class Partition(NamedTuple):
    """Who belongs where: users to local clusters, local to global clusters (replicate first)."""

    server: I64[1]  #: (n,) each user's local server (fixed)
    lc: I64[2]  #: (R, n) each user's local cluster slot
    gk: I64[2]  #: (R, n) each local slot's global cluster slot
    mem: I64[3]  #: (R, n, n) the local slots of each global cluster, the first ``nmem`` of them
    nmem: I64[2]  #: (R, n) local clusters per global cluster (0: no global cluster at this slot)


class Users(NamedTuple):
    """Each user's own statistics (Alg. 1 l.13): V_i, b_i and T_i."""

    V: F64[4]
    bu: F64[3]
    Tu: F64[2]


class Clusters(NamedTuple):
    """Per local cluster slot its synchronised statistics, upload buffer, download queue and privatiser (Alg. 3–5),
    and per global cluster slot its sums; the log-determinants are NaN while a matrix is singular or unused."""

    S: F64[4]  #: synchronised Gram matrix S_c
    u: F64[3]
    Tc: F64[2]
    Sinv: F64[4]  #: S_c⁻¹ (0 while singular)
    Slogdet: F64[2]
    dS: F64[4]  #: upload buffer ΔS_c (with the privatiser's noise and 3ρI shift under CDP)
    du: F64[3]
    dT: F64[2]
    dSm: F64[4]  #: download queue ΔS_c⁻: what other members uploaded since c's last download
    dum: F64[3]
    dTm: F64[2]
    Sg: F64[4]  #: global cluster sums S^g_k
    ug: F64[3]
    Tg: F64[2]
    Sglogdet: F64[2]
    puid: I64[2]  #: the privatiser's tree stream (Alg. 5)
    pcalls: I64[2]  #: its releases so far
    H: F64[4]  #: its latest release's Gram part
    h: F64[3]
    Hbar: F64[4]  #: the release before it
    hbar: F64[3]


class PhaseSettings(NamedTuple):
    """FCLUB's own settings (:class:`fedrec.protocols.FederatedClustering`'s attributes of the same names)."""

    log_u: float  #: ln U of eq. 5 (≤ 0: upload every round)
    log_d: float  #: ln D of eq. 6
    private: bool  #: CDP: every upload draws the privatiser's next release
    trigger_noise: bool  #: CDP's noise enters only the upload trigger; the buffers restart clean
    rho: float  #: ρ of the 3ρI shift of a fresh buffer
    sigma_node: float  #: σ of the privatisers' tree nodes
    message_scalars: int  #: scalars in one (ΔS, Δu, ΔT) or (S, u, T) message
    noise_key: np.uint64  #: the key of the privatisers' tree noise


class Traffic(NamedTuple):
    """The ledger's traffic arrays, (R, endpoints, kinds, sides, units): the local servers' and the global
    server's."""

    server: I64[5]
    global_server: I64[5]


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
def count(traffic: Traffic, r: int, server: int, kind: int, scalars: int, itemsize: int) -> None:
    """One message of ``kind`` (``UPLOAD`` or ``DOWNLOAD``) between local server ``server`` and the global server,
    of ``scalars`` scalars of ``itemsize`` bytes each."""
    if kind == UPLOAD:
        record(traffic.server, server, traffic.global_server, 0, r, UPLOAD, scalars, itemsize)
    else:
        record(traffic.global_server, 0, traffic.server, server, r, DOWNLOAD, scalars, itemsize)


@jit
def next_buffer(cfg: PhaseSettings, r: int, c: int, cl: Clusters, N: np.ndarray, Z: np.ndarray) -> None:
    """Restart local cluster c's upload buffer: 0, or 3ρI + H − H̄ with the privatiser's next release (Alg. 3 l.9–10);
    with ``trigger_noise`` the release is drawn but the buffer restarts at 0 (the trigger adds H − H̄ itself)."""
    d = cl.dS.shape[-1]
    if cfg.private:
        cl.Hbar[r, c] = cl.H[r, c]
        cl.hbar[r, c] = cl.h[r, c]
        cl.pcalls[r, c] += 1
        release(cfg.noise_key, cl.puid[r, c], cl.pcalls[r, c], cfg.sigma_node, d, N, Z)
        for i in range(d):
            cl.h[r, c, i] = N[i, d]
            for j in range(d):
                cl.H[r, c, i, j] = N[i, j]
    if not cfg.private or cfg.trigger_noise:
        cl.dS[r, c] = 0.0
        cl.du[r, c] = 0.0
        return
    for i in range(d):
        cl.du[r, c, i] = cl.h[r, c, i] - cl.hbar[r, c, i]
        for j in range(d):
            cl.dS[r, c, i, j] = cl.H[r, c, i, j] - cl.Hbar[r, c, i, j] + (3.0 * cfg.rho if i == j else 0.0)


@jit
def noisy_trigger(M: np.ndarray, H: np.ndarray, Hbar: np.ndarray, logdet_s: float, log_u: float) -> bool:
    """The authors' upload trigger: det(S + ΔS + H − H̄) / det(S) ≥ U with ``M`` = S + ΔS (overwritten) and
    the privatiser's last two releases; like their determinant ratio it fires on a noisy matrix that is indefinite
    but has a positive determinant, and never on a non-positive one."""
    M += H - Hbar
    sign, logdet = np.linalg.slogdet(M)
    return sign > 0.0 and logdet - logdet_s >= log_u


@jit
def _phase_replicate(r, io, p, cfg, part, users, cl, traffic):
    """Replicate ``r`` plays its steps of the block ``io`` (Alg. 1 l.9–15 with Algorithms 3 and 4)."""
    arrivals, contexts, rewards, arms = io.users, io.contexts, io.rewards, io.arms
    server, lc, gk, mem, nmem = part.server, part.lc, part.gk, part.mem, part.nmem
    V, bu, Tu = users.V, users.bu, users.Tu
    S, u, Tc, Sinv, Slogdet, dS, du, dT = cl.S, cl.u, cl.Tc, cl.Sinv, cl.Slogdet, cl.dS, cl.du, cl.dT
    dSm, dum, dTm, Sg, ug, Tg, Sglogdet = cl.dSm, cl.dum, cl.dTm, cl.Sg, cl.ug, cl.Tg, cl.Sglogdet
    St = arrivals.shape[1]
    K, d = contexts.shape[2], contexts.shape[3]
    L = np.zeros((d, d))
    M = np.zeros((d, d))
    N = np.zeros((d + 1, d + 1))
    Z = np.zeros((d + 1, d + 1))
    theta = np.zeros(d)
    scores = np.zeros(K)
    for s in range(St):
        i = arrivals[r, s]
        c = lc[r, i]
        k = gk[r, c]
        members = nmem[r, k]
        b = beta(p, Tc[r, c], members, d, io.t0 + s + 1)
        a = ucb_pick(contexts[r, s], Sinv[r, c], u[r, c], b, p.squared, theta, scores)
        arms[r, s] = a
        y = rewards[r, s, a]
        x = contexts[r, s, a]
        # the user's own statistics (Alg. 1 l.13) and the cluster's upload buffer (Alg. 3 l.1)
        for q1 in range(d):
            bu[r, i, q1] += y * x[q1]
            du[r, c, q1] += y * x[q1]
            for q2 in range(d):
                V[r, i, q1, q2] += x[q1] * x[q2]
                dS[r, c, q1, q2] += x[q1] * x[q2]
        Tu[r, i] += 1.0
        dT[r, c] += 1.0
        # Alg. 3: upload when det(S + ΔS) / det(S) ≥ U
        fire = cfg.log_u <= 0.0
        if not fire and not np.isnan(Slogdet[r, c]):
            for q1 in range(d):
                for q2 in range(d):
                    M[q1, q2] = S[r, c, q1, q2] + dS[r, c, q1, q2]
            if cfg.trigger_noise:
                fire = noisy_trigger(M, cl.H[r, c], cl.Hbar[r, c], Slogdet[r, c], cfg.log_u)
            else:
                ld = cholesky_logdet(M, 0.0, L)
                fire = (not np.isnan(ld)) and ld - Slogdet[r, c] >= cfg.log_u
        if fire:
            count(traffic, r, server[i], UPLOAD, cfg.message_scalars, dS.itemsize)
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
            next_buffer(cfg, r, c, cl, N, Z)
            refresh(S[r], Sinv[r], Slogdet[r], c, L)
            Sglogdet[r, k] = cholesky_logdet(Sg[r, k], 0.0, L)
        # Alg. 4: every member lagging the global cluster by det ratio ≥ D downloads its queue
        for m in range(nmem[r, k]):
            o = mem[r, k, m]
            fire = cfg.log_d <= 0.0
            if not fire and not (np.isnan(Slogdet[r, o]) or np.isnan(Sglogdet[r, k])):
                fire = Sglogdet[r, k] - Slogdet[r, o] >= cfg.log_d
            if fire:
                count(traffic, r, server[o], DOWNLOAD, cfg.message_scalars, S.itemsize)  # slot o: its smallest user
                S[r, o] += dSm[r, o]
                u[r, o] += dum[r, o]
                Tc[r, o] += dTm[r, o]
                dSm[r, o] = 0.0
                dum[r, o] = 0.0
                dTm[r, o] = 0.0
                refresh(S[r], Sinv[r], Slogdet[r], o, L)


#: (serial, parallel over replicates), called as ``kernel(replicates, io, p, cfg, part, users, cl, traffic)``
PHASE_RUN = over_replicates(_phase_replicate)
