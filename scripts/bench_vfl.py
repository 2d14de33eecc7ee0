"""Cost of vertical federation (Cao et al. Fig. 5 and Table 1) and fedrec's VFUCB against a straightforward one.

Cases (every case prints JSON lines, nothing is asserted):
  ref    fedrec's VFUCB against a per-party numpy implementation (party objects, one mask product per party and arm,
         the AP summing the shares and inverting Λ̃ every round, as Appendix C counts it) on the same stream:
         decisions compared, time ratio printed.
  over   measured overhead VFUCB / LinUCB and VFTS / LinTS of fedrec (masking, channel and all) against d for
         K ∈ {100, 500, 1000}, beside the op-count model of Appendix C; and the d = 100, K = 10 setting of §5.1.
  comm   the AP's communication per round: the paper's K·M·d·8 bytes (its upper bound counts the AP's own share)
         and what fedrec's ledger counts (K·(M − 1) d-vectors); d = 1000 and 5000 at K = 1000 (Fig. 5(c)).
With --figure PATH the model and measured overheads are drawn (Fig. 5(a, b)). One torch thread.

    .venv/bin/python -m scripts.bench_vfl --figure docs/figures/vfl_fig5.png
"""
from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import numpy as np
import torch

from fedrec.bandits import LinTS, LinUCB
from fedrec.bandits.linear import TIE_TOLERANCE
from fedrec.envs.synthetic import LinearEnv
from fedrec.federation.vertical import draw_mask, equal_partition
from fedrec.protocols.vertical import VerticalLinearBandit

M = 5
UCB = functools.partial(LinUCB, alpha=0.5, lam=1.0)
TS = functools.partial(LinTS, v=0.01, lam=1.0)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="ref,over,comm")
    p.add_argument("--ref-steps", type=int, default=1000)
    p.add_argument("--over-steps", type=int, default=20, help="rounds per timing at K >= 100")
    p.add_argument("--dims", default="10,20,50,100,200")
    p.add_argument("--arms", default="100,500,1000")
    p.add_argument("--figure", type=Path, default=None)
    return p.parse_args()


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


# ---------------------------------------------------------------------------------------- op-count model
def model_cost(d: int, K: int, ts: bool, vertical: bool) -> float:
    """Operations per round under Appendix C's cost model (our operation counts of it)."""
    if ts:
        base = d * d + d ** 3 + K * d + K + d + d ** 3 + d + d * d
    else:
        base = K * d + d ** 3 + K * d * d + K + 2 * d * d + d
    return base + (K * d * d + K * M * d if vertical else 0)


# ----------------------------------------------------------------------------------- a plain reference
class Party:
    """A party of the reference: its columns and its mask block."""

    def __init__(self, columns: slice, block: np.ndarray) -> None:
        self.columns, self.block = columns, block

    def shares(self, contexts: np.ndarray) -> list[np.ndarray]:
        return [self.block @ x[self.columns] for x in contexts]


def reference_vfucb(contexts: np.ndarray, rewards: np.ndarray, Q: np.ndarray, beta: float = 0.5) -> np.ndarray:
    """VFUCB as Algorithm 1 reads: every round each party masks each arm, the AP sums, inverts Λ̃, scores."""
    T, K, d = contexts.shape
    offsets = np.cumsum((0,) + equal_partition(d, M))
    parties = [Party(slice(offsets[j], offsets[j + 1]), Q[:, offsets[j]:offsets[j + 1]]) for j in range(M)]
    Lam, u = np.eye(d), np.zeros(d)
    arms = np.empty(T, dtype=np.int64)
    for t in range(T):
        masked = [sum(shares) for shares in zip(*(p.shares(contexts[t]) for p in parties))]
        inv = np.linalg.inv(Lam)
        theta = inv @ u
        scores = [x @ theta + beta * np.sqrt(x @ inv @ x) for x in masked]
        best = max(scores)
        a = next(k for k, s in enumerate(scores) if s >= best - TIE_TOLERANCE)
        x = masked[a]
        Lam += np.outer(x, x)
        u += rewards[t, a] * x
        arms[t] = a
    return arms


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def play(policy, mode: str, d: int, K: int, T: int, seed: int = 0) -> tuple[float, torch.Tensor]:
    """Seconds and arms of one fedrec run (no shadow central run)."""
    env = LinearEnv(num_clients=1, dim=d, num_arms=K, seed=seed, contexts="sphere", noise_std=0.05, chunk_size=T)
    batch = env.interactions(0, T)
    p = VerticalLinearBandit(1, d, 1, policy, seed, mode=mode, parties=M, track_central=False)
    p.run(batch.clients[:, :2], batch.contexts[:, :2], batch.rewards[:, :2])  # compile / warm outside the timer
    p = VerticalLinearBandit(1, d, 1, policy, seed, mode=mode, parties=M, track_central=False)
    return timed(lambda: p.run(batch.clients, batch.contexts, batch.rewards))


def case_ref(args: argparse.Namespace) -> None:
    d, K, T = 100, 10, args.ref_steps
    env = LinearEnv(num_clients=1, dim=d, num_arms=K, seed=0, contexts="sphere", noise_std=0.05, chunk_size=T)
    batch = env.interactions(0, T)
    ours_time, arms = play(UCB, "vertical", d, K, T)
    Q = draw_mask(d, 0, 0)
    ref_time, ref_arms = timed(lambda: reference_vfucb(batch.contexts[0].numpy(), batch.rewards[0].numpy(), Q))
    emit({"case": "ref_vfucb", "d": d, "K": K, "M": M, "steps": T, "ours_s": round(ours_time, 3),
          "reference_s": round(ref_time, 3), "ratio": round(ref_time / ours_time, 1),
          "decisions_identical": bool((arms[0].numpy() == ref_arms).all())})


def case_over(args: argparse.Namespace) -> list[dict]:
    rows = []
    settings = [(100, 10, 2000)] + [(d, K, args.over_steps) for K in map(int, args.arms.split(","))
                                    for d in map(int, args.dims.split(","))]
    for d, K, T in settings:
        rec = {"case": "overhead", "d": d, "K": K, "M": M, "steps": T}
        for name, policy, ts in (("ucb", UCB, False), ("ts", TS, True)):
            central, _ = play(policy, "central", d, K, T)
            vertical, _ = play(policy, "vertical", d, K, T)
            rec[f"{name}_measured"] = round(vertical / central, 2)
            rec[f"{name}_model"] = round(model_cost(d, K, ts, True) / model_cost(d, K, ts, False), 2)
            rec[f"{name}_central_ms_per_round"] = round(1e3 * central / T, 3)
        emit(rec)
        rows.append(rec)
    return rows


def case_comm() -> None:
    for d, K in ((1000, 1000), (5000, 1000)):
        paper = K * M * d * 8
        emit({"case": "comm_per_round", "d": d, "K": K, "M": M, "paper_bound_GB": paper / 1e9,
              "ledger_GB": K * (M - 1) * d * 8 / 1e9, "paper_reports_GB": {1000: 0.04, 5000: 6.25}[d]})
    d, K, T = 50, 20, 10  # the ledger's count on a small run, against the formula
    env = LinearEnv(num_clients=1, dim=d, num_arms=K, seed=0, contexts="sphere", chunk_size=T)
    batch = env.interactions(0, T)
    p = VerticalLinearBandit(1, d, 1, UCB, 0, parties=M, track_central=False)
    p.run(batch.clients, batch.contexts, batch.rewards)
    shares = int(p.ledger.totals()["comm_upload_bytes"][0])
    emit({"case": "comm_ledger_check", "d": d, "K": K, "steps": T, "upload_bytes": shares,
          "formula_K_(M-1)_d_8_T": K * (M - 1) * d * 8 * T,
          "mask_bytes": int(p.ledger.totals()["comm_download_bytes"][0]), "formula_d2_8": d * d * 8})


def figure(rows: list[dict], path: Path) -> None:
    """Fig. 5(a, b): measured and modelled overhead against d, one colour per K, one legend for both panels."""
    from fedrec.app.plots import legend_below, save_figure, set_title, subplots

    fig, axes = subplots(1, 2, figsize=(11, 4.4))
    for ax, name, title in zip(axes, ("ucb", "ts"), ("VFUCB / LinUCB", "VFTS / LinTS")):
        for K in sorted({r["K"] for r in rows if r["K"] >= 100}):
            sel = [r for r in rows if r["K"] == K]
            line, = ax.plot([r["d"] for r in sel], [r[f"{name}_measured"] for r in sel], "o-",
                            label=f"K = {K} measured")
            ax.plot([r["d"] for r in sel], [r[f"{name}_model"] for r in sel], "--", color=line.get_color(),
                    label=f"K = {K} op-count model")
        ax.set_xscale("log")
        ax.set_xlabel("context dimension d")
        ax.set_ylabel("relative cost")
        set_title(ax, title + f" (M = {M})")
        ax.grid(alpha=0.3)
    legend_below(fig, axes[0], ncols=3)
    save_figure(fig, path)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    cases = args.cases.split(",")
    if "ref" in cases:
        case_ref(args)
    if "over" in cases:
        rows = case_over(args)
        if args.figure:
            figure(rows, args.figure)
    if "comm" in cases:
        case_comm()


if __name__ == "__main__":
    main()
