#!/usr/bin/env bash
# Reproduce Fig. 2(a)-(c) of Zhu et al. (Gossip_UCB / Fed_UCB): eps in {1, 2, 5, inf}, T = 10^6, 100 trials each,
# then draw the figures and print the R(6e5) tables. The four eps levels of a figure run as one sweep (one process:
# Python, torch and the compiled kernels load once). Extra arguments are Hydra overrides for every run.
# Usage: bash scripts/reproduce_gossip.sh [OUT_DIR] [TRIALS] [EXPERIMENTS] [OVERRIDES...]
#   EXPERIMENTS: comma-separated, default gossip_synthetic_k3,gossip_synthetic_n10,gossip_diabetes
#   (Fig. 2(a)+(b) alone: gossip_synthetic_k3,gossip_synthetic_n10)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-reproductions/gossip}
R=${2:-100}
EXPERIMENTS=${3:-gossip_synthetic_k3,gossip_synthetic_n10,gossip_diabetes}
shift $(( $# < 3 ? $# : 3 ))
PY=.venv/bin/python
source scripts/lib.sh
positive_int TRIALS "$R"
fresh_out "$OUT"
for exp in ${EXPERIMENTS//,/ }; do
  logged "$OUT/$exp.log" $PY train.py -m +experiment="$exp" privacy.epsilon=1,2,5,inf replicates="$R" "$@" \
    hydra.sweep.dir="$OUT/$exp" "hydra.sweep.subdir=eps_\${privacy.epsilon}" trainer.enable_progress_bar=false \
    logger.tensorboard=false
  $PY scripts/gossip_figure.py "$OUT/$exp.png" "$OUT/$exp"/eps_*/ --title "$exp" > "$OUT/$exp.md"
done
echo "done: $OUT"
