"""PNG plots of a run's metric history (matplotlib, headless)."""
from __future__ import annotations

import textwrap
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
    ("normalized_reward.png", "steps", "step t", "normalized_reward", "cumulative reward / random policy's"),
    ("relative_ctr.png", "steps", "logged event t", "relative_ctr", "CTR / random policy's CTR (replay)"),
    ("test_rmse.png", "round", "round t", "test_rmse", "test RMSE"),
    ("test_f1.png", "round", "round t", "test_f1", "test F1 (threshold 0.5)"),
    ("test_ndcg10.png", "round", "round t", "test_ndcg@10", "test NDCG@10"),
    ("rmse_vs_epsilon.png", "epsilon_spent", "epsilon spent (max over clients)", "test_rmse", "test RMSE"),
    ("rmse_vs_nominal_epsilon.png", "epsilon_nominal", "authors' nominal epsilon, sum of per-round budgets (max over "
     "clients)", "test_rmse", "test RMSE"),
)
#: characters per line of a title (small font on the figure's 5 inches)
TITLE_WIDTH = 72


def save_figure(fig: plt.Figure, path: str | Path) -> Path:
    """Write ``fig`` as a PNG atomically (a crash never leaves half a file) and close it."""
    out = atomic_write(Path(path), lambda f: fig.savefig(f, format="png"))
    plt.close(fig)
    return out


def spread(history: Sequence[dict[str, float]], y_key: str) -> tuple[list[float], list[float], str] | None:
    """(low, high, legend) of the spread of ``y_key`` over replicates, where every round of ``history`` logs it:
    mean ± 1 std (``{y_key}_std``, bandit replicates) or min to max (``_min``/``_max``, a multi-agent run's trials);
    None if it is not logged or has no width (a single trial)."""
    if all(f"{y_key}_std" in h for h in history):
        low = [h[y_key] - h[f"{y_key}_std"] for h in history]
        high = [h[y_key] + h[f"{y_key}_std"] for h in history]
        legend = "mean ± 1 std over replicates"
    elif all(f"{y_key}_min" in h and f"{y_key}_max" in h for h in history):
        low, high = [h[f"{y_key}_min"] for h in history], [h[f"{y_key}_max"] for h in history]
        legend = "min to max over trials"
    else:
        return None
    return (low, high, legend) if low != high else None


def metric_figure(history: Sequence[dict[str, float]], x_key: str, xlabel: str, y_key: str, ylabel: str,
                  title: str = "") -> plt.Figure:
    """``y_key`` against ``x_key`` over the rounds of ``history``, with its :func:`spread` as a band; ``title`` is
    wrapped to the figure's width."""
    lines = [wrapped for line in title.splitlines() for wrapped in textwrap.wrap(line, TITLE_WIDTH)]
    fig, ax = plt.subplots(figsize=(5, 3.5 + 0.15 * len(lines)), dpi=120)
    x = [h[x_key] for h in history]
    ax.plot(x, [h[y_key] for h in history])
    band = spread(history, y_key)
    if band is not None:
        low, high, legend = band
        ax.fill_between(x, low, high, alpha=0.25, linewidth=0, label=legend)
        ax.legend(loc="best", fontsize="small")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title("\n".join(lines), fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_run(history: Sequence[dict[str, float]], out_dir: str | Path, title: str = "",
             rating_scale: str | None = None) -> list[Path]:
    """Every plot of :data:`PLOTS` whose metrics the history has, as PNGs in ``out_dir``; ``rating_scale`` (e.g.
    ``"ratings 1–5 as r / 5"``) is added to the RMSE axis labels."""
    out_dir = Path(out_dir)
    paths = []
    for name, x_key, xlabel, y_key, ylabel in PLOTS:
        if not history or x_key not in history[0] or y_key not in history[0]:
            continue
        if y_key == "test_rmse" and rating_scale:
            ylabel = f"{ylabel} ({rating_scale})"
        fig = metric_figure(history, x_key, xlabel, y_key, ylabel, title)
        paths.append(save_figure(fig, out_dir / name))
    return paths
