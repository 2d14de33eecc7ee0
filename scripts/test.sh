#!/usr/bin/env bash
# Set up (first time) and run the test suite (long reproductions marked `slow` are excluded; run them
# with `.venv/bin/python -m pytest -m slow`). Two pytest-xdist workers: the suite is mostly single-threaded
# compiles and small runs, so two workers share two cores; each test file runs on one worker (--dist loadfile), so
# the numba kernels a file needs compile once instead of in both workers at the same time (12.6 minutes here on
# 2026-11-27 with a cold cache, against 13.2-14.2 distributing single tests; pass -n 0 for one process). The 25
# slowest tests are listed at the end, to keep an eye on the suite's time. The linter (ruff, its rules in
# pyproject.toml) runs first: a finding fails the run before the tests start.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
export FEDREC_DATA_DIR="${FEDREC_DATA_DIR:-$PWD/data}"
.venv/bin/python -m pytest -m "not slow" -q -n 2 --dist loadfile --durations=25 "$@"
