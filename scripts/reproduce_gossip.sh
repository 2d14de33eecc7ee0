#!/usr/bin/env bash
# Reproduce Fig. 2(a)-(c) of Zhu et al. (Gossip_UCB / Fed_UCB): eps in {1, 2, 5, inf}, T = 10^6, 100 trials each,
# then draw the figures and print the R(6e5) tables. Usage: bash scripts/reproduce_gossip.sh [OUT_DIR] [TRIALS]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-reproductions/gossip}
R=${2:-100}
PY=.venv/bin/python
source scripts/lib.sh
fresh_out "$OUT"
for exp in gossip_synthetic_k3 gossip_synthetic_n10 gossip_diabetes; do
  mkdir -p "$OUT/$exp"
  for eps in 1 2 5 inf; do
    logged "$OUT/$exp/eps_$eps.log" $PY train.py +experiment=$exp privacy.epsilon=$eps replicates="$R" \
      hydra.run.dir="$OUT/$exp/eps_$eps" trainer.enable_progress_bar=false logger.tensorboard=false
  done
  $PY scripts/gossip_figure.py "$OUT/$exp.png" "$OUT/$exp"/eps_*/ --title "$exp" > "$OUT/$exp.md"
done
echo "done: $OUT"
