"""FCLUB-DC, CDP-FCLUB-DC, FCLUB and Homo(-DC): federated online clustering of bandits (Liu et al., UAI 2022).

n users sit on L local servers (contiguous blocks of n/L, spec fclub.md §8.2). Time runs in phases: phase s starts
at round 2^s − 1 and lasts 2^s rounds (§2.2). At a phase start (Algorithm 2, here in Python) each server deletes the
edges of its user graph whose estimates drifted apart (eq. 3), uploads one aggregate per connected component (local
cluster), and the global server merges local clusters of different servers whose aggregates agree (eq. 4); when
the partition changed (and at the first phase) every local cluster is renewed with a copy of its global cluster's
sums. Within a phase (the compiled kernel) the arriving user's local cluster recommends from its synchronised
statistics, and the upload (eq. 5) and download (eq. 6) triggers exchange buffered increments with the global
cluster. With ``epsilon`` set, each local cluster's releases pass the tree-based privatiser of Algorithm 5, whose
noise and the 2ρI / 3ρI shifts reach the statistics used to recommend and merge (§8.5).

Local cluster slots are their smallest user's id and global cluster slots their smallest local slot, so a
partition is the pair of arrays (``lc``, ``gk``) and "the partition changed" is an array comparison.
"""
from __future__ import annotations

import math
import numpy as np
import torch

from fedrec.errors import ConfigError, check_float, check_int
from fedrec.privacy.tree import fclub_accounted_sigma, fclub_epsilon, fclub_node_sigma
from fedrec.protocols.base import StepProtocol, kernel_call
from fedrec.protocols.clustering import Radius, confidence_shape
from fedrec.protocols.kernels.clustering import (
    P_BASE, P_KAPPA, P_LOG_D, P_LOG_U, P_PRIVATE, P_RATIO, P_RHO, P_RHO_MAX, P_SCALARS, P_SIGMA_NODE,
)
from fedrec.protocols.kernels.fclub import PHASE_RUN, count, release
from fedrec.rng import stream_key


#: how CDP-FCLUB-DC's node noise is calibrated (see ``calibration``)
CALIBRATIONS = ("paper", "accountant")


class FederatedClustering(StepProtocol):
    """The FCLUB family on the v2 engine (state in buffers, compiled phase loop, ledger per local server).

    Args:
        num_clients, dim, replicates, seed: n users, d, batched runs, run seed.
        num_servers: L (users on contiguous blocks of n/L).
        upload_threshold, download_threshold: U and D (≥ 1; 1 communicates every round: FCLUB, Homo).
        conventions: ``paper`` or ``authors`` (:mod:`fedrec.protocols.clustering`): the bonus, λ and β recipe.
        lam: ridge λ of the user estimates and of the non-private aggregates (None: the convention's).
        delete_alpha, merge_alpha: α₁ and α₂ of eqs. 3–4.
        pooled: Homo(-DC): one local cluster per server, all in one global cluster, never split or merged.
        bonus: ``sqrt`` (the paper's UCB) or ``squared`` (β·xᵀS⁻¹x, the authors' code, §8.3); None: the convention's.
        beta: a fixed β, or None for the convention's recipe; ``beta_scale`` multiplies the recipe's.
        sigma0, alpha, clusters_bound: σ₀, the failure probability α and the m inside Lemma 1's log.
        epsilon, delta, horizon: CDP-FCLUB-DC when ``epsilon`` is set: the privatiser's (ε, δ) and the upload
            bound t_c = ``horizon`` that fixes the tree depth ν (§2.0). ``epsilon=inf`` runs the private code path
            with zero noise, ρ = κ = 0 and the λ ridge: FCLUB-DC decision for decision (spec §6 test 5).
        calibration: the node noise σ_N: ``paper`` (σ_N² = 64ν ln(2/δ)²/ε² per privatiser, Sec. 3) or
            ``accountant`` (the smallest σ_N whose run of ``horizon`` rounds, phases composed, spends at most
            (ε, δ) by :func:`fedrec.privacy.tree.fclub_epsilon`; ρ and κ rescaled with it). The paper's σ_N spends
            far less than ε at small ε and more than ε at large ε (≳ 16 at T = 10⁵) once phases compose.
    """

    max_agents_per_step = 1
    #: the phase loop has no torch path (yet): ``backend=torch`` is refused
    backends = ("compiled",)
    #: the kernels count messages straight into the ledger
    honours_channel = False

    def __init__(
        self, num_clients: int, dim: int, replicates: int = 1, seed: int = 0, num_servers: int = 5,
        upload_threshold: float = 1.01, download_threshold: float = 1.01, conventions: str = "paper",
        lam: float | None = None, delete_alpha: float = 1.5, merge_alpha: float = 2.0, pooled: bool = False,
        bonus: str | None = None, beta: float | None = None, beta_scale: float | None = None,
        sigma0: float | None = None, alpha: float = 0.1, clusters_bound: int = 4, epsilon: float | None = None,
        delta: float = 0.1, horizon: int = 100_000, calibration: str = "paper", backend: str = "auto",
    ) -> None:
        L = check_int("num_servers", num_servers)
        n = check_int("num_clients", num_clients)
        if L > n or n % L:
            raise ConfigError(f"num_servers must divide num_clients = {n} (contiguous blocks of n/L), got {L}")
        super().__init__(n, dim, replicates, seed, backend, {"server": L, "global": 1})
        self.num_servers = L
        self.U = check_float("upload_threshold", upload_threshold, low=1.0)
        self.D = check_float("download_threshold", download_threshold, low=1.0)
        self.delete_alpha = check_float("delete_alpha", delete_alpha, low=0.0, low_open=True)
        self.merge_alpha = check_float("merge_alpha", merge_alpha, low=0.0)
        self.pooled = bool(pooled)
        self.private = epsilon is not None
        self.radius = Radius.resolve(conventions, self.private, bonus, lam, sigma0, beta_scale, beta)
        self.lam = self.radius.lam
        d, R = self.dim, self.replicates
        if self.private:
            eps = check_float("epsilon", epsilon, low=0.0, low_open=True, allow_inf=True)
            dlt = check_float("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
            t_c = check_int("horizon", horizon)
        else:
            eps = dlt = t_c = None
        m = check_int("clusters_bound", clusters_bound)
        alpha = check_float("alpha", alpha, low=0.0, high=1.0, low_open=True)
        params = self.radius.params("fclub", d, L, m, alpha, synchronous=self.U == self.D == 1.0, horizon=t_c,
                                    epsilon=eps, delta=dlt)
        params[P_LOG_U] = math.log(self.U)
        params[P_LOG_D] = math.log(self.D)
        params[P_PRIVATE] = float(self.private)
        params[P_SCALARS] = d * d + d + 1  # (ΔS, Δu, ΔT) or (S, u, T)
        if self.private:
            if calibration not in CALIBRATIONS:
                raise ConfigError(f"calibration must be one of {list(CALIBRATIONS)}, got {calibration!r}")
            nu = math.ceil(math.log2(t_c + 1)) + 1
            rho = 8 * math.sqrt(2) * nu * math.log(4 / dlt) * (4 * math.sqrt(d) + 2 * math.log(2 * m * L / alpha)) / eps
            kappa = math.sqrt(2 * nu) * (math.sqrt(d) + 2 * math.log(2 * m * L / alpha)) / math.sqrt(2 * eps)
            sigma = fclub_node_sigma(eps, dlt, t_c) if rho > 0 else 0.0
            if calibration == "accountant" and rho > 0:  # ρ bounds ‖H‖ ∝ σ, κ ∝ ‖h‖/√ρ ∝ √σ: rescale both
                scale = fclub_accounted_sigma(eps, dlt, t_c, t_c) / sigma
                sigma, rho, kappa = sigma * scale, rho * scale, kappa * math.sqrt(scale)
            if math.isfinite(eps) and min(self.U, self.D) <= 1.0:
                raise ConfigError("upload_threshold and download_threshold must be > 1 with epsilon set "
                                  "(rho_max of Lemma 1 divides by ln min(U, D))")
            if self.radius.conventions == "paper" and rho > 0:  # Lemma 1's radius with the privatiser's bounds
                rho_max = 3 * rho + 3 * rho * d * math.log(t_c) / math.log(min(self.U, self.D))
                params[P_BASE], params[P_RATIO], params[P_RHO_MAX] = rho, rho_max / rho, rho_max
                params[P_KAPPA] = kappa
            params[P_RHO], params[P_SIGMA_NODE] = rho, sigma
            self.rho, self.epsilon, self.delta, self.nu, self.horizon = rho, eps, dlt, nu, t_c
        else:
            params[P_RHO] = params[P_SIGMA_NODE] = 0.0
        self.params = params
        self.server = np.arange(n) // (n // L)
        f64 = dict(dtype=torch.float64)
        for name, shape in (("V", (R, n, d, d)), ("bu", (R, n, d)), ("Tu", (R, n)),
                            ("S", (R, n, d, d)), ("u", (R, n, d)), ("Tc", (R, n)), ("Sinv", (R, n, d, d)),
                            ("Slogdet", (R, n)), ("dS", (R, n, d, d)), ("du", (R, n, d)), ("dT", (R, n)),
                            ("dSm", (R, n, d, d)), ("dum", (R, n, d)), ("dTm", (R, n)),
                            ("Sg", (R, n, d, d)), ("ug", (R, n, d)), ("Tg", (R, n)), ("Sglogdet", (R, n)),
                            ("H", (R, n, d, d)), ("h", (R, n, d)), ("Hbar", (R, n, d, d)), ("hbar", (R, n, d))):
            self.register_buffer(name, torch.zeros(shape, **f64))
        same = torch.from_numpy(self.server[:, None] == self.server[None, :]) & ~torch.eye(n, dtype=torch.bool)
        self.register_buffer("adj", same.expand(R, n, n).clone())
        self.register_buffer("lc", torch.from_numpy(self.server * (n // L)).expand(R, n).clone())
        self.register_buffer("gk", torch.zeros(R, n, dtype=torch.long))
        self.register_buffer("mem", torch.zeros(R, n, n, dtype=torch.long))
        self.register_buffer("nmem", torch.zeros(R, n, dtype=torch.long))
        self.register_buffer("puid", torch.zeros(R, n, dtype=torch.long))
        self.register_buffer("pcalls", torch.zeros(R, n, dtype=torch.long))
        self.register_buffer("next_uid", torch.zeros(R, dtype=torch.long))
        self.register_buffer("t", torch.zeros((), dtype=torch.long))
        self.register_buffer("phase", torch.zeros((), dtype=torch.long))

    def get_extra_state(self) -> dict:
        return {"seed": self.seed}  # the privatisers' noise is keyed by it: a resume must draw the checkpoint's

    def set_extra_state(self, state: dict) -> None:
        self.seed = int(state["seed"])

    @property
    def noise_key(self) -> np.uint64:
        """The key of the privatisers' tree noise (privatiser ``uid`` is stream ``uid`` under it), from the seed."""
        return stream_key(self.seed, "fclub.privatiser")

    # ---------------------------------------------------------------------------------------------- steps
    def _run(self, clients: torch.Tensor, contexts: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
        arms = torch.empty(clients.shape, dtype=torch.long)
        S, done = clients.shape[1], 0
        while done < S:
            if int(self.t) + 1 == 2 ** (int(self.phase) + 1) - 1:  # round t + 1 starts the next phase
                self.phase += 1
                for r in range(self.replicates):
                    self._detect_and_adjust(r)
            stop = min(S, done + 2 ** (int(self.phase) + 1) - 1 - (int(self.t) + 1))
            block = slice(done, stop)
            kernel_call(PHASE_RUN[self.replicates > 1], clients[:, block].contiguous().numpy(),
                        contexts[:, block].contiguous().numpy(), rewards[:, block].contiguous().numpy(),
                        arms[:, block].numpy() if stop - done == S else _view(arms, block),
                        self.params, int(self.t), self.noise_key, self.server, *self._views())
            self.t += stop - done
            done = stop
        return arms

    def _views(self) -> tuple[np.ndarray, ...]:
        names = ("lc", "gk", "mem", "nmem", "V", "bu", "Tu", "S", "u", "Tc", "Sinv", "Slogdet", "dS", "du", "dT",
                 "dSm", "dum", "dTm", "Sg", "ug", "Tg", "Sglogdet", "H", "h", "Hbar", "hbar", "puid", "pcalls")
        ledger = self.channel.ledger
        return (*(getattr(self, n).numpy() for n in names), ledger.traffic("server").numpy(),
                ledger.traffic("global").numpy())

    # ---------------------------------------------------------------------------------------------- Alg. 2
    def _detect_and_adjust(self, r: int) -> None:
        """Phase start of replicate r: delete edges, upload local aggregates, merge, and renew if needed."""
        from scipy.sparse.csgraph import connected_components

        d, n = self.dim, self.num_clients
        V, b, T = self.V[r].numpy(), self.bu[r].numpy(), self.Tu[r].numpy()
        adj = self.adj[r].numpy()
        if not self.pooled:
            theta = np.linalg.solve(self.lam * np.eye(d) + V, b[..., None])[..., 0]
            width = confidence_shape(T)
            far = np.linalg.norm(theta[:, None] - theta[None], axis=-1) > self.delete_alpha * (
                width[:, None] + width[None])
            adj &= ~far
        _, labels = connected_components(adj, directed=False)
        _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
        slot = first[inverse]  # a local cluster's slot is its smallest user
        locals_ = np.unique(slot)
        uploads = []
        for c in locals_:
            users = slot == c
            Vt, bt, Tt = V[users].sum(0), b[users].sum(0), float(T[users].sum())
            if self.private:
                uid = self._new_privatiser(r)
                H0, h0 = self._release(uid, 1)
                shift = 2 * self.rho if self.rho > 0 else self.lam  # ε = ∞: no noise, the non-private ridge
                uploads.append((shift * np.eye(d) + H0 + Vt, h0 + bt, Tt, uid, H0, h0))
            else:
                uploads.append((self.lam * np.eye(d) + Vt, bt, Tt, 0, None, None))
            self._count(r, int(self.server[c]), "upload")
        group = self._merge(locals_, uploads)
        new_gk = np.zeros(n, dtype=np.int64)
        new_gk[locals_] = locals_[group]
        old_lc, old_gk = self.lc[r].numpy(), self.gk[r].numpy()
        if int(self.phase) > 1 and np.array_equal(slot, old_lc) and np.array_equal(new_gk[locals_], old_gk[locals_]):
            return  # same partition: keep every asynchronous state, discard the candidate privatisers
        self._renew(r, slot, locals_, new_gk, uploads)

    def _merge(self, locals_: np.ndarray, uploads: list[tuple]) -> np.ndarray:
        """For each local cluster, the index (into ``locals_``) of its global cluster's first member (eq. 4)."""
        from scipy.sparse.csgraph import connected_components

        m = len(locals_)
        if self.pooled:
            return np.zeros(m, dtype=np.int64)
        theta = np.stack([np.linalg.solve(Vt, bt) for Vt, bt, *_ in uploads])
        width = confidence_shape(np.array([Tt for _, _, Tt, *_ in uploads]))
        servers = self.server[locals_]
        close = np.linalg.norm(theta[:, None] - theta[None], axis=-1) < self.merge_alpha * (
            width[:, None] + width[None])
        close &= servers[:, None] != servers[None, :]
        _, labels = connected_components(close, directed=False)
        first = {lab: i for i, lab in reversed(list(enumerate(labels)))}
        return np.array([first[lab] for lab in labels])

    def _renew(self, r: int, slot: np.ndarray, locals_: np.ndarray, new_gk: np.ndarray, uploads: list[tuple]) -> None:
        """Alg. 2 l.10–16: global sums of the uploads, copied (never aliased) into every member, fresh buffers."""
        d = self.dim
        a = {name: getattr(self, name)[r].numpy() for name in (
            "S", "u", "Tc", "dS", "du", "dT", "dSm", "dum", "dTm", "Sg", "ug", "Tg", "H", "h", "Hbar", "hbar", "Sinv",
            "Slogdet", "Sglogdet", "nmem", "mem", "lc", "gk", "puid", "pcalls")}
        for name in ("S", "u", "Tc", "dS", "du", "dT", "dSm", "dum", "dTm", "Sg", "ug", "Tg", "H", "h", "Hbar", "hbar",
                     "Sinv", "nmem"):
            a[name][...] = 0
        a["Slogdet"][:] = math.nan
        a["Sglogdet"][:] = math.nan
        a["lc"][:], a["gk"][:] = slot, new_gk
        index = {int(c): j for j, c in enumerate(locals_)}
        for k in np.unique(new_gk[locals_]):
            members = [int(c) for c in locals_ if new_gk[c] == k]
            a["Sg"][k] = sum(uploads[index[c]][0] for c in members)
            a["ug"][k] = sum(uploads[index[c]][1] for c in members)
            a["Tg"][k] = sum(uploads[index[c]][2] for c in members)
            a["Sglogdet"][k] = np.linalg.slogdet(a["Sg"][k])[1]
            a["mem"][k, :len(members)] = members
            a["nmem"][k] = len(members)
            inverse = np.linalg.inv(a["Sg"][k])
            for c in members:  # copies, never views of the global cluster's arrays
                a["S"][c], a["u"][c], a["Tc"][c] = a["Sg"][k], a["ug"][k], a["Tg"][k]
                a["Sinv"][c], a["Slogdet"][c] = inverse, a["Sglogdet"][k]
                self._count(r, int(self.server[c]), "download")
                if self.private:
                    _, _, _, uid, H0, h0 = uploads[index[c]]
                    a["puid"][c], a["pcalls"][c] = uid, 2
                    a["Hbar"][c], a["hbar"][c] = H0, h0
                    H, h = self._release(uid, 2)
                    a["H"][c], a["h"][c] = H, h
                    a["dS"][c] = 3 * self.rho * np.eye(d) + H - H0
                    a["du"][c] = h - h0

    # ---------------------------------------------------------------------------------------------- helpers
    def _new_privatiser(self, r: int) -> int:
        """A fresh privatiser of replicate r: its counter-based stream key (replicate in the high bits)."""
        self.next_uid[r] += 1
        return (r << 32) | int(self.next_uid[r])

    def _release(self, uid: int, calls: int) -> tuple[np.ndarray, np.ndarray]:
        """(H, h) of release ``calls`` of privatiser ``uid`` (Alg. 5)."""
        d = self.dim
        N, Z = np.zeros((d + 1, d + 1)), np.zeros((d + 1, d + 1))
        release(self.noise_key, uid, calls, float(self.params[P_SIGMA_NODE]), d, N, Z)
        return N[:d, :d].copy(), N[:d, d].copy()

    def _count(self, r: int, server: int, kind: str) -> None:
        """One phase-start upload or renewal download of local server ``server`` (§4.5), as the kernel counts."""
        ledger = self.channel.ledger
        count(ledger.traffic("server").numpy(), ledger.traffic("global").numpy(), r, server,
              0 if kind == "upload" else 1, self.params[P_SCALARS])

    def metrics(self) -> dict[str, torch.Tensor]:
        """Per replicate: the number of global clusters and of local clusters at the last phase start, and with
        CDP the ε one record has spent so far (:func:`fedrec.privacy.tree.fclub_epsilon`, at ``delta``)."""
        out = {"global_clusters": [], "local_clusters": []}
        for r in range(self.replicates):
            out["global_clusters"].append(int((self.nmem[r] > 0).sum()))
            out["local_clusters"].append(int(len(np.unique(self.lc[r].numpy()))))
        if self.private and math.isfinite(self.epsilon):
            spent = fclub_epsilon(float(self.params[P_SIGMA_NODE]), self.delta, self.horizon, int(self.phase))
            out["epsilon_spent"] = [spent] * self.replicates
        return {k: torch.tensor(v, dtype=torch.float64) for k, v in out.items()}

    def partition(self, r: int = 0) -> np.ndarray:
        """The global cluster slot of every user of replicate r (for the adjusted Rand index)."""
        return self.gk[r].numpy()[self.lc[r].numpy()]


def _view(arms: torch.Tensor, block: slice) -> np.ndarray:
    """A writable numpy view of ``arms[:, block]`` (the kernel writes the arms in place)."""
    return arms.numpy()[:, block]


__all__ = ["FederatedClustering", "confidence_shape"]
