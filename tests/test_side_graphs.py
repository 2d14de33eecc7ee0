"""Side graphs as graph regularisation (issue 40 item 3, fedrec.recsys.side_graphs): the Laplacian against
networkx's, the server's item term and the clients' user term against autograd of the edge sums written out, the
friends' messages against a plain count, the refusals, and the Monti experiments' settings end to end."""
from __future__ import annotations

import dataclasses

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fedrec.data import load_ratings
from fedrec.data.ratings import RatingData
from fedrec.errors import ConfigError
from fedrec.federation.channel import Channel
from fedrec.models import FedGNN, MatrixFactorization
from fedrec.privacy import ClientDP
from fedrec.recsys import FedSGD
from fedrec.recsys.side_graphs import SideGraphs, laplacian
from fedrec.tasks import FedRecTask
from tests.helpers import write_ml1m


def _graph(n: int, p: float, seed: int) -> sp.csr_matrix:
    """A random symmetric 0/1 adjacency with a few self-loops (which the regulariser ignores)."""
    g = nx.gnp_random_graph(n, p, seed=seed)
    g.add_edges_from((v, v) for v in range(0, n, 7))
    return sp.csr_matrix(nx.to_scipy_sparse_array(g, nodelist=range(n), dtype=np.float64))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> RatingData:
    folder = write_ml1m(tmp_path_factory.mktemp("ml1m"), users=30, items=40, seed=4)
    data = load_ratings("ml-1m", folder, seed=0, rounds=3, num_clients=8)  # several users per client
    return dataclasses.replace(data, user_graph=_graph(30, 0.15, 1), item_graph=_graph(40, 0.1, 2))


def _task(data: RatingData, side: dict | None, model_cls=MatrixFactorization, **kw) -> FedRecTask:
    torch.manual_seed(0)
    model = model_cls(data.num_users, data.num_items, 4, bias=True, head="linear", init_std=0.3)
    return FedRecTask(data, model, FedSGD(weighting="uniform", reduce="sum"), rounds=data.rounds, pseudo_items=0,
                      seed=3, optimizer="sgd", lr=0.05, weight_decay=0.0, objective="sse", side_graphs=side, **kw)


def _edge_sum_grad(table: torch.Tensor, graph: sp.csr_matrix, weight: float, k: int) -> torch.Tensor:
    """Autograd of ½ λ Σ over undirected edges (no self-loops) of ‖x_a − x_b‖², on the first k columns."""
    x = table.detach()[:, :k].double().requires_grad_(True)
    coo = sp.triu(graph, k=1).tocoo()
    loss = sum(0.5 * weight * (x[a] - x[b]).pow(2).sum() for a, b in zip(coo.row, coo.col))
    loss.backward()
    return x.grad


@pytest.mark.parametrize("seed", range(3))
def test_the_laplacian_is_networkx_s_without_self_loops(seed: int) -> None:
    graph = _graph(25, 0.2, seed)
    g = nx.from_scipy_sparse_array(graph)
    g.remove_edges_from(nx.selfloop_edges(g))
    want = nx.laplacian_matrix(g, nodelist=range(25)).toarray()
    np.testing.assert_array_equal(laplacian(graph).to_dense().numpy(), want)


@pytest.mark.parametrize("biases", [False, True])
def test_one_round_adds_both_terms_to_the_plain_round_s_step(tiny: RatingData, biases: bool) -> None:
    """Server SGD, no weight decay: the item table moves by −lr·(aggregate + ∂(½λ_i Σ‖q_i − q_j‖²)), the used users'
    rows by −lr·(their gradient + ∂(½λ_u Σ‖p_u − p_v‖²)); the biases by the data alone, or smoothed too."""
    lam_u, lam_i, lr = 0.7, 1.3, 0.05
    plain, side = _task(tiny, None), _task(tiny, {"users": lam_u, "items": lam_i, "biases": biases})
    u0, v0 = side.model.user_emb.detach().clone(), side.model.item_emb.detach().clone()
    plain.run_round(0)
    side.run_round(0)
    k = side.model.row_dim if biases else side.model.embed_dim
    d_items = torch.zeros_like(v0, dtype=torch.float64)
    d_items[:, :k] = _edge_sum_grad(v0, tiny.item_graph, lam_i, k)
    torch.testing.assert_close(side.model.item_emb.detach().double(),
                               plain.model.item_emb.detach().double() - lr * d_items, rtol=0, atol=1e-6)
    trained = torch.from_numpy(np.unique(tiny.training_until(0).user))
    d_users = torch.zeros_like(u0, dtype=torch.float64)
    d_users[:, :k] = _edge_sum_grad(u0, tiny.user_graph, lam_u, k)
    moved = torch.zeros(tiny.num_users, dtype=torch.bool)
    moved[trained] = True
    want = plain.model.user_emb.detach().double() - lr * d_users * moved.unsqueeze(1)
    torch.testing.assert_close(side.model.user_emb.detach().double(), want, rtol=0, atol=1e-6)
    torch.testing.assert_close(side.model.user_emb.detach()[~moved], u0[~moved], rtol=0, atol=0)


def test_friends_in_other_clients_send_one_message_each(tiny: RatingData) -> None:
    """Against a plain count: one peer message of embed_dim scalars per (trained user, friend in another client)."""
    task = _task(tiny, {"users": 0.5})
    task.run_round(0)
    owner = tiny.client_of_user
    want = 0
    for u in np.unique(tiny.training_until(0).user):
        for v in tiny.user_graph[u].indices:
            want += int(v != u and owner[v] != owner[u])
    totals = task.channel.ledger.totals()
    assert want > 0
    assert int(totals["comm_peer_messages"].sum()) == want
    assert int(totals["comm_peer_scalars"].sum()) == want * task.model.embed_dim


def test_the_central_baseline_sends_no_peer_messages_and_takes_the_same_first_step(tiny: RatingData) -> None:
    """One party holds every user: no friend is in another client; under the summed loss its first step equals
    the federated run's."""
    fed, central = _task(tiny, {"users": 0.5, "items": 0.5}), _task(tiny, {"users": 0.5, "items": 0.5},
                                                                    federated=False)
    fed.run_round(0)
    central.run_round(0)
    assert int(central.channel.ledger.totals()["comm_peer_messages"].sum()) == 0
    torch.testing.assert_close(central.model.item_emb, fed.model.item_emb, rtol=0, atol=1e-6)
    torch.testing.assert_close(central.model.user_emb, fed.model.user_emb, rtol=0, atol=1e-6)


def test_the_item_term_runs_under_client_dp_and_with_fedgnn(tiny: RatingData) -> None:
    dp = ClientDP(tiny.num_clients, "gaussian", epsilon=4.0)
    task = _task(tiny, {"items": 0.5}, model_cls=FedGNN, privacy=dp)
    for t in range(tiny.rounds):
        assert np.isfinite(task.run_round(t)["test_rmse"])
    assert task.summary()["side_graph_items"] == 0.5


@pytest.mark.parametrize(("side", "needle"), [
    ({"users": 1.0}, "friends, which client DP does not cover"),
    ({"users": -1.0}, "task.side_graphs.users"),
    ({"edges": 1.0}, "task.side_graphs has no field 'edges'"),
])
def test_refusals_name_the_field(tiny: RatingData, side: dict, needle: str) -> None:
    dp = ClientDP(tiny.num_clients, "gaussian", epsilon=4.0)
    with pytest.raises(ConfigError, match=needle):
        _task(tiny, side, privacy=dp)


def test_a_graph_the_data_lacks_is_refused_with_the_datasets_that_have_it(tiny: RatingData) -> None:
    with pytest.raises(ConfigError, match=r"task.side_graphs.items=1: data=.* has no item graph .*flixster"):
        _task(dataclasses.replace(tiny, item_graph=None), {"items": 1.0})
    asym = sp.csr_matrix(([1.0], ([0], [1])), shape=(30, 30))
    with pytest.raises(ConfigError, match="user graph .* is not symmetric"):
        _task(dataclasses.replace(tiny, user_graph=asym), {"users": 1.0})


def test_smoothing_biases_needs_a_model_with_biases(tiny: RatingData) -> None:
    torch.manual_seed(0)
    with pytest.raises(ConfigError, match=r"task.side_graphs.biases=true .* \+model.bias=true"):
        FedRecTask(tiny, MatrixFactorization(tiny.num_users, tiny.num_items, 4), FedSGD(), rounds=tiny.rounds,
                   pseudo_items=0, side_graphs={"items": 1.0, "biases": True})


def test_zero_weights_build_nothing(tiny: RatingData) -> None:
    assert SideGraphs.from_config({"users": 0.0, "items": 0.0}, tiny.user_graph, tiny.item_graph, "x", False) is None
    assert _task(tiny, None).side_graphs is None


def test_a_user_term_message_goes_through_the_channel() -> None:
    """Two users in two clients, one edge: each sends the other its vector (one peer message each way)."""
    graphs = SideGraphs(sp.csr_matrix(np.array([[0.0, 1.0], [1.0, 0.0]])), None, users=1.0)
    model = MatrixFactorization(2, 3, 4)
    channel = Channel(endpoints={"client": 2, "server": 1}, bytes_per_scalar=4)
    term = graphs.user_term(model, torch.tensor([0, 1]), np.array([0, 1]), channel)
    u = model.user_emb.detach()
    torch.testing.assert_close(term, torch.stack([u[0] - u[1], u[1] - u[0]]), rtol=0, atol=1e-6)
    assert channel.ledger.per_endpoint("client", "peer").tolist() == [[1, 1]]
