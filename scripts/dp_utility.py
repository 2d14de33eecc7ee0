"""Accuracy against ε for client- and server-placed DP: the test RMSE of MF and FedGNN at ε ∈ {1, 2, 4, 8, ∞},
each chosen at the round of least validation RMSE, beside a bias baseline μ + b_u + b_i and the non-private run.

Rows (``--data``): ``ml100k`` (MovieLens-100K from $FEDREC_DATA_DIR, 943 clients of one user) or ``ml10m``
(synthetic ratings of MovieLens-10M's size: 69,878 users in 6,988 clients, 10,677 items, 10,000,054 ratings;
``ml1m``: of MovieLens-1M's, 6,040 users in 605 clients); ``--one-client-per-user`` makes every user a client
(user-level DP) at the synthetic sizes too.
Models: as the authors configure them (d = ``--dim``, no biases, each client's RMSE averaged by the server), or with
``--summed`` matrix factorisation's own setting: biases μ + b_u + b_i and a linear head, the squared error summed
over every rating (``aggregator.reduce=sum``), so that ``--weight-decay`` is MF's L2 on every row; with
``--user-solve`` each client sets its user row to its ridge solution before computing its upload, and with
``--item-solve`` the server solves the items too (``task.item_solve``: Newton steps from the clients' residual sums,
counts and second moment, averaged from round ``--average-from`` and weighted by the items' counts to the power
``--count-power`` in private runs, with ``--noise-ridge`` and ``--count-average``; the non-private reference takes
full, unweighted steps at ``--reference-ridge``); ``--noise-schedule`` gives server placement's rounds their factors
on the noise multiplier; ``--accountant prv`` calibrates server placement's noise by the PRV accountant instead of
RDP (tighter: about 5 % less noise at ε = 8 with every client every round).
Client placement: every client takes part every round and noises its own upload (the accountant's per-client
ledger, no amplification). Server placement: Poisson sampling at ``--sample-rate`` (the expected clients per
round over the clients, per data set), each upload clipped to ``--server-clip``, one Gaussian draw on the sum,
accounted as subsampled rounds. The share of the non-private gain over the bias baseline that a private run keeps,
``(bias − private) / (bias − non-private)``, is the measure the DP page's target is set in (≥ 0.9 at ε = 8 on
``ml10m``).

    FEDREC_DATA_DIR=/path/to/data .venv/bin/python -m scripts.dp_utility --data ml100k --rounds 100 \\
        --out docs/figures/dp_utility_ml100k.csv --figure docs/figures/dp_utility_ml100k.png
    .venv/bin/python -m scripts.dp_utility --data ml10m --one-client-per-user --no-stream --models mf --summed \\
        --user-solve --dim 16 --init-std 0.05 --init-bias 0.6 --weight-decay 7 --placements server \\
        --epsilons inf,8,2,4,1 --rounds 40 --sample-rate 0.5 --adaptive-clip --server-clip 1 \\
        --out docs/figures/dp_utility_ml10m_summed.csv --figure docs/figures/dp_utility_ml10m_summed.png
    .venv/bin/python -m scripts.dp_utility --data ml10m --one-client-per-user --no-stream --models mf --summed \\
        --user-solve --item-solve --dim 8 --init-std 0.05 --init-bias 0.6 --weight-decay 7 --placements server \\
        --epsilons inf,8,4,2,1 --rounds 10 --sample-rate 1 --server-clip 1 --reference-ridge 1 --factor-scale 25 \\
        --average-from 6 --count-power 0.5 --item-ridge 10 --noise-ridge 50 --count-average \\
        --noise-schedule 2,2,2,2,2,1,1,1,1,1 --out docs/figures/dp_utility_ml10m_als.csv \\
        --figure docs/figures/dp_utility_ml10m_als.png
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrec.aggregation import FedAvgM
from fedrec.app.plots import legend_below, save_figure, set_title, subplots
from fedrec.models import FedGNN, MatrixFactorization
from fedrec.privacy import ClientDP
from fedrec.privacy.accountant import sampled_noise_multiplier
from fedrec.recsys import FedSGD, Strategy
from fedrec.tasks import FedRecTask
from fedrec.trainer import FederatedTrainer

SIZES = {"ml1m": (6_040, 3_706, 1_000_209, 605), "ml10m": (69_878, 10_677, 10_000_054, 6_988)}
MODELS = {"mf": MatrixFactorization, "fedgnn": FedGNN}
DELTA = 1e-6


def load(name: str, rounds: int, one_client_per_user: bool = False, stream: bool = True) -> Any:
    """The data set with a validation split (10 % of the training ratings) for model selection; ``stream=False``
    has every training rating from round 0 (else half arrives over the rounds)."""
    if name == "ml100k":
        from fedrec.data import load_ratings

        return load_ratings("ml-100k", os.environ.get("FEDREC_DATA_DIR", "data"), seed=0, rounds=rounds,
                            val_fraction=0.1, stream=stream)
    from fedrec.data.synthetic import synthetic_ratings

    users, items, ratings, clients = SIZES[name]
    return synthetic_ratings(users=users, items=items, ratings=ratings, rounds=rounds, seed=0, stream=stream,
                             num_clients=None if one_client_per_user else clients,
                             val_fraction=0.1)


def bias_baseline(data: Any, regs: tuple[float, ...] = (0.5, 1, 2, 5, 10, 20, 50),
                  sweeps: int = 10) -> dict[str, float]:
    """μ + b_u + b_i fitted to every training rating by alternating ridge sweeps (closed form per bias), its ridge
    chosen among ``regs`` by validation RMSE: that ridge, its validation and test RMSE (the scale of the data,
    normalised); ``sweeps=0`` is the mean rating alone."""
    tr = data.training_until(data.rounds - 1)
    u, i, r = np.asarray(tr.user), np.asarray(tr.item), np.asarray(tr.rating, dtype=np.float64)
    mu = r.mean()

    def rmse(split: Any, bu: np.ndarray, bi: np.ndarray) -> float:
        pred = np.clip(mu + bu[np.asarray(split.user)] + bi[np.asarray(split.item)], 0.0, 1.0)
        return float(np.sqrt(np.mean((pred - np.asarray(split.rating, dtype=np.float64)) ** 2)))

    best: dict[str, float] = {"val_rmse": math.inf}
    for reg in regs:
        bu, bi = np.zeros(data.num_users), np.zeros(data.num_items)
        for _ in range(sweeps):
            bu = np.bincount(u, r - mu - bi[i], data.num_users) / (np.bincount(u, minlength=data.num_users) + reg)
            bi = np.bincount(i, r - mu - bu[u], data.num_items) / (np.bincount(i, minlength=data.num_items) + reg)
        fit = {"reg": float(reg), "val_rmse": rmse(data.val, bu, bi), "test_rmse": rmse(data.test, bu, bi)}
        if fit["val_rmse"] < best["val_rmse"]:
            best = fit
    return best


def run(data: Any, model: str, placement: str, epsilon: float, args: argparse.Namespace) -> dict[str, Any]:
    """One run: its test RMSE at the round of least validation RMSE, and what it spent."""
    torch.manual_seed(0)
    N, private = data.num_clients, math.isfinite(epsilon)
    strategy, pseudo, server = Strategy(), args.pseudo_items, None
    aggregator, privacy = FedSGD("uniform", reduce="sum") if args.summed else FedSGD(), None
    if private and placement == "client":
        privacy = ClientDP(N, "gaussian", epsilon=epsilon, delta=DELTA, clip=args.client_clip)
    elif private:
        privacy = ClientDP(N, "gaussian", epsilon=epsilon, delta=DELTA, clip=args.server_clip, placement="server",
                           adjacency="add_remove", sensitivity_factor=1.0, adaptive_clip=args.adaptive_clip,
                           target_quantile=args.target_quantile, noise_schedule=args.noise_schedule,
                           accountant=args.accountant)
        strategy, pseudo = Strategy("poisson", sample_rate=args.sample_rate), 0
        aggregator = aggregator if args.summed else FedSGD("uniform")
        server = None if args.server_momentum_lr is None else FedAvgM(lr=args.server_momentum_lr)
    parts: dict[str, Any] = {"bias": True, "head": "linear", "init_std": args.init_std,
                             "init_bias": args.init_bias} if args.summed else {}
    setting: dict[str, Any] = {"objective": "sse", "mean_init": False,
                               "user_solve": args.user_solve} if args.summed else {}
    if args.item_solve:  # the non-private reference takes full, unweighted steps (both are there for the noise)
        ridge = args.reference_ridge or args.item_ridge
        if private:  # a fixed ridge, or one in proportion to the noise's standard deviation z · clip
            ridge = args.item_ridge if args.ridge_per_noise is None else args.ridge_per_noise * args.server_clip * \
                sampled_noise_multiplier(epsilon, DELTA, args.sample_rate, data.rounds, args.accountant)
        setting["item_solve"] = {"enabled": True, "factor_scale": args.factor_scale, "ridge": ridge,
                                 "average_from": args.average_from if private and args.average_from >= 0 else None,
                                 "count_power": args.count_power if private else 0.0,
                                 "noise_ridge": args.noise_ridge, "count_average": args.count_average}
    task = FedRecTask(data, MODELS[model](data.num_users, data.num_items, args.dim, **parts), aggregator, privacy,
                      rounds=data.rounds, pseudo_items=pseudo, seed=0, strategy=strategy, lr=args.lr, server=server,
                      weight_decay=args.weight_decay, **setting)
    task.setup(FederatedTrainer(accelerator=args.device, num_threads=None))
    t0, best = time.perf_counter(), (math.inf, math.nan, -1)
    for r in range(data.rounds):
        m = task.run_round(r)
        if m["val_rmse"] < best[0]:
            best = (m["val_rmse"], m["test_rmse"], r)
    s = task.summary()
    return {"model": model, "placement": placement if private else "none", "epsilon": epsilon,
            "sample_rate": s["sample_rate"], "noise_multiplier": s["noise_multiplier"],
            "epsilon_spent": s["epsilon_spent"], "val_rmse": best[0], "test_rmse": best[1], "round": best[2],
            "clients_per_round": s["clients_per_round_mean"], "seconds": round(time.perf_counter() - t0, 1)}


def figure(rows: list[dict[str, Any]], bias: float, title: str, path: Path) -> None:
    fig, ax = subplots(figsize=(6, 4.8))
    for colour, model in enumerate(MODELS):  # one colour per model, one line style per placement
        ref = [r["test_rmse"] for r in rows if r["model"] == model and r["placement"] == "none"]
        for placement, style in (("client", "o--"), ("server", "s-")):
            pts = sorted((r["epsilon"], r["test_rmse"]) for r in rows if r["model"] == model
                         and r["placement"] == placement)
            if pts:
                ax.plot(*zip(*pts), style, color=f"C{colour}", label=f"{model}, {placement} placement")
        if ref:
            ax.axhline(ref[0], ls=":", color=f"C{colour}", label=f"{model} non-private")
    ax.axhline(bias, color="black", lw=0.8, label="bias baseline")
    ax.set(xscale="log", xlabel="ε (δ = 1e-6)", ylabel="test RMSE (r / 5), val-selected round")
    epsilons = sorted({r["epsilon"] for r in rows if math.isfinite(r["epsilon"])})
    ax.set_xticks(epsilons, [f"{e:g}" for e in epsilons])  # the swept values, not 2 × 10⁰
    ax.minorticks_off()
    set_title(ax, title)
    legend_below(fig, ax, ncols=2)
    save_figure(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="ml100k", choices=["ml100k", *SIZES])
    p.add_argument("--models", default="mf,fedgnn")
    p.add_argument("--placements", default="client,server")
    p.add_argument("--epsilons", default="1,2,4,8,inf")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--sample-rate", type=float, default=0.2)
    p.add_argument("--server-clip", type=float, default=0.1)
    p.add_argument("--client-clip", type=float, default=0.1)
    p.add_argument("--pseudo-items", type=int, default=0)
    p.add_argument("--accountant", choices=["rdp", "prv"], default="rdp",
                   help="server placement: the accountant that calibrates the noise")
    p.add_argument("--adaptive-clip", action="store_true", help="server placement: adaptive clipping")
    p.add_argument("--noise-schedule", type=lambda text: [float(g) for g in text.split(",")], default=None,
                   help="server placement: each round's factor on the noise multiplier, comma-separated")
    p.add_argument("--target-quantile", type=float, default=0.5, help="adaptive clipping: the norms' quantile")
    p.add_argument("--server-momentum-lr", type=float, default=None,
                   help="server placement: FedAvgM at this server lr on the noised mean (default: task.optimizer)")
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--weight-decay", type=float, default=1e-4, help="the server's and clients' L2 (task.weight_decay)")
    p.add_argument("--summed", action="store_true",
                   help="MF's own setting: biases, a linear head, the squared error summed over every rating")
    p.add_argument("--init-std", type=float, default=1.0, help="with --summed: the embeddings' initial std")
    p.add_argument("--user-solve", action="store_true",
                   help="with --summed: clients solve their user rows (ridge) instead of a gradient step")
    p.add_argument("--init-bias", type=float, default=0.0,
                   help="with --summed: μ's initial value (0.6: the middle of 1..5 stars / 5, public)")
    p.add_argument("--item-solve", action="store_true",
                   help="with --user-solve: the server's item step of ALS (task.item_solve) instead of the optimiser")
    p.add_argument("--item-ridge", type=float, default=30.0, help="--item-solve: the items' ridge")
    p.add_argument("--ridge-per-noise", type=float, default=None,
                   help="--item-solve: private runs' ridge as this multiple of the noise's std z · --server-clip")
    p.add_argument("--reference-ridge", type=float, default=None,
                   help="--item-solve: the non-private run's ridge (default: --item-ridge)")
    p.add_argument("--factor-scale", type=float, default=25.0, help="--item-solve: the user factors' scale")
    p.add_argument("--average-from", type=int, default=4,
                   help="--item-solve: private runs average their steps from this round on (-1: never)")
    p.add_argument("--count-power", type=float, default=0.0,
                   help="--item-solve: private runs weight each item's part of an upload by its count^-a")
    p.add_argument("--noise-ridge", type=float, default=0.0,
                   help="--item-solve: rho, each item's ridge grows by rho sigma^2 / curvature (0 without noise)")
    p.add_argument("--count-average", action="store_true",
                   help="--item-solve: the items' Hessians take the mean of every step's noised counts")
    p.add_argument("--one-client-per-user", action="store_true", help="synthetic sizes: every user a client")
    p.add_argument("--no-stream", action="store_true", help="every training rating from round 0")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--figure", type=Path)
    args = p.parse_args()
    if args.noise_schedule is not None and args.ridge_per_noise is not None:
        p.error("--ridge-per-noise takes the uniform calibration's z: with --noise-schedule use --noise-ridge")
    data = load(args.data, args.rounds, args.one_client_per_user, stream=not args.no_stream)
    bias, mean = bias_baseline(data), bias_baseline(data, regs=(0.0,), sweeps=0)
    print(f"{args.data}: test RMSE of the bias baseline {bias['test_rmse']:.4f} (ridge {bias['reg']:g}, chosen on "
          f"validation), of the mean rating "
          f"{mean['test_rmse']:.4f}", flush=True)
    rows: list[dict[str, Any]] = []
    for model in args.models.split(","):
        for eps in (float(e) for e in args.epsilons.split(",")):
            for placement in args.placements.split(",") if math.isfinite(eps) else ["none"]:
                row = run(data, model, placement, eps, args)
                rows.append(row)
                print(row, flush=True)
    ref = {r["model"]: r["test_rmse"] for r in rows if r["placement"] == "none"}
    for r in rows:
        gain = bias["test_rmse"] - ref.get(r["model"], math.nan)
        r["gain_kept"] = (bias["test_rmse"] - r["test_rmse"]) / gain if gain else math.nan
        r["bias_test_rmse"], r["mean_test_rmse"] = bias["test_rmse"], mean["test_rmse"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    if args.figure is not None:
        figure(rows, bias["test_rmse"], f"{args.data}: accuracy against ε", args.figure)


if __name__ == "__main__":
    main()
