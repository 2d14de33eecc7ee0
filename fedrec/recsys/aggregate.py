"""Aggregation (step ④ of the round): how the server combines the clients' uploads (pluggable; ``aggregator=...``).

An upload (:class:`Uploads`) carries the client's (noised) ω update and one embedding row per uploaded item, with
the item ids X^t. ω is combined as a weighted mean over the clients; each item's row is the weighted mean over the
clients that uploaded that item (item-wise averaging as in FedGNN, Wu et al.; BGTplanner §IV-A defers to it).
The server step (:mod:`fedrec.recsys.server`) then applies its optimiser to the result, so both aggregators
produce a gradient-like update. Nothing depends on the order of the rows (clients shuffle them,
:func:`fedrec.recsys.upload.upload_order`): only float64 rounding does.

An aggregation rule is a small class over the uploads: an :class:`Aggregator` whose :meth:`~Aggregator.partial`
sums add up over disjoint sets of clients runs sharded across processes (:meth:`~Aggregator.finish` turns the total
into the update); one that overrides ``__call__`` sees every upload at once and runs in one process.

The robust rules (:class:`CoordinateMedian`, :class:`TrimmedMean`, :class:`Krum`, :class:`MultiKrum`,
:class:`GeometricMedian`, :class:`Bulyan`, :class:`CenteredClipping`) apply a rule
of :mod:`fedrec.aggregation` to ω over the round's C clients and to each item's rows over its n uploaders (all items
with the same n at once); they need every upload in one process (``trainer.devices=1``). Krum's parameters are set
for the whole round and scale with a group's share of it: a group of n updates assumes
``f_n = min(⌊f·n/C⌋, ⌊(n − 3)/2⌋)`` Byzantine ones (so ``n ≥ 2f_n + 3``) and Multi-Krum keeps
``m_n = max(1, ⌊m·n/C⌋)`` (``m`` unset: ``n − f_n``); a group of fewer than 3 updates, where Krum is undefined,
takes the coordinate median (its one row, or the mean of its two). The median and the trimmed mean are defined for
any n (⌊βn⌋ = 0 cuts nothing). :class:`Bulyan` scales ``f`` the same way, bounded by ``⌊(n − 3)/4⌋`` (so
``n ≥ 4f_n + 3``), with the coordinate median below 3 updates. :class:`GeometricMedian` and
:class:`CenteredClipping` are defined for any n and weight the updates. :class:`NormBound` bounds every ω update and
every row, then sums like FedAvg, so it runs sharded too.
"""
from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from fedrec.aggregation import (
    bound_norms,
    bulyan,
    centered_clipping,
    check_beta,
    check_bound,
    check_f,
    check_iterations,
    coordinate_median,
    geometric_median,
    krum,
    trimmed_mean,
)
from fedrec.errors import ConfigError, check_choice, check_float, check_int

WEIGHTINGS = ("uploaded_items", "ratings", "uniform")
#: ``aggregator.reduce``: weighted means (the authors') or weighted sums of the uploads
REDUCTIONS = ("mean", "sum")


@dataclass
class Uploads:
    """What the participating clients of a round send, as the server receives it."""

    clients: Tensor  # (C,) global client ids
    shared: Tensor  # (C, P) flattened ω updates (P = 0 for models without ω)
    row_client: Tensor  # (R,) index into clients
    row_item: Tensor  # (R,) global item ids: X^t, real and pseudo items, in no meaningful order
    rows: Tensor  # (R, k) item-row updates
    num_ratings: Tensor | None  # (C,) ratings each client trained on; None under DP (it is private)

    def keep(self, clients: Tensor) -> Uploads:
        """The uploads of the clients where ``clients`` ``(C,)`` bool is True alone (rows renumbered)."""
        if bool(clients.all()):
            return self
        new = torch.cumsum(clients.long(), 0) - 1
        rows = clients.to(self.row_client.device)[self.row_client]

        def on(t: Tensor, mask: Tensor) -> Tensor:
            return t[mask.to(t.device)]
        return Uploads(on(self.clients, clients), on(self.shared, clients),
                       new.to(self.row_client.device)[self.row_client[rows]], on(self.row_item, rows),
                       on(self.rows, rows), None if self.num_ratings is None else on(self.num_ratings, clients))


@dataclass
class AggregateSums:
    """Weighted sums of uploads (float64), additive over disjoint sets of clients."""

    shared: Tensor  # (P,) Σ_c w_c ω_c
    weight: Tensor  # (1,) Σ_c w_c
    rows: Tensor  # (I, k) Σ w_c · row, per item
    row_weight: Tensor  # (I,) Σ w_c over the item's uploaders
    row_count: Tensor  # (I,) the item's uploaders

    @classmethod
    def zeros(cls, num_shared: int, num_items: int, dim: int, device: torch.device | str = "cpu") -> AggregateSums:
        """The sums of no uploads."""
        def z(*shape: int) -> Tensor:
            return torch.zeros(*shape, dtype=torch.float64, device=device)
        return cls(z(num_shared), z(1), z(num_items, dim), z(num_items), z(num_items))

    def tensors(self) -> list[Tensor]:
        """The fields, in order (what an all-reduce adds up in place)."""
        return [self.shared, self.weight, self.rows, self.row_weight, self.row_count]


class Aggregator:
    """Weighted mean of ω over clients and item-wise weighted mean of embedding rows over uploaders.

    The clients' local work (``strategy.local_steps``, ``strategy.local_lr``) is the round strategy's
    (:class:`fedrec.recsys.strategy.Strategy`); :attr:`default_local_steps` is what a rule runs when the strategy
    leaves it unset.

    Args:
        weighting: client weights: ``"uploaded_items"`` (|real ∪ pseudo items|, the authors' n_u),
            ``"ratings"`` (local data size, McMahan et al.'s FedAvg) or ``"uniform"``.
        reduce: ``"mean"`` takes ω's weighted mean over clients and each item row's over its uploaders (the
            authors'); ``"sum"`` keeps the weighted sums, so that an item's update grows with the clients that
            rated it, as the gradient of a loss summed over clients does: with ``task.objective=sse`` and
            ``weighting="uniform"`` the round's update is the gradient of the squared error summed over all ratings.
    """

    #: local SGD steps per client when ``strategy.local_steps`` is unset (1: clients upload their gradients)
    default_local_steps = 1

    def __init__(self, weighting: str = "uploaded_items", reduce: str = "mean") -> None:
        self.weighting = check_choice("aggregator.weighting", weighting, WEIGHTINGS)
        self.reduce = check_choice("aggregator.reduce", reduce, REDUCTIONS)

    def validate(self, num_clients: int) -> None:
        """Check the rule's settings against the run's number of clients (nothing to check for a mean)."""

    def client_weights(self, up: Uploads) -> Tensor:
        C = up.clients.numel()
        if self.weighting == "uploaded_items":
            return torch.bincount(up.row_client, minlength=C).double()
        if self.weighting == "ratings":
            if up.num_ratings is None:
                raise ConfigError("aggregator.weighting=ratings needs the clients' rating counts, which private "
                                  "uploads do not carry")
            return up.num_ratings.double()
        return torch.ones(C, dtype=torch.float64)

    def __call__(self, up: Uploads) -> tuple[Tensor, Tensor, Tensor]:
        """``(ω update (P,), item ids (I_t,), item-row updates (I_t, k))`` for the items in X^t."""
        num_items = int(up.row_item.max()) + 1 if up.row_item.numel() else 0
        return self.finish(self.partial(up, num_items), up.shared.dtype)

    def partial(self, up: Uploads, num_items: int) -> AggregateSums:
        """The weighted sums of these uploads, which add up over disjoint sets of clients (a sharded run adds its
        processes' with an all-reduce)."""
        device = up.rows.device
        w = self.client_weights(up).to(device)
        rw, row_item = w[up.row_client.to(device)], up.row_item.to(device)
        zeros = torch.zeros(num_items, dtype=torch.float64, device=device)
        return AggregateSums(
            shared=(w.unsqueeze(1) * up.shared.double()).sum(0),
            weight=w.sum().reshape(1),
            rows=torch.zeros(num_items, up.rows.shape[1], dtype=torch.float64, device=device).index_add(
                0, row_item, rw.unsqueeze(1) * up.rows.double()),
            row_weight=zeros.index_add(0, row_item, rw),
            row_count=torch.bincount(row_item, minlength=num_items).double(),
        )

    def finish(self, sums: AggregateSums, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor, Tensor]:
        """The weighted means of all clients' summed uploads: ``(ω update, item ids, item-row updates)``."""
        items = torch.nonzero(sums.row_count > 0).reshape(-1)
        if self.reduce == "sum":
            return sums.shared.to(dtype), items, sums.rows[items].to(dtype)
        rows = sums.rows[items] / sums.row_weight[items].unsqueeze(1)
        return (sums.shared / sums.weight).to(dtype), items, rows.to(dtype)


def is_additive(rule: type[Aggregator]) -> bool:
    """Whether ``rule`` combines sums over clients (:meth:`Aggregator.partial`, :meth:`Aggregator.finish`), which add
    up over any split of the clients (processes, chunks); a robust rule's own ``__call__`` needs every upload."""
    return rule.__call__ is Aggregator.__call__


def streams_chunks(client_chunk: int | None, rule: type[Aggregator], server_placed: bool, attacked: bool) -> bool:
    """Whether a round goes ``client_chunk`` clients at a time all the way to the server's sums, so that its uploads,
    not only its local training, follow the chunk: the combination must be additive (server placement's clipped
    sums, or a rule that :func:`is_additive`) and no attack may rewrite the round's uploads together."""
    return client_chunk is not None and (server_placed or is_additive(rule)) and not attacked


class FedSGD(Aggregator):
    """FedSGD (McMahan et al. 2017) as the authors run it: one gradient per client, weighted by its uploaded
    items (more local steps are FedAvg: the strategy refuses them with this rule)."""


class FedAvg(Aggregator):
    """FedAvg (McMahan et al. 2017): ``strategy.local_steps`` local SGD steps per client before uploading (5 unless
    set). Updates are
    weighted by uploaded items by default, which DP allows; ``weighting="ratings"`` (local data size, McMahan's
    rule) reveals private counts and is refused with privacy on. The server applies its optimiser to the mean
    update (with ``task.optimizer=sgd``, ``task.lr = strategy.local_lr`` and no weight decay this is McMahan's
    averaging of local models; with Adam it is FedAdam-like)."""

    default_local_steps = 5


class NormBound(Aggregator):
    """Norm bounding (Sun et al. 2019): every client's ω update and every uploaded item row is scaled to L2 norm at
    most ``bound``, then combined as FedSGD/FedAvg do (a weighted mean; sums, so it runs sharded).

    Args:
        bound: the largest L2 norm of an ω update or an item row.
        weighting: as :class:`Aggregator`'s.
    """

    def __init__(self, bound: float = 0.1, weighting: str = "uploaded_items") -> None:
        super().__init__(weighting=weighting)
        self.bound = check_bound(bound)

    def partial(self, up: Uploads, num_items: int) -> AggregateSums:
        bounded = replace(up, shared=bound_norms(up.shared.double(), self.bound),
                          rows=bound_norms(up.rows.double(), self.bound))
        return super().partial(bounded, num_items)


def itemwise(rule: Callable[[Tensor, Tensor], Tensor], rows: Tensor, row_item: Tensor,
             row_weight: Tensor) -> tuple[Tensor, Tensor]:
    """``(item ids (I_t,), rows (I_t, k))``: ``rule(updates (b, n, k), weights (b, n))`` applied to every item's
    rows over its uploaders, for all ``b`` items with the same number ``n`` of uploaders at once; an item's rows
    are taken in upload order."""
    items, group, counts = torch.unique(row_item, return_inverse=True, return_counts=True)
    order = torch.argsort(group, stable=True)  # rows grouped by item
    first = torch.cumsum(counts, 0) - counts
    out = rows.new_empty(items.numel(), rows.shape[1])
    for n in torch.unique(counts).tolist():
        which = torch.nonzero(counts == n).reshape(-1)
        picked = order[first[which].unsqueeze(1) + torch.arange(n, device=rows.device)]  # (b, n) row indices
        out[which] = rule(rows[picked], row_weight[picked])
    return items, out


class RobustAggregator(Aggregator, metaclass=ABCMeta):
    """A rule that needs every upload at once: :meth:`rule` applied to ω over the round's clients and to each
    item's rows over its uploaders (see the module docstring); one process only."""

    @abstractmethod
    def rule(self, updates: Tensor, weights: Tensor, clients: int) -> Tensor:
        """Combine ``updates (..., n, P)`` with ``weights (..., n)``: a group of n of the round's ``clients``."""

    def __call__(self, up: Uploads) -> tuple[Tensor, Tensor, Tensor]:
        w = self.client_weights(up).to(up.rows.device)
        C = up.clients.numel()
        shared = self.rule(up.shared.double(), w, C)
        items, rows = itemwise(lambda u, uw: self.rule(u, uw, C), up.rows.double(), up.row_item.to(up.rows.device),
                               w[up.row_client.to(up.rows.device)])
        return shared.to(up.shared.dtype), items, rows.to(up.rows.dtype)


class CoordinateMedian(RobustAggregator):
    """The coordinate-wise median (Yin et al. 2018) of ω over the clients and of each item's row over its
    uploaders, unweighted as in the paper; of an even number of values, the mean of the two middle ones."""

    def rule(self, updates: Tensor, weights: Tensor, clients: int) -> Tensor:
        return coordinate_median(updates, weights)


class TrimmedMean(RobustAggregator):
    """The coordinate-wise β-trimmed mean (Yin et al. 2018): of n values, the ⌊βn⌋ largest and smallest are cut
    and the rest averaged, unweighted as in the paper (ω over the clients, each item's row over its uploaders).

    Args:
        beta: the fraction cut per side, in [0, 1/2).
    """

    def __init__(self, beta: float = 0.1, weighting: str = "uploaded_items") -> None:
        super().__init__(weighting=weighting)
        self.beta = check_beta(beta)

    def rule(self, updates: Tensor, weights: Tensor, clients: int) -> Tensor:
        return trimmed_mean(updates, weights, self.beta)


class ByzantineRule(RobustAggregator, metaclass=ABCMeta):
    """A rule that assumes ``f`` Byzantine clients among the round's C and ``f_n`` in a group of n of them
    (``min(⌊f·n/C⌋, ⌊(n − 3)/per_client⌋)``, see the module docstring); a group of fewer than 3 updates takes the
    coordinate median.

    Args:
        f: the Byzantine clients assumed among the round's C; the run needs ``C ≥ per_client·f + 3``.
    """

    #: clients needed per Byzantine one (``C ≥ per_client·f + 3``), and the rule's name in errors
    per_client, name = 2, "Krum"

    def __init__(self, f: int = 1, weighting: str = "uploaded_items") -> None:
        super().__init__(weighting=weighting)
        self.f = check_int("aggregator.f", f, minimum=0)

    def validate(self, num_clients: int) -> None:
        check_f(self.f, num_clients, self.per_client, self.name)

    def byzantine(self, n: int, clients: int) -> int:
        """``f_n``: the Byzantine updates assumed in a group of n of the round's ``clients`` (n ≥ 3)."""
        return min(self.f * n // clients, (n - 3) // self.per_client)

    def rule(self, updates: Tensor, weights: Tensor, clients: int) -> Tensor:
        n = updates.shape[-2]
        if n < 3:
            return coordinate_median(updates, weights)
        return self.combine(updates, weights, n, clients, self.byzantine(n, clients))

    @abstractmethod
    def combine(self, updates: Tensor, weights: Tensor, n: int, clients: int, f_n: int) -> Tensor:
        """The rule on a group of ``n ≥ 3`` updates assuming ``f_n`` Byzantine ones."""


class Krum(ByzantineRule):
    """Krum (Blanchard et al. 2017): of a group's updates, the one whose squared distances to its ``n − f_n − 2``
    nearest others sum least, assuming ``f`` Byzantine clients in the round (scaled to each group, see the module
    docstring).

    Args:
        f: the Byzantine clients assumed among the round's C; the run needs ``C ≥ 2f + 3``.
    """

    def keep(self, n: int, clients: int, f_n: int) -> int:
        """The updates a group of n keeps: 1 (Krum)."""
        return 1

    def combine(self, updates: Tensor, weights: Tensor, n: int, clients: int, f_n: int) -> Tensor:
        return krum(updates, weights, f_n, self.keep(n, clients, f_n))


class MultiKrum(Krum):
    """Multi-Krum (Blanchard et al. 2017): the weighted mean of the ``m`` updates of least Krum score.

    Args:
        f: the Byzantine clients assumed among the round's C (``C ≥ 2f + 3``).
        m: the updates kept among the round's C, scaled to each group; None keeps ``n − f_n`` of a group of n.
    """

    def __init__(self, f: int = 1, m: int | None = None, weighting: str = "uploaded_items") -> None:
        super().__init__(f=f, weighting=weighting)
        self.m = None if m is None else check_int("aggregator.m", m)

    def validate(self, num_clients: int) -> None:
        super().validate(num_clients)
        if self.m is not None and self.m > num_clients:
            raise ConfigError(f"aggregator.m={self.m} is more than the {num_clients} clients")

    def keep(self, n: int, clients: int, f_n: int) -> int:
        return n - f_n if self.m is None else min(n, max(1, self.m * n // clients))


class GeometricMedian(RobustAggregator):
    """The weighted geometric median (RFA, Pillutla et al. 2022) of ω over the clients and of each item's rows over
    its uploaders, by smoothed Weiszfeld iterations from the weighted mean
    (:func:`fedrec.aggregation.geometric_median`).

    Args:
        iterations: the most Weiszfeld steps.
        tolerance: stop once the objective ``Σ w_c ‖z − u_c‖`` changes by at most this share of itself.
        smoothing: ν > 0, the least distance a weight divides by.
        weighting: the weights w_c, as :class:`Aggregator`'s.
    """

    def __init__(self, iterations: int = 100, tolerance: float = 1e-6, smoothing: float = 1e-6,
                 weighting: str = "uploaded_items") -> None:
        super().__init__(weighting=weighting)
        self.iterations = check_iterations(iterations)
        self.tolerance = check_float("aggregator.tolerance", tolerance, low=0.0)
        self.smoothing = check_float("aggregator.smoothing", smoothing, low=0.0, low_open=True)

    def rule(self, updates: Tensor, weights: Tensor, clients: int) -> Tensor:
        return geometric_median(updates, weights, self.iterations, self.tolerance, self.smoothing)


class Bulyan(ByzantineRule):
    """Bulyan (El Mhamdi et al. 2018): Krum picks ``n − 2f_n`` of a group's updates one at a time, then each
    coordinate is the mean of the ``n − 4f_n`` picked values closest to their median, unweighted; ``f`` is set for
    the round and scaled to each group (see the module docstring).

    Args:
        f: the Byzantine clients assumed among the round's C; the run needs ``C ≥ 4f + 3``.
    """

    per_client, name = 4, "Bulyan"

    def combine(self, updates: Tensor, weights: Tensor, n: int, clients: int, f_n: int) -> Tensor:
        return bulyan(updates, weights, f_n)


CENTERS = ("zero", "median")


class CenteredClipping(RobustAggregator):
    """Centered clipping (Karimireddy et al. 2021): ``v ← v + Σ w_c clip_τ(u_c − v) / Σ w_c``, ``iterations``
    times, for ω over the clients and for each item's rows over its uploaders. The paper starts from the previous
    round's aggregate; this aggregator keeps nothing between rounds (a resumed run would lose it), so ``v`` starts
    at zero (the paper's first round) or at the group's coordinate median.

    Args:
        tau: the clipping radius τ > 0.
        iterations: the clipping steps L.
        center: ``"zero"`` or ``"median"``, where v starts.
        weighting: the weights w_c, as :class:`Aggregator`'s (``uniform``: the paper's 1/n).
    """

    def __init__(self, tau: float = 0.1, iterations: int = 3, center: str = "zero",
                 weighting: str = "uploaded_items") -> None:
        super().__init__(weighting=weighting)
        self.tau = check_float("aggregator.tau", tau, low=0.0, low_open=True)
        self.iterations = check_iterations(iterations)
        self.center = check_choice("aggregator.center", center, CENTERS)

    def rule(self, updates: Tensor, weights: Tensor, clients: int) -> Tensor:
        start = coordinate_median(updates, weights) if self.center == "median" else None
        return centered_clipping(updates, weights, self.tau, self.iterations, start)
