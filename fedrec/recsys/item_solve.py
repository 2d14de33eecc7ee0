"""The server's item step of alternating least squares (``task.item_solve``), built to survive DP noise.

Matrix factorisation with biases predicts ``μ + b_u + b_i + p_u·q_i``. With the user rows solved by their clients
(``task.user_solve``), each item's least-squares problem is a ridge regression of the residuals on the features
``ũ_u = (s·p_u, 1)`` of the users who rated it, in the coordinates ``ṽ_i = (q_i / s, b_i)``:

    min Σ_{u rated i} (r_ui − μ − b_u − ũ_u·ṽ_i)² + λ ‖ṽ_i‖²,   Hessian A_i = Σ_u ũ_u ũ_uᵀ + λ I.

Exact ALS needs every ``A_i``, ``(k+1)²`` numbers per item, and under DP each of them would be noised. Here a client
uploads per rated item only its residual times its features, ``e_ui ũ_u`` (a gradient of the summed loss, k + 1
numbers), and a count, and once its features' outer product ``ũ_u ũ_uᵀ``; the server approximates
``A_i ≈ n_i M + λ I`` by the item's count ``n_i`` times the raters' second moment ``M`` (normalised to a unit bias
entry) and takes the Newton step ``ṽ_i ← ṽ_i + η_t (n_i M + λ I)⁻¹ (Σ_u e_ui ũ_u − λ ṽ_i)`` on every item. The
approximation changes the path, not the fixed point: the step is zero exactly where the item's gradient is.

Why it helps under DP (server placement, :mod:`fedrec.privacy.central`): the noise on a sum is ``z·clip`` in every
coordinate whatever the item's count, and a gradient step with one learning rate lets it move a rarely rated item
as far as a popular one; the Newton step divides it by ``n_i M + λ``, so rare items stay near their prior and
popular ones move to their solution in one step. From round ``average_from`` the step size falls as
``η_t = 1 / (t − average_from + 2)``, which averages the noisy solutions of the later rounds instead of keeping the
last. ``s`` (``factor_scale``) sets how the clip's norm is shared between the factors and the bias: user rows are
small beside the bias's constant 1 (there are more users than items to share the L2), and scaling them up gives
the factors' part of every upload, and of the noise-to-signal, a larger share. The counts and the moment ride in
the same clipped upload at the fixed weights :data:`COUNT_WEIGHT` and :data:`MOMENT_WEIGHT` (the residual part's
is 1), so one Gaussian draw and one accountant cover all of it. The global bias μ is not learned: it stays at its
public initial value (``model.init_bias``).

With ``count_power = a > 0`` the clip's norm is also shared unevenly between a client's items: each item's part of
the upload is weighted by ``f_i ∝ n_i^(−a)``, from the counts of the previous step's noised sums (released, so free),
which spends less of a heavy user's norm on items that thousands rate and more on the rest (the adaptive weights of
Krichene et al., ICML 2023). The ridge λ stays in the weighted sums' units, where the noise is the same for every
item: in the ratings' units item i's ridge is ``λ / f_i``, more shrinkage where the noise weighs more.

Two settings act on the noise alone (the fixed point without noise stays the ridge solution). ``noise_ridge = ρ``
adds ``ρ σ² / (n_i e_k)`` to item i's ridge along the moment's eigenvector k (eigenvalue ``e_k``; σ the noise's
standard deviation on the sums, 0 without noise): the shrinkage that minimises the expected error of a noisy
estimate (a Wiener filter), which leaves a popular item's direction at λ and pulls a rare item's towards its prior.
``count_average`` gives the Hessians the mean of every step's noised counts instead of the last step's, each weighted
by its precision ``(f_i / σ_t)²`` (a round's weights and noise differ): the counts change little between rounds (not
at all without a stream), and a rarely rated item's count is otherwise as noisy as it is large.

Private ALS on the full statistics is Chien et al. (ICML 2021), whose item step noises every ``A_i``; this one
trades that for a shared second moment, which is what keeps the noise per item at k + 2 numbers.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fedrec.errors import ConfigError, check_float, check_int
from fedrec.models.recommender import FederatedRecommender
from fedrec.recsys.data import RoundData
from fedrec.recsys.local import LocalUpdates

#: the weight of each rated item's count in a client's upload, beside its residual part's 1
COUNT_WEIGHT = 1 / 12
#: the weight of the client's features' second moment in its upload
MOMENT_WEIGHT = 1 / 30
#: the least curvature ``n_i e_k`` the noise ridge divides by (an item without raters gets a ridge that holds it)
_CURVATURE_FLOOR = 1e-6


@dataclass(frozen=True)
class ItemSolve:
    """``task.item_solve``: the item step's ridge λ (at full participation), the factor scale ``s``, the round
    from which the steps average (None: never), the power ``a`` of the count weights (0: none), the noise ridge ρ
    and whether the Hessians' counts average over the steps (module docstring)."""

    ridge: float = 30.0
    factor_scale: float = 25.0
    average_from: int | None = 4
    count_power: float = 0.0
    noise_ridge: float = 0.0
    count_average: bool = False

    @classmethod
    def from_config(cls, node: Mapping[str, Any] | None) -> ItemSolve | None:
        """The setting from ``task.item_solve`` (None, or ``enabled: false``: off), errors naming its fields."""
        node = dict(node or {})
        unknown = sorted(set(node) - {"enabled", *cls.__dataclass_fields__})
        if unknown:
            raise ConfigError(f"task.item_solve.{unknown[0]}: not a field of task.item_solve (enabled, "
                              f"{', '.join(cls.__dataclass_fields__)})")
        enabled = node.pop("enabled", bool(node))
        if not isinstance(enabled, bool):
            raise ConfigError(f"task.item_solve.enabled must be true or false, got {enabled!r}")
        if not enabled:
            return None
        average = node.get("average_from", cls.average_from)
        count_average = node.get("count_average", cls.count_average)
        if not isinstance(count_average, bool):
            raise ConfigError(f"task.item_solve.count_average must be true or false, got {count_average!r}")
        return cls(ridge=check_float("task.item_solve.ridge", node.get("ridge", cls.ridge), low=0.0, low_open=True),
                   factor_scale=check_float("task.item_solve.factor_scale",
                                            node.get("factor_scale", cls.factor_scale), low=0.0, low_open=True),
                   average_from=None if average is None else check_int("task.item_solve.average_from", average,
                                                                       minimum=0),
                   count_power=check_float("task.item_solve.count_power", node.get("count_power", cls.count_power),
                                           low=0.0),
                   noise_ridge=check_float("task.item_solve.noise_ridge", node.get("noise_ridge", cls.noise_ridge),
                                           low=0.0),
                   count_average=count_average)

    def statistics(self, model: FederatedRecommender, data: RoundData, weights: Tensor | None = None
                   ) -> LocalUpdates:
        """Every client's upload: per item row ``f_i · (Σ e_ui ũ_u, COUNT_WEIGHT · n)`` over its users ``u`` who
        rated the item (``n`` of them), and ``MOMENT_WEIGHT · Σ_u vec(ũ_u ũ_uᵀ)`` over its users as ω; ``e_ui`` is
        the residual of the current model (user rows already solved) and ``f`` the server's ``weights`` (None: 1).
        Its loss is its summed squared error."""
        k, s = model.embed_dim, self.factor_scale
        users = model.user_emb.detach()[data.users].double()
        items = model.item_emb.detach()[data.row_item].double()
        eu, er = data.entry_user, data.entry_row
        mu = {"global_bias": model.global_bias.detach().double()}  # the model's own prediction, in float64
        resid = data.entry_rating.double() - model.pair_logits(mu, users, items[er], eu)
        feats = torch.cat([s * users[:, :k], torch.ones_like(users[:, k:])], 1)
        per_entry = torch.cat([resid.unsqueeze(1) * feats[eu], torch.full_like(resid, COUNT_WEIGHT).unsqueeze(1)], 1)
        if weights is not None:
            per_entry = per_entry * weights.to(per_entry)[data.row_item[er]].unsqueeze(1)
        rows = torch.zeros(len(items), k + 2, dtype=torch.float64, device=items.device).index_add_(0, er, per_entry)
        outer = (feats.unsqueeze(2) * feats.unsqueeze(1)).reshape(len(feats), -1)
        moment = torch.zeros(data.num_clients, outer.shape[1], dtype=torch.float64, device=items.device).index_add_(
            0, data.user_client, MOMENT_WEIGHT * outer)
        loss = torch.zeros(data.num_clients, dtype=torch.float64, device=items.device).index_add_(
            0, data.entry_client, resid.pow(2))
        dtype = model.item_emb.dtype
        return LocalUpdates({"moment": moment.to(dtype)}, rows.to(dtype),
                            torch.zeros_like(model.user_emb.detach()[data.users]), loss.to(dtype))


class ItemSolveStep:
    """The server step of :class:`ItemSolve` on a round's summed (and, under server placement, noised) uploads,
    in place of the optimiser's; ``sample_rate`` is the expected share of clients in a round (the sums shrink with
    it, so the ridge is taken at ``λ · sample_rate``) and ``noise_stddev`` says the standard deviation of the noise
    on the sums the step is given (None: there is none)."""

    def __init__(self, spec: ItemSolve, sample_rate: float, noise_stddev: Callable[[], float] | None = None) -> None:
        self.spec = spec
        self.sample_rate = check_float("sample_rate", sample_rate, low=0.0, high=1.0, low_open=True)
        self.noise_stddev = noise_stddev
        self.steps = 0
        self.counts: Tensor | None = None  # the items' rater counts from the (noised) sums: the last step's or mean
        # under count_average: the precision-weighted sum of every step's counts, and the precisions' sum
        self.count_total: tuple[Tensor, Tensor] | None = None

    def item_weights(self) -> Tensor | None:
        """``(I,)`` float64, the weights ``f_i ∝ max(n_i, 1)^(−a)`` of the items' parts of the next uploads from the
        last step's counts, scaled so that their mean square over ratings, ``Σ n_i f_i² / Σ n_i``, is 1 (the clip
        means the same as without them); None without ``count_power`` or before the first step (module
        docstring). They are computed from released sums, so they cost no privacy; None too while those sum to no
        rating."""
        if not self.spec.count_power or self.counts is None:
            return None
        counts = self.counts.clamp(min=0.0)
        if not float(counts.sum()) > 0:
            return None
        weights = counts.clamp(min=1.0).pow(-self.spec.count_power)
        return weights / ((counts * weights.pow(2)).sum() / counts.sum()).sqrt()

    def __call__(self, model: FederatedRecommender, g_shared: Tensor, items: Tensor, g_rows: Tensor) -> None:
        k, s = model.embed_dim, self.spec.factor_scale
        table = model.item_emb.detach().double()
        sums = torch.zeros(len(table), k + 2, dtype=torch.float64, device=table.device)
        sums[items] = g_rows.double()
        weights = self.item_weights()  # those the clients were sent for this round
        weights = torch.ones(len(table), dtype=torch.float64, device=table.device) if weights is None else \
            weights.to(table.device)
        sigma = 0.0 if self.noise_stddev is None else self.noise_stddev()
        if self.spec.count_average:  # the steps' estimates in ratings' units, each weighted by its precision
            raw = sums[:, k + 1] / COUNT_WEIGHT / weights  # its noise: σ / (COUNT_WEIGHT f_i)
            precision = weights.pow(2) / (sigma ** 2 if sigma > 0 else 1.0)
            total, weight = (raw * precision, precision) if self.count_total is None else \
                (self.count_total[0] + raw * precision, self.count_total[1] + precision)
            self.count_total = (total, weight)
            self.counts = (total / weight).clamp(min=0.0)
            counts = self.counts * weights  # weighted: f_i n_i
        else:
            counts = (sums[:, k + 1] / COUNT_WEIGHT).clamp(min=0.0)  # weighted: f_i n_i
            self.counts = counts / weights
        moment = g_shared.double().view(k + 1, k + 1) / MOMENT_WEIGHT
        moment = (moment + moment.T) / 2
        users = moment[k, k]  # the number of users in the sums (their ũ's last entry is 1)
        moment = moment / users if users > 0 else torch.zeros_like(moment)
        # λ acts on the weighted sums, where the noise is the same for every item (λ / f_i in ratings' units)
        lam, (ev, basis) = self.spec.ridge * self.sample_rate, torch.linalg.eigh(moment)
        ev = ev.clamp(min=0.0)  # noise can leave a negative eigenvalue: the moment of real features has none
        v = torch.cat([table[:, :k] / s, table[:, k:]], 1)
        curvature = counts.unsqueeze(1) * ev  # every A_i is diagonal in the moment's eigenbasis
        if self.spec.noise_ridge and sigma > 0:  # λ + ρ σ² / (n_i e_k), per item and direction
            lam = lam + self.spec.noise_ridge * sigma ** 2 / curvature.clamp(min=_CURVATURE_FLOOR)
        step = ((sums[:, :k + 1] @ basis - lam * (v @ basis)) / (curvature + lam)) @ basis.T
        start = self.spec.average_from
        v = v + (step if start is None or self.steps < start else step / (self.steps - start + 2))
        with torch.no_grad():
            model.item_emb.copy_(torch.cat([v[:, :k] * s, v[:, k:]], 1).to(model.item_emb.dtype))
        self.steps += 1

    def state_dict(self) -> dict[str, Any]:
        """The steps taken (the averaging's clock) and the items' counts (the next weights', and their running
        sum under ``count_average``)."""
        return {"steps": self.steps, "counts": None if self.counts is None else self.counts.clone(),
                "count_total": None if self.count_total is None else tuple(t.clone() for t in self.count_total)}

    def load_state_dict(self, model: FederatedRecommender, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state_dict` (``model`` is unused)."""
        if state is None:
            return
        if "steps" not in state:
            raise ConfigError("cannot resume: the checkpoint's server step is an optimiser's, this run has "
                              "task.item_solve")
        self.steps = int(state["steps"])
        self.counts = None if state.get("counts") is None else state["counts"].clone()
        self.count_total = None if state.get("count_total") is None else tuple(t.clone() for t in
                                                                              state["count_total"])
