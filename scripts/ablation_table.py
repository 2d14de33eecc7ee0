"""The ablation table of scripts/reproduce_fedpergnn_ablation.sh: one row per multirun named in ``OUT/rows.tsv``
(its first line: the experiment and the overrides given to every row; then each row's folder, label and
overrides), the mean ± sample std over its seeds of the test RMSE on the original scale at the best validation
round (``selected_test_rmse_raw``), written to ``OUT/ablation.md`` and printed. A row the script recorded as
failed (``OUT/FAILED``) keeps its place: its finished seeds, marked, or "failed" when none finished.

    .venv/bin/python scripts/ablation_table.py OUT
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

from fedrec.app.sweeps import pivot, read_runs
from fedrec.errors import ConfigError, run_script
from fedrec.utils.io import WriteError, atomic_write

METRIC = "selected_test_rmse_raw"


def read_rows(rows_file: Path) -> tuple[list[str], list[list[str]]]:
    """``rows.tsv``'s header (the experiment, then the overrides every row got, if any) and its rows (folder, label,
    overrides); a malformed file is refused naming the line."""
    if not rows_file.is_file():
        raise ConfigError(f"{rows_file}: missing (the ablation script writes it: the experiment, then a row per line)")
    with rows_file.open() as f:
        lines = list(csv.reader(f, delimiter="\t"))
    if not lines or not lines[0] or not lines[0][0]:
        raise ConfigError(f"{rows_file}:1: expected the experiment's name")
    for n, row in enumerate(lines[1:], start=2):
        if len(row) != 3 or not row[0]:
            raise ConfigError(f"{rows_file}:{n}: expected folder, label and overrides separated by tabs, got {row!r}")
    if len(lines) == 1:
        raise ConfigError(f"{rows_file}: no rows")
    return lines[0], lines[1:]


def table(out: Path) -> str:
    """The Markdown table of the rows in ``out/rows.tsv``."""
    header, rows = read_rows(out / "rows.tsv")
    failed = set((out / "FAILED").read_text().split()) if (out / "FAILED").is_file() else set()
    lines = [f"| {header[0]} | overrides | test RMSE (original scale) at the best validation round | seeds |",
             "|---|---|---|---|"]
    for part, label, overrides in rows:
        try:
            cell = pivot(read_runs(out / part), METRIC).iloc[0]
            value, runs = f"{cell['mean']:.4f}" + (f" ± {cell['std']:.4f}" if cell["runs"] > 1 else "") + (
                f" (some seeds failed: `{part}.log`)" if part in failed else ""), int(cell["runs"])
        except ConfigError as e:
            if part not in failed:
                raise ConfigError(f"row {part!r} ({out / part}): {e}") from None
            value, runs = f"failed (`{part}.log`)", 0
        lines.append(f"| {label} | {f'`{overrides}`' if overrides else ''} | {value} | {runs} |")
    given = " ".join(header[1:]).strip()
    return "\n".join(lines) + "\n" + (f"\nEvery row also ran with `{given}`.\n" if given else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="the ablation script's output folder")
    args = p.parse_args()

    def write() -> None:
        text = table(args.out)
        try:
            atomic_write(args.out / "ablation.md", lambda f: f.write(text), mode="w")
        except WriteError as e:
            raise ConfigError(f"output: {e}") from None
        print(text, end="")

    run_script(write)


if __name__ == "__main__":
    main()
