"""The ablation table of scripts/reproduce_fedpergnn_ablation.sh: one row per multirun named in ``OUT/rows.tsv``
(its folder, label and overrides), the mean ± sample std over its seeds of the test RMSE on the original scale at the
best validation round (``selected_test_rmse_raw``), written to ``OUT/ablation.md`` and printed.

    .venv/bin/python scripts/ablation_table.py OUT
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

from fedrec.app.sweeps import pivot, read_runs
from fedrec.errors import ConfigError, run_script
from fedrec.utils.io import atomic_write

METRIC = "selected_test_rmse_raw"


def table(out: Path) -> str:
    """The Markdown table of the rows in ``out/rows.tsv``."""
    rows_file = out / "rows.tsv"
    if not rows_file.is_file():
        raise ConfigError(f"{rows_file}: missing (the ablation script writes it: part, label, overrides per line)")
    with rows_file.open() as f:
        rows = list(csv.reader(f, delimiter="\t"))
    experiment = rows[0][0]
    lines = [f"| {experiment} | overrides | test RMSE (original scale) at the best validation round | seeds |",
             "|---|---|---|---|"]
    for part, label, overrides in rows[1:]:
        cell = pivot(read_runs(out / part), METRIC).iloc[0]
        value = f"{cell['mean']:.4f}" + (f" ± {cell['std']:.4f}" if cell["runs"] > 1 else "")
        lines.append(f"| {label} | {f'`{overrides}`' if overrides else ''} | {value} | {int(cell['runs'])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="the ablation script's output folder")
    args = p.parse_args()

    def write() -> None:
        text = table(args.out)
        atomic_write(args.out / "ablation.md", lambda f: f.write(text), mode="w")
        print(text, end="")

    run_script(write)


if __name__ == "__main__":
    main()
