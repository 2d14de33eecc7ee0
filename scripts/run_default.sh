#!/usr/bin/env bash
# Set up (first time) and run the default experiment: Async-LinUCB on a small synthetic world, no download.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python train.py "$@"
