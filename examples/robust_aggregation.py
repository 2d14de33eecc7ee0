"""Aggregation rules and server optimisers on plain tensors (``fedrec.aggregation``), outside any fedrec run.

Two small demonstrations, with torch alone (no dataset):

1. **Rules against attackers.** 40 clients upload noisy copies of one true update; 8 of them send instead a
   far-away update. Each rule combines the ``(C, P)`` uploads with ``(C,)`` weights into one ``(P,)`` update; the
   weighted mean is dragged away, the robust rules stay near the honest mean.
2. **Server optimisers.** Federated least squares: every round each client takes a few local SGD steps on its own
   data from the global model, and the server moves the model by the mean change Δ with ``new = opt.step(x, Δ)``
   (FedAvg: ``x + Δ``; FedAvgM, FedAdam and FedYogi keep their moments between calls).

    python examples/robust_aggregation.py --rounds 30

The last line reads ``mean_error=… median_error=… trimmed_error=… krum_error=… multi_krum_error=…
norm_bounded_error=… initial_loss=… fedavg_loss=… fedavgm_loss=… fedadam_loss=… fedyogi_loss=…``.
"""
from __future__ import annotations

import argparse

import torch

from fedrec.aggregation import (
    FedAdam,
    FedAvgM,
    FedYogi,
    ServerOptimizer,
    coordinate_median,
    krum,
    norm_bounded_mean,
    trimmed_mean,
    weighted_mean,
)


def rules_against_attackers(seed: int) -> dict[str, float]:
    """The largest coordinate error of each rule's result against the honest clients' mean."""
    g = torch.Generator().manual_seed(seed)
    C, f, P = 40, 8, 10
    truth = torch.randn(P, generator=g)
    updates = truth + 0.1 * torch.randn(C, P, generator=g)
    updates[:f] = 50.0 + torch.randn(f, P, generator=g)  # the attackers agree on a far-away update
    weights = torch.rand(C, generator=g) + 0.5
    honest = updates[f:].mean(0)
    results = {
        "mean": weighted_mean(updates, weights),
        "median": coordinate_median(updates, weights),
        "trimmed": trimmed_mean(updates, weights, beta=0.25),
        "krum": krum(updates, weights, f=f),
        "multi_krum": krum(updates, weights, f=f, m=C - f),
        "norm_bounded": norm_bounded_mean(updates, weights, bound=float(truth.norm())),
    }
    return {f"{name}_error": float((r - honest).abs().max()) for name, r in results.items()}


def federated_least_squares(opt: ServerOptimizer, rounds: int, seed: int) -> tuple[float, float]:
    """Train a linear model over 20 clients with ``opt`` as the server: (initial loss, final loss)."""
    g = torch.Generator().manual_seed(seed)
    C, n, P = 20, 30, 5
    w_true = torch.randn(P, generator=g)
    X = torch.randn(C, n, P, generator=g) + torch.randn(C, 1, P, generator=g)  # each client's own feature shift
    y = X @ w_true + 0.1 * torch.randn(C, n, generator=g)

    def loss(w: torch.Tensor) -> float:
        return float(((X @ w - y) ** 2).mean())

    x = torch.zeros(P)
    first = loss(x)
    for _ in range(rounds):
        local = x.expand(C, P).clone()
        for _ in range(3):  # local SGD steps on each client's mean squared error
            grad = 2 * torch.einsum("cnp,cn->cp", X, torch.einsum("cnp,cp->cn", X, local) - y) / n
            local = local - 0.01 * grad
        delta = weighted_mean(local - x, torch.ones(C))  # Δ: the clients' mean model change
        x = opt.step(x, delta)
    return first, loss(x)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    out = rules_against_attackers(args.seed)
    for name, opt in (("fedavg", FedAvgM(lr=1.0, beta1=0.0)), ("fedavgm", FedAvgM(lr=1.0, beta1=0.5)),
                      ("fedadam", FedAdam(lr=0.1, tau=1e-3)), ("fedyogi", FedYogi(lr=0.1, tau=1e-3))):
        out["initial_loss"], out[f"{name}_loss"] = federated_least_squares(opt, args.rounds, args.seed)
    print("error of each rule against the honest mean, then each server's loss after", args.rounds, "rounds")
    print(" ".join(f"{k}={v:.6g}" for k, v in out.items()))
    return out


if __name__ == "__main__":
    main()
