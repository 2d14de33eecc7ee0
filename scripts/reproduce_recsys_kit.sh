#!/usr/bin/env bash
# The recommendation kit's tables (docs/papers/recsys_kit.md): MF, NeuMF, LightGCN and FedGNN on MovieLens implicit
# feedback (leave-one-out), each central (task.federated=false), federated, and federated with client DP at
# eps = 10, as one Hydra multirun over seeds per cell; then the table and the NDCG@10-over-rounds figure
# (scripts/recsys_table.py, with the popularity ranking beside).
# Usage: bash scripts/reproduce_recsys_kit.sh [OUT_DIR] [SEEDS] [RANKING] [JOBS] [OVERRIDES...]
#   SEEDS: Hydra list of seeds (default 0,1,2); RANKING: full (every item not trained on, default) or sampled (the
#   held-out item against 99 sampled negatives); JOBS: sweeps run side by side (2); OVERRIDES: Hydra overrides for
#   every run (e.g. task.rounds=50). DATASET=ml1m runs ML-1M (its ratings file must be in the data directory).
# Time on this 2-core machine, ML-100K, 100 rounds, 3 seeds: about 35 minutes per ranking (58 with other jobs running).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-reproductions/recsys_kit}
SEEDS=${2:-0,1,2}
RANKING=${3:-full}
JOBS=${4:-2}
shift $(( $# < 4 ? $# : 4 ))
DATASET=${DATASET:-ml100k}
PY=.venv/bin/python
source scripts/lib.sh
[[ $SEEDS =~ ^[0-9]+(,[0-9]+)*$ ]] || fail "SEEDS must be a comma-separated list of seeds, got '$SEEDS'"
case $RANKING in full|sampled) ;; *) fail "RANKING must be full or sampled, got '$RANKING'" ;; esac
positive_int JOBS "$JOBS"
case $DATASET in ml100k|ml1m) ;; *) fail "DATASET must be ml100k or ml1m, got '$DATASET'" ;; esac
fresh_out "$OUT"
declare -A SETTINGS=([central]="task.federated=false" [federated]="" [dp]="privacy=gaussian privacy.epsilon=10")
cell() {  # cell MODEL SETTING [OVERRIDES...]: one multirun over the seeds into OUT/MODEL_SETTING
  # shellcheck disable=SC2086  # a setting's overrides are words
  $PY train.py -m +experiment="$1_${DATASET}_implicit" ${SETTINGS[$2]} seed="$SEEDS" task.eval.ranking="$RANKING" \
    plots=false logger.tensorboard=false "${@:3}" hydra.sweep.dir="$OUT/$1_$2" > "$OUT/$1_$2.log" 2>&1 \
    || echo "$1 $2" >> "$OUT/FAILED"
}
for model in mf neumf lightgcn fedgnn; do
  for s in central federated dp; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 2; done
    cell "$model" "$s" "$@" &
  done
done
wait
if [ -f "$OUT/FAILED" ]; then
  fail "failed sweeps (see their .log files in $OUT): $(tr '\n' ',' < "$OUT/FAILED")"
fi
$PY scripts/recsys_table.py "$OUT"/*_central "$OUT"/*_federated "$OUT"/*_dp --out "$OUT/table" --popularity
