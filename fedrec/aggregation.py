"""Aggregation rules and server optimisers on plain tensors, usable alone; the recommendation round's aggregators
(:mod:`fedrec.recsys.aggregate`) and its server step (:mod:`fedrec.recsys.server`) are built on them.

**Rules** combine the updates of C clients: ``updates`` is ``(C, P)`` (or batched, ``(..., C, P)``: one rule per
leading index, as the round does for all items with the same number of uploaders at once) and ``weights`` ``(C,)``
(``(..., C)``); each returns ``(P,)`` (``(..., P)``).

* :func:`weighted_mean`: ``Σ w_c u_c / Σ w_c`` (FedAvg's).
* :func:`coordinate_median`: the median of each coordinate over the clients, the mean of the two middle values for
  an even C (Yin et al. 2018, unweighted as in the paper: ``weights`` is only shape-checked).
* :func:`trimmed_mean`: per coordinate, the mean of the values left after cutting the ``⌊βC⌋`` largest and the
  ``⌊βC⌋`` smallest (Yin et al. 2018, unweighted), ``0 ≤ β < 1/2``.
* :func:`krum`: each update's score is the sum of its squared distances to its ``C − f − 2`` nearest other updates;
  ``m = 1`` (Krum) returns the update of least score, ``m > 1`` (Multi-Krum) the weighted mean of the ``m`` updates
  of least score (Blanchard et al. 2017; ties go to the lower index). Needs ``C ≥ 2f + 3``.
* :func:`norm_bounded_mean`: the weighted mean after scaling every update down to L2 norm at most ``bound``
  (Sun et al. 2019).
* :func:`geometric_median`: the weighted geometric median by smoothed Weiszfeld iterations (RFA, Pillutla et al.
  2022, Algorithm 2), from the weighted mean.
* :func:`bulyan`: Krum applied recursively to pick ``θ = C − 2f`` updates, then per coordinate the mean of the
  ``β = θ − 2f`` picked values closest to their median (El Mhamdi et al. 2018). Needs ``C ≥ 4f + 3``.
* :func:`centered_clipping`: ``v ← v + Σ_c w_c clip_τ(u_c − v) / Σ_c w_c`` repeated L times from a reference point
  (Karimireddy et al. 2021, Algorithm 2; zero unless given).

The rules keep autograd: a ``backward()`` through any of them reaches the updates (the order statistics pass the
gradient to the values they pick, Krum's and Bulyan's choices carry none). Sorting a CPU tensor that needs no gradient
goes through numpy, several times faster there than torch's sort of this layout and with the same values.

**Server optimisers** (Reddi et al., *Adaptive Federated Optimization*, ICLR 2021, Algorithm 2) move the global
model ``x`` by the round's aggregate Δ, the (weighted) mean of the clients' model changes ``x_c − x``:
``new = opt.step(x, Δ)``, the moments kept in the optimiser between calls (:meth:`ServerOptimizer.state_dict`).

* :class:`FedAvgM`: ``m ← β₁m + Δ``, ``x ← x + η m`` (server momentum, Hsu et al. 2019; β₁ = 0 and η = 1 is
  McMahan's FedAvg, the clients' mean model).
* :class:`FedAdagrad`, :class:`FedAdam`, :class:`FedYogi`: ``m ← β₁m + (1 − β₁)Δ``, then
  ``v ← v + Δ²`` (Adagrad), ``v ← β₂v + (1 − β₂)Δ²`` (Adam) or ``v ← v − (1 − β₂)Δ² sign(v − Δ²)`` (Yogi), and
  ``x ← x + η m / (√v + τ)``, starting from ``m = 0`` and ``v = τ²`` (the least Algorithm 2 allows). Without bias
  correction, as in the paper; ``bias_correction=True`` (Adam, Yogi) scales η by ``√(1 − β₂ᵗ) / (1 − β₁ᵗ)`` in a
  coordinate's t-th step (Kingma and Ba's, as some libraries apply it).

The defaults (η = 1 and β₁ = 0.9 for FedAvgM; η = 0.1, β₁ = 0.9, β₂ = 0.99, τ = 1e-3 for the adaptive ones) are
common choices, not tuned for any model; τ sets the scale below which Δ is not normalised, so it must sit well below
a typical |Δ| (the ``server`` configs are tuned for FedGNN on MovieLens-100K, where |Δ| is about 1e-4).

``step(table, Δ_rows, rows=ids)`` steps only rows ``ids`` of a table (an embedding table whose rows not every
round updates): the other rows, and their moments and step counts, are left as they are (lazy moments).

Errors name the config fields a run sets them by (``aggregator.beta``, ``server.tau``, ...).
"""
from __future__ import annotations

import math
from abc import ABCMeta, abstractmethod
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrec.errors import ConfigError, check_float, check_int

__all__ = [
    "FedAdagrad",
    "FedAdam",
    "FedAvgM",
    "FedYogi",
    "ServerOptimizer",
    "bound_norms",
    "bulyan",
    "centered_clipping",
    "coordinate_median",
    "geometric_median",
    "krum",
    "norm_bounded_mean",
    "trimmed_mean",
    "weighted_mean",
]

# ------------------------------------------------------------------------------------------------------ rules
def _check(updates: Tensor, weights: Tensor) -> int:
    """The number of clients C, after checking that ``updates`` is ``(..., C, P)`` and ``weights`` ``(..., C)``."""
    if updates.dim() < 2 or weights.shape != updates.shape[:-1] or updates.shape[-2] == 0:
        raise ValueError(f"updates must be (..., C, P) with C >= 1 and weights (..., C), got {tuple(updates.shape)} "
                         f"and {tuple(weights.shape)}")
    return updates.shape[-2]


def sorted_clients(updates: Tensor) -> Tensor:
    """``updates`` sorted along the clients (dimension −2). Torch's sort where a gradient must flow back (or off the
    CPU); numpy's otherwise, several times faster on a CPU for this layout, with the same values."""
    if updates.device.type != "cpu" or (updates.requires_grad and torch.is_grad_enabled()):
        return torch.sort(updates, dim=-2).values
    return torch.from_numpy(np.sort(updates.detach().numpy(), axis=-2))


def median_of_sorted(ordered: Tensor) -> Tensor:
    """The median of values sorted along dimension −2: the middle one, or the mean of the two middle ones."""
    n = ordered.shape[-2]
    return (ordered[..., (n - 1) // 2, :] + ordered[..., n // 2, :]) / 2


def weighted_mean(updates: Tensor, weights: Tensor) -> Tensor:
    """``Σ_c w_c u_c / Σ_c w_c`` over the clients (the weights need not be normalised; their sum must be > 0)."""
    _check(updates, weights)
    w = weights.to(updates.dtype).unsqueeze(-1)
    return (w * updates).sum(-2) / w.sum(-2)


def coordinate_median(updates: Tensor, weights: Tensor) -> Tensor:
    """The coordinate-wise median over the clients (Yin et al. 2018): the middle value for an odd C, the mean of
    the two middle values for an even C. Unweighted as in the paper; ``weights`` is only shape-checked, so every
    rule has one signature."""
    _check(updates, weights)
    return median_of_sorted(sorted_clients(updates))


def check_beta(beta: float) -> float:
    """The trimmed mean's β, checked: ``0 ≤ β < 1/2`` (a larger β would cut every value)."""
    return check_float("aggregator.beta", beta, low=0.0, high=0.5, high_open=True)


def share_count(share: float, count: int) -> int:
    """``⌊share·count⌋`` (with a 1e-9 guard, so that 0.29 · 100 is 29): e.g. the values the trimmed mean cuts
    per side."""
    return math.floor(share * count + 1e-9)


def trimmed_mean(updates: Tensor, weights: Tensor, beta: float) -> Tensor:
    """The coordinate-wise β-trimmed mean (Yin et al. 2018): per coordinate, the mean of the ``C − 2⌊βC⌋`` values
    left once the ``⌊βC⌋`` largest and smallest are cut. Unweighted as in the paper (``weights`` shape-checked)."""
    C = _check(updates, weights)
    cut = share_count(check_beta(beta), C)
    return sorted_clients(updates)[..., cut:C - cut, :].mean(-2)


def squared_distances(updates: Tensor) -> Tensor:
    """``(..., C, C)`` float64 squared L2 distances between the updates, ``‖a‖² + ‖b‖² − 2a·b`` clamped at 0 (equal
    updates have equal rows of distances, so ties stay ties)."""
    x = updates.double()
    sq = (x * x).sum(-1)
    return (sq.unsqueeze(-1) + sq.unsqueeze(-2) - 2 * (x @ x.transpose(-1, -2))).clamp_min(0)


def krum_scores(updates: Tensor, f: int) -> Tensor:
    """``(..., C)``: each update's sum of squared distances to its ``C − f − 2`` nearest other updates (Blanchard et
    al. 2017, the Krum score). It only ranks the updates, so it carries no gradient."""
    nearest = updates.shape[-2] - f - 2
    d = squared_distances(updates.detach())
    d.diagonal(dim1=-2, dim2=-1).fill_(math.inf)
    # each row's `nearest` smallest, by numpy's partition (about ten times torch's kthvalue here)
    smallest = np.partition(d.cpu().numpy(), nearest - 1, axis=-1)[..., :nearest]
    return torch.from_numpy(smallest.sum(-1)).to(updates.device)


def krum(updates: Tensor, weights: Tensor, f: int, m: int = 1) -> Tensor:
    """Krum (``m = 1``): the update of least Krum score, assuming at most ``f`` Byzantine clients; Multi-Krum
    (``m > 1``): the weighted mean of the ``m`` updates of least score (Blanchard et al. 2017). Ties go to the lower
    index. Needs ``C ≥ 2f + 3`` clients and ``1 ≤ m ≤ C``."""
    C = _check(updates, weights)
    f = check_f(f, C, 2, "Krum")
    m = check_int("aggregator.m", m)
    if m > C:
        raise ConfigError(f"aggregator.m={m} is more than the {C} clients")
    best = krum_scores(updates, f).argsort(dim=-1, stable=True)[..., :m]
    chosen = torch.take_along_dim(updates, best.unsqueeze(-1), dim=-2)
    if m == 1:
        return chosen.squeeze(-2)
    return weighted_mean(chosen, torch.take_along_dim(weights, best, dim=-1))


def check_f(f: int, clients: int, per_client: int, rule: str) -> int:
    """``aggregator.f`` checked against ``clients``: at least ``per_client·f + 3`` of them (Krum 2, Bulyan 4)."""
    f = check_int("aggregator.f", f, minimum=0)
    need = per_client * f + 3
    if clients < need:
        raise ConfigError(f"aggregator.f={f} is too large for {clients} clients: {rule} needs at least "
                          f"{per_client}f + 3 = {need}")
    return f


def check_bound(bound: float) -> float:
    """Norm bounding's bound, checked: a positive number."""
    return check_float("aggregator.bound", bound, low=0.0, low_open=True)


def bound_norms(updates: Tensor, bound: float) -> Tensor:
    """Every update (the last dimension) scaled by ``min(1, bound / ‖u‖₂)``: its L2 norm at most ``bound``."""
    norms = updates.norm(dim=-1, keepdim=True)
    return updates * torch.clamp(check_bound(bound) / norms, max=1.0)  # bound / 0 = inf: a zero update stays


def norm_bounded_mean(updates: Tensor, weights: Tensor, bound: float) -> Tensor:
    """The weighted mean of the updates, each first scaled to L2 norm at most ``bound`` (Sun et al. 2019)."""
    _check(updates, weights)
    return weighted_mean(bound_norms(updates, bound), weights)


def check_iterations(iterations: int) -> int:
    """An iterative rule's number of iterations, checked: at least 1."""
    return check_int("aggregator.iterations", iterations)


def geometric_median(updates: Tensor, weights: Tensor, iterations: int = 100, tolerance: float = 1e-6,
                     smoothing: float = 1e-6) -> Tensor:
    """The weighted geometric median ``argmin_z Σ_c w_c ‖z − u_c‖`` by the smoothed Weiszfeld iterations of RFA
    (Pillutla et al. 2022, Algorithm 2): ``z ← Σ β_c u_c / Σ β_c`` with ``β_c = w_c / max(ν, ‖z − u_c‖)``, from
    the weighted mean, for ``iterations`` steps or until the objective changes by at most ``tolerance`` times
    itself (each batch entry on its own). ``smoothing`` is ν > 0."""
    _check(updates, weights)
    iterations = check_iterations(iterations)
    tolerance = check_float("aggregator.tolerance", tolerance, low=0.0)
    nu = check_float("aggregator.smoothing", smoothing, low=0.0, low_open=True)
    w = weights.to(updates.dtype)
    z = weighted_mean(updates, weights)
    distance = (updates - z.unsqueeze(-2)).norm(dim=-1)  # (..., C), at the current z
    objective = (w * distance).sum(-1)
    done = torch.zeros_like(objective, dtype=torch.bool)
    for _ in range(iterations):  # a batch entry that has converged keeps its z, as a call of its own would
        beta = (w / distance.clamp_min(nu)).unsqueeze(-1)
        z = torch.where(done.unsqueeze(-1), z, (beta * updates).sum(-2) / beta.sum(-2))
        distance = (updates - z.unsqueeze(-2)).norm(dim=-1)
        new = (w * distance).sum(-1)
        done, objective = done | ((objective - new).abs() <= tolerance * new), new
        if bool(done.all()):
            break
    return z


def krum_selection(updates: Tensor, f: int, count: int) -> Tensor:
    """``(..., count)`` indices: Krum applied ``count`` times, each time to the updates not yet picked, scoring with
    the ``n − f − 2`` nearest of the n left (0 once fewer are left; ties to the lower index), Bulyan's selection (El
    Mhamdi et al. 2018, Algorithm 1). The choice carries no gradient.

    The ``n − f − 2`` nearest of an update's ``n − 1`` others are all but its ``f + 1`` farthest, so a score is the
    sum of the distances to the others left less the sum of the ``f + 1`` farthest left, both kept up to date as
    updates are picked (the farthest by walking each row sorted farthest first): ``O(C²)`` in all after one sort,
    not per pick. The few updates whose kept score is within rounding of the least are scored again directly
    (:func:`exact_scores`), so equal scores stay equal and ties go to the lower index."""
    C = updates.shape[-2]
    if count == C:  # every update is picked, in index order
        return torch.arange(C, device=updates.device).expand(*updates.shape[:-2], C)
    d = squared_distances(updates.detach()).reshape(-1, C, C)
    d.diagonal(dim1=-2, dim2=-1).fill_(0)
    far, order = d.sort(dim=-1, descending=True, stable=True)  # each row's others, farthest first
    rank = order.argsort(dim=-1)  # rank[b, i, j]: where j sits in row i
    other = order != torch.arange(C, device=d.device).unsqueeze(-1)
    counted = other & (other.cumsum(-1) <= f + 1)
    top, total = torch.where(counted, far, 0.0).sum(-1), d.sum(-1)
    end = ((other.cumsum(-1) < f + 1).sum(-1) + 1).clamp(max=C)  # row i's f + 1 farthest lie before end[i]
    slack = 1e-9 * total.amax(-1, keepdim=True)  # far above the kept scores' rounding
    left = torch.ones(d.shape[:-1], dtype=torch.bool, device=d.device)
    picked = []
    for step in range(count):
        nearest = C - step - f - 2
        if nearest > 0:
            kept = (total - top).masked_fill(~left, math.inf)
            close = kept <= kept.amin(-1, keepdim=True) + slack
            scores = torch.full_like(total, math.inf)
            scores[close] = exact_scores(far, order, other, left, close, nearest)
        else:  # no nearest: every update left scores 0
            scores = torch.zeros_like(total).masked_fill(~left, math.inf)
        best = scores.argmin(dim=-1, keepdim=True)  # the first of equal scores
        picked.append(best)
        left = left.scatter(-1, best, False)
        column = best.unsqueeze(-2).expand(-1, C, 1)
        gone = torch.gather(d, -1, column).squeeze(-1)
        total = total - gone
        inside = torch.gather(rank, -1, column).squeeze(-1) < end  # the pick was among row i's farthest
        top = top - torch.where(inside, gone, 0.0)
        top, end = refill(top, end, inside, far, order, other, left)
    return torch.cat(picked, dim=-1).reshape(*updates.shape[:-2], count)


def exact_scores(far: Tensor, order: Tensor, other: Tensor, left: Tensor, rows: Tensor, nearest: int) -> Tensor:
    """The Krum scores of the ``rows`` (bool ``(B, C)``) of :func:`krum_selection`, summed afresh: each row's
    ``nearest`` nearest others still ``left``, smallest first."""
    b, i = torch.nonzero(rows, as_tuple=True)
    alive = (torch.gather(left[b], -1, order[b, i]) & other[b, i]).flip(-1)
    taken = alive & (alive.cumsum(-1) <= nearest)
    return torch.where(taken, far[b, i].flip(-1), 0.0).sum(-1)


def refill(top: Tensor, end: Tensor, need: Tensor, far: Tensor, order: Tensor, other: Tensor,
           left: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`krum_selection`'s walk: each row in ``need`` lost one of its farthest others, so its next other still
    left (at ``end`` or after, farthest first) joins them."""
    C = far.shape[-1]
    while bool(need.any()):
        at = end.clamp(max=C - 1).unsqueeze(-1)
        j = torch.gather(order, -1, at)
        alive = torch.gather(left, -1, j.squeeze(-1)) & torch.gather(other, -1, at).squeeze(-1)
        joins = need & (end < C) & alive
        top = top + torch.where(joins, torch.gather(far, -1, at).squeeze(-1), 0.0)
        end = torch.where(need & (end < C), end + 1, end)
        need = need & ~joins & (end < C)
    return top, end


def bulyan(updates: Tensor, weights: Tensor, f: int) -> Tensor:
    """Bulyan (El Mhamdi et al. 2018, Algorithm 1): Krum picks ``θ = C − 2f`` updates one at a time
    (:func:`krum_selection`), then each coordinate is the mean of the ``β = θ − 2f`` picked values closest to their
    median (ties to the smaller value). Unweighted as in the paper (``weights`` shape-checked). Needs
    ``C ≥ 4f + 3``."""
    C = _check(updates, weights)
    f = check_f(f, C, 4, "Bulyan")
    theta = C - 2 * f
    chosen = krum_selection(updates, f, theta)
    ordered = sorted_clients(torch.take_along_dim(updates, chosen.unsqueeze(-1), dim=-2))
    gap = (ordered - median_of_sorted(ordered).unsqueeze(-2)).abs().detach()
    closest = gap.argsort(dim=-2, stable=True)[..., :theta - 2 * f, :]
    return torch.take_along_dim(ordered, closest, dim=-2).mean(-2)


def centered_clipping(updates: Tensor, weights: Tensor, tau: float, iterations: int = 1,
                      center: Tensor | None = None) -> Tensor:
    """Centered clipping (Karimireddy et al. 2021, Algorithm 2): ``v ← v + Σ_c w_c clip_τ(u_c − v) / Σ_c w_c``,
    ``iterations`` times, where ``clip_τ`` scales a vector down to L2 norm at most τ; ``v`` starts at ``center``
    ``(..., P)`` (the paper's previous aggregate), or zero. Uniform weights give the paper's 1/n."""
    _check(updates, weights)
    tau = check_float("aggregator.tau", tau, low=0.0, low_open=True)
    iterations = check_iterations(iterations)
    v = updates.new_zeros(updates.shape[:-2] + updates.shape[-1:]) if center is None else center.to(updates.dtype)
    if v.shape != updates.shape[:-2] + updates.shape[-1:]:
        raise ValueError(f"center must be {tuple(updates.shape[:-2] + updates.shape[-1:])}, got {tuple(v.shape)}")
    for _ in range(iterations):
        v = v + weighted_mean(bound_norms(updates - v.unsqueeze(-2), tau), weights)
    return v


# ------------------------------------------------------------------------------------------ server optimisers
class ServerOptimizer(metaclass=ABCMeta):
    """A server optimiser of Reddi et al.'s Algorithm 2 family: ``x ← x + η·direction``, where the direction comes
    from moments of the aggregates Δ kept per coordinate between calls.

    Args:
        lr: the server learning rate η.
    """

    #: the moments this optimiser keeps besides the step count
    moments: tuple[str, ...] = ("m",)

    def __init__(self, lr: float = 1.0) -> None:
        self.lr = check_float("server.lr", lr, low=0.0, low_open=True)
        self.state: dict[str, Tensor] = {}

    def initial(self, name: str, like: Tensor) -> Tensor:
        """Moment ``name``'s value before the first step (zero)."""
        return torch.zeros_like(like)

    @abstractmethod
    def direction(self, state: dict[str, Tensor], delta: Tensor) -> Tensor:
        """Update the moments in ``state`` (this step's rows) by ``delta`` and return the step's direction."""

    def rate(self, steps: Tensor) -> Tensor:
        """The step size of rows whose moments have taken ``steps`` steps (this one included): η."""
        return torch.full_like(steps, self.lr, dtype=torch.float64)

    def step(self, current: Tensor, aggregate: Tensor, rows: Tensor | None = None) -> Tensor:
        """The model after one server step: ``current`` moved by the aggregate Δ (same shape) and the kept moments.

        With ``rows`` (distinct ids), ``current`` is a table ``(R, P)`` and ``aggregate`` ``(len(rows), P)``: only
        those rows step; the others, with their moments and step counts, are left as they are. The state takes the
        shape of the first call's ``current``.
        """
        table = current.reshape(1, -1) if rows is None else current
        index = torch.zeros(1, dtype=torch.long, device=current.device) if rows is None else rows
        delta = aggregate.reshape(1, -1) if rows is None else aggregate
        if delta.shape != (index.numel(), table.shape[1]):
            raise ValueError(f"aggregate must be {(index.numel(), table.shape[1])} for these rows, got "
                             f"{tuple(aggregate.shape)}")
        if not self.state:
            self.state = {name: self.initial(name, table) for name in self.moments}
            self.state["steps"] = torch.zeros(table.shape[0], dtype=torch.long, device=table.device)
        elif self.state["steps"].shape[0] != table.shape[0] or self.state[self.moments[0]].shape != table.shape:
            raise ValueError(f"this optimiser's state is for shape {tuple(self.state[self.moments[0]].shape)}, got "
                             f"{tuple(table.shape)}")
        rows_state = {name: self.state[name][index] for name in self.moments}
        steps = self.state["steps"][index] + 1
        move = self.direction(rows_state, delta.to(table.dtype))
        for name in self.moments:
            self.state[name][index] = rows_state[name]
        self.state["steps"][index] = steps
        new = table.clone()
        new[index] = table[index] + self.rate(steps).to(table.dtype).unsqueeze(1) * move
        return new.reshape(current.shape)

    def state_dict(self) -> dict[str, Any]:
        """The moments and step counts (empty before the first step)."""
        return {name: v.clone() for name, v in self.state.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s moments and step counts."""
        self.state = {name: v.clone() for name, v in state.items()}


class FedAvgM(ServerOptimizer):
    """Server momentum (Hsu et al. 2019): ``m ← β₁m + Δ``, ``x ← x + η m``; ``beta1 = 0`` and ``lr = 1`` is
    McMahan's FedAvg (the global model becomes the clients' mean model).

    Args:
        lr: the server learning rate η.
        beta1: the momentum β₁ in [0, 1).
    """

    def __init__(self, lr: float = 1.0, beta1: float = 0.9) -> None:
        super().__init__(lr)
        self.beta1 = check_float("server.beta1", beta1, low=0.0, high=1.0, high_open=True)

    def direction(self, state: dict[str, Tensor], delta: Tensor) -> Tensor:
        state["m"] = self.beta1 * state["m"] + delta
        return state["m"]


class _Adaptive(ServerOptimizer):
    """The adaptive optimisers of Algorithm 2: ``m ← β₁m + (1 − β₁)Δ``, a rule for ``v`` (:meth:`second_moment`),
    ``x ← x + η m / (√v + τ)``; ``v`` starts at τ²."""

    moments = ("m", "v")

    def __init__(self, lr: float, beta1: float, tau: float) -> None:
        super().__init__(lr)
        self.beta1 = check_float("server.beta1", beta1, low=0.0, high=1.0, high_open=True)
        self.tau = check_float("server.tau", tau, low=0.0, low_open=True)

    def initial(self, name: str, like: Tensor) -> Tensor:
        return torch.full_like(like, self.tau ** 2) if name == "v" else torch.zeros_like(like)

    @abstractmethod
    def second_moment(self, v: Tensor, delta: Tensor) -> Tensor:
        """The new v from the old one and this round's Δ."""

    def direction(self, state: dict[str, Tensor], delta: Tensor) -> Tensor:
        state["m"] = self.beta1 * state["m"] + (1 - self.beta1) * delta
        state["v"] = self.second_moment(state["v"], delta)
        return state["m"] / (state["v"].sqrt() + self.tau)


class FedAdagrad(_Adaptive):
    """FedAdagrad (Reddi et al. 2021, Algorithm 2): ``v ← v + Δ²``.

    Args:
        lr: the server learning rate η.
        beta1: the first moment's decay β₁ in [0, 1).
        tau: the adaptivity τ > 0 (a larger τ is less adaptive).
    """

    def __init__(self, lr: float = 0.1, beta1: float = 0.9, tau: float = 1e-3) -> None:
        super().__init__(lr, beta1, tau)

    def second_moment(self, v: Tensor, delta: Tensor) -> Tensor:
        return v + delta * delta


class _BiasCorrectable(_Adaptive):
    """An adaptive optimiser with a decaying second moment (β₂), whose η may take Kingma and Ba's correction."""

    def __init__(self, lr: float = 0.1, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3,
                 bias_correction: bool = False) -> None:
        super().__init__(lr, beta1, tau)
        self.beta2 = check_float("server.beta2", beta2, low=0.0, high=1.0, high_open=True)
        if not isinstance(bias_correction, bool):
            raise ConfigError(f"server.bias_correction must be true or false, got {bias_correction!r}")
        self.bias_correction = bias_correction

    def rate(self, steps: Tensor) -> Tensor:
        if not self.bias_correction:
            return super().rate(steps)
        t = steps.double()
        return self.lr * torch.sqrt(1 - self.beta2 ** t) / (1 - self.beta1 ** t)


class FedAdam(_BiasCorrectable):
    """FedAdam (Reddi et al. 2021, Algorithm 2): ``v ← β₂v + (1 − β₂)Δ²``.

    Args:
        lr: the server learning rate η.
        beta1, beta2: the moments' decays in [0, 1).
        tau: the adaptivity τ > 0.
        bias_correction: scale η by ``√(1 − β₂ᵗ) / (1 − β₁ᵗ)`` (Kingma and Ba); off in the paper.
    """

    def second_moment(self, v: Tensor, delta: Tensor) -> Tensor:
        return self.beta2 * v + (1 - self.beta2) * delta * delta


class FedYogi(_BiasCorrectable):
    """FedYogi (Reddi et al. 2021, Algorithm 2; Zaheer et al. 2018): ``v ← v − (1 − β₂)Δ² sign(v − Δ²)``, so v
    moves towards Δ² by a step that does not scale with v. It takes :class:`FedAdam`'s arguments."""

    def second_moment(self, v: Tensor, delta: Tensor) -> Tensor:
        square = delta * delta
        return v - (1 - self.beta2) * square * torch.sign(v - square)
