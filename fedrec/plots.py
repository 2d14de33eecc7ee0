"""PNG plots of a run's metric history (matplotlib, headless)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

from fedrec.io import atomic_write

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_bandit_run(history: Sequence[dict[str, float]], out_dir: str | Path, title: str = "") -> list[Path]:
    """Cumulative regret over time, and regret against communication, as two PNGs in ``out_dir``."""
    out_dir = Path(out_dir)
    steps = [h["steps"] for h in history]
    regret = [h["cumulative_regret"] for h in history]
    comm = [h["comm_messages"] for h in history]
    paths = []
    for name, x, xlabel in (("regret.png", steps, "step t"), ("regret_vs_comm.png", comm, "communication C_t (messages)")):
        fig, ax = plt.subplots(figsize=(5, 3.5), dpi=120)
        ax.plot(x, regret)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("cumulative regret R_t")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = atomic_write(out_dir / name, lambda f: fig.savefig(f, format="png"))
        plt.close(fig)
        paths.append(path)
    return paths
