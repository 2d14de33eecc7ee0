"""``task.client_chunk``: local training a chunk of clients at a time gives the round's updates (each client's update
depends on its own data alone; to float32 rounding, as torch's CPU reductions may sum a batch of another shape in
another order), so whole runs end with the same model and metrics, on one process and sharded. Where the server's
combination is a sum, the whole round streams: each chunk's uploads are assembled, screened and summed before the
next chunk trains."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fedrec.tasks.recommendation as round_module
from fedrec.app.build import build_task
from fedrec.app.build.capacity import recommendation_sizes
from fedrec.data.ratings import RatingData
from fedrec.errors import ConfigError
from fedrec.models import FedGNN, MatrixFactorization, NeuMF
from fedrec.privacy import ClientDP
from fedrec.recsys import CoordinateMedian, FedAvg, FedSGD, NormBound, Strategy
from fedrec.recsys.local import local_updates
from fedrec.recsys.objectives import rmse_losses
from fedrec.tasks import FedRecTask
from tests.helpers import make_task, play_sharded, tiny_fixture, tiny_round

ROUNDS = 3
grouped = tiny_fixture(users=60, items=50, seed=2, rounds=ROUNDS, num_clients=13)


def _server_dp(data: RatingData) -> ClientDP:
    return ClientDP(data.num_clients, "gaussian", epsilon=4.0, placement="server", adjacency="add_remove",
                    sensitivity_factor=1.0)


#: float64 results of the same arithmetic summed in batches of other shapes: equal to rounding in the last places
EXACT = {"rtol": 1e-12, "atol": 1e-12}


@pytest.mark.parametrize("chunk", [1, 2, 4])
@pytest.mark.parametrize("model_cls", [FedGNN, MatrixFactorization, NeuMF])
def test_local_updates_in_chunks_equal_the_round_at_once(model_cls: type, chunk: int, float64: None) -> None:
    """Three clients whose users are not in client order: every output equal (in float64; float32's batched
    kernels differ by CPU, by up to 1.5e-7 in NeuMF's tower on AMD EPYC's AVX-512 ones), user rows back at their
    places."""
    d = tiny_round()
    torch.manual_seed(0)
    model = model_cls(6, 24, 4)
    for steps, lr, mu, l2 in ((1, 0.05, 0.0, 0.0), (3, 0.1, 0.5, 0.01)):
        whole = local_updates(model, d, steps, lr, mu, rmse_losses, l2)
        parts = local_updates(model, d, steps, lr, mu, rmse_losses, l2, chunk=chunk)
        assert whole.shared.keys() == parts.shared.keys()
        for name in whole.shared:
            assert whole.shared[name].dtype == torch.float64
            torch.testing.assert_close(parts.shared[name], whole.shared[name], **EXACT, msg=name)
        for field in ("rows", "users", "loss"):
            torch.testing.assert_close(getattr(parts, field), getattr(whole, field), **EXACT, msg=field)
        # the users are not in client order: a row put back at another user's place would differ by far more
        assert not torch.allclose(parts.users, parts.users.roll(1, 0))


@pytest.mark.parametrize("case", ["fedgnn", "mf_fedavg_dp", "fedgnn_sampled"])
def test_a_chunked_run_ends_with_the_same_model_and_metrics(grouped: RatingData, case: str) -> None:
    """A few rounds with chunks of 3 of the 13 clients against all at once: the same metrics and model state (to
    float32 rounding, carried over the rounds by Adam's normalised steps); with DP, local steps and client sampling
    too (the same clients and noise: the draws do not depend on the chunks)."""
    def task(chunk: int | None):
        if case == "fedgnn":
            return make_task(grouped, client_chunk=chunk)
        if case == "mf_fedavg_dp":
            dp = ClientDP(grouped.num_clients, "gaussian", epsilon=4.0, delta=1e-5)
            return make_task(grouped, dp, FedAvg(), MatrixFactorization, prox_mu=0.1, client_chunk=chunk,
                             strategy=Strategy(local_steps=2))
        return make_task(grouped, client_chunk=chunk,
                         strategy=Strategy(participation="poisson", sample_rate=0.6, dropout=0.1))

    chunked, whole = task(3), task(None)
    for r in range(ROUNDS):
        got, want = chunked.run_round(r), whole.run_round(r)
        assert set(got) == set(want)
        for name, v in want.items():
            assert got[name] == pytest.approx(v, rel=1e-6, abs=1e-7, nan_ok=True), (r, name)
    # Adam divides each step by the gradient's own scale, so a rounding difference in a near-zero gradient moves
    # its parameter by up to ~1e-6 a round (3.4e-6 in one of 200 entries after three rounds here)
    for name, v in whole.model.state_dict().items():
        torch.testing.assert_close(chunked.model.state_dict()[name], v, rtol=1e-5, atol=1e-5, msg=name)


def test_a_bad_chunk_is_refused_naming_the_field(grouped: RatingData) -> None:
    for bad in (0, -2, 1.5, "3", True):
        with pytest.raises(ConfigError, match="task.client_chunk"):
            make_task(grouped, client_chunk=bad)


@pytest.mark.parametrize("server_dp", [False, True])
def test_chunks_within_the_shards_of_two_processes_change_nothing(grouped: RatingData, server_dp: bool,
                                                                 float64: None) -> None:
    """Each process streams its shard a chunk at a time and the processes add up the chunks' sums (FedSGD's, or
    server placement's clipped sums before the one noise draw): the same model, in float64 (in float32 the users'
    Adam steps carry rounding differences in near-zero gradients over the rounds, up to 4.4e-6 in one user row)."""
    def task(chunk: int | None) -> FedRecTask:
        if not server_dp:
            return make_task(grouped, client_chunk=chunk)
        return make_task(grouped, _server_dp(grouped), FedSGD("uniform"), client_chunk=chunk,
                         strategy=Strategy(participation="poisson", sample_rate=0.7))

    def run(chunk: int | None) -> list[dict[str, torch.Tensor]]:
        tasks = [task(chunk), task(chunk)]
        play_sharded(tasks, range(ROUNDS))
        return [t.model.state_dict() for t in tasks]

    for chunked, whole in zip(run(2), run(None)):
        for name, v in whole.items():
            assert v.dtype == torch.float64
            torch.testing.assert_close(chunked[name], v, **EXACT, msg=name)


def test_item_solve_refuses_a_chunk_it_would_not_use(grouped: RatingData) -> None:
    torch.manual_seed(0)
    model = MatrixFactorization(grouped.num_users, grouped.num_items, 4, head="linear")
    with pytest.raises(ConfigError, match="task.client_chunk=4 chunks the clients' local training"):
        FedRecTask(grouped, model, FedSGD("uniform", reduce="sum"), rounds=ROUNDS, pseudo_items=0, objective="sse",
                   user_solve=True, item_solve={"enabled": True}, client_chunk=4)


STREAMED = {  # each run's settings besides the chunk, and whether its round streams
    "server_dp_sampled": (lambda g: dict(privacy=_server_dp(g), aggregator=FedSGD("uniform"),
                                         strategy=Strategy(participation="poisson", sample_rate=0.7)), True),
    "norm_bound": (lambda g: dict(aggregator=NormBound(0.05)), True),
    "median": (lambda g: dict(aggregator=CoordinateMedian()), False),
}


@pytest.mark.parametrize("case", sorted(STREAMED))
def test_a_streamed_round_assembles_a_chunk_of_uploads_at_a_time_and_sums_them_to_the_same_update(
        grouped: RatingData, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With an additive combination (FedSGD's sums, a norm bound's, server placement's clipped sums with its one
    noise draw) no more than a chunk's uploads are assembled at once and the model is the unchunked run's; a robust
    rule, which needs every upload together, gets the whole round's uploads (only its local training is chunked)."""
    settings, streams = STREAMED[case]
    assembled: list[int] = []
    assemble = round_module.assemble_uploads

    def counted(d, *args, **kw):
        assembled.append(d.num_clients)
        return assemble(d, *args, **kw)
    monkeypatch.setattr(round_module, "assemble_uploads", counted)

    def task(chunk: int | None) -> FedRecTask:
        kw = settings(grouped)
        return make_task(grouped, kw.pop("privacy", None), kw.pop("aggregator"), client_chunk=chunk, **kw)

    chunked, whole = task(3), task(None)
    for r in range(ROUNDS):
        assembled.clear()
        got = chunked.run_round(r)
        assert max(assembled) <= 3 if streams else len(assembled) == 1, assembled
        assert sum(assembled) == got["clients"]
        assert (chunked.last_uploads is None) == streams
        want = whole.run_round(r)
        for name, v in want.items():
            assert got[name] == pytest.approx(v, rel=1e-6, abs=1e-7, nan_ok=True), (r, name)
    for name, v in whole.model.state_dict().items():
        torch.testing.assert_close(chunked.model.state_dict()[name], v, rtol=1e-5, atol=1e-5, msg=name)
    got, want = chunked.summary(), whole.summary()  # ε, the ledger's counts and the used uploads among them
    assert got.keys() == want.keys()
    for name, v in want.items():
        assert got[name] == (pytest.approx(v, rel=1e-6, nan_ok=True) if isinstance(v, float) else v), name


def _poison(task: FedRecTask, client: int) -> None:
    """Make ``client``'s local update non-finite (a NaN user row)."""
    user = int(np.flatnonzero(task.data.client_of_user == client)[0])
    with torch.no_grad():
        task.model.user_emb[user] = math.nan


def test_a_streamed_round_drops_and_counts_a_bad_upload_in_any_chunk_and_abort_still_aborts(
        grouped: RatingData) -> None:
    """A non-finite client in the second chunk: dropped and counted, the same update as without chunks; late
    clients (a deadline) are left out of the chunks' sums as well; under ``abort`` the run stops, naming the
    round."""
    bad = int(grouped.client_of_user[grouped.training_until(0).user[-1]])

    def task(chunk: int | None, policy: str = "drop") -> FedRecTask:
        t = make_task(grouped, client_chunk=chunk, strategy=Strategy(on_bad_update=policy, deadline=1.5))
        _poison(t, bad)
        return t

    chunked, whole = task(3), task(None)
    got, want = chunked.run_round(0), whole.run_round(0)
    assert got["clients_bad"] == want["clients_bad"] == 1 and got["clients_late"] == want["clients_late"] > 0
    assert got["clients"] == want["clients"] <= got["clients_selected"] - got["clients_late"]
    assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-6)
    torch.testing.assert_close(chunked.model.item_emb, whole.model.item_emb, rtol=1e-6, atol=1e-7)
    assert chunked.summary()["comm_upload_messages_used"] == whole.summary()["comm_upload_messages_used"]
    with pytest.raises(FloatingPointError, match="round 0: a client's update is not finite"):
        task(3, "abort").run_round(0)


@pytest.mark.parametrize("overrides, streams", [
    (("aggregator=fedsgd",), True),
    (("aggregator=norm_bound",), True),
    (("aggregator=median",), False),
    (("aggregator=fedsgd", "attack=scale", "attack.fraction=0.25"), False),
    (("aggregator=fedsgd", "aggregator.weighting=uniform", "privacy=gaussian", "privacy.placement=server"), True),
])
def test_the_memory_estimate_streams_the_rounds_the_task_streams(compose_cfg, overrides: tuple[str, ...],
                                                                 streams: bool) -> None:
    """The estimate decides from the config, before the objects exist, what the built task decides from them."""
    cfg = compose_cfg("+experiment=fedgnn_synthetic", "model=mf", "data.users=60", "data.items=40",
                      "data.ratings=600", "data.num_clients=12", "task.client_chunk=5", "task.pseudo_items=4",
                      *overrides)
    task = build_task(cfg)
    sizes = recommendation_sizes(cfg, task.data.num_users, task.data.num_items, len(task.data.training),
                                 task.data.num_clients, chunk=(100, 20))
    assert task._streamed() == sizes["streamed"] == streams
    assert sizes["chunk_clients"] == (5 if streams else 12)
