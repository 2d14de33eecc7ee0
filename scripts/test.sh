#!/usr/bin/env bash
# Set up (first time) and run the test suite (long reproductions marked `slow` are excluded; run them
# with `.venv/bin/python -m pytest -m slow`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export FEDREC_DATA_DIR="${FEDREC_DATA_DIR:-$(cd .. && pwd)/shared/data}"
.venv/bin/python -m pytest -m "not slow" -q "$@"
