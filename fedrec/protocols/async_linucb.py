"""Async-LinUCB (Li & Wang, AISTATS'22, Algorithms 1–2): asynchronous event-triggered communication.

An invariant of the protocol (from the paper's App. B): S_j = V_j − ΔV_j = V_g − ΔV_{−j} changes only when j itself
communicates, so log det S_j(λ) is cached per client. The upload trigger (Eq. 3) compares log det V_i(λ) − log det
S_i(λ) with log γ_U, and after an upload the download triggers (Eq. 4) of all registered clients are one comparison
of log det V_g(λ) − log det S_j(λ) with log γ_D each: O(N) per upload instead of the authors' 2N determinants. A
download adds ΔV_{−j} = V_g − S_j to the client's statistics and marks its row stale: the row is refactorised when
the client next acts (most clients download several times before they act again).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fedrec.bandits.linear import RowState
from fedrec.protocols.base import PolicyFactory, log_threshold
from fedrec.protocols.client_server import ClientServerLinUCB
from fedrec.protocols.kernels.client_server import ASYNC_RUN, AsyncSettings, AsyncState


class AsyncLinUCB(ClientServerLinUCB):
    """Async-LinUCB for homogeneous clients, batched over replicates and clients.

    Args:
        gamma_u, gamma_d: upload / download thresholds γ_U, γ_D >= 1 (``inf`` disables communication).
        policy: the clients' local policy (default: LinUCB with the paper's λ = 0.1 and the radius of Eq. 5).
        preregister: register every client at t = 0 (with γ_U = γ_D = 1 this
            recovers centralised LinUCB); otherwise clients register on arrival.
        download_to_uploader: include the uploader in the download loop (authors' code; paper text: j ≠ i_t).
        check_on_register: run a download check for a client when it registers (deviation from Algorithm 2,
            restores the download invariant for newcomers, whose download condition is otherwise first checked at
            the next upload anywhere).
        refresh_on_download: a download takes effect on the client's next decision (paper, Algorithm 2);
            ``False`` is the authors' code, where downloaded statistics reach a client's decisions only after
            its next own update (its cached inverse, θ̂ and radius are refreshed only there).
        seed, backend: see :class:`~fedrec.protocols.base.StepProtocol`.
        layout: ``dense`` (every client's state allocated up front) or ``sparse`` (on arrival; for many clients),
            see :mod:`fedrec.protocols.client_server`.
    """

    def __init__(
        self,
        num_clients: int,
        dim: int,
        replicates: int = 1,
        gamma_u: float = 5.0,
        gamma_d: float = 5.0,
        policy: PolicyFactory | None = None,
        preregister: bool = False,
        download_to_uploader: bool = True,
        check_on_register: bool = False,
        refresh_on_download: bool = True,
        seed: int = 0,
        backend: str = "auto",
        layout: str = "dense",
    ) -> None:
        super().__init__(num_clients, dim, replicates, policy, seed, backend, preregister, layout)
        self.log_gamma_u = log_threshold("gamma_u", gamma_u)
        self.log_gamma_d = log_threshold("gamma_d", gamma_d)
        self.download_to_uploader = bool(download_to_uploader)
        self.check_on_register = bool(check_on_register)
        self.refresh_on_download = bool(refresh_on_download)
        R, d = self.replicates, self.dim
        rows = self.client_of.shape[0]
        self.register_buffer("synced_count", torch.zeros(rows, dtype=torch.long))
        self.register_buffer("server_logdet", torch.full((R,), d * math.log(self.lam), dtype=torch.float64))
        # downloads that reach the policy only with the client's next own update (refresh_on_download=False)
        rows = 1 if self.refresh_on_download else rows
        self.register_buffer("pending", torch.zeros(rows, d + 1, d + 1, dtype=torch.float64))
        self.register_buffer("pending_count", torch.zeros(rows, dtype=torch.long))

    def _row_state(self) -> dict[str, tuple[torch.nn.Module, str]]:
        out = {**super()._row_state(), "synced_count": (self, "synced_count")}
        if not self.refresh_on_download:
            out.update({k: (self, k) for k in ("pending", "pending_count")})
        return out

    # ------------------------------------------------------------------------------------ torch path
    def _advance(self, rows: Tensor, contexts: Tensor, rewards: Tensor, state: RowState):
        arms, new, z = self._local_step(contexts, rewards, state)
        return arms, torch.ones_like(arms, dtype=torch.bool), new, z  # Eq. (3) is checked after the scatter

    def _gather(self, rows: Tensor) -> RowState:
        if self.refresh_on_download:
            return super()._gather(rows)
        state = {f"policy.{k}": v for k, v in self.policy.gather(rows, refresh=False).items()}
        state["buffer_count"] = self.buffer_count.index_select(0, rows)
        return state

    def _scatter(self, rows: Tensor, state: RowState, z: Tensor) -> None:
        if self.refresh_on_download:
            return super()._scatter(rows, state, z)
        pol = self.policy
        late = rows[pol.stale.index_select(0, rows)]  # their downloads join this update, then a refactorisation
        pol.G.index_add_(0, late, self.pending.index_select(0, late))
        self.pending.index_fill_(0, late, 0.0)
        super()._scatter(rows, state, z)
        pol.count.index_add_(0, late, self.pending_count.index_select(0, late))
        self.pending_count.index_fill_(0, late, 0)
        pol.refactor(late)

    def _upload_due(self, rows: Tensor, due: Tensor) -> Tensor:
        gap = self.policy.logdet.index_select(0, rows) - self.synced_logdet.index_select(0, rows)
        return due & (gap > self.log_gamma_u)  # Eq. (3), on the statistics after the step

    # ------------------------------------------------------------------------------------ Algorithm 1
    def _register(self, rows: Tensor) -> None:
        new = rows[~self.registered.index_select(0, rows)]
        if new.numel() == 0:
            return
        if self.check_on_register:
            reps = self._client_ids(new)[0]
            due = (self.server_logdet.index_select(0, reps) - self.synced_logdet.index_select(0, new)) \
                > self.log_gamma_d
            if bool(due.any()):
                self._download(new[due])
        self.registered[new] = True

    def _communicate(self, reps: Tensor, rows: Tensor) -> None:
        """Uploads of ``rows`` (one per replicate in ``reps``), then the download checks of Eq. (4)."""
        _, clients = self._client_ids(rows)
        delivered = self.channel.send("upload", ("client", clients), ("server", 0), self.buffer.index_select(0, rows),
                                      self.message_scalars, reps)
        self.server.index_add_(0, reps, delivered)
        self.server_count.index_add_(0, reps, self.buffer_count.index_select(0, rows))
        self.synced_logdet.index_copy_(0, rows, self.policy.logdet.index_select(0, rows))  # S_i = V_i
        self.synced_count.index_add_(0, rows, self.buffer_count.index_select(0, rows))
        self.buffer.index_fill_(0, rows, 0.0)
        self.buffer_count.index_fill_(0, rows, 0)
        V = self.server.index_select(0, reps)[:, : self.dim, : self.dim]
        eye = torch.eye(self.dim, dtype=V.dtype, device=V.device)
        L = torch.linalg.cholesky(V + self.lam * eye)
        self.server_logdet.index_copy_(0, reps, 2 * torch.diagonal(L, dim1=-2, dim2=-1).log().sum(-1))
        R, cap = self.replicates, self.capacity
        uploaded = torch.zeros(R, dtype=torch.bool, device=rows.device)
        uploaded[reps] = True
        gap = self.server_logdet.view(R, 1) - self.synced_logdet.view(R, cap)
        due = (gap > self.log_gamma_d) & self.registered.view(R, cap) & uploaded.view(R, 1)
        if not self.download_to_uploader:
            due.view(-1)[rows] = False
        targets = self._in_client_order(due.view(-1).nonzero().view(-1))
        if targets.numel():
            self._download(targets)

    def _download(self, rows: Tensor) -> None:
        """Clients ``rows`` (distinct) take ΔV_{−j} = V_g − S_j, so that S_j = V_g (Eq. 4)."""
        reps, clients = self._client_ids(rows)
        pol = self.policy
        held = pol.G.index_select(0, rows)
        if not self.refresh_on_download:
            held = held + self.pending.index_select(0, rows)
        payload = self.server.index_select(0, reps) - (held - self.buffer.index_select(0, rows))
        delivered = self.channel.send("download", ("server", 0), ("client", clients), payload,
                                      self.message_scalars, reps)
        gained = self.server_count.index_select(0, reps) - self.synced_count.index_select(0, rows)
        if self.refresh_on_download:
            pol.G.index_add_(0, rows, delivered)
            pol.count.index_add_(0, rows, gained)
        else:
            self.pending.index_add_(0, rows, delivered)
            self.pending_count.index_add_(0, rows, gained)
        pol.invalidate(rows)
        self.synced_count.index_copy_(0, rows, self.server_count.index_select(0, reps))
        self.synced_logdet.index_copy_(0, rows, self.server_logdet.index_select(0, reps))

    # --------------------------------------------------------------------------------- compiled path
    kernel_state, kernel_settings = AsyncState, AsyncSettings

    @property
    def kernels(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        return ASYNC_RUN
