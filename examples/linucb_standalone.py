"""LinUCB and LinTS used on their own, without a trainer, protocol or environment class.

A hand-written linear bandit: an unknown unit vector θ, and at every step ``--arms`` fresh arms drawn uniformly
from the unit ball; pulling arm x pays θᵀx plus Gaussian noise. Each policy sees the arms, picks one with
``select`` and learns from the reward with ``update``. A uniformly random policy plays the same instance as a
baseline. Regret is the pseudo-regret, Σ_t (max_x θᵀx − θᵀx_t).

    python examples/linucb_standalone.py --steps 2000 --dim 8 --arms 20

The last line reads ``linucb_regret=… lints_regret=… random_regret=…``.
"""
from __future__ import annotations

import argparse

import torch

from fedrec.bandits import LinTS, LinUCB


def unit_ball(gen: torch.Generator, n: int, dim: int) -> torch.Tensor:
    """``n`` points drawn uniformly from the unit ball of R^dim."""
    direction = torch.randn(n, dim, generator=gen, dtype=torch.float64)
    direction /= direction.norm(dim=1, keepdim=True)
    radius = torch.rand(n, 1, generator=gen, dtype=torch.float64) ** (1.0 / dim)
    return direction * radius


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--arms", type=int, default=20)
    parser.add_argument("--noise", type=float, default=0.1, help="std of the reward noise")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    # every call works on tiny matrices: one thread is much faster than torch's default of one per core (which on
    # a busy machine waits for all of them); FederatedTrainer does the same for its runs
    torch.set_num_threads(1)

    gen = torch.Generator().manual_seed(args.seed)
    theta = torch.randn(args.dim, generator=gen, dtype=torch.float64)
    theta /= theta.norm()

    # the two policies share the regularisation λ; α and v set how much they explore
    policies = {
        "linucb": LinUCB(dim=args.dim, alpha=0.5, lam=1.0),
        "lints": LinTS(dim=args.dim, v=0.1, lam=1.0, seed=args.seed),
    }
    regret = {name: 0.0 for name in [*policies, "random"]}
    for _ in range(args.steps):
        arms = unit_ball(gen, args.arms, args.dim)  # (K, d): this step's arm set
        expected = arms @ theta  # (K,)
        noise = args.noise * torch.randn((), generator=gen, dtype=torch.float64)
        best = float(expected.max())
        for name, policy in policies.items():
            arm = int(policy.select(arms))  # the best arm by the policy's score
            policy.update(arms[arm], expected[arm] + noise)  # observe its noisy reward
            regret[name] += best - float(expected[arm])
        regret["random"] += best - float(expected.mean())  # a uniform pick's expected regret

    print(f"after {args.steps} steps, θ estimated by LinUCB to within "
          f"{float((policies['linucb'].theta() - theta).norm()):.3f}")
    print(" ".join(f"{name}_regret={value:.4f}" for name, value in regret.items()))
    return regret


if __name__ == "__main__":
    main()
