#!/usr/bin/env bash
# Create .venv (if missing) and install fedrec with its test, documentation and cluster-launcher dependencies (the
# `cluster` extra: Hydra's joblib and submitit launchers, exercised by tests/test_launchers.py) and the `mlflow` extra
# (Lightning's MLflow logger and its SQLite store, exercised by tests/test_loggers.py; about 40 s more) and the `tune`
# extra (Hydra's Optuna sweeper, exercised by tests/test_tuning.py). torch is
# bounded in pyproject.toml so pip takes the CPU wheel available on this machine instead of a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev,docs,cluster,mlflow,tune]'
