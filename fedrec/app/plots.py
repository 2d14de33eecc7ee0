"""PNG plots of a run's metric history (matplotlib, headless), and the layout helpers every figure script uses so
that titles wrap, legends stay readable and clear of the axes' text, and round axes tick at integers."""
from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

from fedrec.utils.io import atomic_write

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import Bbox

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
#: characters per line of a run plot's title (small font on the figure's 5 inches; see :func:`wrap`)
TITLE_WIDTH = 72
#: the average advance of a character, in em, of matplotlib's default sans-serif font (DejaVu Sans)
_EM_PER_CHAR = 0.6
#: the smallest legend font a figure uses ("small" is 10 pt × 0.833 at matplotlib's default size)
LEGEND_FONTSIZE = "small"


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], **kwargs: Any) -> tuple[Figure, Any]:
    """``plt.subplots`` at 120 dpi with constrained layout, which makes room for wrapped titles, suptitles and
    legends placed outside the axes (``tight_layout`` does not see a figure legend)."""
    return plt.subplots(nrows, ncols, figsize=figsize, dpi=120, layout="constrained", **kwargs)


def wrap(text: str, width_inches: float, fontsize: float | str = "medium") -> str:
    """``text`` broken into lines that fit ``width_inches`` at ``fontsize`` (its own line breaks kept): about
    width / (0.6 em) characters a line, the average advance of the default font."""
    points = FontProperties(size=fontsize).get_size_in_points()
    chars = max(16, int(width_inches * 72 / (_EM_PER_CHAR * points)))
    return "\n".join(w for line in text.splitlines()
                     for w in (textwrap.wrap(line, chars, break_on_hyphens=False) or [""]))


def set_title(target: Axes | Figure, text: str, fontsize: float | str = "medium") -> None:
    """An axes' title or a figure's suptitle, wrapped to the width it spans so that it never runs off the figure."""
    if isinstance(target, Figure):
        target.suptitle(wrap(text, target.get_figwidth() * 0.95, fontsize), fontsize=fontsize)
    else:
        width = target.get_position().width * target.get_figure().get_figwidth()
        target.set_title(wrap(text, width, fontsize), fontsize=fontsize)


def integer_ticks(ax: Axes, axis: str = "x") -> None:
    """Ticks at whole numbers only on ``axis`` ("x" or "y"): rounds, steps, counts."""
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 2.5, 5, 10]))


def legend_below(fig: Figure, ax: Axes | None = None, ncols: int | None = None) -> None:
    """One legend for the whole figure, under its panels (constrained layout keeps it clear of the axes' labels),
    from the handles of ``ax`` (default: the first axes); entries shared by every panel appear once. It takes
    ``ncols`` columns (default up to 4), fewer when that would be wider than the figure."""
    handles, labels = (ax or fig.axes[0]).get_legend_handles_labels()
    renderer = fig.canvas.get_renderer()
    for n in range(ncols or min(len(labels), 4), 0, -1):
        legend = fig.legend(handles, labels, loc="outside lower center", ncols=n, fontsize=LEGEND_FONTSIZE,
                            frameon=False)
        if n == 1 or legend.get_window_extent(renderer).width <= 0.98 * fig.bbox.width:
            return
        legend.remove()


def legend_beside(ax: Axes) -> None:
    """A panel's own legend, right of its axes and outside them (constrained layout makes room): readable, and
    never over the curves or the neighbouring panel's labels."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=LEGEND_FONTSIZE)


def label_points(ax: Axes, xs: Sequence[float], ys: Sequence[float], labels: Sequence[str],
                 fontsize: float | str = "small") -> None:
    """Label each point (x, y) at the first of eight positions around it whose text stays inside the axes and
    overlaps no marker and no earlier label, measured with the figure's renderer after its layout (the last
    position when none is free)."""
    fig = ax.get_figure()
    fig.canvas.draw()  # settle the layout: the boxes below are in display pixels
    renderer = fig.canvas.get_renderer()
    radius = 5 * fig.dpi / 72  # a default scatter marker's radius, with a margin
    taken = [Bbox.from_extents(px - radius, py - radius, px + radius, py + radius)
             for px, py in ax.transData.transform(list(zip(xs, ys)))]
    offsets = ((5, 5), (5, -12), (-5, 5), (-5, -12), (0, 9), (0, -17), (9, -4), (-9, -4))
    for x, y, text in zip(xs, ys, labels):
        for i, (dx, dy) in enumerate(offsets):
            note = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                               ha="left" if dx > 0 else "right" if dx < 0 else "center", annotation_clip=False)
            note.set_in_layout(False)
            box = note.get_window_extent(renderer)
            inside = ax.bbox.x0 <= box.x0 and box.x1 <= ax.bbox.x1 and ax.bbox.y0 <= box.y0 and box.y1 <= ax.bbox.y1
            if (inside and not any(box.overlaps(other) for other in taken)) or i == len(offsets) - 1:
                taken.append(box)
                break
            note.remove()


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
    fig, ax = subplots(figsize=(5, 3.5 + 0.15 * len(lines)))
    x = [h[x_key] for h in history]
    ax.plot(x, [h[y_key] for h in history])
    band = spread(history, y_key)
    if band is not None:
        low, high, legend = band
        ax.fill_between(x, low, high, alpha=0.25, linewidth=0, label=legend)
        ax.legend(loc="best", fontsize=LEGEND_FONTSIZE)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title("\n".join(lines), fontsize="small")
    if x_key in ("round", "steps"):
        integer_ticks(ax)
    ax.grid(alpha=0.3)
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
