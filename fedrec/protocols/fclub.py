"""FCLUB-DC, CDP-FCLUB-DC, FCLUB and Homo(-DC): federated online clustering of bandits (Liu et al., UAI 2022).

n users sit on L local servers (contiguous blocks of n/L, as in the authors' code). Time runs in phases: phase s
starts at round 2^s − 1 and lasts 2^s rounds (Algorithm 1). At a phase start (Algorithm 2, here in Python) each
server deletes the edges of its user graph whose estimates drifted apart (eq. 3), uploads one aggregate per
connected component (local cluster), and the global server merges local clusters of different servers whose
aggregates agree (eq. 4); when the partition changed (and at the first phase) every local cluster is renewed with a
copy of its global cluster's sums. Within a phase (the compiled kernel) the arriving user's local cluster recommends
from its synchronised statistics, and the upload (eq. 5) and download (eq. 6) triggers exchange buffered increments
with the global cluster. With ``privacy`` (:class:`~fedrec.privacy.TreeGaussian`, CDP-FCLUB-DC), each local
cluster's releases pass the tree-based privatiser of Algorithm 5. ``noise_placement`` says where its noise goes:
``statistics`` (the paper) adds the noise and the 2ρI / 3ρI shifts to the shared statistics used to recommend and
merge; ``trigger`` (the authors' released code) keeps those statistics clean, with the λ ridge, and adds the
privatiser's current noise difference H − H̄ only where the upload trigger (eq. 5) reads them: the shared statistics
are then not differentially private.

Local cluster slots are their smallest user's id and global cluster slots their smallest local slot, so a
partition is the pair of arrays (``lc``, ``gk``) and "the partition changed" is an array comparison.
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch

from fedrec.errors import ConfigError, check_choice, check_float, check_int
from fedrec.federation.ledger import KINDS
from fedrec.privacy.tree import TreeGaussian
from fedrec.protocols.base import StepProtocol, kernel_call
from fedrec.protocols.clustering import Radius, confidence_shape
from fedrec.protocols.kernels.clustering import ClusterParams, StepBlock
from fedrec.protocols.kernels.fclub import PHASE_RUN, Clusters, Partition, PhaseSettings, Traffic, Users, count, release
from fedrec.utils.jit import build, field_types
from fedrec.utils.rng import stream_key

NOISE_PLACEMENTS = ("statistics", "trigger")
#: each conventions value's noise placement when ``noise_placement`` is not given (the authors' code adds the
#: tree noise to the upload trigger only)
CONVENTION_PLACEMENT = {"paper": "statistics", "authors": "trigger"}


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
        bonus: ``sqrt`` (the paper's UCB) or ``squared`` (β·xᵀS⁻¹x, the authors' code); None: the convention's.
        beta: a fixed β, or None for the convention's recipe; ``beta_scale`` multiplies the recipe's.
        sigma0, alpha, clusters_bound: σ₀, the failure probability α and the m inside Lemma 1's log.
        privacy: CDP-FCLUB-DC's mechanism (:class:`~fedrec.privacy.TreeGaussian`: (ε, δ), the upload bound t_c
            that fixes the tree depth ν, the node σ's calibration; with the accountant's σ, ρ and κ are rescaled with
            it); None: no privacy. ε = ∞ runs the private code path with zero noise, ρ = κ = 0 and the λ ridge:
            FCLUB-DC decision for decision.
        noise_placement: where the privatiser's noise goes: ``statistics`` (Alg. 5: into the shared statistics,
            differentially private) or ``trigger`` (the authors' code: only into the upload trigger's reading of
            them, not differentially private; a warning says so); None: the convention's (paper: statistics,
            authors: trigger). No effect without privacy.
    """

    max_agents_per_step = 1
    #: the phase loop has no torch path (yet): ``backend=torch`` is refused
    backends = ("compiled",)
    #: the kernels count messages straight into the ledger
    honours_channel = False
    #: CDP-FCLUB-DC's privatisers (``privacy=tree_gaussian``)
    privacy_mechanisms = (TreeGaussian,)

    def __init__(
        self, num_clients: int, dim: int, replicates: int = 1, seed: int = 0, num_servers: int = 5,
        upload_threshold: float = 1.01, download_threshold: float = 1.01, conventions: str = "paper",
        lam: float | None = None, delete_alpha: float = 1.5, merge_alpha: float = 2.0, pooled: bool = False,
        bonus: str | None = None, beta: float | None = None, beta_scale: float | None = None,
        sigma0: float | None = None, alpha: float = 0.1, clusters_bound: int = 4,
        privacy: TreeGaussian | None = None, noise_placement: str | None = None, backend: str = "auto",
    ) -> None:
        L = check_int("num_servers", num_servers)
        n = check_int("num_clients", num_clients)
        if L > n or n % L:
            raise ConfigError(f"num_servers must divide num_clients = {n} (contiguous blocks of n/L), got {L}")
        if privacy is not None and not isinstance(privacy, TreeGaussian):
            raise ConfigError(f"privacy must be a fedrec.privacy.TreeGaussian or None, got {type(privacy).__name__}")
        super().__init__(n, dim, replicates, seed, backend, {"server": L, "global": 1})
        self.num_servers = L
        self.U = check_float("upload_threshold", upload_threshold, low=1.0)
        self.D = check_float("download_threshold", download_threshold, low=1.0)
        self.delete_alpha = check_float("delete_alpha", delete_alpha, low=0.0, low_open=True)
        self.merge_alpha = check_float("merge_alpha", merge_alpha, low=0.0)
        self.pooled = bool(pooled)
        self.privacy = privacy
        self.private = privacy is not None
        self.radius = Radius.resolve(conventions, self.private, bonus, lam, sigma0, beta_scale, beta)
        self.lam = self.radius.lam
        self.noise_placement = _noise_placement(noise_placement, self.radius.conventions)
        #: the kernel's switch: the noise enters only the upload trigger (and the statistics stay clean)
        self.trigger_noise = self.private and self.noise_placement == "trigger"
        if self.trigger_noise:
            warnings.warn("protocol.noise_placement=trigger (the authors' code): the tree noise enters only the upload "
                          "trigger, so the shared statistics are NOT differentially private and the run reports no "
                          "epsilon (not applicable)", UserWarning, stacklevel=2)
        d, R = self.dim, self.replicates
        m = check_int("clusters_bound", clusters_bound)
        alpha = check_float("alpha", alpha, low=0.0, high=1.0, low_open=True)
        params = self.radius.params("fclub", d, L, m, alpha, synchronous=self.U == self.D == 1.0, privacy=privacy)
        self.log_u, self.log_d = math.log(self.U), math.log(self.D)
        self.message_scalars = d * d + d + 1  # (ΔS, Δu, ΔT) or (S, u, T)
        self.rho = self.sigma_node = 0.0
        if privacy is not None:
            eps, dlt, t_c, nu = privacy.epsilon, privacy.delta, privacy.horizon, privacy.nu
            rho = 8 * math.sqrt(2) * nu * math.log(4 / dlt) * (4 * math.sqrt(d) + 2 * math.log(2 * m * L / alpha)) / eps
            kappa = math.sqrt(2 * nu) * (math.sqrt(d) + 2 * math.log(2 * m * L / alpha)) / math.sqrt(2 * eps)
            if privacy.calibration == "accountant" and rho > 0:  # ρ bounds ‖H‖ ∝ σ, κ ∝ ‖h‖/√ρ ∝ √σ: rescale both
                scale = privacy.sigma / privacy.node_sigma("paper")
                rho, kappa = rho * scale, kappa * math.sqrt(scale)
            if math.isfinite(eps) and min(self.U, self.D) <= 1.0:
                raise ConfigError("upload_threshold and download_threshold must be > 1 with privacy "
                                  "(rho_max of Lemma 1 divides by ln min(U, D))")
            if self.radius.conventions == "paper" and rho > 0:  # Lemma 1's radius with the privatiser's bounds
                rho_max = 3 * rho + 3 * rho * d * math.log(t_c) / math.log(min(self.U, self.D))
                params.update(base=rho, ratio=rho_max / rho, rho_max=rho_max, kappa=kappa)
            self.rho, self.sigma_node = rho, privacy.sigma
        self.params = build(ClusterParams, params)
        self.server = np.arange(n) // (n // L)
        shapes = {1: (R, n), 2: (R, n, d), 3: (R, n, d, d)}  # by a field's rank after the replicate axis
        for struct in (Users, Clusters):
            for name, kind in field_types(struct).items():
                self.register_buffer(name, torch.from_numpy(np.zeros(shapes[kind.ndim - 1], kind.dtype)))
        same = torch.from_numpy(self.server[:, None] == self.server[None, :]) & ~torch.eye(n, dtype=torch.bool)
        self.register_buffer("adj", same.expand(R, n, n).clone())
        self.register_buffer("lc", torch.from_numpy(self.server * (n // L)).expand(R, n).clone())
        self.register_buffer("gk", torch.zeros(R, n, dtype=torch.long))
        self.register_buffer("mem", torch.zeros(R, n, n, dtype=torch.long))
        self.register_buffer("nmem", torch.zeros(R, n, dtype=torch.long))
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
    def _kernel_views(self) -> dict[str, tuple]:
        ledger = self.channel.ledger
        traffic = {"server": ledger.traffic("server"), "global_server": ledger.traffic("global")}
        return {"params": self.params, "settings": build(PhaseSettings, self), "partition": build(Partition, self),
                "users": build(Users, self), "clusters": build(Clusters, self), "traffic": build(Traffic, traffic)}

    def _run(self, clients: torch.Tensor, contexts: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
        arms = torch.empty(clients.shape, dtype=torch.long)
        v = self.kernel_views()
        S, done = clients.shape[1], 0
        while done < S:
            if int(self.t) + 1 == 2 ** (int(self.phase) + 1) - 1:  # round t + 1 starts the next phase
                self.phase += 1
                for r in range(self.replicates):
                    self._detect_and_adjust(r)
            stop = min(S, done + 2 ** (int(self.phase) + 1) - 1 - (int(self.t) + 1))
            block = slice(done, stop)
            # every array C-contiguous, the arms too (copied into place after), so the kernel compiles once
            io = StepBlock(users=clients[:, block].contiguous().numpy(),
                           contexts=contexts[:, block].contiguous().numpy(),
                           rewards=rewards[:, block].contiguous().numpy(),
                           arms=np.empty((clients.shape[0], stop - done), dtype=np.int64), t0=int(self.t))
            kernel_call(PHASE_RUN[self.replicates > 1], clients.shape[0], io, v["params"], v["settings"],
                        v["partition"], v["users"], v["clusters"], v["traffic"])
            arms[:, block] = torch.from_numpy(io.arms)
            self.t += stop - done
            done = stop
        return arms

    # ---------------------------------------------------------------------------------------------- Alg. 2
    def _detect_and_adjust(self, r: int) -> None:
        """Phase start of replicate r: delete edges, upload local aggregates, merge, and renew if needed."""
        from scipy.sparse.csgraph import connected_components

        d, n = self.dim, self.num_clients
        users = self.kernel_views()["users"]
        V, b, T = users.V[r], users.bu[r], users.Tu[r]
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
                if self.trigger_noise:  # the noise waits for the upload trigger: the clean aggregate, as without
                    uploads.append((self.lam * np.eye(d) + Vt, bt, Tt, uid, H0, h0))
                else:
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
        """Alg. 2 l.10–16: global sums of the uploads, copied (never aliased) into every member, fresh buffers and
        privatisers."""
        d = self.dim
        v = self.kernel_views()
        part, cl = v["partition"], v["clusters"]
        for array in (*cl, part.mem, part.nmem):
            array[r] = 0
        cl.Slogdet[r] = cl.Sglogdet[r] = math.nan
        part.lc[r], part.gk[r] = slot, new_gk
        index = {int(c): j for j, c in enumerate(locals_)}
        for k in np.unique(new_gk[locals_]):
            members = [int(c) for c in locals_ if new_gk[c] == k]
            cl.Sg[r, k] = sum(uploads[index[c]][0] for c in members)
            cl.ug[r, k] = sum(uploads[index[c]][1] for c in members)
            cl.Tg[r, k] = sum(uploads[index[c]][2] for c in members)
            cl.Sglogdet[r, k] = np.linalg.slogdet(cl.Sg[r, k])[1]
            part.mem[r, k, :len(members)] = members
            part.nmem[r, k] = len(members)
            inverse = np.linalg.inv(cl.Sg[r, k])
            for c in members:  # copies, never views of the global cluster's arrays
                cl.S[r, c], cl.u[r, c], cl.Tc[r, c] = cl.Sg[r, k], cl.ug[r, k], cl.Tg[r, k]
                cl.Sinv[r, c], cl.Slogdet[r, c] = inverse, cl.Sglogdet[r, k]
                self._count(r, int(self.server[c]), "download")
                if self.private:
                    _, _, _, uid, H0, h0 = uploads[index[c]]
                    cl.puid[r, c], cl.pcalls[r, c] = uid, 2
                    cl.Hbar[r, c], cl.hbar[r, c] = H0, h0
                    H, h = self._release(uid, 2)
                    cl.H[r, c], cl.h[r, c] = H, h
                    if not self.trigger_noise:  # trigger: the buffers start clean, at 0
                        cl.dS[r, c] = 3 * self.rho * np.eye(d) + H - H0
                        cl.du[r, c] = h - h0

    # ---------------------------------------------------------------------------------------------- helpers
    def _new_privatiser(self, r: int) -> int:
        """A fresh privatiser of replicate r: its counter-based stream key (replicate in the high bits)."""
        self.next_uid[r] += 1
        return (r << 32) | int(self.next_uid[r])

    def _release(self, uid: int, calls: int) -> tuple[np.ndarray, np.ndarray]:
        """(H, h) of release ``calls`` of privatiser ``uid`` (Alg. 5)."""
        d = self.dim
        N, Z = np.zeros((d + 1, d + 1)), np.zeros((d + 1, d + 1))
        release(self.noise_key, uid, calls, self.sigma_node, d, N, Z)
        return N[:d, :d].copy(), N[:d, d].copy()

    def _count(self, r: int, server: int, kind: str) -> None:
        """One phase-start upload or renewal download of local server ``server``, as the kernel counts."""
        traffic = self.kernel_views()["traffic"]
        count(traffic, r, server, KINDS.index(kind), self.message_scalars, self.S.element_size())

    def metrics(self) -> dict[str, torch.Tensor]:
        """Per replicate: the number of global clusters and of local clusters at the last phase start, and with
        CDP in the ``statistics`` placement the ε one record has spent so far
        (:meth:`fedrec.privacy.TreeGaussian.epsilon_spent`, at its δ)."""
        out = {"global_clusters": [], "local_clusters": []}
        for r in range(self.replicates):
            out["global_clusters"].append(int((self.nmem[r] > 0).sum()))
            out["local_clusters"].append(int(len(np.unique(self.lc[r].numpy()))))
        if self.privacy is not None and math.isfinite(self.privacy.epsilon) and not self.trigger_noise:
            out["epsilon_spent"] = [self.privacy.epsilon_spent(int(self.phase))] * self.replicates
        return {k: torch.tensor(v, dtype=torch.float64) for k, v in out.items()}

    def summary(self) -> dict[str, Any]:
        """With privacy, where its noise went; in the ``trigger`` placement the shared statistics carry no noise, so
        no ε describes them: ``epsilon`` is "not applicable" and ``differentially_private`` false."""
        if self.privacy is None:
            return {}
        if self.trigger_noise:
            return {"noise_placement": "trigger", "epsilon": "not applicable", "differentially_private": False}
        return {"noise_placement": "statistics"}

    def partition(self, r: int = 0) -> np.ndarray:
        """The global cluster slot of every user of replicate r (for the adjusted Rand index)."""
        return self.gk[r].numpy()[self.lc[r].numpy()]


def _noise_placement(value: str | None, conventions: str) -> str:
    """The noise placement given, or the conventions' (:data:`CONVENTION_PLACEMENT`)."""
    if value is None:
        return CONVENTION_PLACEMENT[conventions]
    return check_choice("protocol.noise_placement", value, NOISE_PLACEMENTS)


__all__ = ["FederatedClustering", "confidence_shape"]
