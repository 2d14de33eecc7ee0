"""Async-LinUCB (Li & Wang, AISTATS'22, Algorithms 1–2): event-triggered uploads and downloads.

Client j's last synchronised copy S_j = V_j − ΔV_j = V_g − ΔV_{−j} (spec invariant 1) changes only when j
itself communicates, so log det S_j(λ) is cached per client. The upload trigger (Eq. 3) compares
log det V_i(λ) − log det S_i(λ) with log γ_U, and after an upload the download triggers (Eq. 4) of all
registered clients are one vector comparison of log det V_g(λ) − log det S_j(λ) with log γ_D: O(N) per
upload instead of the 2N determinants of the authors' code.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from fedrec.bandits.linear import LinearBandit, RowState
from fedrec.federation.protocol import EventTriggeredProtocol, log_threshold, make_linucb


class AsyncLinUCB(EventTriggeredProtocol):
    """Async-LinUCB for homogeneous clients, batched over replicates and clients.

    Args:
        gamma_u, gamma_d: upload / download thresholds γ_U, γ_D >= 1 (``inf`` disables communication).
        lam, alpha, sigma, delta, radius_bound: the clients' LinUCB (``alpha=None``: the radius of Eq. 5).
        preregister: register every client at t = 0 (spec test 5); otherwise clients register on arrival.
        download_to_uploader: include the uploader in the download loop (authors' code; paper text: j ≠ i_t).
        check_on_register: run a download check for a client when it registers (deviation from Algorithm 2,
            restores the download invariant for newcomers; spec §2 caveat).
    """

    def __init__(
        self,
        num_clients: int,
        dim: int,
        replicates: int = 1,
        gamma_u: float = 5.0,
        gamma_d: float = 5.0,
        lam: float = 0.1,
        alpha: float | None = None,
        sigma: float = 0.1,
        delta: float = 0.1,
        radius_bound: str = "determinant",
        preregister: bool = False,
        download_to_uploader: bool = True,
        check_on_register: bool = False,
        refactor_every: int = 1000,
    ) -> None:
        super().__init__(num_clients, dim, replicates)
        self.log_gamma_u = log_threshold("gamma_u", gamma_u)
        self.log_gamma_d = log_threshold("gamma_d", gamma_d)
        self.download_to_uploader = bool(download_to_uploader)
        self.check_on_register = bool(check_on_register)
        R, N, d = self.replicates, self.num_clients, self.dim
        self.policy = make_linucb(d, (R, N), lam, alpha, sigma, delta, radius_bound, refactor_every)
        self.lam = self.policy.lam
        kw = dict(dtype=torch.float64)
        # client upload buffers (ΔV_i, Δb_i) as augmented matrices, and cached log det S_i(λ)
        self.register_buffer("buffer", torch.zeros(R * N, d + 1, d + 1, **kw))
        self.register_buffer("buffer_count", torch.zeros(R * N, dtype=torch.long))
        self.register_buffer("synced_logdet", torch.full((R * N,), d * math.log(self.lam), **kw))
        self.register_buffer("synced_count", torch.zeros(R * N, dtype=torch.long))
        self.register_buffer("registered", torch.full((R * N,), bool(preregister)))
        # server aggregate (V_g, b_g) and log det V_g(λ)
        self.register_buffer("server", torch.zeros(R, d + 1, d + 1, **kw))
        self.register_buffer("server_logdet", torch.full((R,), d * math.log(self.lam), **kw))
        self.register_buffer("server_count", torch.zeros(R, dtype=torch.long))

    @property
    def message_scalars(self) -> int:
        """Scalars in one {ΔV, Δb} message."""
        return self.dim * self.dim + self.dim

    # -------------------------------------------------------------------------- steps (Algorithm 2)
    def _bandits(self) -> dict[str, LinearBandit]:
        return {"policy": self.policy}

    def _row_buffers(self) -> dict[str, Tensor]:
        return {"buffer_count": self.buffer_count, "registered": self.registered}

    def _additive(self) -> list[Tensor]:
        return [self.policy.G, self.buffer]

    def _advance(self, rows: Tensor, contexts: Tensor, rewards: Tensor, state: RowState):
        pol = self.policy
        local = {k: state[f"policy.{k}"] for k in pol.state_keys}
        arms, x, r = pol.pick(contexts, rewards, pol.scores(contexts, local))
        local, z = pol.advance(local, x, r)
        new = {f"policy.{k}": v for k, v in local.items()}
        new["buffer_count"] = state["buffer_count"] + 1
        new["registered"] = torch.ones_like(state["registered"])  # a newcomer has S_j = 0 (ΔV_{−j} = V_g)
        due = (local["logdet"] - self.synced_logdet[rows]) > self.log_gamma_u  # Eq. (3)
        return arms, due, new, z

    def _window_limit(self, rows: Tensor) -> Tensor:
        """With ``check_on_register``, a newcomer's registration (and possible download) opens a window."""
        w = rows.shape[1]
        if not self.check_on_register:
            return torch.full((rows.shape[0],), w, dtype=torch.long)
        first = rows[:, 0]
        fresh = first[~self.registered[first]]
        if fresh.numel():
            self.registered[fresh] = True
            reps = fresh // self.num_clients
            due = (self.server_logdet[reps] - self.synced_logdet[fresh]) > self.log_gamma_d
            if bool(due.any()):
                self._download(reps[due], fresh[due])
        new = ~self.registered[rows]
        return torch.where(new, torch.arange(w), w).min(-1).values

    # --------------------------------------------------------------------------- Algorithm 1
    def _communicate(self, rows: Tensor) -> Tensor:
        """Upload (Eq. 3 fired for ``rows``), then check the download trigger (Eq. 4) of every registered client."""
        reps = rows // self.num_clients
        counts = self.buffer_count[rows]
        self.server.index_add_(0, reps, self.channel.send("upload", reps, self.buffer[rows], self.message_scalars))
        self.server_count.index_add_(0, reps, counts)
        self.synced_logdet[rows] = self.policy.logdet[rows]  # S_i = V_i after the upload
        self.synced_count[rows] += counts
        self.buffer[rows] = 0
        self.buffer_count[rows] = 0
        L = torch.linalg.cholesky_ex(self.server[reps, :-1, :-1] + self.lam * self.policy._eye).L
        self.server_logdet[reps] = 2 * torch.diagonal(L, dim1=-2, dim2=-1).log().sum(-1)
        if self.log_gamma_d == math.inf:
            return rows
        R, N = self.replicates, self.num_clients
        due = (self.server_logdet[reps].view(-1, 1) - self.synced_logdet.view(R, N)[reps]) > self.log_gamma_d
        due &= self.registered.view(R, N)[reps]
        if not self.download_to_uploader:
            due[torch.arange(len(rows)), rows % N] = False
        hit = due.nonzero()
        if hit.numel() == 0:
            return rows
        down_reps = reps[hit[:, 0]]
        down_rows = down_reps * N + hit[:, 1]
        self._download(down_reps, down_rows, torch.cholesky_inverse(L)[hit[:, 0]])
        return torch.cat([rows, down_rows])

    def _download(self, reps: Tensor, rows: Tensor, server_inv: Tensor | None = None) -> None:
        """Send ΔV_{−j} = V_g − S_j to the addressed clients (Eq. 4).

        A client with an empty upload buffer then holds exactly V_g, so it takes the server's inverse
        ``server_inv`` (when given) instead of refactorising.
        """
        pol = self.policy
        synced = pol.G[rows] - self.buffer[rows]
        pol.G.index_add_(0, rows, self.channel.send("download", reps, self.server[reps] - synced, self.message_scalars))
        pol.count[rows] += self.server_count[reps] - self.synced_count[rows]
        self.synced_logdet[rows] = self.server_logdet[reps]
        self.synced_count[rows] = self.server_count[reps]
        if server_inv is None:
            pol.refactor(rows)
            return
        empty = self.buffer_count[rows] == 0
        in_sync = rows[empty]
        pol.inv[in_sync] = server_inv[empty]
        pol.logdet[in_sync] = self.server_logdet[reps[empty]]
        pol.since_refactor[in_sync] = 0
        pol.refactor(rows[~empty])
