#!/usr/bin/env bash
# Reproduce Fig. 4 and Fig. 6(a, b) of Cao et al. (vertical federated LinUCB / LinTS) on the synthetic world:
# d = 100 in 5 parties, K = 10, T = 5000, 5 seeds; VFCB, central and partial (ratios 0.2 and 0.8), UCB and TS, in two
# Hydra multiruns (one process each); then draw the figures and print the table. Then the MovieLens-100K replay that
# stands in for the paper's Criteo runs (Fig. 6(c)): eight 5-seed runs, ~12 min, table in OUT_DIR/table_movielens.md.
# Usage: bash scripts/reproduce_vfl.sh [OUT_DIR] [SEEDS]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-reproductions/vfl}
R=${2:-5}
PY=.venv/bin/python
source scripts/lib.sh
fresh_out "$OUT"
common=(+experiment=vfl_synthetic replicates="$R" hydra.sweep.dir="$OUT" "hydra.sweep.subdir=\${hydra.job.override_dirname}"
        trainer.enable_progress_bar=false logger.tensorboard=false plots=false
        "hydra.job.config.override_dirname.exclude_keys=[+experiment,replicates,trainer.enable_progress_bar,logger.tensorboard,plots]")
logged "$OUT/full.log" $PY train.py -m "${common[@]}" protocol=vfucb,central_linucb,vfts,central_lints
logged "$OUT/partial.log" $PY train.py -m "${common[@]}" protocol=partial_linucb,partial_lints \
  protocol.partial_ratio=0.2,0.8
$PY scripts/vfl_figure.py "$OUT" > "$OUT/table.md"
cat "$OUT/table.md"

# MovieLens-100K replay (in place of the paper's Criteo log): full / VFUCB / partial 0.2 and 0.8, under the paper's
# outer-sum contexts and the outer-product alternative
ML="$OUT/movielens"
mlcommon=(+experiment=vfl_movielens replicates="$R" hydra.sweep.dir="$ML" "hydra.sweep.subdir=\${hydra.job.override_dirname}"
          trainer.enable_progress_bar=false logger.tensorboard=false plots=false
          "hydra.job.config.override_dirname.exclude_keys=[+experiment,replicates,trainer.enable_progress_bar,logger.tensorboard,plots]")
logged "$ML.full.log" $PY train.py -m "${mlcommon[@]}" protocol=vfucb,central_linucb env.combine=outer_sum,outer_product
logged "$ML.partial.log" $PY train.py -m "${mlcommon[@]}" protocol=partial_linucb protocol.partial_ratio=0.2,0.8 \
  env.combine=outer_sum,outer_product
$PY scripts/vfl_figure.py --replay "$ML" > "$OUT/table_movielens.md"
cat "$OUT/table_movielens.md"
