"""Helpers shared by several test modules: small data sets written in MovieLens' format, a recommendation task on
them, random inputs of the aggregation rules, threads standing in for ranks, and the CLI's paths and readers.

Test modules import from here (or from :mod:`tests.reference`, the independent oracles), never from each other.
"""
from __future__ import annotations

import csv
import functools
import json
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import DictConfig
from scipy.stats import binom

from fedrec.app.sweeps import job_folders, without_timings
from fedrec.bandits import LinTS
from fedrec.data import RatingData, load_ratings
from fedrec.data.integrity import write_sums
from fedrec.envs.synthetic import LinearEnv
from fedrec.federation.collective import Collective
from fedrec.federation.ledger import KINDS, SIDES, UNITS
from fedrec.models import FedGNN
from fedrec.protocols import paper_linucb
from fedrec.recsys import FedSGD, Uploads
from fedrec.recsys.data import RoundData, round_data
from fedrec.tasks import FedRecTask

# ------------------------------------------------------------------------------------------------ CLI
ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
ALL_EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
#: federated recommendation experiments (tested in test_fedrec_cli.py); the others are bandit runs
FEDREC_PREFIXES = ("fedgnn_", "fedpergnn_", "bgtplanner_", "mf_", "neumf_", "lightgcn_")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

Compose = Callable[..., DictConfig]


def quick_command_line(experiment: str | None, data_dir: Path, *extra: str) -> list[str]:
    """The command line ``train.py`` runs for ``+experiment=NAME quick=true``: the experiment's own short recipe,
    expanded and checked as ``train.py`` expands and checks it."""
    from fedrec.app.presets import expand_quick
    from fedrec.app.schema import check_command_line

    argv = [*([f"+experiment={experiment}"] if experiment else []), "quick=true", f"data_dir={data_dir}",
            "logger.tensorboard=false", *extra]
    argv = expand_quick(CONF, argv)
    check_command_line(CONF, argv)
    return argv


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file with a header line, as dicts of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def event_tags(tb_dir: Path) -> set[str]:
    """The scalar tags of every TensorBoard events file under ``tb_dir`` (at least one file must exist)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    files = sorted(tb_dir.glob("**/events.out.tfevents.*"))
    assert files, f"no TensorBoard events file under {tb_dir}"
    return {v.tag for f in files for ev in EventFileLoader(str(f)).Load() for v in ev.summary.value}


def run_two_rounds(compose_cfg: Compose, data_dir: Path, out: Path, *overrides: str) -> dict:
    """Two rounds of the FedGNN ML-100K experiment with ``overrides`` (the model's), through the CLI's run."""
    from fedrec.app.cli import run

    cfg = compose_cfg("+experiment=fedgnn_ml100k", *overrides, "task.rounds=2", f"data_dir={data_dir}",
                      "plots=false", "logger.tensorboard=false")
    return run(cfg, output_dir=out)


# ------------------------------------------------------------------------------------------------ rating data
def write_ratings_dat(root: Path, lines: Iterable[str | tuple[int, ...]]) -> Path:
    """``root/ml-1m/ratings.dat`` holding ``lines`` (each ``user::item::rating::timestamp`` or the tuple of those
    four), listed in the folder's checksums (a file of its own, not the published one: its line count is not
    checked); its path."""
    (root / "ml-1m").mkdir(parents=True, exist_ok=True)
    path = root / "ml-1m" / "ratings.dat"
    path.write_text("".join((line if isinstance(line, str) else "::".join(map(str, line))) + "\n" for line in lines))
    write_sums(path.parent)
    return path


def write_ml1m(folder: Path, users: int = 40, items: int = 60, seed: int = 0) -> Path:
    """A small random file in MovieLens-1M's format under ``folder`` (4 to 15 ratings a user); ``folder``."""
    rng = np.random.default_rng(seed)
    lines = []
    for u in range(1, users + 1):
        for i in rng.choice(items, size=int(rng.integers(4, 16)), replace=False):
            lines.append(f"{u}::{i + 1}::{int(rng.integers(1, 6))}::978300760")
    write_ratings_dat(folder, lines)
    return folder


def tiny_ratings(tmp_path_factory: pytest.TempPathFactory, *, users: int, items: int, seed: int, rounds: int,
                 num_clients: int, **load: Any) -> RatingData:
    """:func:`write_ml1m`'s file of ``users`` × ``items`` (drawn from ``seed``) loaded as ML-1M for ``rounds``
    rounds over ``num_clients`` clients (``load``: further arguments of ``load_ratings``)."""
    folder = write_ml1m(tmp_path_factory.mktemp("ml1m"), users=users, items=items, seed=seed)
    return load_ratings("ml-1m", folder, seed=0, rounds=rounds, num_clients=num_clients, **load)


def tiny_fixture(**kwargs: Any) -> Any:
    """A module-scoped fixture of :func:`tiny_ratings` with ``kwargs``: a module names its data in one line,
    ``tiny = tiny_fixture(users=..., ...)``."""

    @pytest.fixture(scope="module")
    def tiny(tmp_path_factory: pytest.TempPathFactory) -> RatingData:
        return tiny_ratings(tmp_path_factory, **kwargs)

    return tiny


def make_task(data: RatingData, privacy: Any = None, aggregator: Any = None, model_cls: type = FedGNN, *,
              embed_dim: int = 4, rounds: int | None = None, pseudo_items: int = 5, seed: int = 3,
              **kw: Any) -> FedRecTask:
    """A recommendation task on ``data`` whose model (``embed_dim`` wide) is initialised from torch seed 0;
    ``rounds`` defaults to the data's, the aggregator to FedSGD; ``kw`` goes to :class:`FedRecTask`."""
    torch.manual_seed(0)
    model = model_cls(data.num_users, data.num_items, embed_dim)
    return FedRecTask(data, model, aggregator or FedSGD(), privacy, rounds=data.rounds if rounds is None else rounds,
                      pseudo_items=pseudo_items, seed=seed, **kw)


def planner_task(data: RatingData, mechanism: str = "gaussian", epsilon: float = 4.0) -> FedRecTask:
    """The budget planners' task: matrix factorisation under client-level DP of ``mechanism`` at ``epsilon``."""
    from fedrec.models import MatrixFactorization
    from fedrec.privacy import ClientDP

    dp = ClientDP(data.num_clients, mechanism, epsilon=epsilon, delta=1e-5)
    return make_task(data, dp, model_cls=MatrixFactorization, pseudo_items=3, seed=1)


def tiny_round() -> RoundData:
    """Six users in three clients (two each, in no order of user ids), a few ratings each and one with 20 (more
    than a block of pairs holds)."""
    rng = np.random.default_rng(1)
    user, item = [], []
    for u in range(6):
        picks = rng.choice(24, size=20 if u == 4 else int(rng.integers(2, 5)), replace=False)
        user += [u] * len(picks)
        item += picks.tolist()
    rating = rng.uniform(0, 1, len(user))
    return round_data(np.array(user), np.array(item), rating, np.array([1, 0, 2, 1, 0, 2]), 24)


def central_losses(make: Callable[[int, int, torch.Tensor, torch.Tensor], torch.nn.Module],
                   steps: int = 300) -> list[float]:
    """The loss (mean squared error of ``σ(logit)``) over ``steps`` full-batch Adam steps of the model ``make(num_users,
    num_items, user, item)`` builds, one party holding all ratings of a small synthetic set."""
    from fedrec.data import synthetic_ratings

    data = synthetic_ratings(users=200, items=150, ratings=6000, seed=0, rounds=1)
    tr = data.training_until(0)
    user, item = torch.from_numpy(tr.user), torch.from_numpy(tr.item)
    rating = torch.from_numpy(tr.rating).float()
    torch.manual_seed(0)
    model = make(data.num_users, data.num_items, user, item)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((torch.sigmoid(model(user, item)) - rating) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# ------------------------------------------------------------------------------------------------ aggregation inputs
def random_case(seed: int, clients: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Random updates (``clients`` × ``dim``, a random scale) and positive weights."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(clients, dim)) * rng.uniform(0.1, 3.0), rng.uniform(0.1, 5.0, clients)


def t(x: np.ndarray) -> torch.Tensor:
    """``x`` as a float64 tensor."""
    return torch.from_numpy(np.asarray(x, dtype=np.float64))


def random_uploads(seed: int, clients: int = 11, items: int = 9, k: int = 3, P: int = 4) -> Uploads:
    """Random uploads with items of 1, 2, 3 and many uploaders (items 0, 1, 2 and the rest)."""
    rng = np.random.default_rng(seed)
    pairs = {(c, int(i)) for c in range(clients) for i in rng.choice(np.arange(3, items), size=4, replace=False)}
    pairs |= {(int(rng.integers(clients)), 0)}
    pairs |= {(c, 1) for c in rng.choice(clients, 2, replace=False)}
    pairs |= {(c, 2) for c in rng.choice(clients, 3, replace=False)}
    pairs = sorted(pairs, key=lambda p: (p[0], rng.random()))  # grouped by client, rows in random order
    return Uploads(clients=torch.arange(clients) * 3, shared=torch.from_numpy(rng.normal(size=(clients, P))),
                   row_client=torch.tensor([c for c, _ in pairs]), row_item=torch.tensor([i for _, i in pairs]),
                   rows=torch.from_numpy(rng.normal(size=(len(pairs), k)) * rng.uniform(0.1, 3, (len(pairs), 1))),
                   num_ratings=None)


def with_malicious(attack: Any, data: RatingData, up: Uploads) -> torch.Tensor:
    """Set ``attack`` up on ``data`` with the uploads' clients 1, 4 and 5 malicious; which uploads are theirs."""
    attack.setup(data, 0)
    attack.malicious = torch.zeros(data.num_clients, dtype=torch.bool)
    attack.malicious[up.clients[[1, 4, 5]]] = True
    return attack.malicious[up.clients]


# ------------------------------------------------------------------------------------------------ threads as ranks
class ThreadHub:
    """What the ranks of an in-process sharded run exchange."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world)
        self.slots: list[Any] = [None] * world


class ThreadCollective(Collective):
    """A rank of an in-process sharded run: the ranks are threads, the all-reduce adds their buffers in rank order."""

    def __init__(self, rank: int, hub: ThreadHub) -> None:
        super().__init__()
        self.global_rank, self.world_size, self.hub = rank, len(hub.slots), hub

    def _exchange(self, value: Any) -> list[Any]:
        self.hub.slots[self.global_rank] = value
        self.hub.barrier.wait()
        seen = list(self.hub.slots)
        self.hub.barrier.wait()
        return seen

    def all_reduce(self, tensors: list[torch.Tensor]) -> None:
        flat = torch.cat([x.reshape(-1).double() for x in tensors]) if tensors else torch.zeros(0)
        total = sum(self._exchange(flat))
        offset = 0
        for x in tensors:
            x.copy_(total[offset:offset + x.numel()].view_as(x).to(x.dtype))
            offset += x.numel()

    def broadcast(self, obj: Any) -> Any:
        return self._exchange(obj)[0]


class StubTrainer:
    """The two attributes a task's ``setup`` reads from its trainer."""

    def __init__(self, collective: Collective) -> None:
        self.collective, self.should_stop = collective, False


def on_ranks(hub: ThreadHub, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(rank)`` on a thread per rank of ``hub`` (the ranks of one in-process run); what each returned, or
    the first error raised (the others' barriers then break)."""
    results: list[Any] = [None] * len(hub.slots)
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = work(rank)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            hub.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(hub.slots))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return results


def play_sharded(tasks: list[FedRecTask], rounds: range) -> list[list[dict[str, float]]]:
    """Run ``tasks`` as the ranks of one sharded run (a thread each; one task: a one-process run) for ``rounds``;
    each rank's metrics."""
    hub = ThreadHub(len(tasks))

    def work(rank: int) -> list[dict[str, float]]:
        tasks[rank].setup(StubTrainer(ThreadCollective(rank, hub) if len(tasks) > 1 else Collective()))
        return [tasks[rank].run_round(r) for r in rounds]

    return on_ranks(hub, work)


# ------------------------------------------------------------------------------------------------ bandit engine
LAM = 0.1
BACKENDS = ("compiled", "torch")


def stream(N=12, d=4, K=6, T=300, seed=0, replicates=1, arrival="uniform", global_dim=None):
    """``T`` interactions of a small synthetic linear environment (contexts in the unit ball)."""
    env = LinearEnv(num_clients=N, dim=d, num_arms=K, replicates=replicates, seed=seed, contexts="ball",
                    arrival=arrival, global_dim=global_dim)
    return env.interactions(0, T)


def lints(v=0.3):
    """A LinTS policy factory at ``v`` (λ = :data:`LAM`)."""
    return functools.partial(LinTS, v=v, lam=LAM)


def ucb(bound="determinant", alpha=None):
    """The paper's LinUCB at λ = :data:`LAM` with radius ``bound`` (or a fixed ``alpha``)."""
    return paper_linucb(lam=LAM, radius_bound=bound, alpha=alpha)


def assert_same_ledger(a, b) -> None:
    """Two protocols' ledgers agree exactly on every endpoint, kind, unit and side, and in their totals."""
    for role, n in (("client", a.num_clients), ("server", 1)):
        for kind in KINDS:
            for unit in UNITS:
                for side in SIDES:
                    x = a.ledger.per_endpoint(role, kind, unit, side)
                    assert x.shape == (a.replicates, n)
                    assert torch.equal(x, b.ledger.per_endpoint(role, kind, unit, side)), (role, kind, unit, side)
    ta, tb = a.ledger.totals(), b.ledger.totals()
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


# ------------------------------------------------------------------------------------------------ audits
def exceedances_allowed(seeds: int, alpha: float = 0.05) -> int:
    """The most bounds above the true ε that ``seeds`` independent audits at confidence 1 − α may show before a
    binomial test (at 0.1 %) says their failure rate is above α."""
    return int(binom.ppf(0.999, seeds, alpha))


# ---------------------------------------------------------------------------------------------------- sweeps
#: three seeds of the default experiment, six rounds each, in the launching process (Hydra's basic launcher)
SWEEP = ["-m", "task.steps=600", "task.steps_per_round=100", "env.num_clients=20", "seed=0,1,2", "plots=false",
         "logger.tensorboard=false"]


def summaries(sweep: Path) -> dict[str, dict[str, Any]]:
    """Each job's summary.json without the fields that measure time."""
    return {job.name: without_timings(json.loads((job / "summary.json").read_text())) for job in job_folders(sweep)}
