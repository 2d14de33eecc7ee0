"""The documentation renders as a reader sees it, checked without a browser: the built site's HTML (pipes in table
code, formulas typeset by MathJax from a local file, code in tables wrapping only at separators) and every figure
script's layout, drawn on small synthetic data and measured with matplotlib's renderer (titles inside the figure,
no text overlapping other text, whole-number ticks on round axes). ``scripts/docs_screenshots.py`` shows the same
pages in headless Chromium."""
from __future__ import annotations

import html
import importlib
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from fedrec.app import plots

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MKDOCS = Path(sys.executable).parent / "mkdocs"
#: the hand-written pages (the API pages render docstrings, the configuration page YAML comments)
PAGES = sorted(p for p in DOCS.rglob("*.md") if p.parent.name != "api" and p.name != "configuration.md")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]+`")
INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\s)([^$\n]+?)(?<!\s)\$(?!\d)")


# --------------------------------------------------------------------------------------------------------- the site
@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def page_html(site: Path, page: Path) -> str:
    rel = page.relative_to(DOCS).with_suffix("")
    target = site / ("index.html" if rel.name == "index" and rel.parent == Path() else rel / "index.html")
    return target.read_text(encoding="utf-8")


def prose(markdown: str) -> str:
    """The Markdown outside fenced blocks and HTML comments."""
    return re.sub(r"<!--.*?-->", "", FENCE.sub("", markdown), flags=re.S)


def cells_code(page_html_text: str) -> list[str]:
    """The inner HTML of every code element in a table cell."""
    return [code for cell in re.findall(r"<td\b[^>]*>(.*?)</td>", page_html_text, flags=re.S)
            for code in re.findall(r"<code>(.*?)</code>", cell, flags=re.S)]


def test_pipes_in_table_code_render_without_backslash(site: Path) -> None:
    escaped = [(page, span) for page in PAGES for line in prose(page.read_text(encoding="utf-8")).splitlines()
               if line.lstrip().startswith("|") for span in CODE.findall(line) if "\\|" in span]
    assert len(escaped) >= 5  # running.md's protocol lists, robust_fedrec.md's weighting, …
    for page, span in escaped:
        shown = {html.unescape(c.replace("<wbr>", "")) for c in cells_code(page_html(site, page))}
        assert span.strip("`").replace("\\|", "|") in shown, (page.name, span)
    for page in sorted(site.rglob("index.html")):
        backslashed = [c for c in cells_code(page.read_text(encoding="utf-8")) if "\\|" in c]
        assert backslashed == [], (page, backslashed[:3])


def test_code_in_table_cells_wraps_only_at_separators(site: Path) -> None:
    css = (site / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    rule = re.search(r"\.md-typeset table:not\(\[class\]\) code\s*\{([^}]*)\}", css)
    assert rule and re.search(r"word-break:\s*normal", rule[1]) and re.search(r"overflow-wrap:\s*normal", rule[1])
    codes = cells_code(page_html(site, DOCS / "benchmarks.md"))
    assert "scripts/<wbr>bench_<wbr>" not in "".join(codes)  # never inside a name
    commands = [c for c in codes if c.startswith(".venv/")]
    assert commands and all("<wbr>" in c for c in commands)
    for page in sorted(site.rglob("index.html")):
        text = page.read_text(encoding="utf-8")
        assert 'href="' in text and "stylesheets/extra.css" in text, page
        for code in cells_code(text):
            for before, after in zip(code.split("<wbr>"), code.split("<wbr>")[1:]):
                assert before[-1:] in "/|,=" or after.startswith("."), (page, code)


def test_formulas_are_typeset_by_a_local_mathjax(site: Path) -> None:
    mathjax = site / "javascripts" / "mathjax" / "tex-svg.js"
    assert mathjax.stat().st_size > 1_000_000 and b"MathJax" in mathjax.read_bytes()[:200_000]
    config = (site / "javascripts" / "mathjax.js").read_text(encoding="utf-8")
    assert "arithmatex" in config
    pages_with_math = 0
    for page in PAGES:
        source = CODE.sub("", prose(page.read_text(encoding="utf-8")))
        formulas = INLINE_MATH.findall(source)
        text = page_html(site, page)
        spans = [html.unescape(s) for s in re.findall(r'<span class="arithmatex">\\\((.*?)\\\)</span>', text)]
        assert sorted(spans) == sorted(f.strip() for f in formulas), page.name
        if formulas:
            pages_with_math += 1
            scripts = re.findall(r'<script src="([^"]+)"', text)
            assert [s for s in scripts if s.endswith("javascripts/mathjax.js")], page.name
            assert [s for s in scripts if s.endswith("javascripts/mathjax/tex-svg.js")], page.name
            assert not any(s.startswith(("http:", "https:", "//")) and "mathjax" in s.lower() for s in scripts)
    assert pages_with_math >= 8


def test_no_formula_is_left_as_plain_tex(site: Path) -> None:
    """Sub- and superscripts in TeX notation (``X^t``, ``μ_{i,k}``) outside code and typeset math."""
    leftovers = []
    for page in PAGES:
        text = page_html(site, page)
        text = re.sub(r"<(pre|code|script)\b.*?</\1>|<span class=\"arithmatex\">.*?</span>", "", text, flags=re.S)
        text = re.sub(r"<[^>]+>", " ", text)
        leftovers += [(page.name, m) for m in re.findall(r"\w+\^[\w({]+|\w+_\{[^}]*\}", html.unescape(text))]
    assert leftovers == []


# ------------------------------------------------------------------------------------------------------ the plots
def _texts(fig: Figure) -> Iterator[tuple[str, Text | Any]]:
    """(what, artist) of every visible, non-empty text of the figure; a legend counts as one box."""
    if fig._suptitle is not None and fig._suptitle.get_text():
        yield "suptitle", fig._suptitle
    for legend in fig.legends:
        yield "figure legend", legend
    for i, ax in enumerate(fig.axes):
        for side, title in (("title", ax.title), ("left title", ax._left_title), ("right title", ax._right_title)):
            if title.get_text():
                yield f"axes {i} {side}", title
        for name, label in (("xlabel", ax.xaxis.label), ("ylabel", ax.yaxis.label)):
            if label.get_text():
                yield f"axes {i} {name}", label
        for axis_name, axis, interval in (("x", ax.xaxis, ax.get_xlim()), ("y", ax.yaxis, ax.get_ylim())):
            lo, hi = sorted(interval)
            for tick, label in zip(axis.get_majorticklocs(), axis.get_majorticklabels()):
                if label.get_visible() and label.get_text() and lo - 1e-9 * abs(hi - lo) <= tick <= hi + 1e-9 * abs(
                        hi - lo):
                    yield f"axes {i} {axis_name} tick {label.get_text()}", label
            if axis.get_offset_text().get_text():
                yield f"axes {i} {axis_name} offset", axis.get_offset_text()
        if ax.get_legend() is not None:
            yield f"axes {i} legend", ax.get_legend()
        for note in ax.texts:
            if note.get_visible() and note.get_text():
                yield f"axes {i} text {note.get_text()}", note


def layout_problems(fig: Figure) -> list[str]:
    """Texts outside the figure, or overlapping another text (tick labels of one axis may touch their neighbours'
    padding: boxes are shrunk by a pixel), and round axes with a fractional tick."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(what, artist.get_window_extent(renderer)) for what, artist in _texts(fig)]
    problems = [f"{what} outside the figure" for what, box in boxes
                if box.x0 < -1 or box.y0 < -1 or box.x1 > fig.bbox.x1 + 1 or box.y1 > fig.bbox.y1 + 1]
    for (a, box_a), (b, box_b) in combinations(boxes, 2):
        if _shrunk(box_a).overlaps(_shrunk(box_b)):
            problems.append(f"{a} overlaps {b}")
    for i, ax in enumerate(fig.axes):
        if re.search(r"\b(round|step)s?\b", ax.get_xlabel()):
            lo, hi = sorted(ax.get_xlim())
            ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
            problems += [f"axes {i}: round axis tick {t:g}" for t in ticks if not math.isclose(t, round(t))]
    return problems


def _shrunk(box: Bbox) -> Bbox:
    return Bbox.from_extents(box.x0 + 1, box.y0 + 1, box.x1 - 1, box.y1 - 1)


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], list[Figure]]]:
    """Import a figure script with its ``save_figure`` (and fedrec.app.plots') capturing the figures it saves."""
    figures: list[Figure] = []

    def capture(fig: Figure, path: str | Path) -> Path:
        figures.append(fig)
        return Path(path)

    monkeypatch.setattr(plots, "save_figure", capture)

    def load(name: str) -> Any:
        module = importlib.import_module(f"scripts.{name}")
        if hasattr(module, "save_figure"):
            monkeypatch.setattr(module, "save_figure", capture)
        return module

    load.figures = figures  # type: ignore[attr-defined]
    yield load
    plots.plt.close("all")


def _curve(n: int, scale: float, seed: int) -> np.ndarray:
    return scale * np.cumsum(np.random.default_rng(seed).random(n))


def assert_clean(figures: list[Figure], count: int) -> None:
    assert len(figures) == count
    for fig in figures:
        assert layout_problems(fig) == []


def test_checker_sees_a_title_off_the_figure_and_overlapping_labels() -> None:
    fig, ax = plots.plt.subplots(figsize=(3, 2), dpi=100)
    ax.set_title("a title far too long for a figure three inches wide, running off both of its edges")
    ax.plot([0, 1.5], [0, 1])
    ax.set_xlabel("round")
    ax.annotate("one label", (0.5, 0.5))
    ax.annotate("one label", (0.5, 0.5))
    problems = layout_problems(fig)
    assert "axes 0 title outside the figure" in problems
    assert "axes 0 text one label overlaps axes 0 text one label" in problems
    assert any(p.startswith("axes 0: round axis tick") for p in problems)
    plots.plt.close(fig)


def test_run_plots_are_clean() -> None:
    history = [{"round": r, "test_rmse": 1 / (r + 1), "test_rmse_std": 0.01} for r in range(7)]
    title = "fedgnn_ml100k_dp\n" + " ".join(f"task.option_{i}=value_{i}" for i in range(10))
    fig = plots.metric_figure(history, "round", "round t", "test_rmse", "test RMSE", title)
    assert layout_problems(fig) == []
    plots.plt.close(fig)


def test_tradeoff_has_a_title_and_its_labels_do_not_overlap(drawn: Callable) -> None:
    module = drawn("plot_tradeoff")
    jobs = [{"protocol": "Async-LinUCB", "threshold": g, "comm_messages": c, "cumulative_regret": r}
            for g, c, r in [(1.01, 3e5, 447), (1.5, 1.2e5, 460), (3, 4e4, 491), (10, 1.7e4, 520), (100, 1.6e4, 937),
                            (math.inf, 0, 7903)]]
    jobs += [{"protocol": "Sync-LinUCB", "threshold": d, "comm_messages": c, "cumulative_regret": r}
             for d, c, r in [(0.1, 1e6, 414), (1, 3e5, 420), (10, 6.7e4, 435), (100, 1.77e4, 523), (1000, 3952, 1504)]]
    fig = module.draw(jobs, "cumulative_regret")
    assert fig.axes[0].get_title()
    assert len(fig.axes[0].texts) == len(jobs)
    assert layout_problems(fig) == []


def test_gossip_figure_wraps_a_long_title(drawn: Callable) -> None:
    module = drawn("gossip_figure")
    runs = [(eps, [{"steps": t, "cumulative_regret": t ** 0.7 / eps, "cumulative_regret_min": 0.9 * t ** 0.7 / eps,
                    "cumulative_regret_max": 1.1 * t ** 0.7 / eps} for t in range(10_000, 1_000_001, 10_000)])
            for eps in (1.0, 2.0, 5.0, math.inf)]
    fig = module.draw(runs, "gossip_synthetic_n10: N = 10 agents on the ring C10, M = 5 arms, 100 trials, T = 10^6")
    assert "\n" in fig.axes[0].get_title()
    assert layout_problems(fig) == []


def test_recsys_figure_has_one_readable_legend(drawn: Callable) -> None:
    module = drawn("recsys_table")
    curves = {setting: {model: [(np.arange(1, 101), _curve(100, 1e-3, seed)) for seed in range(3)]
                        for model in ("MF", "NeuMF", "LightGCN", "FedGNN")}
              for setting in ("central", "federated", "federated + DP ε=10")}
    fig = module.draw(curves, "test NDCG@10")
    (legend,) = fig.legends
    assert legend.get_texts()[0].get_fontsize() >= 8
    assert layout_problems(fig) == []


def test_robust_figures_are_clean(drawn: Callable, tmp_path: Path) -> None:
    module = drawn("robust_table")
    rules, fractions, privacies = ["FedSGD", "CoordinateMedian", "Krum", "Bulyan"], [0.0, 0.05, 0.1, 0.2], ["none",
                                                                                                         "ε = 10"]
    stats = {(rule, f, p, metric): (0.2 + i * 0.01 + f, 0.01) for i, rule in enumerate(rules) for f in fractions
             for p in privacies for metric in module.METRICS}
    module.plot_grid(stats, rules, fractions, privacies, tmp_path / "grid.png",
                     "FedGNN on ML-100K under item promotion: benign RMSE and target exposure against the malicious "
                     "fraction, mean ± std over three seeds")
    curves = {name: [_curve(40, -0.01, seed) + 1 for seed in range(2)] for name in module.SERVERS}
    module.plot_servers(curves, list(module.SERVERS), tmp_path / "servers.png")
    assert_clean(drawn.figures, 2)


def test_dp_utility_figure_is_clean(drawn: Callable, tmp_path: Path) -> None:
    module = drawn("dp_utility")
    rows = [{"model": m, "placement": p, "epsilon": e, "test_rmse": 0.3 - 0.01 * e + 0.02 * (p == "client")}
            for m in module.MODELS for p in ("client", "server") for e in (1.0, 2.0, 4.0, 8.0)]
    rows += [{"model": m, "placement": "none", "epsilon": math.inf, "test_rmse": 0.2} for m in module.MODELS]
    module.figure(rows, 0.19, "ml100k: accuracy against ε", tmp_path / "dp.png")
    assert_clean(drawn.figures, 1)


def test_bgtplanner_fig3_is_clean(drawn: Callable) -> None:
    module = drawn("bgtplanner_fig3")
    cells = {(mech, planner, float(e)): [{"final_test_rmse": 0.3 - 0.005 * e + 0.001 * i, "final_test_f1": 0.5}]
             for mech in ("gaussian", "laplace") for i, planner in enumerate(module.PLANNERS) for e in (2, 4, 6, 8, 10)}
    assert layout_problems(module.draw(cells)) == []


def test_vfl_figures_are_clean(drawn: Callable) -> None:
    module = drawn("vfl_figure")
    steps = np.arange(100, 5001, 100)
    runs = {}
    for family, policy, vertical in (("ucb", "LinUCB", "VFUCB"), ("ts", "LinTS", "VFTS")):
        for i, (name, label) in enumerate((("vertical", vertical), ("central", f"central {policy}"),
                                           ("partial 0.2", f"partial {policy} 0.2"),
                                           ("partial 0.8", f"partial {policy} 0.8"))):
            runs[(family, name)] = (label, {}, {"steps": steps, "cumulative_regret": _curve(len(steps), 1 + i, i),
                                                "theta_norm_diff_central": np.full(len(steps), -0.1 * i)})
    for fig in (module.draw_fig4(runs), module.draw_fig6(runs)):
        assert layout_problems(fig) == []


def test_fclub_figures_are_clean(drawn: Callable, tmp_path: Path) -> None:
    module = drawn("fclub_figure")
    steps = np.arange(1000, 100_001, 1000, dtype=float)

    def run(method: str, conventions: str, seed: int, **factors: object) -> Any:
        summary = {"steps": 100_000, "cumulative_regret": 100.0 + seed, "cumulative_regret_std": 3.0,
                   "comm_messages": 1000.0 * (seed + 1), "wall_seconds": 1.0, "experiment": "fclub_synthetic"}
        cols = {"steps": steps, "cumulative_regret": _curve(len(steps), 1, seed),
                "cumulative_regret_std": np.ones(len(steps)), "comm_messages": np.cumsum(np.full(len(steps), 3.0))}
        return module.Run(tmp_path / f"{method}{seed}", method, conventions, summary, cols, dict(factors))

    module.comparison([run(m, c, i) for c in ("paper", "authors") for i, m in enumerate(module.METHODS[:6])], tmp_path)
    module.factor_report([run("FCLUB-DC", "paper", i, UD=1 + 10.0 ** -k)
                          for i, k in enumerate(range(1, 6))], "UD", tmp_path / "study.png")
    assert_clean(drawn.figures, 3)


def test_benchmark_figures_are_clean(drawn: Callable, tmp_path: Path) -> None:
    bench_vfl = drawn("bench_vfl")
    costs = [{"K": K, "d": d, **{f"{n}_{kind}": 1 + d / K for n in ("ucb", "ts") for kind in ("measured", "model")}}
             for K in (100, 1000) for d in (10, 50, 100, 500)]
    bench_vfl.figure(costs, tmp_path / "vfl_fig5.png")
    bench_scale = drawn("bench_scale")
    runs = [{"protocol": p, "layout": layout, "clients": n, "peak_mib": n / 100, "steps_per_s": 1e5 / n,
             "steps": 100_000} for p in ("AsyncLinUCB", "SyncLinUCB") for layout in ("dense", "sparse")
            for n in (10 ** 3, 10 ** 4, 10 ** 5)]
    bench_scale.plot_clients(runs, tmp_path / "clients.png")
    assert_clean(drawn.figures, 2)
