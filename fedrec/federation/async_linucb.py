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

from fedrec.bandits.linear import RowState
from fedrec.federation.protocol import ClientServerLinUCB, log_threshold


class AsyncLinUCB(ClientServerLinUCB):
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
        super().__init__(
            num_clients, dim, replicates, lam, alpha, sigma, delta, radius_bound, preregister, refactor_every
        )
        self.log_gamma_u = log_threshold("gamma_u", gamma_u)
        self.log_gamma_d = log_threshold("gamma_d", gamma_d)
        self.download_to_uploader = bool(download_to_uploader)
        self.check_on_register = bool(check_on_register)
        R, N = self.replicates, self.num_clients
        self.register_buffer("synced_count", torch.zeros(R * N, dtype=torch.long))
        self.register_buffer("server_logdet", torch.full((R,), self.dim * math.log(self.lam), dtype=torch.float64))

    def _advance(self, rows: Tensor, contexts: Tensor, rewards: Tensor, state: RowState):
        arms, new, z = self._local_step(contexts, rewards, state)
        due = (new["policy.logdet"] - self.synced_logdet[rows]) > self.log_gamma_u  # Eq. (3)
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
        R, N = self.replicates, self.num_clients
        pol, buffer, buffer_count, server = self.policy, self.buffer, self.buffer_count, self.server
        reps = rows.div(N, rounding_mode="floor")
        counts = buffer_count.index_select(0, rows)
        server.index_add_(0, reps, self.channel.send("upload", reps, buffer.index_select(0, rows), self.message_scalars))
        self.server_count.index_add_(0, reps, counts)
        self.synced_logdet.index_copy_(0, rows, pol.logdet.index_select(0, rows))  # S_i = V_i after the upload
        self.synced_count.index_add_(0, rows, counts)
        buffer.index_fill_(0, rows, 0)
        buffer_count.index_fill_(0, rows, 0)
        aggregate = server.index_select(0, reps)
        L = torch.linalg.cholesky_ex(aggregate[:, :-1, :-1] + self.lam * pol._eye).L
        logdet = 2 * torch.diagonal(L, dim1=-2, dim2=-1).log().sum(-1)
        self.server_logdet.index_copy_(0, reps, logdet)
        if self.log_gamma_d == math.inf:
            return rows
        due = (logdet.unsqueeze(1) - self.synced_logdet.view(R, N).index_select(0, reps)) > self.log_gamma_d
        due &= self.registered.view(R, N).index_select(0, reps)
        if not self.download_to_uploader:
            due[torch.arange(len(rows)), rows - reps * N] = False
        hit = due.nonzero()
        if hit.numel() == 0:
            return rows
        k = hit[:, 0]
        down_reps = reps.index_select(0, k)
        down_rows = down_reps * N + hit[:, 1]
        self._download(down_reps, down_rows, aggregate.index_select(0, k), torch.cholesky_inverse(L).index_select(0, k))
        return torch.cat([rows, down_rows])

    def _download(self, reps: Tensor, rows: Tensor, aggregate: Tensor | None = None, inverse: Tensor | None = None) -> None:
        """Send ΔV_{−j} = V_g − S_j to the addressed clients (Eq. 4).

        ``aggregate`` (V_g of each addressed client's server) and its ``inverse`` may be passed when known. A
        client with an empty upload buffer then holds exactly V_g and takes that inverse instead of refactorising.
        """
        pol = self.policy
        if aggregate is None:
            aggregate = self.server.index_select(0, reps)
        synced = pol.G.index_select(0, rows) - self.buffer.index_select(0, rows)
        pol.G.index_add_(0, rows, self.channel.send("download", reps, aggregate - synced, self.message_scalars))
        server_count = self.server_count.index_select(0, reps)
        pol.count.index_add_(0, rows, server_count - self.synced_count.index_select(0, rows))
        self.synced_count.index_copy_(0, rows, server_count)
        logdet = self.server_logdet.index_select(0, reps)
        self.synced_logdet.index_copy_(0, rows, logdet)
        if inverse is None:
            pol.refactor(rows)
            return
        empty = self.buffer_count.index_select(0, rows) == 0
        if not bool(empty.all()):
            pol.refactor(rows[~empty])
            rows, inverse, logdet = rows[empty], inverse[empty], logdet[empty]
        pol.inv.index_copy_(0, rows, inverse)
        pol.logdet.index_copy_(0, rows, logdet)
        pol.since_refactor.index_fill_(0, rows, 0)
