"""The round as matrix factorisation's summed loss (issue 40): with ``task.objective=sse``,
``aggregator.weighting=uniform`` and ``aggregator.reduce=sum`` the aggregated item update is the gradient of
the squared error summed over every rating of the round, computed here in one central backward pass; with the
authors' ``reduce=mean`` it is not (each item's sum is divided by its uploaders)."""
from __future__ import annotations

import pytest
import torch

from fedrec.errors import ConfigError
from fedrec.models import FedGNN, MatrixFactorization
from fedrec.recsys.aggregate import FedSGD, Uploads
from fedrec.recsys.local import local_updates
from fedrec.recsys.objectives import OBJECTIVES
from tests.helpers import tiny_round


def _uploads(upd, d) -> Uploads:
    return Uploads(d.clients, upd.flat_shared(), d.row_client, d.row_item, upd.rows,
                   d.ratings_per_client())


def _central_item_gradient(model: MatrixFactorization, d) -> torch.Tensor:
    """The gradient of Σ over all ratings (ŷ − y)² with respect to the item table, one backward pass."""
    items = model.item_emb.detach().clone().requires_grad_(True)
    users = model.user_emb.detach()
    u, i = d.users[d.entry_user], d.row_item[d.entry_row]
    pred = (users[u] * items[i]).sum(1)
    loss = ((torch.sigmoid(pred) - d.entry_rating.double()) ** 2).sum()
    return torch.autograd.grad(loss, items)[0]


@pytest.mark.parametrize(("objective", "weighting"), [("sse", "uniform"), ("mse", "ratings")])
def test_summed_item_updates_are_the_central_gradient_of_the_summed_loss(objective: str, weighting: str) -> None:
    """sse with equal weights, or the per-client mean weighted by the client's ratings: both add up to Σ over
    ratings."""
    torch.manual_seed(5)
    model = MatrixFactorization(6, 24, 3).double()
    d = tiny_round()
    upd = local_updates(model, d, objective=OBJECTIVES[objective])
    _, items, rows = FedSGD(weighting=weighting, reduce="sum")(_uploads(upd, d))
    central = _central_item_gradient(model, d)
    torch.testing.assert_close(rows.double(), central[items])
    assert set(items.tolist()) == set(d.row_item.tolist())
    # the authors' mean over uploaders divides each item's sum by its uploaders: another vector
    _, items_m, rows_m = FedSGD(weighting=weighting)(_uploads(upd, d))
    shared = torch.bincount(d.row_item, minlength=24)[items_m] > 1
    assert not torch.allclose(rows_m[shared].double(), central[items_m][shared])


def test_the_sse_loss_is_the_sum_and_a_bad_reduction_is_refused() -> None:
    torch.manual_seed(6)
    model = MatrixFactorization(6, 24, 3).double()
    d = tiny_round()
    sse = local_updates(model, d, objective=OBJECTIVES["sse"])
    mse = local_updates(model, d, objective=OBJECTIVES["mse"])
    torch.testing.assert_close(sse.loss, mse.loss * d.ratings_per_client().double())
    with pytest.raises(ConfigError, match="aggregator.reduce must be one of"):
        FedSGD(reduce="median")


def test_summed_omega_is_the_central_gradient_of_the_summed_loss() -> None:
    """FedGNN's ω: the clients' gradients of their own copies add up to the gradient of the loss over all ratings
    with respect to the one shared ω (each user represented from its own ratings)."""
    torch.manual_seed(7)
    model = FedGNN(6, 24, 3).double()
    d = tiny_round()
    upd = local_updates(model, d, objective=OBJECTIVES["sse"])
    shared, _, _ = FedSGD(weighting="uniform", reduce="sum")(_uploads(upd, d))
    params = {n: p.detach().clone().requires_grad_(True) for n, p in model.shared_parameters().items()}
    users, items = model.user_emb.detach()[d.users], model.item_emb.detach()[d.row_item]
    h = model.user_states(params, users, items[d.entry_row], d.entry_user)
    pred = model.link(model.pair_logits(params, h, items[d.entry_row], d.entry_user))
    loss = ((pred - d.entry_rating.double()) ** 2).sum()
    central = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(params.values()))])
    torch.testing.assert_close(shared.double(), central)
