"""Per-server baselines of the FCLUB comparison (Liu et al., UAI 2022, §5): per-user LinUCB,
CLUB (Gentile et al., ICML 2014) and SCLUB (Li et al., IJCAI 2019), each local server learning on its own users
only (contiguous blocks of n/L), so nothing is communicated.

* ``linucb``: every user its own LinUCB.
* ``club``: each server keeps a graph on its users, complete at first; the arriving user's connected component
  recommends from its aggregate, and after the update the user's edges to users whose estimates differ by more
  than α (F(T_i) + F(T_j)) are deleted.
* ``sclub``: each server keeps a partition of its users. Phases start at rounds t = 2^s: every user is unchecked
  and every cluster snapshots its (T, θ̂). After its update the arriving user leaves its cluster when its estimate
  is far from the snapshot (α (F(T_i) + F(T̃))) or its arrival frequency T_i/t differs from a member's by more than
  2 α_p F(t), and becomes checked; then one pass over the server's pairs of fully checked clusters, in order of
  their smallest users, merges those whose estimates are within (α/2)(F + F) and whose mean frequencies
  T_c/(|c| t) are within α_p F(t) (SCLUB's thresholds, Li et al. 2019; a merged cluster snapshots its current
  (T, θ̂)).

All three score with the family's radius (:mod:`fedrec.protocols.clustering`, one ``conventions`` switch).
Cluster slots are their smallest user, so :meth:`LocalClustering.partition` labels users by that slot.
"""
from __future__ import annotations

import numpy as np
import torch

from fedrec.errors import ConfigError, check_choice, check_float, check_int
from fedrec.protocols.base import StepProtocol, kernel_call
from fedrec.protocols.clustering import Radius
from fedrec.protocols.kernels.club import CLUB, CLUB_RUN, LINUCB, SCLUB, SCLUB_RUN, LocalSettings, LocalState
from fedrec.protocols.kernels.clustering import ClusterParams, StepBlock
from fedrec.utils.jit import build

#: the methods and their kernel codes (``LocalSettings.method``)
METHODS = {"linucb": LINUCB, "club": CLUB, "sclub": SCLUB}


class LocalClustering(StepProtocol):
    """Per-user LinUCB, CLUB or SCLUB on every local server, batched over replicates (compiled kernels).

    Args:
        num_clients, dim, replicates, seed: n users, d, batched runs, run seed.
        method: one of :data:`METHODS`.
        num_servers: L (users on contiguous blocks of n/L; the ledger's endpoints, which stay silent).
        alpha: CLUB's deletion constant or SCLUB's α (the authors ran 0.25 and 1.5); unused by ``linucb``.
        alpha_p: SCLUB's frequency constant α_p.
        conventions, bonus, lam, beta, beta_scale, sigma0: the radius (:class:`fedrec.protocols.clustering.Radius`).
        failure, clusters_bound: the failure probability and the m inside Lemma 1's log (``paper`` conventions).
    """

    max_agents_per_step = 1
    #: the step loops have no torch path (yet): ``backend=torch`` is refused
    backends = ("compiled",)
    #: the kernels count messages straight into the ledger
    honours_channel = False
    #: no privacy: each server learns on its own users' raw data
    privacy_mechanisms = ()

    def __init__(
        self, num_clients: int, dim: int, replicates: int = 1, seed: int = 0, method: str = "club",
        num_servers: int = 5, alpha: float = 0.25, alpha_p: float = 1.0, conventions: str = "paper",
        bonus: str | None = None, lam: float | None = None, beta: float | None = None,
        beta_scale: float | None = None, sigma0: float | None = None, failure: float = 0.1,
        clusters_bound: int = 4, backend: str = "auto",
    ) -> None:
        check_choice("method", method, METHODS)
        L = check_int("num_servers", num_servers)
        n = check_int("num_clients", num_clients)
        if L > n or n % L:
            raise ConfigError(f"num_servers must divide num_clients = {n} (contiguous blocks of n/L), got {L}")
        super().__init__(n, dim, replicates, seed, backend, {"server": L, "global": 1})
        self.method, self.num_servers = method, L
        self.alpha = check_float("alpha", alpha, low=0.0, low_open=True)
        self.alpha_p = check_float("alpha_p", alpha_p, low=0.0, low_open=True)
        self.radius = Radius.resolve(conventions, False, bonus, lam, sigma0, beta_scale, beta)
        failure = check_float("failure", failure, low=0.0, high=1.0, low_open=True)
        self.params = build(ClusterParams, self.radius.params(method, self.dim, L, clusters_bound, failure))
        block = n // L
        self.server = np.arange(n) // block
        self.lo = (self.server * block).astype(np.int64)
        self.hi = self.lo + block
        R, d = self.replicates, self.dim
        f64 = dict(dtype=torch.float64)
        self.register_buffer("V", torch.zeros(R, n, d, d, **f64))
        self.register_buffer("b", torch.zeros(R, n, d, **f64))
        self.register_buffer("T", torch.zeros(R, n, **f64))
        self.register_buffer("theta", torch.zeros(R, n, d, **f64))
        same = torch.from_numpy(self.server[:, None] == self.server[None, :]) & ~torch.eye(n, dtype=torch.bool)
        self.register_buffer("adj", (same if method == "club" else torch.zeros(n, n, dtype=torch.bool))
                             .expand(R, n, n).clone())
        self.register_buffer("cl", torch.from_numpy(self.lo).expand(R, n).clone())  # SCLUB's cluster slots
        self.register_buffer("snapT", torch.zeros(R, n, **f64))
        self.register_buffer("snapTheta", torch.zeros(R, n, d, **f64))
        self.register_buffer("checked", torch.zeros(R, n, dtype=torch.bool))
        self.register_buffer("t", torch.zeros((), dtype=torch.long))

    def _kernel_views(self) -> dict[str, tuple]:
        return {"params": self.params, "settings": build(LocalSettings, self, method=METHODS[self.method]),
                "state": build(LocalState, self)}

    def _run(self, clients: torch.Tensor, contexts: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
        arms = torch.empty(clients.shape, dtype=torch.long)
        io = StepBlock(users=clients.contiguous().numpy(), contexts=contexts.contiguous().numpy(),
                       rewards=rewards.contiguous().numpy(), arms=arms.numpy(), t0=int(self.t))
        v = self.kernel_views()
        kernel = (SCLUB_RUN if self.method == "sclub" else CLUB_RUN)[self.replicates > 1]
        kernel_call(kernel, clients.shape[0], io, v["params"], v["settings"], v["state"])
        self.t += clients.shape[1]
        return arms

    def partition(self, r: int = 0) -> np.ndarray:
        """The cluster of every user of replicate r, labelled by its smallest user."""
        if self.method == "sclub":
            return self.cl[r].numpy().copy()
        from scipy.sparse.csgraph import connected_components

        _, labels = connected_components(self.adj[r].numpy(), directed=False)
        _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
        return first[inverse]

    def metrics(self) -> dict[str, torch.Tensor]:
        """Per replicate: the number of clusters (over all servers)."""
        return {"clusters": torch.tensor([float(len(np.unique(self.partition(r)))) for r in range(self.replicates)],
                                         dtype=torch.float64)}


__all__ = ["LocalClustering", "METHODS"]
