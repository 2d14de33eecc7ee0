"""Models written with ordinary layers (:class:`fedrec.models.PlainRecommender`): a plain ``nn.Linear`` head
federated by the framework equals the same model batched by hand (per-user weights indexed explicitly), trains in
the federated task, and a model fedrec cannot federate is refused when the run is built, naming ``model``."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from fedrec.app.build import build_task
from fedrec.app.cli import run
from fedrec.app.schema import check_command_line
from fedrec.errors import ConfigError
from fedrec.models import FederatedRecommender, PlainRecommender
from fedrec.recsys.local import local_updates
from tests.helpers import tiny_round

CONF = Path(__file__).resolve().parents[1] / "conf"
QUICK = ("+experiment=fedgnn_synthetic", "model=mf", "task.rounds=2", "data.users=120", "data.items=60",
         "data.ratings=2000", "data.num_clients=12", "task.pseudo_items=20", "plots=false", "logger.tensorboard=false")


class LinearHead(PlainRecommender):
    """``logit = w · [p_u; q_i] + b``: one ordinary ``nn.Linear`` over the concatenated rows."""

    def __init__(self, num_users: int, num_items: int, embed_dim: int = 8) -> None:
        super().__init__(num_users, num_items, embed_dim)
        self.head = nn.Linear(2 * self.embed_dim, 1)

    def forward(self, user_vecs: Tensor, item_vecs: Tensor) -> Tensor:
        return self.head(torch.cat([user_vecs, item_vecs], -1)).squeeze(-1)


class MLPHead(PlainRecommender):
    """Two ordinary layers with a width of its own (a constructor argument no fedrec option file declares)."""

    def __init__(self, num_users: int, num_items: int, embed_dim: int = 8, hidden: int = 4) -> None:
        super().__init__(num_users, num_items, embed_dim)
        self.net = nn.Sequential(nn.Linear(2 * self.embed_dim, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, user_vecs: Tensor, item_vecs: Tensor) -> Tensor:
        return self.net(torch.cat([user_vecs, item_vecs], -1)).squeeze(-1)


class HandBatched(FederatedRecommender):
    """:class:`LinearHead` written the hand-batched way: each pair's weights indexed by its user when ω carries a
    leading per-user dimension."""

    def __init__(self, num_users: int, num_items: int, embed_dim: int = 8) -> None:
        super().__init__(num_users, num_items, embed_dim)
        self.head = nn.Linear(2 * self.embed_dim, 1)

    def represent(self, shared: dict[str, Tensor], user_vecs: Tensor, item_vecs: Tensor, entry_user: Tensor) -> Tensor:
        return user_vecs

    def score(self, shared: dict[str, Tensor], h: Tensor, item_vecs: Tensor, pair_user: Tensor) -> Tensor:
        w, b = shared["head.weight"], shared["head.bias"]
        x = torch.cat([h[pair_user], item_vecs], -1)
        if w.dim() == 3:  # (S, 1, 2k): each pair with its user's copy
            return (x * w[pair_user, 0]).sum(-1) + b[pair_user, 0]
        return (x * w[0]).sum(-1) + b[0]


def twins(k: int = 3) -> tuple[LinearHead, HandBatched]:
    torch.manual_seed(5)
    plain = LinearHead(6, 24, k).double()
    hand = HandBatched(6, 24, k).double()
    hand.load_state_dict(plain.state_dict())
    return plain, hand


@pytest.mark.parametrize("steps", [1, 3])
def test_a_plain_linear_head_federated_equals_its_hand_batched_form(steps: int) -> None:
    plain, hand = twins()
    d = tiny_round()  # one user holds more pairs than a block, so its pairs span two blocks
    got, want = local_updates(plain, d, local_steps=steps, local_lr=0.1), local_updates(hand, d, steps, 0.1)
    torch.testing.assert_close(got.loss, want.loss)
    torch.testing.assert_close(got.rows, want.rows)
    torch.testing.assert_close(got.users, want.users)
    for name in ("head.weight", "head.bias"):
        torch.testing.assert_close(got.shared[name], want.shared[name])
    # every client's ω update is its own (not a sum over clients)
    assert not torch.allclose(got.shared["head.weight"][0], got.shared["head.weight"][1])
    # without a per-user dimension the score is the module's own forward
    users, items = plain.user_emb[d.users[d.entry_user]], plain.item_emb[d.row_item[d.entry_row]]
    torch.testing.assert_close(plain.score(plain.shared_parameters(), users, items, torch.arange(len(users))),
                               plain(users, items))


def test_a_plain_model_trains_in_the_federated_task_as_its_hand_batched_form(
        compose_cfg: Callable[..., DictConfig], tmp_path: Path) -> None:
    summaries = [run(compose_cfg(*QUICK, f"model._target_=test_plain_models.{name}"), output_dir=tmp_path / name)
                 for name in ("LinearHead", "HandBatched")]
    assert summaries[0]["model"] == "LinearHead" and summaries[0]["rounds_run"] == 2
    for key in ("final_test_rmse", "best_test_f1"):
        assert summaries[0][key] == pytest.approx(summaries[1][key], rel=1e-5), key


def test_a_users_own_constructor_argument_is_set_from_the_command_line(
        compose_cfg: Callable[..., DictConfig], tmp_path: Path) -> None:
    line = [*QUICK, "model._target_=test_plain_models.MLPHead", "+model.hidden=5"]
    check_command_line(CONF, line)  # the pre-check reads what MLPHead takes
    task = build_task(compose_cfg(*line))
    assert task.model.net[0].out_features == 5
    with pytest.raises(ConfigError, match=r"model\.hiden: model=mf has no field 'hiden'"):
        check_command_line(CONF, [*line[:-1], "+model.hiden=5"])


class RecBoleStyle(nn.Module):
    """A model of another library's kind: ids in, its own embedding tables."""

    def __init__(self, num_users: int, num_items: int, embed_dim: int = 8) -> None:
        super().__init__()
        self.users, self.items = nn.Embedding(num_users, embed_dim), nn.Embedding(num_items, embed_dim)

    def forward(self, user: Tensor, item: Tensor) -> Tensor:
        return (self.users(user) * self.items(item)).sum(-1)


class IdsInForward(PlainRecommender):
    """A plain model whose forward expects ids, not rows."""

    def __init__(self, num_users: int, num_items: int, embed_dim: int = 8) -> None:
        super().__init__(num_users, num_items, embed_dim)
        self.table = nn.Embedding(num_items, 1)

    def forward(self, user_vecs: Tensor, item_vecs: Tensor) -> Tensor:
        return self.table(item_vecs).squeeze(-1)


class OneColumn(LinearHead):
    """Returns ``(Q, 1)``, not ``(Q,)``."""

    def forward(self, user_vecs: Tensor, item_vecs: Tensor) -> Tensor:
        return self.head(torch.cat([user_vecs, item_vecs], -1))


class NoForward(PlainRecommender):
    """Leaves forward undefined."""


@pytest.mark.parametrize(("name", "says"), [
    ("RecBoleStyle", "not a fedrec model.*PlainRecommender.*forward\\(user_vecs, item_vecs\\)"),
    ("IdsInForward", "IdsInForward fails on two users' three pairs"),
    ("OneColumn", "one finite logit per pair: three pairs gave shape \\(3, 1\\)"),
    ("NoForward", "NoForward leaves forward undefined"),
])
def test_a_model_fedrec_cannot_federate_is_refused_when_the_run_is_built(
        compose_cfg: Callable[..., DictConfig], name: str, says: str) -> None:
    with pytest.raises(ConfigError, match=f"^model: .*{says}"):
        build_task(compose_cfg(*QUICK, f"model._target_=test_plain_models.{name}"))
