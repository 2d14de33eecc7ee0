"""FedGNN's graph expansion (issue 40 item 2): the server's matching against a direct construction, what the server
sees (keyed hashes only), the ledger's counts, the expanded model against PyG's GAT layers and against a per-client
loop, and runs that compose it with client DP and pseudo items and resume exactly."""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import DictConfig

import fedrec.recsys.expansion as expansion_module
from fedrec.app.cli import run
from fedrec.errors import ConfigError
from fedrec.federation.channel import Channel
from fedrec.models import FedGNN
from fedrec.models.fedgnn import StarGAT
from fedrec.models.recommender import Neighbours
from fedrec.recsys.data import round_data
from fedrec.recsys.expansion import ROLE, GraphExpansion, keyed_hashes, server_match
from fedrec.recsys.local import local_updates
from fedrec.recsys.objectives import rmse_losses
from tests.helpers import tiny_round

QUICK = ("+experiment=fedgnn_synthetic", "task.rounds=4", "data.users=120", "data.items=60", "data.ratings=2500",
         "data.num_clients=12", "task.pseudo_items=8", "plots=false", "logger.tensorboard=false")
Compose = Callable[..., DictConfig]


def _ratings(seed: int, users: int = 12, items: int = 9) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    pairs = [(u, i) for u in range(users) for i in range(items) if rng.random() < 0.45]
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


# ------------------------------------------------------------------------------------------------ the server
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("count", [1, 3, 50])
def test_the_server_returns_other_raters_of_the_same_item(seed: int, count: int) -> None:
    """Against a direct construction: a (user, item) message gets every other rater of the item when there are at
    most ``count``, else ``count`` distinct ones among them; never itself."""
    user, item = _ratings(seed)
    got = server_match(user, keyed_hashes(seed, 9)[item], count, key=seed)
    assert got.shape == (len(user), count)
    for e, (u, i) in enumerate(zip(user, item)):
        others = set(user[(item == i) & (user != u)].tolist())
        mine = got[e][got[e] >= 0].tolist()
        assert len(mine) == len(set(mine)) == min(count, len(others))
        assert set(mine) <= others
        assert (got[e][len(mine):] == -1).all()  # padding after the picks
    again = server_match(user, keyed_hashes(seed, 9)[item], count, key=seed)
    np.testing.assert_array_equal(again, got)  # keyed: a resumed run redraws it


def test_the_server_samples_neighbours_uniformly() -> None:
    """Eleven co-raters, two picked per message: each is picked with probability 2/11 over many keys."""
    user = np.arange(12)
    counts = np.zeros(12)
    trials = 3000
    for key in range(trials):
        picked = server_match(user, np.zeros(12, dtype=np.int64), 2, key=key)[0]
        counts[picked] += 1
    assert counts[0] == 0
    expected = trials * 2 / 11
    assert np.all(np.abs(counts[1:] - expected) < 4 * np.sqrt(expected * (1 - 2 / 11)))


def test_the_server_sees_only_keyed_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    """What reaches the matching step is the senders' pseudonyms and HMAC-SHA256s of the item ids under the
    clients' key (computed here with the standard library), and the hashes of one item differ between keys."""
    seen = []
    real = expansion_module.server_match
    monkeypatch.setattr(expansion_module, "server_match",
                        lambda sender, hashed, count, key: seen.append((sender, hashed)) or real(sender, hashed,
                                                                                                 count, key))
    user, item = _ratings(0)
    exp = GraphExpansion(3, 1, 12, 9)
    exp.expand(user, item, np.arange(12), torch.randn(12, 4), Channel(endpoints={"client": 12, ROLE: 1}),
               hash_key=1234, match_key=5)
    (sender, hashed), = seen
    np.testing.assert_array_equal(sender, user)
    secret = (1234).to_bytes(8, "little")
    expected = [int.from_bytes(hmac.new(secret, int(i).to_bytes(8, "little"), hashlib.sha256).digest()[:8],
                               "little", signed=True) for i in item]
    np.testing.assert_array_equal(hashed, expected)
    assert not set(hashed.tolist()) & set(range(9))
    assert not set(keyed_hashes(1234, 9).tolist()) & set(keyed_hashes(1235, 9).tolist())


def test_entries_get_the_vectors_of_their_neighbours_and_the_ledger_counts_the_messages() -> None:
    user, item = _ratings(1)
    client_of_user = np.arange(12) // 3  # four clients of three users
    vecs = torch.randn(12, 4)
    channel = Channel(endpoints={"client": 4, "server": 1, ROLE: 1}, bytes_per_scalar=4)
    exp = GraphExpansion(2, 1, 12, 9)
    exp.expand(user, item, client_of_user, vecs, channel, hash_key=7, match_key=8)
    d = round_data(user, item, np.ones(len(user)), client_of_user, 9)
    nb = exp.attach(d).neighbours
    ids = server_match(user, keyed_hashes(7, 9)[item], 2, key=8)
    for e in range(len(d.entry_user)):
        u, i = int(d.users[d.entry_user[e]]), int(d.row_item[d.entry_row[e]])
        row = ids[np.flatnonzero((user == u) & (item == i))[0]]
        assert nb.mask[e].tolist() == (row >= 0).tolist()
        torch.testing.assert_close(nb.vecs[e][nb.mask[e]], vecs[row[row >= 0]])
        assert (nb.vecs[e][~nb.mask[e]] == 0).all()
    # one message each way per client: up 2 scalars per hashed item plus a 4-wide vector per user, down 4 per
    # neighbour returned
    up = channel.ledger.per_endpoint("client", "upload", "scalars")[0]
    down = channel.ledger.per_endpoint("client", "download", "scalars", side="received")[0]
    for c in range(4):
        mine = client_of_user[user] == c
        assert int(up[c]) == 2 * mine.sum() + 4 * len(np.unique(user[mine]))
        assert int(down[c]) == 4 * (ids[mine] >= 0).sum()
    assert channel.ledger.per_endpoint(ROLE, "upload", "messages", side="received")[0, 0] == 4
    assert channel.ledger.per_endpoint(ROLE, "download", "messages")[0, 0] == 4


def test_a_rating_the_expansion_did_not_see_has_no_neighbours() -> None:
    user, item = _ratings(2)
    exp = GraphExpansion(3, 2, 12, 9)
    exp.expand(user[:-1], item[:-1], np.arange(12), torch.randn(12, 4), Channel(endpoints={"client": 12, ROLE: 1}),
               hash_key=1, match_key=2)
    d = round_data(user, item, np.ones(len(user)), np.arange(12), 9)
    nb = exp.attach(d).neighbours
    last = int(np.flatnonzero((d.users[d.entry_user] == int(user[-1])).numpy()
                              & (d.row_item[d.entry_row] == int(item[-1])).numpy())[0])
    assert not nb.mask[last].any() and nb.mask.any()
    assert [exp.due(r) for r in range(5)] == [True, False, True, False, True]


# ------------------------------------------------------------------------------------------------ the model
def test_the_dense_star_equals_the_flat_star() -> None:
    torch.manual_seed(0)
    k, sizes = 5, [3, 0, 5, 1]
    gat = StarGAT(k)
    with torch.no_grad():
        gat.bias.normal_()
    centres = torch.randn(len(sizes), k)
    flat = torch.randn(sum(sizes), k)
    owner = torch.cat([torch.full((n,), s) for s, n in enumerate(sizes)])
    dense, mask = torch.zeros(len(sizes), 6, k), torch.zeros(len(sizes), 6, dtype=torch.bool)
    at = 0
    for s, n in enumerate(sizes):
        dense[s, :n], mask[s, :n] = flat[at:at + n], True
        at += n
    dense[~mask] = torch.randn(int((~mask).sum()), k)  # padding must not matter
    params = dict(gat.named_parameters())
    torch.testing.assert_close(gat.attend_dense(params, centres, dense, mask), gat.attend(params, centres, flat, owner))
    per_star = {n: p.detach().expand(len(sizes), *p.shape).clone() for n, p in params.items()}
    per_star["lin_weight"][2] *= 2.0
    torch.testing.assert_close(gat.attend_dense(per_star, centres, dense, mask, torch.arange(len(sizes))),
                               gat.attend(per_star, centres, flat, owner))


def test_the_expanded_fedgnn_equals_two_pyg_gat_layers_on_the_local_graph() -> None:
    """A user u with three items; item 0 has neighbours a, b, item 2 has c. PyG's GATConv over the edges
    {a, b, u} → 0, {u} → 1, {c, u} → 2 gives the items; a second GATConv over {0, 1, 2} → u gives h_u."""
    from torch_geometric.nn import GATConv

    torch.manual_seed(1)
    k = 4
    model = FedGNN(1, 3, k, expansion=True)
    layers = []
    for ours in (model.item_gat, model.gat):
        conv = GATConv(k, k, heads=1)
        with torch.no_grad():
            ours.bias.normal_()
            conv.lin.weight.copy_(ours.lin_weight)
            conv.att_src.copy_(ours.att_src.view(1, 1, k))
            conv.att_dst.copy_(ours.att_dst.view(1, 1, k))
            conv.bias.copy_(ours.bias)
        layers.append(conv)
    u, items, others = torch.randn(1, k), torch.randn(3, k), torch.randn(3, k)  # others: a, b, c
    vecs = torch.zeros(3, 2, k)
    vecs[0] = others[:2]
    vecs[2, 0] = others[2]
    mask = torch.tensor([[True, True], [False, False], [True, False]])
    h = model.represent(model.shared_parameters(), u, items, torch.zeros(3, dtype=torch.long), Neighbours(vecs, mask))
    # nodes: 0 u, 1-3 items, 4-6 a, b, c
    x = torch.cat([u, items, others])
    e1 = torch.tensor([[4, 5, 0, 0, 6, 0], [1, 1, 1, 2, 3, 3]])
    item_out = layers[0](x, e1)[1:4]
    x2 = torch.cat([u, item_out])
    e2 = torch.tensor([[1, 2, 3], [0, 0, 0]])
    torch.testing.assert_close(h[0], layers[1](x2, e2)[0], atol=1e-6, rtol=1e-5)


def test_each_client_differentiates_its_own_copy_of_both_layers() -> None:
    """The batched round's per-client gradients (ω of both layers, user and item rows) equal each client's own
    backward pass; the neighbours' vectors are constants of the graph and get no gradient."""
    torch.manual_seed(2)
    model = FedGNN(6, 24, 3, expansion=True).double()
    d = tiny_round()
    E = len(d.entry_user)
    nb = Neighbours(torch.randn(E, 3, 3, dtype=torch.float64), torch.rand(E, 3) < 0.6)
    d = dataclasses.replace(d, neighbours=nb)
    upd = local_updates(model, d)
    base = {n: p.detach() for n, p in model.shared_parameters().items()}
    assert any(n.startswith("item_gat.") for n in base)
    for c in range(d.num_clients):
        keep = d.user_client == c
        mine = {n: p.clone().requires_grad_(True) for n, p in base.items()}
        users = model.user_emb.detach()[d.users[keep]].clone().requires_grad_(True)
        rows = model.item_emb.detach()[d.row_item[d.row_client == c]].clone().requires_grad_(True)
        alone = d.select(c, c + 1)
        loss = rmse_losses(model, alone, mine, users, rows)
        grads = torch.autograd.grad(loss.sum(), [*mine.values(), users, rows])
        for (n, _), g in zip(mine.items(), grads):
            torch.testing.assert_close(upd.shared[n][c], g)
        torch.testing.assert_close(upd.users[keep], grads[-2])
        torch.testing.assert_close(upd.rows[d.row_client == c], grads[-1])


# ------------------------------------------------------------------------------------------------ runs
def _summary(compose_cfg: Compose, tmp_path: Path, name: str, *extra: str) -> dict:
    return run(compose_cfg(*QUICK, *extra), output_dir=tmp_path / name)


def test_expansion_composes_with_client_dp_and_pseudo_items(compose_cfg: Compose, tmp_path: Path) -> None:
    """The same private run with and without expansion: the accountant spends the same ε (expansion adds no noised
    upload), and the uploads grow by exactly the item layer's ω and the expansion messages."""
    dp = ("privacy=gaussian", "privacy.epsilon=5")
    plain = _summary(compose_cfg, tmp_path, "plain", *dp)
    expanded = _summary(compose_cfg, tmp_path, "expanded", *dp, "task.expansion.neighbours=4", "task.expansion.every=2")
    assert expanded["epsilon_spent"] == plain["epsilon_spent"] > 0
    assert expanded["expansion_neighbours"] == 4 and expanded["final_test_rmse"] != plain["final_test_rmse"]
    k = 8  # fedgnn_synthetic's embed_dim
    layer = k * k + 3 * k
    grown = expanded["comm_upload_messages"] - plain["comm_upload_messages"]
    assert grown == 2 * 12  # rounds 0 and 2: one expansion message per client
    extra = expanded["comm_upload_scalars"] - plain["comm_upload_scalars"]
    assert extra > 4 * 12 * layer  # every round's uploads carry the item layer, plus the expansion's


def test_a_resumed_expanded_run_repeats_the_uninterrupted_one(compose_cfg: Compose, tmp_path: Path) -> None:
    ov = ("task.expansion.neighbours=3", "task.expansion.every=2", "task.rounds=5")
    full = _summary(compose_cfg, tmp_path, "full", *ov)
    _summary(compose_cfg, tmp_path, "part", *ov, "trainer.max_rounds=3")  # stops between two expansions
    resumed = _summary(compose_cfg, tmp_path, "resumed", *ov,
                       f"ckpt_path={tmp_path / 'part' / 'checkpoints' / 'last.ckpt'}")
    strip = lambda s: {k: v for k, v in s.items() if k != "wall_seconds"}
    assert json.dumps(strip(resumed), sort_keys=True) == json.dumps(strip(full), sort_keys=True)


@pytest.mark.parametrize(("override", "says"), [
    ("model=mf", "task.expansion.neighbours=3: model MatrixFactorization does not read expansion neighbours"),
    ("task.expansion.every=0", "task.expansion.every must be an integer >= 1"),
    ("task.expansion.neighbours=-1", None),
])
def test_bad_expansion_settings_are_refused(compose_cfg: Compose, tmp_path: Path, override: str,
                                            says: str | None) -> None:
    extra = () if override.startswith("task.expansion.neighbours") else ("task.expansion.neighbours=3",)
    with pytest.raises(ConfigError, match=says or "task.expansion.neighbours must be an integer >= 0"):
        _summary(compose_cfg, tmp_path, "bad", *extra, override)


def test_the_residual_adds_each_layers_centre() -> None:
    torch.manual_seed(3)
    plain = FedGNN(4, 9, 3, expansion=True)
    res = FedGNN(4, 9, 3, expansion=True, residual=True)
    res.load_state_dict(plain.state_dict())
    users, items = torch.randn(2, 3), torch.randn(5, 3)
    owner = torch.tensor([0, 0, 1, 1, 1])
    nb = Neighbours(torch.randn(5, 2, 3), torch.rand(5, 2) < 0.5)
    shared = plain.shared_parameters()
    items_plain = plain._expanded_items(shared, users, items, owner, nb)
    torch.testing.assert_close(res._expanded_items(shared, users, items, owner, nb), items_plain + items)
    expected = plain.gat.attend({n.removeprefix("gat."): p for n, p in shared.items() if n.startswith("gat.")},
                                users, items_plain + items, owner) + users
    torch.testing.assert_close(res.represent(shared, users, items, owner, nb), expected)
