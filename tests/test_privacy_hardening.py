"""Privacy hardening (issue 16): shuffled uploads, clipping that holds exactly, the adjacency behind the
sensitivity, deployment-grade randomness, and logs that keep raw-data metrics out when asked."""
from __future__ import annotations

import functools
import json
import math
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chi2

from fedrec.app.cli import run
from fedrec.data import RatingData
from fedrec.envs.synthetic import LinearEnv
from fedrec.errors import ConfigError
from fedrec.models import FedGNN, MatrixFactorization
from fedrec.privacy import ClientDP, GaussianMechanism, LaplaceMechanism
from fedrec.privacy.mechanisms import check_sensitivity
from fedrec.protocols import AsyncLinUCB, paper_linucb
from fedrec.recsys import Aggregator, FedSGD, Uploads
from fedrec.recsys.upload import upload_order
from fedrec.tasks import FedRecTask
from fedrec.utils.rng import KeyedRows, stream_key
from tests import helpers
from tests.helpers import event_tags, read_csv, tiny_fixture, write_ml1m

#: significance level of the uniformity tests (their seeds are fixed, so each outcome is deterministic)
ALPHA = 1e-3
SHUFFLE_ROUNDS = 60
tiny = tiny_fixture(users=30, items=40, seed=1, rounds=SHUFFLE_ROUNDS, num_clients=8)
#: this module's tasks train matrix factorisation unless they say otherwise
make_task = functools.partial(helpers.make_task, model_cls=MatrixFactorization)




# ------------------------------------------------------------------------------------------------ 1. shuffled uploads
def real_mask(task: FedRecTask, up: Uploads, round_idx: int) -> torch.Tensor:
    """Which upload rows carry a real item of their client (found by (client, item), never by position)."""
    d = task._prepare(round_idx).data
    n = task.data.num_items
    real = set((d.clients[d.row_client] * n + d.row_item).tolist())
    return torch.tensor([k in real for k in (up.clients[up.row_client] * n + up.row_item).tolist()])


def position_chi_square(uploads: list[tuple[int, int, torch.Tensor]], bins: int = 5) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom of the hypothesis that real rows sit at uniformly random
    positions of their client's upload. ``uploads`` holds ``(rows, real rows, positions of the real rows)`` per
    client upload; positions are pooled into ``bins`` bins by relative position ``j / rows``; under uniformity
    each position holds a real row with probability ``real / rows``, which gives the expected counts (the fixed
    number of real rows per upload makes the statistic conservative)."""
    observed, expected = np.zeros(bins), np.zeros(bins)
    for n, m, positions in uploads:
        bin_of = np.arange(n) * bins // n
        expected += np.bincount(bin_of, minlength=bins) * (m / n)
        observed += np.bincount(bin_of[positions.numpy()], minlength=bins)
    return float(((observed - expected) ** 2 / expected).sum()), bins - 1


def test_upload_order_groups_clients_and_shuffles_each_uniformly() -> None:
    row_client = torch.tensor([0] * 3 + [1] * 4 + [2] * 3 + [0] * 7 + [2] * 2)  # real rows, then pseudo rows
    real_of_client0 = torch.zeros(row_client.numel(), dtype=torch.bool)
    real_of_client0[:3] = True
    counts = torch.zeros(10)
    for r in range(2000):
        order = upload_order(row_client, torch.arange(3), key=int(stream_key(7, "upload_order", r)))
        assert sorted(order.tolist()) == list(range(row_client.numel()))  # a permutation
        assert torch.equal(row_client[order], torch.sort(row_client).values)  # grouped by client, in client order
        counts += real_of_client0[order][:10].float()  # client 0's 10 rows come first
    stat = float(((counts - 600.0) ** 2 / 600.0).sum())  # 3 real rows of 10 at each position: 2000 · 3/10
    assert chi2.sf(stat, 9) > ALPHA, counts.tolist()
    stuck = torch.cat([torch.ones(3), torch.zeros(7)]) * 2000  # the order before the shuffle: real rows first
    assert chi2.sf(float(((stuck - 600.0) ** 2 / 600.0).sum()), 9) < 1e-12  # the test would see it


def test_real_rows_sit_at_uniform_positions_in_every_round(tiny: RatingData) -> None:
    task = make_task(tiny, ClientDP(tiny.num_clients, "laplace", epsilon=10.0))
    shuffled, unshuffled = [], []
    for r in range(SHUFFLE_ROUNDS):
        task.run_round(r)
        up = task.last_uploads
        real = real_mask(task, up, r)
        for c in range(up.clients.numel()):
            mine = real[up.row_client == c]
            n, m = mine.numel(), int(mine.sum())
            shuffled.append((n, m, mine.nonzero().flatten()))
            unshuffled.append((n, m, torch.arange(m)))  # what the upload was before: real rows first
    assert len(shuffled) == SHUFFLE_ROUNDS * tiny.num_clients and all(0 < m < n for n, m, _ in shuffled)
    stat, dof = position_chi_square(shuffled)
    assert chi2.sf(stat, dof) > ALPHA, stat
    stat, dof = position_chi_square(unshuffled)
    assert chi2.sf(stat, dof) < 1e-12, stat  # the statistic does see the old order


def test_aggregation_is_unchanged_by_the_shuffle(tiny: RatingData) -> None:
    task = make_task(tiny, ClientDP(tiny.num_clients, "gaussian", epsilon=10.0), model_cls=FedGNN)
    for r in range(3):
        task.run_round(r)
    up = task.last_uploads
    real = real_mask(task, up, 2)
    # the order before the shuffle, rebuilt from the rows' contents: real rows by (client, item), then pseudo rows
    canonical = np.lexsort((up.row_item.numpy(), up.row_client.numpy(), (~real).numpy()))
    assert not np.array_equal(canonical, np.arange(len(canonical)))  # the upload really was shuffled
    idx = torch.from_numpy(canonical)
    unshuffled = Uploads(up.clients, up.shared, up.row_client[idx], up.row_item[idx], up.rows[idx], up.num_ratings)
    for aggregator in (FedSGD(), Aggregator(weighting="uniform")):
        shared, items, rows = aggregator(up)
        ref_shared, ref_items, ref_rows = aggregator(unshuffled)
        assert torch.equal(items, ref_items)
        torch.testing.assert_close(shared, ref_shared, rtol=2 * torch.finfo(torch.float32).eps, atol=0.0)
        torch.testing.assert_close(rows, ref_rows, rtol=2 * torch.finfo(torch.float32).eps, atol=0.0)


def test_pseudo_rows_are_drawn_from_the_noised_rows(tiny: RatingData) -> None:
    """Pseudo rows are post-processing of the DP upload: they follow the noised real rows, whose spread is the
    noise's, not the clean gradients' (which would leak them without noise)."""
    task = make_task(tiny, ClientDP(tiny.num_clients, "gaussian", epsilon=10.0, clip=0.1))
    task.run_round(0)
    up = task.last_uploads
    real = real_mask(task, up, 0)
    noised, pseudo = up.rows[real].double(), up.rows[~real].double()
    sigma = float(task.privacy.mechanism.noise_std(task.privacy.levels(torch.tensor(task.privacy.uniform_budget(
        SHUFFLE_ROUNDS)))))
    assert abs(float(noised.std()) / sigma - 1) < 0.1  # the real rows carry the noise
    assert abs(float(pseudo.std()) / float(noised.std()) - 1) < 0.2  # and the pseudo rows look like them
    assert float(pseudo.std()) > 5 * 0.1  # far above any clipped clean value (a whole upload has norm ≤ 0.1)


def test_items_in_every_round_of_x_t_are_the_real_ones(tiny: RatingData) -> None:
    """Leak by design (FedGNN's pseudo items): a client's ratings persist from round to round while its pseudo items
    are redrawn, so intersecting its uploaded item sets over a few rounds leaves exactly its real items."""
    task = make_task(tiny)
    sets = [task.upload_items(r) for r in range(8)]
    d0 = task._prepare(0).data
    for c in range(tiny.num_clients):
        seen = set.intersection(*(set(X.indices[X.indptr[c]:X.indptr[c + 1]].tolist()) for X in sets))
        assert seen == set(d0.row_item[d0.clients[d0.row_client] == c].tolist())


def test_x_t_lists_each_clients_items_sorted(tiny: RatingData) -> None:
    task = make_task(tiny)
    X = task.upload_items(1)
    assert X.has_sorted_indices
    for c in range(tiny.num_clients):
        ids = X.indices[X.indptr[c]:X.indptr[c + 1]]
        assert np.all(np.diff(ids) > 0)


# ------------------------------------------------------------------------------------------------ 2. exact clipping
def exact_power(values: list[float], p: int) -> Fraction:
    """``Σ |v|^p`` over float values, in exact rational arithmetic (the documented arithmetic of the bound); the
    terms share one power-of-two denominator, so they are summed as integers."""
    ratios = [Fraction(v) for v in values]
    den = max((r.denominator**p for r in ratios), default=1)
    return Fraction(sum(abs(r.numerator) ** p * (den // r.denominator**p) for r in ratios), den)


def client_values(parts: list[torch.Tensor], owners: list[torch.Tensor], client: int) -> list[float]:
    """Every value ``client`` owns, as Python floats (exact: float32 and float64 values are doubles)."""
    rows = [part.reshape(part.shape[0], math.prod(part.shape[1:]))[owner == client]
            for part, owner in zip(parts, owners)]
    return [v for r in rows for v in r.double().flatten().tolist()]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int64)


MAGNITUDES = st.sampled_from([0.0, 1e-45, 1e-40, 1e-30, 1e-8, 1.0, 3.0, 1e8, 1e30, 3.4e38, 5e-324, 1e-310, 1e-200,
                              1e200, 1.7e308])


@st.composite
def adversarial_uploads(draw):
    """A batch of client uploads spread over several parts (some rows owned by arbitrary clients), with values of
    any magnitude and sign (huge, tiny, denormal, zero, single elements) and a clip that is often exactly, or within
    a rounding of, one client's norm (rows on and inside the ball)."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    info = torch.finfo(dtype)
    anything = st.floats(allow_nan=False, allow_infinity=False, width=info.bits)
    scaled = st.builds(lambda m, f: m * f, MAGNITUDES, st.floats(-2.0, 2.0))
    value = st.one_of(anything, scaled.filter(lambda v: abs(v) <= info.max))
    num_clients = draw(st.integers(1, 4))
    parts, owners = [], []
    for _ in range(draw(st.integers(1, 6))):
        width = draw(st.integers(1, 5))
        if draw(st.booleans()):  # one row per client (the mechanism is told so with owner None)
            rows, owner = num_clients, None
        else:
            rows = draw(st.integers(0, 6))
            owner = torch.tensor(draw(st.lists(st.integers(0, num_clients - 1), min_size=rows, max_size=rows)),
                                 dtype=torch.long)
        flat = draw(st.lists(value, min_size=rows * width, max_size=rows * width))
        parts.append(torch.tensor(flat, dtype=torch.float64).to(dtype).reshape(rows, width))
        owners.append(owner)
    return dtype, num_clients, parts, owners, draw(st.integers(0, num_clients - 1)), draw(
        st.sampled_from(["boundary", "above", "below", "free"])), draw(st.floats(-30, 30))


def clip_for(kind: str, norm: float, log_clip: float) -> float:
    """A clip on (``boundary``), one float above or below a client's evaluated norm, or anywhere (``free``)."""
    if kind == "free" or not 0.0 < norm < math.inf:
        return 10.0**log_clip
    if kind == "boundary":
        return norm
    with np.errstate(over="ignore"):
        near = float(np.nextafter(norm, math.inf if kind == "above" else 0.0))
    return near if 0.0 < near < math.inf else norm


@settings(max_examples=150, deadline=None)
@given(case=adversarial_uploads(), laplace=st.booleans())
def test_clipping_bound_holds_exactly_on_adversarial_uploads(case, laplace: bool) -> None:
    dtype, num_clients, parts, given_owners, pivot, kind, log_clip = case
    owners = [torch.arange(num_clients) if o is None else o for o in given_owners]
    p = 1 if laplace else 2
    mech_cls = LaplaceMechanism if laplace else GaussianMechanism
    pivot_norm = float(mech_cls(clip=1.0).client_norms(parts, given_owners, num_clients)[pivot])
    mech = mech_cls(clip=clip_for(kind, pivot_norm, log_clip))
    clip = mech.clip
    out = mech.clip_parts(parts, given_owners, num_clients)
    bound = Fraction(clip) ** p
    eps, sub = torch.finfo(dtype).eps, torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps
    for c in range(num_clients):
        before, after = client_values(parts, owners, c), client_values(out, owners, c)
        assert exact_power(after, p) <= bound  # exact real arithmetic: no tolerance
        if exact_power(before, p) <= bound:  # already inside the ball: untouched, bit for bit
            for part, new, owner in zip(parts, out, owners):
                assert torch.equal(bits(new[owner == c]), bits(part[owner == c]))
            continue
        # clipped: any float64 evaluation of the norm is within the bound too (unless its squares over- or
        # underflow, which they do not for 1e-150 < clip < 1e150)
        if 1e-150 < clip < 1e150:
            assert torch.linalg.vector_norm(torch.tensor(after, dtype=torch.float64), ord=p) <= clip
        # a shrunk copy of the upload (signs kept, no value grows) that ends close to the ball's surface
        x, y = np.array(before), np.array(after)
        assert np.all(np.sign(x) * np.sign(y) >= 0) and np.all(np.abs(y) <= np.abs(x))
        n = len(after)  # the documented aim, 2·(n + 4)·2⁻⁵¹ / ord + eps below clip, retries, denormal rounding
        low = clip * (1 - 2 * (n + 4) * 2.0**-51 - 4 * eps) - 4 * n * sub
        if low > 0:
            assert exact_power(after, p) >= Fraction(low) ** p


@pytest.mark.parametrize("mech_cls", [GaussianMechanism, LaplaceMechanism])
def test_float32_rows_never_overshoot_and_are_barely_shrunk(mech_cls) -> None:
    """The issue's finding: about half of the clipped float32 rows exceeded C, by up to 4.5e-8 relative."""
    mech = mech_cls(clip=0.1)
    u = torch.randn(2000, 16, generator=torch.Generator().manual_seed(0))
    out = mech.clip_rows(u)
    p = int(mech.norm_ord)
    norms = torch.linalg.vector_norm(out.double(), ord=p, dim=1)
    assert bool((norms <= 0.1).all())
    eps = torch.finfo(torch.float32).eps
    assert float(norms.min()) >= 0.1 * (1 - 3 * eps)
    assert all(exact_power(row.tolist(), p) <= Fraction(0.1) ** p for row in out.double())
    # the direction is kept: each row is its input times one factor, up to the rounding of each value to float32
    factor = norms / torch.linalg.vector_norm(u.double(), ord=p, dim=1)
    assert torch.allclose(out.double(), u.double() * factor.unsqueeze(1), rtol=2 * eps, atol=0.0)


@pytest.mark.parametrize("factor", [1.0, 1.5, 1.999])
def test_a_sensitivity_factor_below_two_is_refused_under_replace_one(factor: float) -> None:
    for build in (lambda: GaussianMechanism(clip=0.1, sensitivity_factor=factor),
                  lambda: LaplaceMechanism(clip=0.1, sensitivity_factor=factor, adjacency="replace_one")):
        with pytest.raises(ConfigError, match=r"sensitivity_factor.*replace_one.*diameter.*adjacency=add_remove"):
            build()
    with pytest.raises(ConfigError, match=r"^privacy\.sensitivity_factor=.*privacy\.adjacency=add_remove"):
        ClientDP(4, "gaussian", sensitivity_factor=factor)
    dp = ClientDP(4, "gaussian", clip=0.1, sensitivity_factor=factor, adjacency="add_remove")
    assert dp.mechanism.sensitivity == pytest.approx(factor * 0.1)
    assert dp.summary()["adjacency"] == "add_remove"


def test_adjacency_values_are_checked_by_name() -> None:
    assert check_sensitivity(2.0, "replace_one") == 2.0 and check_sensitivity(1.0, "add_remove") == 1.0
    with pytest.raises(ConfigError, match=r"privacy\.sensitivity_factor=0\.5 is below 1.*add_remove"):
        ClientDP(4, "laplace", sensitivity_factor=0.5, adjacency="add_remove")
    with pytest.raises(ConfigError, match=r"privacy\.adjacency must be one of \['replace_one', 'add_remove'\]"):
        ClientDP(4, "laplace", adjacency="swap")
    assert ClientDP(4, "laplace").summary()["adjacency"] == "replace_one"


# ------------------------------------------------------------------------------------------------ 4. secure randomness
def first_round_uploads(data: RatingData, rng: str) -> Uploads:
    task = make_task(data, ClientDP(data.num_clients, "gaussian", epsilon=10.0, rng=rng), model_cls=FedGNN)
    task.run_round(0)
    return task.last_uploads


def test_secure_noise_differs_between_runs_with_one_seed_and_reproducible_noise_does_not(tiny: RatingData) -> None:
    a, b = first_round_uploads(tiny, "reproducible"), first_round_uploads(tiny, "reproducible")
    assert torch.equal(a.shared, b.shared) and torch.equal(a.rows, b.rows) and torch.equal(a.row_item, b.row_item)
    s, t = first_round_uploads(tiny, "secure"), first_round_uploads(tiny, "secure")
    # ω is the same clipped update in both runs (same seed, same model), so what differs is the noise, everywhere
    assert bool((s.shared != t.shared).all())
    assert not torch.equal(s.row_item, t.row_item)  # pseudo items and upload order are drawn securely too
    for rng in ("reproducible", "secure"):
        assert ClientDP(3, "laplace", rng=rng).summary()["privacy_rng"] == rng


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_secure_noise_has_the_calibrated_std(mechanism: str) -> None:
    dp = ClientDP(100, mechanism, epsilon=10.0, clip=0.1, rng="secure")
    level = dp.levels(torch.tensor(dp.uniform_budget(50)))
    noise = []
    for r in range(20):  # one fresh secure generator per round
        u = torch.randn(100, 500, generator=torch.Generator().manual_seed(r))
        noisy, clipped = dp.mechanism.privatize_parts([u], [None], 100, level,
                                                      [KeyedRows(dp.draw_key(0, "privacy", r), np.arange(100))])
        noisy, clipped = noisy[0], clipped[0]
        noise.append((noisy - clipped).double())
    noise = torch.cat(noise)
    assert abs(float(noise.std()) / float(dp.mechanism.noise_std(level)) - 1) < 0.05
    assert abs(float(noise.mean())) < 0.01 * float(dp.mechanism.noise_std(level))


def test_rng_setting_is_checked_by_name() -> None:
    with pytest.raises(ConfigError, match=r"privacy\.rng must be one of \['reproducible', 'secure'\]"):
        ClientDP(3, "gaussian", rng="urandom")


# ------------------------------------------------------------------------------------------------ 5. private metrics
def test_metrics_from_raw_client_data_are_flagged(tiny: RatingData) -> None:
    task = make_task(tiny)
    private = ["train_loss", "test_rmse", "val_f1", "final_test_rmse", "best_val_rmse", "best_test_f1_round"]
    public = ["clients", "epsilon_spent", "comm_messages", "comm_upload_scalars", "rounds_run", "round"]
    assert all(task.is_private_metric(m) for m in private)
    assert not any(task.is_private_metric(m) for m in public)


@pytest.fixture(scope="module")
def small_ml1m(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_ml1m(tmp_path_factory.mktemp("ml1m_cli"), users=40, items=50, seed=3)


PLANNER_RUN = ("+experiment=bgtplanner_ml1m", "data.num_clients=10", "task.rounds=8", "task.pseudo_items=5",
               "++planner.num_actions=2", "++planner.initial_rounds=2", "++planner.min_rounds=6",
               "trainer.checkpoint_every=0")


def test_private_metrics_switched_off_leave_every_log_but_the_checkpoint(compose_cfg, small_ml1m: Path,
                                                                         tmp_path: Path) -> None:
    out = tmp_path / "run"
    summary = run(compose_cfg(*PLANNER_RUN, f"data_dir={small_ml1m}", "logger.private_metrics=false"),
                  output_dir=out)
    private = summary["private_metrics"]
    assert {"train_loss", "test_rmse", "test_f1", "val_rmse"} <= set(private)
    assert summary["private_metrics_logged"] is False and summary["privacy"] == "gaussian"
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == summary
    leaked = re.compile(r"^(final_|best_)?(train|test|val)_")
    assert not [k for k in on_disk if leaked.match(k)]
    columns = set(read_csv(out / "metrics.csv")[0])
    assert {"clients", "epsilon_spent", "comm_messages"} <= columns and not columns & set(private)
    tags = event_tags(out / "tb")
    assert "epsilon_spent" in tags and not tags & set(private)
    assert not (out / "test_rmse.png").exists()
    # the planner still received the validation RMSE every round: its rewards are RMSE decreases
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)
    rewards = ckpt["callbacks"]["budget_planner"]["rewards"]
    assert len(rewards) == summary["rounds_run"] > 0 and any(r != 0.0 for r in rewards)
    # the checkpoint is not a log: it keeps the raw metrics and the clients' own state (their user rows)
    assert "train_loss" in ckpt["history"][-1] and "user_emb" in ckpt["task"]["model"]


def test_private_metrics_are_logged_and_marked_by_default(compose_cfg, small_ml1m: Path, tmp_path: Path) -> None:
    summary = run(compose_cfg(*PLANNER_RUN, f"data_dir={small_ml1m}", "logger.tensorboard=false", "plots=false"),
                  output_dir=tmp_path)
    assert summary["private_metrics_logged"] is True
    assert {"train_loss", "test_rmse", "val_rmse"} <= set(summary["private_metrics"])
    assert "final_test_rmse" in summary and "train_loss" in read_csv(tmp_path / "metrics.csv")[0]
    assert summary["privacy_rng"] == "reproducible" and summary["adjacency"] == "replace_one"


@pytest.mark.parametrize(("override", "field"), [("logger.private_metrics=sometimes", "logger.private_metrics"),
                                                  ("privacy.rng=urandom", "privacy.rng"),
                                                  ("privacy.sensitivity_factor=1", "privacy.sensitivity_factor"),
                                                  ("privacy.adjacency=swap", "privacy.adjacency")])
def test_bad_hardening_values_are_named(compose_cfg, small_ml1m: Path, tmp_path: Path, override: str,
                                        field: str) -> None:
    cfg = compose_cfg("+experiment=fedgnn_ml100k_dp", "data=ml1m", "data.num_clients=10", f"data_dir={small_ml1m}",
                      "task.rounds=1", "plots=false", "logger.tensorboard=false", override)
    with pytest.raises(ConfigError, match=re.escape(field)):
        run(cfg, output_dir=tmp_path)
    assert not (tmp_path / "summary.json").exists()


# ------------------------------------------------------------------------------------------------ threat model
def test_an_async_linucb_upload_reveals_its_observations_in_the_clear() -> None:
    """Async-LinUCB has no privacy mechanism: with γ_U = 1 a client uploads after its step, and an upload of one
    observation z = [x; y] is z zᵀ itself, from which the server reads z up to a common sign (and y² exactly)."""
    d = 3
    it = LinearEnv(num_clients=4, dim=d, num_arms=5, seed=0, contexts="sphere").interactions(0, 1)
    protocol = AsyncLinUCB(4, d, gamma_u=1.0, gamma_d=1.0, policy=paper_linucb(), backend="torch")
    arm = int(protocol.step(it.clients[:, 0], it.contexts[:, 0], it.rewards[:, 0]))
    z = torch.cat([it.contexts[0, 0, arm], it.rewards[0, 0, arm].view(1)]).double()
    received = protocol.server[0]  # what the server holds after the upload: z zᵀ
    k = int(torch.argmax(received.diagonal()))
    z_read = received[:, k] / received[k, k].sqrt()
    assert torch.allclose(torch.sign(z_read[k] * z[k]) * z_read, z, atol=1e-9)
    assert float(received[d, d]) == pytest.approx(float(z[d]) ** 2, abs=1e-12)
