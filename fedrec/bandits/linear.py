"""Linear contextual bandit policies (LinUCB, LinTS) as torch modules over batched ridge statistics.

Every policy holds, for each of ``prod(batch_shape)`` independent rows (clients, replicate seeds, or both):
the augmented Gram matrix ``G = Σ z zᵀ`` with ``z = [x; y]`` (so ``V = G[:d, :d]`` and ``b = G[:d, d]`` grow
by one rank-one addition), the inverse ``(V + λI)^{-1}`` kept current by Sherman–Morrison updates, and
``log det(V + λI)`` kept current by the matrix determinant lemma. A row's inverse and log-determinant are
recomputed from ``V`` by Cholesky once it has had ``refactor_every`` updates since the last time, which bounds
the round-off drift of the rank-one updates. Everything is float64.

A step is a pure function of a row's state (:meth:`LinearBandit.gather` → :meth:`scores` / :meth:`advance` →
:meth:`scatter`), which lets federated protocols compute many clients' steps in one batch. ``G`` is not part
of that state: it only ever grows by the z zᵀ a step returns, so callers add those to ``G`` directly.
"""
from __future__ import annotations

import math
from abc import ABCMeta, abstractmethod
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fedrec.errors import ConfigError, check_choice, check_float, check_int

__all__ = ["LinTS", "LinUCB", "LinearBandit", "RowState", "confidence_radius"]

#: a row's state: tensors with a leading row dimension, keyed by buffer name
RowState = dict[str, Tensor]

#: the policy kinds of the compiled kernels (:class:`fedrec.protocols.kernels.linear.LinearParams`)
LINUCB, LINTS = 0, 1

#: arms whose scores are within this of the maximum count as tied; the lowest index among them is picked, so
#: exact ties (e.g. unit-norm arms before any data) do not depend on the rounding of one implementation
TIE_TOLERANCE = 1e-9


def first_near_max(scores: Tensor) -> Tensor:
    """Per row of ``scores`` (m, K), the first arm within :data:`TIE_TOLERANCE` of the row's maximum."""
    best = scores.max(-1, keepdim=True).values
    return (scores >= best - TIE_TOLERANCE).to(torch.int8).argmax(-1)


def confidence_radius(
    logdet: Tensor, count: Tensor, dim: int, lam: float, sigma: float, delta: float, bound: str = "determinant"
) -> Tensor:
    """OFUL radius α_t (Abbasi-Yadkori et al. 2011; Async-LinUCB paper Eq. 5, with ‖θ‖ ≤ 1).

    ``bound="determinant"`` uses log det(V(λ))/det(λI) exactly, as the paper prints it;
    ``bound="count"`` uses its upper bound d·log(1 + n/(dλ)), as the authors' code does.
    """
    if bound == "determinant":
        info = logdet - dim * math.log(lam)
    else:
        info = dim * torch.log1p(count.to(logdet.dtype) / (dim * lam))
    return sigma * torch.sqrt(info.clamp_min(0) + 2 * math.log(1 / delta)) + math.sqrt(lam)


class LinearBandit(nn.Module, metaclass=ABCMeta):
    """Batched ridge-regression state shared by LinUCB and LinTS.

    Rows are addressed by a flat index into ``batch_shape``; methods taking ``index=None`` act on all rows.
    """

    #: whether the compiled kernels implement this policy (else protocols play it on the torch path)
    compiled = True
    #: a row's state; ``b`` is a copy of the b column of ``G`` and is never scattered back
    state_keys = ("inv", "logdet", "b", "count", "since_refactor")
    #: the part of a row's state that a step changes and :meth:`scatter` writes back
    step_keys = ("inv", "logdet", "count", "since_refactor")

    def __init__(
        self,
        dim: int,
        lam: float = 1.0,
        batch_shape: Sequence[int] = (),
        refactor_every: int = 1000,
        device: str | torch.device | None = None,
    ) -> None:
        super().__init__()
        self.dim = check_int("dim", dim)
        self.lam = check_float("lam", lam, low=0.0, low_open=True)
        self.refactor_every = check_int("refactor_every", refactor_every)
        self.batch_shape = tuple(check_int("batch_shape", s) for s in batch_shape)
        rows = math.prod(self.batch_shape)
        d = self.dim
        kw = dict(dtype=torch.float64, device=device)
        eye = torch.eye(d, **kw)
        self.register_buffer("G", torch.zeros(rows, d + 1, d + 1, **kw))
        self.register_buffer("inv", (eye / self.lam).expand(rows, d, d).clone())
        self.register_buffer("logdet", torch.full((rows,), d * math.log(self.lam), **kw))
        self.register_buffer("count", torch.zeros(rows, dtype=torch.long, device=device))
        self.register_buffer("since_refactor", torch.zeros(rows, dtype=torch.long, device=device))
        # rows whose G changed wholesale (a download) and whose inverse is recomputed when next used
        self.register_buffer("stale", torch.zeros(rows, dtype=torch.bool, device=device))
        self.register_buffer("_eye", eye, persistent=False)

    # ------------------------------------------------------------------------------------------ views
    @property
    def V(self) -> Tensor:
        """Unregularised Gram matrices Σ x xᵀ, shape (rows, d, d) (a view into ``G``)."""
        return self.G[:, : self.dim, : self.dim]

    @property
    def b(self) -> Tensor:
        """Response vectors Σ x y, shape (rows, d) (a view into ``G``)."""
        return self.G[:, : self.dim, self.dim]

    @property
    def num_rows(self) -> int:
        return self.G.shape[0]

    def theta(self, index: Tensor | None = None) -> Tensor:
        """Ridge estimates θ̂ = (V + λI)^{-1} b of the addressed rows, shape (rows, d)."""
        return _theta(self.gather(self._rows(index)))

    # ------------------------------------------------------------------------------- pure row steps
    def gather(self, rows: Tensor, refresh: bool = True) -> RowState:
        """Copy the state of ``rows`` (refactorising stale ones first, unless ``refresh`` is False)."""
        if refresh:
            self.refresh(rows)
        state = {k: getattr(self, k).index_select(0, rows) for k in self.state_keys}
        state["row"] = rows
        return state

    def invalidate(self, rows: Tensor) -> None:
        """Mark ``rows`` for refactorisation when next used (their ``G`` was replaced or added to)."""
        self.stale.index_fill_(0, rows, True)

    def refresh(self, rows: Tensor | None = None) -> None:
        """Refactorise the stale rows among ``rows`` (all rows if None)."""
        stale = self.stale if rows is None else self.stale.index_select(0, rows)
        if bool(stale.any()):
            self.refactor(stale.nonzero().view(-1) if rows is None else rows[stale])

    def scatter(self, rows: Tensor, state: RowState) -> None:
        """Write ``state`` back into ``rows`` (distinct) and refactorise rows that are due.

        The rows' z zᵀ must already have been added to ``G`` (refactorisation reads V from it).
        """
        for k in self.step_keys:
            getattr(self, k).index_copy_(0, rows, state[k])
        due = state["since_refactor"] >= self.refactor_every
        if bool(due.any()):
            self.refactor(rows[due])

    @abstractmethod
    def scores(self, contexts: Tensor, state: RowState) -> Tensor:
        """Scores (m, K) of the arms ``contexts`` (m, K, d) for rows in ``state``."""

    @abstractmethod
    def kernel_params(self) -> dict[str, float | int | bool]:
        """The policy's settings by name, as the compiled kernels take them (the fields of
        :class:`fedrec.protocols.kernels.linear.LinearParams`)."""

    def advance(self, state: RowState, x: Tensor, r: Tensor) -> tuple[RowState, Tensor]:
        """State after observing (x, r): Sherman–Morrison inverse and determinant-lemma log-det.

        Returns (new state, z = [x; r]); the caller adds z zᵀ to ``G``. Rejects non-finite inputs.
        """
        z = torch.cat([x, r.unsqueeze(-1)], dim=-1)
        if not bool(torch.isfinite(z).all()):
            raise ValueError("reward and context must be finite (got NaN or inf)")
        inv = state["inv"]
        Ax = torch.bmm(inv, x.unsqueeze(-1))  # (m, d, 1)
        denom = torch.bmm(x.unsqueeze(-2), Ax).add_(1.0)  # (m, 1, 1)
        new = {
            "inv": inv - torch.bmm(Ax, Ax.transpose(-1, -2)).div_(denom),
            "logdet": state["logdet"] + denom.view(-1).log(),
            "b": state["b"] + x * r.unsqueeze(-1),  # the same arithmetic as G's b column gets from z zᵀ
            "count": state["count"] + 1,
            "since_refactor": state["since_refactor"] + 1,
        }
        return new, z

    def absorb(self, rows: Tensor, z: Tensor) -> None:
        """Add z zᵀ to ``G`` of the (distinct) ``rows``."""
        self.G.index_add_(0, rows, outer(z))

    @staticmethod
    def pick(contexts: Tensor, rewards: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Best arms (:func:`first_near_max`) with their contexts and rewards (``rewards`` is (m, K))."""
        arms = first_near_max(scores)
        col = arms.view(-1, 1)
        x = contexts.gather(1, col.unsqueeze(-1).expand(-1, 1, contexts.shape[-1])).squeeze(1)
        return arms, x, rewards.to(contexts.dtype).gather(1, col).squeeze(1)

    # ------------------------------------------------------------------------------------------- API
    def _rows(self, index: Tensor | None) -> Tensor:
        if index is None:
            return torch.arange(self.num_rows, device=self.G.device)
        return torch.as_tensor(index, dtype=torch.long, device=self.G.device).reshape(-1)

    def _flat_contexts(self, contexts: Tensor, index: Tensor | None) -> Tensor:
        contexts = torch.as_tensor(contexts, dtype=torch.float64, device=self.G.device)
        if contexts.dim() < 2 or contexts.shape[-1] != self.dim:
            raise ValueError(f"contexts must have shape (..., K, {self.dim}), got {tuple(contexts.shape)}")
        if contexts.shape[-2] < 1:
            raise ValueError("contexts must hold at least one arm (K >= 1)")
        if not bool(torch.isfinite(contexts).all()):
            raise ValueError("contexts must be finite (got NaN or inf)")
        if index is None:
            expected = self.batch_shape + tuple(contexts.shape[-2:])
            if tuple(contexts.shape) != expected:
                raise ValueError(f"contexts must have shape {expected}, got {tuple(contexts.shape)}")
        return contexts.reshape(-1, *contexts.shape[-2:])

    @torch.no_grad()
    def select(self, contexts: Tensor, index: Tensor | None = None) -> Tensor:
        """Pick one arm per addressed row: the best score, ties (within :data:`TIE_TOLERANCE`) to the lowest index.

        ``contexts`` is ``(*batch_shape, K, d)`` when ``index`` is None, else ``(len(index), K, d)``.
        Returns arm indices shaped like the addressed rows (a 0-d tensor for an unbatched policy).
        """
        flat = self._flat_contexts(contexts, index)
        arms = first_near_max(self.scores(flat, self.gather(self._rows(index))))
        return arms.reshape(self.batch_shape) if index is None else arms

    @torch.no_grad()
    def update(self, x: Tensor, reward: Tensor | float, index: Tensor | None = None) -> None:
        """Add observations (x, reward) to the addressed (distinct) rows. Rejects NaN/inf inputs."""
        rows = self._rows(index)
        x = torch.as_tensor(x, dtype=torch.float64, device=self.G.device).reshape(-1, self.dim)
        r = torch.as_tensor(reward, dtype=torch.float64, device=self.G.device).reshape(-1)
        if x.shape[0] != rows.shape[0] or r.shape[0] != rows.shape[0]:
            raise ValueError(
                f"update expects one context and one reward per addressed row ({rows.shape[0]}), "
                f"got {x.shape[0]} contexts and {r.shape[0]} rewards"
            )
        if _repeated(rows):  # one row at a time, in order: each update sees the ones before it
            for i in range(rows.shape[0]):
                self.update(x[i], r[i], rows[i : i + 1])
            return
        new, z = self.advance(self.gather(rows), x, r)
        self.absorb(rows, z)
        self.scatter(rows, new)

    @torch.no_grad()
    def play(self, contexts: Tensor, rewards: Tensor, index: Tensor | None = None) -> Tensor:
        """One simulated step: select arms, read the picked arms' rewards from ``rewards`` (…, K), update.

        Equivalent to :meth:`select` followed by :meth:`update`, but gathers each row's state once. A row
        addressed several times plays in order, each step after the previous one's update.
        """
        flat = self._flat_contexts(contexts, index)
        rows = self._rows(index)
        r = torch.as_tensor(rewards, device=self.G.device).reshape(flat.shape[:2])
        if not bool(torch.isfinite(r).all()):
            raise ValueError("rewards must be finite (got NaN or inf)")
        if _repeated(rows):
            return torch.cat([self.play(flat[i : i + 1], r[i : i + 1], rows[i : i + 1]) for i in range(len(rows))])
        state = self.gather(rows)
        arms, x, r = self.pick(flat, r, self.scores(flat, state))
        new, z = self.advance(state, x, r)
        self.absorb(rows, z)
        self.scatter(rows, new)
        return arms.reshape(self.batch_shape) if index is None else arms

    @torch.no_grad()
    def refactor(self, index: Tensor | None = None) -> None:
        """Recompute inverse and log-determinant of the addressed rows from V by Cholesky."""
        rows = self._rows(index)
        if rows.numel() == 0:
            return
        L = torch.linalg.cholesky(self.V[rows] + self.lam * self._eye)
        self.inv[rows] = torch.cholesky_inverse(L)
        self.logdet[rows] = 2 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
        self.since_refactor[rows] = 0
        self.stale[rows] = False

    @torch.no_grad()
    def broadcast_statistics(self, index: Tensor, G: Tensor, count: Tensor | int) -> None:
        """Give every addressed row the same statistics ``G`` (d+1, d+1), factorising it once."""
        L = torch.linalg.cholesky(G[: self.dim, : self.dim] + self.lam * self._eye)
        self.G[index] = G
        self.count[index] = count
        self.inv[index] = torch.cholesky_inverse(L)
        self.logdet[index] = 2 * torch.log(torch.diagonal(L)).sum()
        self.since_refactor[index] = 0
        self.stale[index] = False


def _repeated(rows: Tensor) -> bool:
    return rows.numel() > 1 and torch.unique(rows).numel() < rows.numel()


def outer(z: Tensor) -> Tensor:
    """Batched outer products z zᵀ of the rows of ``z`` (m, n) -> (m, n, n)."""
    return z.unsqueeze(-1) * z.unsqueeze(-2)


def _theta(state: RowState) -> Tensor:
    return torch.bmm(state["inv"], state["b"].unsqueeze(-1)).squeeze(-1)


class LinUCB(LinearBandit):
    """LinUCB / OFUL: score = xᵀθ̂ + α·‖x‖_{(V+λI)^{-1}} (Async-LinUCB paper Eq. 5).

    ``alpha`` fixes the exploration weight; ``alpha=None`` uses the theoretical radius of
    :func:`confidence_radius` with noise level ``sigma`` and confidence ``delta``.
    """

    def __init__(
        self,
        dim: int,
        alpha: float | None = 1.0,
        lam: float = 1.0,
        batch_shape: Sequence[int] = (),
        sigma: float = 0.1,
        delta: float = 0.1,
        radius_bound: str = "determinant",
        refactor_every: int = 1000,
        device: str | torch.device | None = None,
    ) -> None:
        super().__init__(dim, lam, batch_shape, refactor_every, device)
        self.alpha = None if alpha is None else check_float("alpha", alpha, low=0.0)
        self.sigma = check_float("sigma", sigma, low=0.0)
        self.delta = check_float("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
        self.radius_bound = check_choice("radius_bound", radius_bound, ("determinant", "count"))

    def radius(self, state: RowState) -> Tensor | float:
        """Exploration weight α of the rows in ``state``."""
        if self.alpha is not None:
            return self.alpha
        return confidence_radius(
            state["logdet"], state["count"], self.dim, self.lam, self.sigma, self.delta, self.radius_bound
        )

    def kernel_params(self) -> dict[str, float | int | bool]:
        return {"kind": LINUCB, "lam": self.lam, "alpha": math.nan if self.alpha is None else self.alpha,
                "sigma": self.sigma, "delta": self.delta, "count_bound": self.radius_bound == "count", "v": 0.0,
                "refactor_every": self.refactor_every, "seed": 0}

    def scores(self, contexts: Tensor, state: RowState) -> Tensor:
        CA = torch.bmm(contexts, state["inv"])  # (m, K, d); xᵀθ̂ = xᵀ(V+λI)^{-1} b
        mean = torch.bmm(CA, state["b"].unsqueeze(-1)).squeeze(-1)
        width = (CA * contexts).sum(-1).clamp_min_(0).sqrt_()
        alpha = self.radius(state)
        if isinstance(alpha, Tensor):
            return torch.addcmul(mean, alpha.unsqueeze(-1), width)
        return mean.add_(width, alpha=alpha)


class LinTS(LinearBandit):
    """Linear Thompson sampling: score = xᵀθ̃ with θ̃ ~ N(θ̂, v²(V+λI)^{-1}) (Agrawal & Goyal 2013).

    Every row draws from its own counter-based stream (:func:`fedrec.utils.rng.normals`, keyed by ``seed``, the row
    and the row's draw counter ``draws``), so rows are independent, the compiled and torch paths draw the same
    numbers, and a resumed run redraws exactly what the uninterrupted run would have. A row addressed twice in
    one :meth:`select` call uses one draw for both.

    ``sampler`` is the square root S (S Sᵀ = (V+λI)^{-1}) that shapes the draw: ``cholesky`` (the paper's, and
    the compiled kernels') or ``symmetric`` (the symmetric root, torch only), with which a rotated problem draws
    the rotated sample — VFTS and LinTS then agree path by path (Cao et al., Theorem A.1).
    """

    state_keys = LinearBandit.state_keys + ("draws",)
    SAMPLERS = ("cholesky", "symmetric")

    def __init__(
        self,
        dim: int,
        v: float = 1.0,
        lam: float = 1.0,
        batch_shape: Sequence[int] = (),
        seed: int = 0,
        refactor_every: int = 1000,
        device: str | torch.device | None = None,
        sampler: str = "cholesky",
    ) -> None:
        super().__init__(dim, lam, batch_shape, refactor_every, device)
        self.v = check_float("v", v, low=0.0)
        self.seed = check_int("seed", seed, minimum=0)
        self.sampler = check_choice("sampler", sampler, self.SAMPLERS)
        self.compiled = sampler == "cholesky"
        self.register_buffer("draws", torch.zeros(self.num_rows, dtype=torch.long, device=device))
        # the stream each row draws from (its row by default; a protocol whose rows move, e.g. allocated on arrival,
        # keeps a row's stream its owner's, and sets it again after loading a state dict)
        self.register_buffer("stream", torch.arange(self.num_rows, device=device), persistent=False)

    def get_extra_state(self) -> dict:
        return {"seed": self.seed}  # the draws are a function of (seed, row, counter): a checkpoint carries both

    def extra_repr(self) -> str:
        return f"v={self.v}, lam={self.lam}, seed={self.seed}, sampler={self.sampler!r}"

    def set_extra_state(self, state: dict) -> None:
        self.seed = int(state["seed"])

    def kernel_params(self) -> dict[str, float | int | bool]:
        if not self.compiled:
            raise ConfigError(f"LinTS sampler={self.sampler!r} runs on protocol.backend=torch only")
        return {"kind": LINTS, "lam": self.lam, "alpha": math.nan, "sigma": 0.0, "delta": 0.5, "count_bound": False,
                "v": self.v, "refactor_every": self.refactor_every, "seed": self.seed}

    def standard_normals(self, rows: Tensor, draws: Tensor) -> Tensor:
        """z ~ N(0, I_d) of draw ``draws[m]`` of row ``rows[m]``: (m, d) from the rows' counter-based streams."""
        from fedrec.utils.rng import normals

        z = normals(self.seed, rows.cpu().numpy(), draws.cpu().numpy(), self.dim)
        return torch.from_numpy(z).to(device=self.G.device)

    def scores(self, contexts: Tensor, state: RowState) -> Tensor:
        theta = _theta(state)
        if self.sampler == "cholesky":
            root = torch.linalg.cholesky(state["inv"])
        else:
            evals, evecs = torch.linalg.eigh(state["inv"])
            root = (evecs * evals.clamp_min(0).sqrt().unsqueeze(-2)) @ evecs.transpose(-1, -2)
        rows, draws = state["row"], state["draws"]
        z = self.standard_normals(self.stream.index_select(0, rows), draws).to(theta)
        self.draws.index_copy_(0, rows, draws + 1)
        sample = theta + self.v * torch.bmm(root, z.unsqueeze(-1)).squeeze(-1)
        return torch.bmm(contexts, sample.unsqueeze(-1)).squeeze(-1)
