"""PNG plots of a run's metric history (matplotlib, headless)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

from fedrec.io import atomic_write

matplotlib.use("Agg")
import matplotlib.pyplot as plt

#: (file name, x metric, x label, y metric, y label) of the plots a run gets, when its history has both metrics
PLOTS = (
    ("regret.png", "steps", "step t", "cumulative_regret", "cumulative regret R_t"),
    ("regret_vs_comm.png", "comm_messages", "communication C_t (messages)", "cumulative_regret",
     "cumulative regret R_t"),
    ("relative_ctr.png", "steps", "logged event t", "relative_ctr", "CTR / random policy's CTR (replay)"),
    ("test_rmse.png", "round", "round t", "test_rmse", "test RMSE"),
    ("test_f1.png", "round", "round t", "test_f1", "test F1 (threshold 0.5)"),
    ("rmse_vs_epsilon.png", "epsilon_spent", "epsilon spent (max over clients)", "test_rmse", "test RMSE"),
)


def save_figure(fig: plt.Figure, path: str | Path) -> Path:
    """Write ``fig`` as a PNG atomically (a crash never leaves half a file) and close it."""
    out = atomic_write(Path(path), lambda f: fig.savefig(f, format="png"))
    plt.close(fig)
    return out


def plot_run(history: Sequence[dict[str, float]], out_dir: str | Path, title: str = "") -> list[Path]:
    """Every plot of :data:`PLOTS` whose metrics the history has, as PNGs in ``out_dir``."""
    out_dir = Path(out_dir)
    paths = []
    for name, x_key, xlabel, y_key, ylabel in PLOTS:
        if not history or x_key not in history[0] or y_key not in history[0]:
            continue
        fig, ax = plt.subplots(figsize=(5, 3.5), dpi=120)
        ax.plot([h[x_key] for h in history], [h[y_key] for h in history])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        paths.append(save_figure(fig, out_dir / name))
    return paths
