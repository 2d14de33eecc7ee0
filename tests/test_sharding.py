"""A federated recommendation run sharded across processes equals the one-process run (issue: beyond one process).

The pieces are checked against independent references: the keyed draws against a plain-Python splitmix64 and
their distributions; a shard's data against ``round_data`` of its clients alone; summed partial aggregates and
metric sums against the whole. Whole runs are sharded two ways: in one process with a threaded all-reduce (fast,
every privacy setting), and through ``train.py trainer.devices=2`` with Lightning Fabric's gloo DDP, whose
metrics, ε, final parameters and written files are compared with a one-process run, and whose checkpoints resume
across process counts.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fedrec.app.sweeps import without_timings
from fedrec.data import RatingData, load_ratings
from fedrec.errors import ConfigError
from fedrec.federation.collective import Collective
from fedrec.metrics import metrics_from_sums, rating_metrics, rating_sums
from fedrec.models import FedGNN, MatrixFactorization
from fedrec.models.recommender import Neighbours
from fedrec.privacy import ClientDP
from fedrec.recsys import AggregateSums, FedAvg, FedSGD, Uploads
from fedrec.recsys.data import round_data
from fedrec.tasks import FedRecTask
from fedrec.trainer import FederatedTrainer
from fedrec.trainer.distributed import check_distribution
from fedrec.utils.rng import KeyedRows, keyed_group_shuffle, keyed_sample_excluding, rank_within
from tests.helpers import StubTrainer, play_sharded, write_ml1m
from tests.reference.keyed import MASK, mix, reference_uniform

ROOT = Path(__file__).resolve().parents[1]


def test_keyed_uniforms_equal_a_plain_python_splitmix() -> None:
    key, owners, starts = 0xDEADBEEF12345678, [0, 7, 2 ** 40], [0, 3, 11]
    got = KeyedRows(key, owners, starts).draw("uniform", 5)
    want = [[reference_uniform(key, o, s + j) for j in range(5)] for o, s in zip(owners, starts)]
    assert got.tolist() == want


def _reference_state(key: int, *owners: int) -> int:
    """The state of the stream of ``owners`` nested under ``key`` (a stream of a stream), in plain Python integers."""
    for owner in owners:
        key = mix(key ^ mix((owner + 0x9E3779B97F4A7C15) & MASK))
    return key


def _reference_draw(state: int, c: int, dist: str) -> float:
    """Draw ``c`` of a stream from the plain-Python uniforms: as is, Box–Muller on pair c // 2 (cosine for even c,
    sine for odd c), or the Laplace(0, 1) inverse CDF."""
    def unit(j: int) -> float:
        bits = mix((state + (j + 1) * 0x9E3779B97F4A7C15) & MASK)
        return ((bits >> 11) + 0.5) * 2.0 ** -53

    if dist == "uniform":
        return unit(c)
    if dist == "normal":
        radius, angle = math.sqrt(-2.0 * math.log(unit(c - c % 2))), 2.0 * math.pi * unit(c - c % 2 + 1)
        return radius * (math.cos(angle) if c % 2 == 0 else math.sin(angle))
    w = unit(c) - 0.5
    return -math.copysign(1.0, w) * math.log(1.0 - 2.0 * abs(w))


@pytest.mark.parametrize("dist", ["uniform", "normal", "laplace"])
def test_the_recipe_equals_a_plain_python_splitmix(dist: str) -> None:
    """The one keyed-draw recipe of fedrec.utils.rng, draw by draw and in blocks, nested streams included, against the
    plain-Python reference above (to the bit)."""
    from fedrec.utils.rng import DISTRIBUTIONS, fill, laplace, normal, substream, uniform

    scalar = {"uniform": uniform, "normal": normal, "laplace": laplace}[dist]
    for key, owners in ((0xDEADBEEF12345678, (0,)), (3, (7, 2 ** 40)), (2 ** 64 - 1, (5, 0, 11))):
        state = np.uint64(key)
        for owner in owners:
            state = np.uint64(substream(state, owner))
        assert int(state) == _reference_state(key, *owners)
        want = [_reference_draw(int(state), c, dist) for c in range(9)]
        assert [scalar(state, c) for c in range(9)] == want
        for start in (0, 1, 4):
            out = np.empty(9 - start)
            fill(state, start, DISTRIBUTIONS[dist], out)
            assert out.tolist() == want[start:]
        block = KeyedRows(key, [owners[0]], 0).draw(dist, 9) if len(owners) == 1 else None
        assert block is None or block[0].tolist() == want


def test_lints_normals_are_the_recipe_on_the_nested_stream_seed_row_draw() -> None:
    from fedrec.utils.rng import fill_normals, normals

    seed, rows, draws = 7, np.array([0, 3, 2 ** 33]), np.array([0, 5, 1])
    got = normals(seed, rows, draws, 5)
    want = [[_reference_draw(_reference_state(seed, int(r), int(d)), c, "normal") for c in range(5)]
            for r, d in zip(rows, draws)]
    assert got.tolist() == want
    out = np.empty(3)
    fill_normals(seed, 3, 5, out)
    assert out.tolist() == want[1][:3]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=8), st.integers(0, 20), st.integers(1, 9),
       st.sampled_from(["uniform", "normal", "laplace"]))
def test_an_owners_draws_do_not_depend_on_the_block(owners: list[int], start: int, width: int, dist: str) -> None:
    """Row i of a block equals the same owner's row drawn alone, and a later start continues the stream."""
    block = KeyedRows(99, owners, start).draw(dist, width)
    for i, o in enumerate(owners):
        alone = KeyedRows(99, [o], 0).draw(dist, start + width)
        np.testing.assert_array_equal(block[i], alone[0, start:])


@pytest.mark.parametrize("dist, reference", [("uniform", stats.uniform), ("normal", stats.norm),
                                             ("laplace", stats.laplace)])
def test_keyed_draws_follow_their_distribution(dist: str, reference: Any) -> None:
    x = KeyedRows(5, np.arange(200), 0).draw(dist, 250).ravel()  # 50,000 draws
    assert stats.kstest(x, reference.cdf).pvalue > 1e-3
    y = KeyedRows(6, np.arange(200), 0).draw(dist, 250).ravel()  # another key: independent
    assert abs(np.corrcoef(x, y)[0, 1]) < 0.02
    if dist == "normal":  # the two halves of a Box–Muller pair are uncorrelated
        pairs = KeyedRows(7, np.arange(200), 0).draw(dist, 250)
        assert abs(np.corrcoef(pairs[:, 0::2].ravel(), pairs[:, 1::2].ravel())[0, 1]) < 0.02


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=6))
def test_a_groups_shuffle_does_not_depend_on_the_other_groups(sizes: list[int]) -> None:
    indptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    owners = np.arange(len(sizes), dtype=np.int64) * 7 + 3
    together = np.arange(indptr[-1], dtype=np.int64)
    keyed_group_shuffle(np.uint64(42), owners, indptr, together)
    for g, n in enumerate(sizes):
        alone = np.arange(n, dtype=np.int64) + indptr[g]
        keyed_group_shuffle(np.uint64(42), owners[g:g + 1], np.array([0, n], dtype=np.int64), alone)
        assert together[indptr[g]:indptr[g + 1]].tolist() == alone.tolist()  # a permutation of the group itself


def test_rank_within_counts_each_group_in_order() -> None:
    group = np.array([2, 0, 2, 1, 2, 0, 1])
    want = [sum(group[:j] == g) for j, g in enumerate(group)]
    assert rank_within(group).tolist() == want


def test_keyed_sampling_without_replacement_is_uniform_and_avoids_exclusions() -> None:
    n, count, keys = 8, 3, 3000
    excluded = np.array([1, 5])
    counts = np.zeros(n)
    for key in range(keys):
        values, valid = keyed_sample_excluding(np.uint64(key), np.array([4]), np.array([0, 2]), excluded, n, count)
        row = values[0][valid[0]].tolist()
        assert len(row) == count == len(set(row)) and not set(row) & {1, 5}
        counts[row] += 1
    free = [v for v in range(n) if v not in (1, 5)]
    expected = keys * count / len(free)
    stat = float(((counts[free] - expected) ** 2 / expected).sum())
    assert stats.chi2.sf(stat, len(free) - 1) > 1e-3
    values, valid = keyed_sample_excluding(np.uint64(0), np.array([4]), np.array([0, 2]), excluded, 4, 3)
    assert values[0][valid[0]].tolist() == [0, 2, 3] and valid.sum() == 2 + 1  # all the free ones, no more


# ------------------------------------------------------------------------------------------------ shards of a round
@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 12), st.integers(0, 12))
def test_a_shard_equals_round_data_of_its_clients(seed: int, a: int, b: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    user, item, rating = rng.integers(0, 40, n), rng.integers(0, 30, n), rng.random(n)
    client_of_user = rng.integers(0, 12, 40)
    d = round_data(user, item, rating, client_of_user, 30)
    lo, hi = sorted((min(a, d.num_clients), min(b, d.num_clients)))
    keep = np.zeros(12, dtype=bool)
    keep[d.clients[lo:hi].numpy()] = True
    want = round_data(user, item, rating, client_of_user, 30, keep)
    got = d.select(lo, hi)
    for field in want.__dataclass_fields__:
        if field != "neighbours":  # None on both: round_data attaches no expansion
            assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert got.neighbours is None and want.neighbours is None
    # an expansion's neighbours follow their entries into the shard
    E = len(d.entry_user)
    vecs = torch.arange(E * 2 * 3, dtype=torch.float32).view(E, 2, 3)
    expanded = dataclasses.replace(d, neighbours=Neighbours(vecs, vecs[..., 0] % 2 == 0))
    mine = ((d.entry_client >= lo) & (d.entry_client < hi)).numpy()
    shard_nb = expanded.select(lo, hi).neighbours
    assert torch.equal(shard_nb.vecs, vecs[mine]) and torch.equal(shard_nb.mask, vecs[mine][..., 0] % 2 == 0)


def _uploads(rng: np.random.Generator, clients: int, items: int, k: int) -> Uploads:
    rows = int(rng.integers(clients, 5 * clients))
    row_client = torch.from_numpy(np.sort(rng.integers(0, clients, rows)))
    return Uploads(clients=torch.arange(clients), shared=torch.from_numpy(rng.normal(size=(clients, 3))).float(),
                   row_client=row_client, row_item=torch.from_numpy(rng.integers(0, items, rows)),
                   rows=torch.from_numpy(rng.normal(size=(rows, k))).float(), num_ratings=None)


def _part(up: Uploads, lo: int, hi: int) -> Uploads:
    keep = (up.row_client >= lo) & (up.row_client < hi)
    return Uploads(up.clients[lo:hi], up.shared[lo:hi], up.row_client[keep] - lo, up.row_item[keep], up.rows[keep],
                   None)


@pytest.mark.parametrize("aggregator", [FedSGD(), FedSGD(weighting="uniform"), FedAvg()])
@pytest.mark.parametrize("seed", range(5))
def test_summed_partial_aggregates_equal_the_whole(aggregator: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    up = _uploads(rng, 9, 12, 4)
    cut = int(rng.integers(0, 10))
    a, b = aggregator.partial(_part(up, 0, cut), 12), aggregator.partial(_part(up, cut, 9), 12)
    total = AggregateSums(*(x + y for x, y in zip(a.tensors(), b.tensors())))
    got = aggregator.finish(total)
    # the reference: the weighted means written out, client by client and item by item
    w = torch.bincount(up.row_client, minlength=9).double() if aggregator.weighting == "uploaded_items" \
        else torch.ones(9, dtype=torch.float64)
    shared = sum(w[c] * up.shared[c].double() for c in range(9)) / w.sum()
    items = sorted(set(up.row_item.tolist()))
    rows = [sum(w[up.row_client[j]] * up.rows[j].double() for j in range(len(up.row_item)) if up.row_item[j] == i)
            / sum(w[up.row_client[j]] for j in range(len(up.row_item)) if up.row_item[j] == i) for i in items]
    torch.testing.assert_close(got[0], shared.float(), rtol=1e-6, atol=1e-7)
    assert got[1].tolist() == items
    torch.testing.assert_close(got[2], torch.stack(rows).float(), rtol=1e-6, atol=1e-7)
    zero = AggregateSums.zeros(3, 12, 4)
    assert [torch.equal(x, y + 0) for x, y in zip(zero.tensors(), aggregator.partial(_part(up, 0, 0), 12).tensors())]


def test_metric_sums_add_up_over_disjoint_pairs() -> None:
    rng = np.random.default_rng(0)
    pred, target = torch.from_numpy(rng.random(500)), torch.from_numpy(rng.random(500))
    parts = rating_sums(pred[:173], target[:173]) + rating_sums(pred[173:], target[173:])
    whole = {"rmse": float(((pred - target) ** 2).mean().sqrt()), "mae": float((pred - target).abs().mean())}
    got = metrics_from_sums(parts)
    assert math.isclose(got["rmse"], whole["rmse"], rel_tol=1e-12)
    assert math.isclose(got["mae"], whole["mae"], rel_tol=1e-12)
    assert got == pytest.approx(rating_metrics(pred, target), rel=1e-12)


@pytest.fixture(scope="module")
def grouped(tmp_path_factory: pytest.TempPathFactory) -> RatingData:
    folder = write_ml1m(tmp_path_factory.mktemp("ml1m"), users=60, items=50, seed=2)
    return load_ratings("ml-1m", folder, seed=0, rounds=4, num_clients=13)


def _task(data: RatingData, privacy: str | None, conventions: str = "paper", model: type = FedGNN,
          rng: str = "reproducible") -> FedRecTask:
    torch.manual_seed(0)
    dp = None if privacy is None else ClientDP(data.num_clients, privacy, epsilon=5.0, clip=0.5,
                                              conventions=conventions, rng=rng)
    return FedRecTask(data, model(data.num_users, data.num_items, 4), FedSGD(), dp, rounds=data.rounds,
                      pseudo_items=5, seed=11)


def _sharded(data: RatingData, world: int, **kw: Any) -> tuple[list[FedRecTask], list[list[dict[str, float]]]]:
    tasks = [_task(data, **kw) for _ in range(world)]
    return tasks, play_sharded(tasks, range(data.rounds))


@pytest.mark.parametrize("privacy, conventions", [(None, "paper"), ("gaussian", "paper"), ("laplace", "paper"),
                                                  ("gaussian", "authors")])
@pytest.mark.parametrize("world", [2, 3])
def test_a_sharded_run_equals_the_one_process_run(grouped: RatingData, privacy: str | None, conventions: str,
                                                  world: int) -> None:
    single = _task(grouped, privacy, conventions)
    single.setup(StubTrainer(Collective()))
    want = [single.run_round(r) for r in range(grouped.rounds)]
    tasks, histories = _sharded(grouped, world, privacy=privacy, conventions=conventions)
    for history in histories:  # every rank reports the same metrics as the one-process run
        assert [set(m) for m in history] == [set(m) for m in want]
        for got_round, want_round in zip(history, want):
            for name, v in want_round.items():
                assert got_round[name] == pytest.approx(v, rel=1e-6, abs=1e-7), name
    for task in tasks:  # and holds the same model, ledger and privacy state
        for name, v in single.model.state_dict().items():
            torch.testing.assert_close(task.model.state_dict()[name], v, rtol=1e-6, atol=1e-6)
        assert {k: v.tolist() for k, v in task.channel.ledger.totals().items()} == \
            {k: v.tolist() for k, v in single.channel.ledger.totals().items()}
        if privacy is not None:
            assert torch.equal(task.privacy.spent(), single.privacy.spent())
            assert task.summary()["epsilon_spent"] == single.summary()["epsilon_spent"]
    # each client was computed by exactly one rank: the shards' uploads partition the clients
    clients = torch.cat([t.last_uploads.clients for t in tasks if t.last_uploads is not None])
    assert sorted(clients.tolist()) == single.last_uploads.clients.tolist()


def test_a_client_draws_the_same_noise_in_any_shard(grouped: RatingData) -> None:
    """The privatised upload of a client is the same whichever rank computes it (noise keyed by client)."""
    single = _task(grouped, "gaussian", model=MatrixFactorization)
    single.setup(StubTrainer(Collective()))
    for r in range(grouped.rounds):
        single.run_round(r)
    tasks, _ = _sharded(grouped, 2, privacy="gaussian", model=MatrixFactorization)  # the last round's uploads
    whole = single.last_uploads
    for task in tasks:
        part = task.last_uploads
        for c, client in enumerate(part.clients.tolist()):
            w = whole.clients.tolist().index(client)
            mine, theirs = part.row_client == c, whole.row_client == w
            assert torch.equal(part.row_item[mine], whole.row_item[theirs])  # same items in the same order
            torch.testing.assert_close(part.rows[mine], whole.rows[theirs], rtol=1e-6, atol=1e-6)


def test_secure_keys_are_rank_zeros_on_every_rank(grouped: RatingData) -> None:
    """privacy.rng=secure: every rank uses rank 0's fresh keys, so all see the same pseudo items (X^t of the last
    round, cached), and a rerun draws others."""
    last = grouped.rounds - 1
    first = [t.upload_items(last) for t in _sharded(grouped, 2, privacy="laplace", rng="secure")[0]]
    assert (first[0] != first[1]).nnz == 0
    again = _sharded(grouped, 2, privacy="laplace", rng="secure")[0][0].upload_items(last)
    assert (again != first[0]).nnz > 0


def test_more_ranks_than_clients_leave_some_ranks_idle(tmp_path: Path) -> None:
    folder = write_ml1m(tmp_path, users=6, items=30, seed=3)
    data = load_ratings("ml-1m", folder, seed=0, rounds=2, num_clients=2)
    single = _task(data, "laplace")
    single.setup(StubTrainer(Collective()))
    want = [single.run_round(r) for r in range(data.rounds)]
    _, histories = _sharded(data, 3, privacy="laplace")
    for history in histories:
        for got_round, want_round in zip(history, want):
            assert got_round == pytest.approx(want_round, rel=1e-6, abs=1e-7)


# ------------------------------------------------------------------------------------------------ devices
# (runs on a CUDA device against the CPU runs: tests/test_cuda.py)


# ------------------------------------------------------------------------------------------------ settings
@pytest.mark.parametrize("field, kwargs, message", [
    ("devices", {"devices": 0}, r"trainer\.devices must be an integer >= 1"),
    ("devices", {"devices": "2"}, r"trainer\.devices must be an integer >= 1"),
    ("devices", {"devices": True}, r"trainer\.devices must be an integer >= 1"),
    ("accelerator", {"accelerator": "tpu"}, r"trainer\.accelerator must be one of \['cpu', 'cuda', 'auto'\]"),
    ("strategy", {"strategy": "fsdp"}, r"trainer\.strategy must be one of \['auto', 'ddp'\]"),
    ("strategy", {"strategy": "ddp"}, r"trainer\.strategy=ddp shards a run across processes: set trainer\.devices"),
])
def test_bad_distribution_settings_name_the_field(field: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FederatedTrainer(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a CUDA device")
def test_cuda_without_a_device_is_an_error_naming_the_accelerator() -> None:
    with pytest.raises(ConfigError, match=r"trainer\.accelerator=cuda: no CUDA device is present"):
        check_distribution("cuda", 1, "auto")
    assert check_distribution("auto", 1, "auto") == ("cpu", 1, "single", 1)


def test_one_process_settings_need_no_lightning() -> None:
    code = ("import sys; from fedrec.trainer import FederatedTrainer; FederatedTrainer(devices=1, "
            "accelerator='cpu'); print('lightning' in sys.modules or 'lightning_fabric' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


# ------------------------------------------------------------------------------------------------ train.py, 2 processes
#: a small private FedGNN run with a planner on synthetic ratings (no download)
RUN = ["+experiment=fedgnn_synthetic", "data.users=120", "data.items=80", "data.ratings=3000", "data.num_clients=24",
       "data.val_fraction=0.1", "task.rounds=6", "task.pseudo_items=5", "privacy=gaussian", "planner=bgtplanner",
       "planner.num_actions=2", "planner.initial_rounds=1", "planner.min_rounds=3", "plots=false",
       "trainer.checkpoint_every=2"]


def _train(out: Path, *extra: str, run: list[str] = RUN) -> dict[str, Any]:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *run, f"hydra.run.dir={out}", *extra],
                          cwd=out.parent, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"summary": json.loads((out / "summary.json").read_text()), "stdout": proc.stdout,
            "ckpt": torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)}


def _files(out: Path) -> set[str]:
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and "tfevents" not in p.name}
    return files | ({"tb events"} if any(out.glob("tb/**/events.*")) else set())


def _same_results(a: dict[str, Any], b: dict[str, Any]) -> None:
    sa, sb = without_timings(a["summary"]), without_timings(b["summary"])
    assert set(sa) == set(sb)
    for key, v in sa.items():
        if isinstance(v, float):
            assert sb[key] == pytest.approx(v, rel=1e-6, abs=1e-7), key
        else:
            assert sb[key] == v, key
    assert sb["epsilon_spent"] == sa["epsilon_spent"]  # the same history of levels: the same ε
    for name, v in a["ckpt"]["task"]["model"].items():
        torch.testing.assert_close(b["ckpt"]["task"]["model"][name], v, rtol=1e-6, atol=1e-6)
    ha, hb = a["ckpt"]["history"], b["ckpt"]["history"]
    assert [sorted(m) for m in ha] == [sorted(m) for m in hb]
    for ma, mb in zip(ha, hb):
        assert mb == pytest.approx(ma, rel=1e-6, abs=1e-7)


@pytest.fixture(scope="module")
def one_and_two(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("ddp")
    return {"one": _train(root / "one"), "two": _train(root / "two", "trainer.devices=2", "trainer.strategy=ddp"),
            "root": root}


def test_two_gloo_processes_equal_one(one_and_two: dict[str, Any]) -> None:
    _same_results(one_and_two["one"], one_and_two["two"])
    assert one_and_two["two"]["stdout"].count("run folder:") == 1  # rank 0 alone reports


def test_only_rank_zero_writes_files(one_and_two: dict[str, Any]) -> None:
    root = one_and_two["root"]
    one, two = _files(root / "one"), _files(root / "two")
    # the same files as a one-process run, none from rank 1; rank 0 also logs Lightning's start-up to Hydra's log
    assert two - {"train.log"} == one - {"train.log"}, two ^ one
    log = (root / "two" / "train.log").read_text()
    assert "GLOBAL_RANK: 0" in log and "GLOBAL_RANK: 1" not in log
    assert not list(root.glob("*ddp_process*")) and not list((root / "two").glob("*ddp_process*"))
    lines = (root / "two" / "metrics.csv").read_text().splitlines()
    assert len(lines) == len((root / "one" / "metrics.csv").read_text().splitlines())  # each round logged once


def test_checkpoints_resume_across_process_counts(one_and_two: dict[str, Any], tmp_path: Path) -> None:
    """Two rounds in one process, two more in two, the rest in one again (a checkpoint of each kind resumed by the
    other) equal the uninterrupted one-process run."""
    part = tmp_path / "part"
    ckpt = f"ckpt_path={part / 'checkpoints' / 'last.ckpt'}"
    _train(part, "trainer.max_rounds=2")
    _train(part, ckpt, "trainer.max_rounds=4", "trainer.devices=2")
    resumed = _train(part, ckpt)
    _same_results(one_and_two["one"], resumed)


@pytest.mark.slow
def test_a_private_implicit_run_on_two_processes_equals_one(tmp_path: Path) -> None:
    """Top-K recommendation on two gloo processes: LightGCN on ML-100K implicit feedback with client DP (BPR negatives
    and pseudo items keyed per user, each process ranking its shard's users, the ranking sums all-reduced) equals
    the one-process run. Marked slow: four Python start-ups and ML-100K's loading, about a minute."""
    run = ["+experiment=lightgcn_ml100k_implicit", "task.rounds=3", "privacy=gaussian", "privacy.epsilon=10",
           "task.eval.ranking=sampled", "plots=false", "trainer.checkpoint_every=1"]
    one = _train(tmp_path / "one", run=run)
    two = _train(tmp_path / "two", "trainer.devices=2", "trainer.strategy=ddp", run=run)
    _same_results(one, two)
    assert one["summary"]["final_test_ndcg@10"] > 0


def test_a_bandit_run_of_one_replicate_refuses_several_devices(tmp_path: Path) -> None:
    """A bandit run shards its replicates (tests/test_bandit_sharding.py): the default run has one."""
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "trainer.devices=2", f"hydra.run.dir={tmp_path}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "error: 2 processes (trainer.num_nodes × trainer.devices): a bandit run shards its replicates over the " \
           "processes, so it needs as many replicates at least (got replicates=1)" in proc.stderr


# ----------------------------------------------------------------------------------------------- sweeps of sharded runs
def _sweep(folder: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("LOCAL_RANK", None)
    folder.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, str(ROOT / "train.py"), "-m", *RUN, "seed=0,1", f"hydra.sweep.dir={folder}",
                           *extra], cwd=folder.parent, capture_output=True, text=True, env=env, timeout=900)


def test_a_sweep_of_sharded_runs_equals_a_sweep_of_one_process_runs(tmp_path: Path) -> None:
    """``-m seed=0,1 trainer.devices=2`` on Hydra's basic launcher: each job starts its second process on that job
    alone (not on the whole sweep again) and the second job does not join the first job's processes; rank 0 alone
    writes. The jobs' results and files, and the sweep summary, are those of the one-process sweep."""
    one, two = tmp_path / "one", tmp_path / "two"
    ran = {"one": _sweep(one), "two": _sweep(two, "trainer.devices=2")}
    for name, proc in ran.items():
        assert proc.returncode == 0, (name, proc.stderr[-3000:])
    log = ran["two"].stdout + ran["two"].stderr
    assert log.count("Launching 2 jobs") == 1 and log.count("sweep: 2 of 2 jobs finished") == 1
    assert log.count("run folder:") == 2
    for job in ("0", "1"):
        a = {"summary": json.loads((one / job / "summary.json").read_text()),
             "ckpt": torch.load(one / job / "checkpoints" / "last.ckpt", weights_only=False)}
        b = {"summary": json.loads((two / job / "summary.json").read_text()),
             "ckpt": torch.load(two / job / "checkpoints" / "last.ckpt", weights_only=False)}
        _same_results(a, b)
        assert _files(two / job) - {"train.log"} == _files(one / job) - {"train.log"}
    assert {p.name for p in two.iterdir()} == {p.name for p in one.iterdir()}
    assert not list(tmp_path.rglob("*ddp_process*"))


def test_a_sweep_of_sharded_runs_on_joblib_is_refused(tmp_path: Path) -> None:
    """joblib's workers cannot relaunch train.py for a job's other processes: the job stops with an error naming
    trainer.devices and the launcher, and the sweep lists it as failed."""
    proc = _sweep(tmp_path / "sweep", "trainer.devices=2", "hydra/launcher=joblib", "hydra.launcher.n_jobs=1",
                  "task.rounds=3")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "trainer.devices=2 in a sweep needs Hydra's basic launcher" in proc.stderr
    assert not list((tmp_path / "sweep").rglob("summary.json"))
