"""Async-LinUCB (Li & Wang, AISTATS'22, Algorithms 1–2): event-triggered uploads and downloads.

Client j's last synchronised copy S_j = V_j − ΔV_j = V_g − ΔV_{−j} (spec invariant 1) changes only when j
itself communicates, so log det S_j(λ) is cached per client. The upload trigger (Eq. 3) compares
log det V_i(λ) − log det S_i(λ) with log γ_U, and after an upload the download triggers (Eq. 4) of all
registered clients are one vector comparison of log det V_g(λ) − log det S_j(λ) with log γ_D: O(N) per
upload instead of the 2N determinants of the authors' code.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from fedrec.bandits.linear import RowState, outer
from fedrec.federation.protocol import ClientServerLinUCB, _Window, log_threshold


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
    def _plan(self, block: _Window, start: Tensor, limit: Tensor) -> tuple[Tensor, _Plan | None]:
        """Plan every upload in [start, limit) and the downloads each triggers (Algorithm 1) before committing.

        Uploads are replayed in time order on the server: upload k adds the uploader's buffer C_k (its committed
        buffer plus z zᵀ of its window steps up to the upload) to V_g, and the download trigger of Eq. (4) is a
        vector comparison over the replicate's clients. A step of a client that uploaded or downloaded earlier
        in the range is stale, so the range ends at the first such step and only the uploads before it count.
        """
        R, w = block.rows.shape
        N, d = self.num_clients, self.dim
        steps = torch.arange(w)
        in_range = (steps >= start.view(-1, 1)) & (steps < limit.view(-1, 1))
        due = block.due.view(R, w) & in_range
        if not bool(due.any()):
            return limit, None
        ev = due.nonzero()  # upload events in time order within each replicate
        ev_rep, ev_pos = ev[:, 0], ev[:, 1]
        ev_flat = ev_rep * w + ev_pos
        ev_row = block.flat_rows[ev_flat]
        n_ev = len(ev_row)
        # C_k = committed buffer + z zᵀ of the uploader's steps in [start, its upload]
        event_of_row = torch.full((R * N,), -1, dtype=torch.long)
        event_of_row.scatter_reduce_(0, ev_row, torch.arange(n_ev), reduce="amin", include_self=False)
        C = self.buffer.index_select(0, ev_row)
        flat_range = in_range.view(-1)
        for sel, z in block.waves:
            k = event_of_row.index_select(0, block.flat_rows[sel])
            take = (k >= 0) & flat_range[sel] & (sel <= ev_flat[k.clamp_min(0)])
            if bool(take.any()):
                C.index_add_(0, k[take], outer(z[take]))
        # V_g after each upload, summed in time order: ((V_g + C_1) + C_2) + ...
        first = torch.ones(n_ev, dtype=torch.bool)
        first[1:] = ev_rep[1:] != ev_rep[:-1]
        C[first] += self.server.index_select(0, ev_rep[first])
        counts = block.carry["buffer_count"].index_select(0, ev_flat)
        counts[first] += self.server_count.index_select(0, ev_rep[first])
        aggregate, agg_count = _segment_cumsum(C, first), _segment_cumsum(counts, first)
        L = torch.linalg.cholesky_ex(aggregate[:, :d, :d] + self.lam * self.policy._eye).L
        logdet = 2 * torch.diagonal(L, dim1=-2, dim2=-1).log().sum(-1)
        dl_event, dl_row = self._replay_downloads(block, in_range, ev_rep, ev_pos, ev_row, event_of_row, logdet)
        # the first upload or download of each client ends the range before its next step
        touched = torch.full((R * N,), w, dtype=torch.long)
        touched.scatter_reduce_(0, torch.cat([ev_row, dl_row]), torch.cat([ev_pos, ev_pos[dl_event]]), reduce="amin")
        stale = (touched[block.rows] < steps) & in_range
        end = torch.minimum(limit, torch.where(stale, steps, w).min(-1).values)
        kept = (ev_pos < end[ev_rep]) & (event_of_row[ev_row] == torch.arange(n_ev))  # a 2nd upload is stale
        dl_kept = kept[dl_event]
        return end, _Plan(
            events=kept.nonzero().view(-1), rows=ev_row, reps=ev_rep, aggregate=aggregate, agg_count=agg_count,
            logdet=logdet, L=L, dl_event=dl_event[dl_kept], dl_row=dl_row[dl_kept],
        )

    def _replay_downloads(
        self, block: _Window, in_range: Tensor, ev_rep: Tensor, ev_pos: Tensor, ev_row: Tensor,
        event_of_row: Tensor, logdet: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """The downloads (event, client row) that the planned uploads trigger, by Eq. (4).

        log det V_g(λ) only grows from upload to upload, so a client that last synchronised at log-det s
        downloads first at the first upload k with L_k > s + log γ_D, and next at the first k' with
        L_k' > L_k + log γ_D: every client's downloads form a chain through the same successor table. An
        uploader's chain restarts at its upload, where its S_i becomes its own V_i. (Rounding can make L dip by
        1e-15 between uploads; the chains follow its running maximum.)
        """
        R, w = block.rows.shape
        N, n_ev = self.num_clients, len(ev_row)
        empty = torch.zeros(0, dtype=torch.long)
        if self.log_gamma_d == math.inf:
            return empty, empty
        tau = self.log_gamma_d
        counts = torch.bincount(ev_rep, minlength=R)
        seg_start = counts.cumsum(0) - counts
        seg_end = seg_start + counts
        local = torch.arange(n_ev) - seg_start[ev_rep]
        width = int(counts.max())
        L = torch.full((R, width), math.inf, dtype=logdet.dtype)
        L[ev_rep, local] = logdet
        L = L.cummax(1).values
        P = torch.full((R, width), w, dtype=torch.long)
        P[ev_rep, local] = ev_pos

        def first_above(r: Tensor, level: Tensor) -> Tensor:  # global index of the first upload of r with L > level
            return seg_start[r] + torch.searchsorted(L[r], level.unsqueeze(-1), right=True).squeeze(-1)

        successor = torch.cat([first_above(ev_rep, L[ev_rep, local] + tau), torch.tensor([n_ev])])
        # chains of every client from its cached log det S_j(λ), from the step where it is registered
        eligible_from = torch.where(self.registered.view(R, N), -1, w)
        newcomer = block.first_visit & in_range & ~self.registered[block.rows]
        eligible_from.view(-1).scatter_reduce_(0, block.rows[newcomer], torch.arange(w).expand(R, w)[newcomer], reduce="amin")
        start = torch.maximum(
            torch.searchsorted(L, self.synced_logdet.view(R, N) + tau, right=True),
            torch.searchsorted(P, eligible_from),
        ) + seg_start.view(-1, 1)
        bound = seg_end.view(-1, 1).expand(R, N).reshape(-1).clone()
        uploaders = ev_row[event_of_row[ev_row] == torch.arange(n_ev)]
        first_upload = event_of_row[uploaders]
        bound[uploaders] = first_upload  # an uploader's chain restarts at its upload ...
        rows = torch.cat([torch.arange(R * N), uploaders])
        k = torch.cat([start.view(-1), torch.maximum(
            first_above(ev_rep[first_upload], block.carry["policy.logdet"][ev_rep[first_upload] * w + ev_pos[first_upload]] + tau),
            first_upload + (0 if self.download_to_uploader else 1),
        )])
        bound = torch.cat([bound, seg_end[ev_rep[first_upload]]])  # ... and runs to the end
        events, clients = [], []
        while True:
            live = k < bound
            if not bool(live.any()):
                break
            k, rows, bound = k[live], rows[live], bound[live]
            events.append(k)
            clients.append(rows)
            k = successor[k]
        if not events:
            return empty, empty
        return torch.cat(events), torch.cat(clients)

    def _communicate(self, plan: _Plan) -> Tensor:
        """Carry out the planned uploads and downloads (their steps are committed)."""
        N = self.num_clients
        pol, buffer, buffer_count = self.policy, self.buffer, self.buffer_count
        ev = plan.events
        rows, reps = plan.rows[ev], plan.reps[ev]
        self.channel.send("upload", reps, buffer.index_select(0, rows), self.message_scalars)
        # each server ends at its replicate's last planned upload
        last = torch.full((self.replicates,), -1, dtype=torch.long)
        last.scatter_reduce_(0, reps, ev, reduce="amax")
        served = (last >= 0).nonzero().view(-1)
        last = last[served]
        self.server.index_copy_(0, served, plan.aggregate[last])
        self.server_count.index_copy_(0, served, plan.agg_count[last])
        self.server_logdet.index_copy_(0, served, plan.logdet[last])
        self.synced_logdet.index_copy_(0, rows, pol.logdet.index_select(0, rows))  # S_i = V_i after the upload
        self.synced_count.index_add_(0, rows, buffer_count.index_select(0, rows))
        buffer.index_fill_(0, rows, 0)
        buffer_count.index_fill_(0, rows, 0)
        if plan.dl_row.numel() == 0:
            return rows
        # a client's downloads in this plan arrive together: it ends holding V_g of its last one
        self.channel.ledger.record("download", plan.reps[plan.dl_event], self.message_scalars, self.channel.bytes_per_scalar)
        clients = torch.unique(plan.dl_row)
        final = torch.full((self.replicates * N,), -1, dtype=torch.long)
        final.scatter_reduce_(0, plan.dl_row, plan.dl_event, reduce="amax")
        k = final[clients]
        self._receive(clients, plan.aggregate[k], plan.agg_count[k], plan.logdet[k])
        empty = buffer_count.index_select(0, clients) == 0  # such a client now holds exactly V_g
        in_sync, k = (clients, k) if bool(empty.all()) else (clients[empty], k[empty])
        used, which = torch.unique(k, return_inverse=True)  # factorise each planned V_g once
        pol.inv.index_copy_(0, in_sync, torch.cholesky_inverse(plan.L[used])[which])
        pol.logdet.index_copy_(0, in_sync, plan.logdet[k])
        pol.since_refactor.index_fill_(0, in_sync, 0)
        pol.stale.index_fill_(0, in_sync, False)
        if len(in_sync) < len(clients):
            pol.invalidate(clients[~empty])  # refactorised when next used: most download again before that
        return torch.cat([rows, clients])

    def _download(self, reps: Tensor, rows: Tensor) -> None:
        """Send ΔV_{−j} = V_g − S_j to newly registered clients (the optional registration-time check)."""
        self.channel.ledger.record("download", reps, self.message_scalars, self.channel.bytes_per_scalar)
        self._receive(
            rows, self.server.index_select(0, reps), self.server_count.index_select(0, reps),
            self.server_logdet.index_select(0, reps),
        )
        self.policy.invalidate(rows)

    def _receive(self, rows: Tensor, aggregate: Tensor, agg_count: Tensor, logdet: Tensor) -> None:
        """Clients ``rows`` (distinct) take the server state ``aggregate``: V_j += V_g − S_j, so S_j = V_g.

        The message is counted by the caller; their inverses are the caller's to update.
        """
        pol = self.policy
        synced = pol.G.index_select(0, rows) - self.buffer.index_select(0, rows)
        pol.G.index_add_(0, rows, self.channel.deliver("download", aggregate - synced))
        pol.count.index_add_(0, rows, agg_count - self.synced_count.index_select(0, rows))
        self.synced_count.index_copy_(0, rows, agg_count)
        self.synced_logdet.index_copy_(0, rows, logdet)


@dataclass
class _Plan:
    """Upload events of a range (``events`` index the planned ones) and the downloads they trigger."""

    events: Tensor
    rows: Tensor
    reps: Tensor
    aggregate: Tensor  # V_g after each upload
    agg_count: Tensor
    logdet: Tensor  # log det V_g(λ) after each upload
    L: Tensor  # its Cholesky factor
    dl_event: Tensor  # upload event of each download
    dl_row: Tensor  # its client


def _segment_cumsum(x: Tensor, first: Tensor) -> Tensor:
    """Cumulative sums of ``x`` along dim 0, restarting where ``first`` is true (``first[0]`` must be true)."""
    cs = x.cumsum(0)
    starts = first.nonzero().view(-1)
    base = torch.zeros_like(cs[:1]).expand(len(starts), *cs.shape[1:]).clone()
    base[1:] = cs[starts[1:] - 1]
    return cs - base[first.cumsum(0) - 1]
