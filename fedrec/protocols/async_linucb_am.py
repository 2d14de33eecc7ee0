"""Async-LinUCB-AM (Li & Wang, AISTATS'22, Algorithms 3 and 5): heterogeneous clients.

Contexts split into a global part x^(g) (shared parameter θ^(g), learned federatedly through Algorithm 1)
and a local part x^(l) (client parameter θ^(i), never leaves the client). Each new reward is split into
partial rewards ŷ^(g), ŷ^(l) by alternating minimisation on the new point only (Eq. 7); arms are chosen by
the sum of the two UCBs (Eq. 8) with the AM radius (σ + 2)·(...) of Lemma 3.3.

AM runs on the torch path only: every step solves Eq. (7) with pseudo-inverses and Algorithm 5 tests ranks, which
the compiled kernels do not implement (yet).
"""
from __future__ import annotations

import torch
from torch import Tensor

from fedrec.bandits.linear import LinearBandit, LinUCB, RowState, outer
from fedrec.errors import ConfigError, check_float, check_int
from fedrec.protocols.async_linucb import AsyncLinUCB
from fedrec.protocols.base import PolicyFactory, build_policy


def project_unit_ball(theta: Tensor) -> Tensor:
    """Proj onto the unit ℓ2 ball: θ / max(‖θ‖, 1)."""
    return theta / theta.norm(dim=-1, keepdim=True).clamp_min(1.0)


class AsyncLinUCBAM(AsyncLinUCB):
    """Async-LinUCB-AM, batched over replicates and clients.

    Args:
        dim: full context dimension d_g + d_l (or d when ``global_dim`` is None).
        global_dim: d_g; the first ``global_dim`` coordinates are x^(g), the rest x^(l). ``None`` uses the same
            features for both parts (x^(g) ≡ x^(l) = x, the paper's real-data setting).
        policy: a LinUCB factory for the global, local and warm-up models (default: the paper's LinUCB).
        am_iterations: maximum alternations of Eq. (7) per step (authors' code: 100); stops early once the
            partial rewards change by at most ``am_tol``.
        noise_pad: the radius uses σ + ``noise_pad`` (paper, Lemma 3.3: 2; authors' code: 0).
        warmup: Algorithm 5: each client first runs a local full-dimensional LinUCB until its local data (or its
            downloaded global statistics) has full rank, then initialises AM on its local data. ``False`` is
            Algorithm 3 started from zero statistics (what the authors' code runs).
        Remaining arguments as in :class:`AsyncLinUCB`.
    """

    backends = ("torch",)
    shards_replicates = False  # runs in one process: no sharded run of it is checked against a one-process run

    def __init__(
        self,
        num_clients: int,
        dim: int,
        replicates: int = 1,
        global_dim: int | None = None,
        gamma_u: float = 5.0,
        gamma_d: float = 5.0,
        policy: PolicyFactory | None = None,
        noise_pad: float = 2.0,
        am_iterations: int = 100,
        am_tol: float = 1e-12,
        warmup: bool = False,
        preregister: bool = False,
        download_to_uploader: bool = True,
        check_on_register: bool = False,
        seed: int = 0,
        backend: str = "auto",
    ) -> None:
        dim = check_int("dim", dim)
        if global_dim is None:
            dims = (dim, dim)
        else:
            global_dim = check_int("global_dim", global_dim)
            if global_dim > dim:
                raise ConfigError(f"global_dim must be <= dim ({dim}), got {global_dim}")
            dims = (global_dim, dim - global_dim)
        if warmup and global_dim is None:
            raise ConfigError("warmup (Algorithm 5) needs split features: set global_dim")
        noise_pad = check_float("noise_pad", noise_pad, low=0.0)
        super().__init__(
            num_clients, dims[0], replicates, gamma_u, gamma_d, policy, preregister, download_to_uploader,
            check_on_register, True, seed, backend,
        )
        if not isinstance(self.policy, LinUCB):
            raise ConfigError(f"policy: Async-LinUCB-AM needs policy=linucb, got {type(self.policy).__name__}")
        self.policy.sigma += noise_pad  # Lemma 3.3: the AM radius uses σ + 2
        self.context_dim = dim
        self.global_dim, self.local_dim = dims
        self.shared_features = global_dim is None
        self.am_iterations = check_int("am_iterations", am_iterations)
        self.am_tol = check_float("am_tol", am_tol, low=0.0)
        R, N = self.replicates, self.num_clients
        self.local = None
        if self.local_dim > 0:
            self.local = build_policy(policy, self.local_dim, (R, N), self.seed)
            self.local.sigma += noise_pad
        self.warmup = bool(warmup) and self.local_dim > 0
        if self.warmup:
            self.warm = build_policy(policy, dim, (R, N), self.seed)
            self.register_buffer("am_ready", torch.zeros(R * N, dtype=torch.bool))

    def _split(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if self.shared_features:
            return x, x
        return x[..., : self.global_dim], x[..., self.global_dim :]

    # ------------------------------------------------------------------------------------------- steps
    def _bandits(self) -> dict[str, LinearBandit]:
        out: dict[str, LinearBandit] = {"policy": self.policy}
        if self.local is not None:
            out["local"] = self.local
        if self.warmup:
            out["warm"] = self.warm
        return out

    def _row_buffers(self) -> dict[str, Tensor]:
        # AM reads whole Gram matrices, so they are carried as state instead of being added after the window
        out = {"buffer": self.buffer, **super()._row_buffers()}
        out.update({f"G.{name}": bandit.G for name, bandit in self._bandits().items()})
        if self.warmup:
            out["am_ready"] = self.am_ready
        return out

    def _additive(self) -> list[Tensor]:
        return []

    def _upload_due(self, rows: Tensor, due: Tensor) -> Tensor:
        return due & (self.policy.logdet.index_select(0, rows) - self.synced_logdet.index_select(0, rows)
                      > self.log_gamma_u)  # Eq. (3); a State-0 client (Algorithm 5 warm-up) never uploads

    def _advance(self, rows: Tensor, contexts: Tensor, rewards: Tensor, state: RowState):
        parts = {name: {k: state[f"{name}.{k}"] for k in b.state_keys} for name, b in self._bandits().items()}
        for name in parts:
            parts[name]["G"] = state[f"G.{name}"]
        cg, cl = self._split(contexts)
        scores = self.policy.scores(cg, parts["policy"])  # Eq. (8): global UCB + local UCB
        if self.local is not None:
            scores = scores + self.local.scores(cl, parts["local"])
        ready = state["am_ready"] if self.warmup else None
        if self.warmup:
            scores = torch.where(ready.unsqueeze(-1), scores, self.warm.scores(contexts, parts["warm"]))
        arms, x, y = self.policy.pick(contexts, rewards, scores)
        xg, xl = self._split(x)
        yg, yl = self._partial_rewards(parts, xg, xl, y)
        new: RowState = {}
        z = self._advance_part(new, "policy", parts, xg, yg)
        new["buffer"] = state["buffer"] + outer(z)
        new["buffer_count"] = state["buffer_count"] + 1
        if self.local is not None:
            self._advance_part(new, "local", parts, xl, yl)
        due = torch.ones_like(arms, dtype=torch.bool)
        if self.warmup:  # State-0 clients keep their global and local statistics and never upload
            self._advance_part(new, "warm", parts, x, y)
            for k in list(new):
                if not k.endswith("warm") and not k.startswith("warm."):
                    new[k] = _where_rows(ready, new[k], state[k])
            new["am_ready"] = ready.clone()
            due &= ready
            self._leave_warmup(new, ~ready)
        return arms, due, new, z

    def _advance_part(self, new: RowState, name: str, parts: dict[str, RowState], x: Tensor, y: Tensor) -> Tensor:
        """Advance one of the bandits (global, local or warm-up) by (x, y) into ``new``; returns z."""
        state, z = self._bandits()[name].advance(parts[name], x, y)
        new.update({f"{name}.{k}": v for k, v in state.items()})
        new[f"G.{name}"] = parts[name]["G"] + outer(z)
        return z

    def _partial_rewards(self, parts: dict[str, RowState], xg: Tensor, xl: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Alternating minimisation of Eq. (7) on the new point; returns (ŷ^(g), ŷ^(l))."""
        if self.local is None:
            return y, torch.zeros_like(y)
        Gg, Gl = parts["policy"]["G"], parts["local"]["G"]
        Mg = torch.linalg.pinv(Gg[:, :-1, :-1] + xg.unsqueeze(-1) * xg.unsqueeze(-2), hermitian=True)
        Ml = torch.linalg.pinv(Gl[:, :-1, :-1] + xl.unsqueeze(-1) * xl.unsqueeze(-2), hermitian=True)
        # θ̃ = Proj(p + q·ŷ) with p = M b and q = M x; only x·θ̃ is needed, a function of five scalars
        g = _Coefficients(xg, (Mg @ Gg[:, :-1, -1:]).squeeze(-1), (Mg @ xg.unsqueeze(-1)).squeeze(-1))
        loc = _Coefficients(xl, (Ml @ Gl[:, :-1, -1:]).squeeze(-1), (Ml @ xl.unsqueeze(-1)).squeeze(-1))
        theta_g = torch.bmm(parts["policy"]["inv"], Gg[:, :-1, -1:]).squeeze(-1)  # start: current ridge θ̂^(g)
        yl = y - (xg * project_unit_ball(theta_g)).sum(-1)
        for _ in range(self.am_iterations):
            yl_new = y - g.x_dot_proj(y - loc.x_dot_proj(yl))
            converged = bool(((yl_new - yl).abs() <= self.am_tol).all())
            yl = yl_new
            if converged:
                break
        return y - loc.x_dot_proj(yl), yl

    # ------------------------------------------------------------------------------ Algorithm 5 warm-up
    def _leave_warmup(self, new: RowState, cold: Tensor) -> None:
        """State-0 rows initialise AM once their local data (or downloaded global data) has full rank."""
        idx = cold.nonzero().view(-1)
        if idx.numel() == 0:
            return
        D, dg = self.context_dim, self.global_dim
        full = torch.linalg.matrix_rank(new["G.warm"][idx, :D, :D], hermitian=True) == D
        glob = torch.linalg.matrix_rank(new["G.policy"][idx, :dg, :dg], hermitian=True) == dg
        for i, f, gf in zip(idx.tolist(), full.tolist(), glob.tolist()):
            if f or gf:
                self._initialise_am(new, i, use_local=f)

    def _initialise_am(self, new: RowState, i: int, use_local: bool) -> None:
        """Batch AM (Eq. 6) on the client's warm-up data, then seed its global and local statistics."""
        dg = self.global_dim
        W = new["G.warm"][i]
        gram, xy = W[:-1, :-1], W[:-1, -1]
        Agg, Agl, All = gram[:dg, :dg], gram[:dg, dg:], gram[dg:, dg:]
        if use_local:  # global block of the least-squares estimate: unbiased for θ^(g) (Remark 1)
            theta_g = (torch.linalg.pinv(gram, hermitian=True) @ xy)[:dg]
        else:  # the client's downloaded global statistics are full rank
            Vg = new["G.policy"][i]
            theta_g = torch.linalg.solve(Vg[:dg, :dg], Vg[:dg, dg])
        Pg, Pl = torch.linalg.pinv(Agg, hermitian=True), torch.linalg.pinv(All, hermitian=True)
        theta_l = torch.zeros(self.local_dim, dtype=W.dtype)
        for _ in range(self.am_iterations):
            theta_l = project_unit_ball(Pl @ (xy[dg:] - Agl.T @ theta_g))
            theta_g = project_unit_ball(Pg @ (xy[:dg] - Agl @ theta_l))
        # augmented Grams of (x^(g), ŷ^(g) = y − x^(l)·θ^(l)) and (x^(l), ŷ^(l) = y − x^(g)·θ^(g)), symmetric
        yy = W[-1, -1]
        zg = _augmented(Agg, xy[:dg] - Agl @ theta_l, yy - 2 * theta_l @ xy[dg:] + theta_l @ All @ theta_l)
        zl = _augmented(All, xy[dg:] - Agl.T @ theta_g, yy - 2 * theta_g @ xy[:dg] + theta_g @ Agg @ theta_g)
        n = new["warm.count"][i]
        for name, G, count in (("policy", new["G.policy"][i] + zg, new["policy.count"][i] + n), ("local", zl, n)):
            bandit = self._bandits()[name]
            L = torch.linalg.cholesky(G[:-1, :-1] + bandit.lam * bandit._eye)
            new[f"G.{name}"][i] = G
            new[f"{name}.b"][i] = G[:-1, -1]
            new[f"{name}.inv"][i] = torch.cholesky_inverse(L)
            new[f"{name}.logdet"][i] = 2 * torch.log(torch.diagonal(L)).sum()
            new[f"{name}.count"][i] = count
            new[f"{name}.since_refactor"][i] = 0
        new["buffer"][i] = new["buffer"][i] + zg
        new["buffer_count"][i] = new["buffer_count"][i] + n
        new["am_ready"][i] = True


def _augmented(gram: Tensor, xy: Tensor, yy: Tensor) -> Tensor:
    """[[XᵀX, Xᵀy], [yᵀX, yᵀy]] from its blocks."""
    d = gram.shape[0]
    out = torch.empty(d + 1, d + 1, dtype=gram.dtype)
    out[:d, :d], out[:d, d], out[d, :d], out[d, d] = gram, xy, xy, yy
    return out


def _where_rows(mask: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """Row-wise select: a where ``mask`` (m,) else b."""
    return torch.where(mask.view(-1, *([1] * (a.dim() - 1))), a, b)


class _Coefficients:
    """x·Proj(p + q s) as a function of the scalar s, from x·p, x·q, p·p, p·q, q·q (batched over rows)."""

    def __init__(self, x: Tensor, p: Tensor, q: Tensor) -> None:
        self.xp, self.xq = (x * p).sum(-1), (x * q).sum(-1)
        self.pp, self.pq, self.qq = (p * p).sum(-1), (p * q).sum(-1), (q * q).sum(-1)

    def x_dot_proj(self, s: Tensor) -> Tensor:
        norm = (self.pp + 2 * s * self.pq + s * s * self.qq).clamp_min(0).sqrt()
        return (self.xp + s * self.xq) / norm.clamp_min(1.0)
