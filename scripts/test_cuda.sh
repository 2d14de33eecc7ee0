#!/usr/bin/env bash
# The tests that need a CUDA device (marked `cuda`, skipped elsewhere), in one short command for a GPU machine: every
# recommendation model, client DP, robust rules, server optimisers, ranking and the bandit protocols against the CPU
# run, and train.py with trainer.accelerator=cuda; with them the host-synchronisation counts of a round. Exits
# non-zero without a device, so a run that tested nothing cannot pass. Python: $PYTHON, else .venv's, else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'error: no CUDA device (torch.cuda.is_available() is False)')"
"$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_host_sync.py "$@"
