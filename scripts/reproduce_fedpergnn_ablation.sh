#!/usr/bin/env bash
# Ablation of the tuned FedPerGNN-style experiments (docs/papers/fedgnn_benchmarks.md, "FedPerGNN's setting"): the whole
# `fedpergnn_<DATASET>` run, then the same run with one part taken away at a time, each one Hydra multirun over the
# seeds; then one table of the test RMSE on the original scale at the best validation round (selected_test_rmse_raw,
# mean ± sample std over the seeds) beside the whole run's (scripts/ablation_table.py: OUT/ablation.md, printed).
# Usage: bash scripts/reproduce_fedpergnn_ablation.sh [OUT_DIR] [SEEDS] [JOBS] [OVERRIDES...]
#   SEEDS: Hydra list of seeds (default 0,1,2); JOBS: multiruns side by side (2); OVERRIDES: Hydra overrides for
#   every row, recorded under the table (e.g. task.rounds=100). DATASET (default flixster): ml100k, douban, flixster or yahoo_music; the side
#   graph rows only where the experiment uses one (flixster, yahoo_music). PARTS (default: every row): the rows to
#   run, of full expansion side_graph side_vectors biases head init l2 residual mean_init.
# Time on this 2-core machine, 3 seeds, beside other jobs: Flixster about 30 minutes, YahooMusic about 15; ML-100K
# and Douban take 10-30 minutes a run.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
OUT=$(absolute "${1:-reproductions/fedpergnn_ablation}")  # relative to where the script was called from
cd "$(dirname "$0")/.."
SEEDS=${2:-0,1,2}
JOBS=${3:-2}
shift $(( $# < 3 ? $# : 3 ))
DATASET=${DATASET:-flixster}
PY=.venv/bin/python
[[ $SEEDS =~ ^[0-9]+(,[0-9]+)*$ ]] || fail "SEEDS must be a comma-separated list of seeds, got '$SEEDS'"
positive_int JOBS "$JOBS"
case $DATASET in ml100k|douban) SIDE=0 ;; flixster|yahoo_music) SIDE=1 ;;
  *) fail "DATASET must be ml100k, douban, flixster or yahoo_music, got '$DATASET'" ;; esac
ALL="full expansion side_graph side_vectors biases head init l2 residual mean_init"
PARTS=${PARTS:-$ALL}
[ -n "${PARTS// /}" ] || fail "PARTS: name at least one row (rows: $ALL)"
for part in $PARTS; do
  [[ " $ALL " == *" $part "* ]] || fail "PARTS: unknown row '$part' (rows: $ALL)"
  [ "$(tr ' ' '\n' <<< "$PARTS" | grep -cx "$part")" = 1 ] || fail "PARTS: row '$part' is named twice"
  if [ "$SIDE" = 0 ] && [[ $part == side_* ]]; then
    fail "PARTS: $part needs a side graph (DATASET=flixster or yahoo_music)"
  fi
done
[ "$SIDE" = 1 ] || PARTS=$(echo "$PARTS" | tr ' ' '\n' | grep -v '^side_' | tr '\n' ' ')
# the biases also carry mean_init (mu's start) and, with a side graph, the smoothed biases: all three go together
NO_BIASES="model.bias=false task.mean_init=false"
[ "$SIDE" = 0 ] || NO_BIASES="$NO_BIASES task.side_graphs.biases=false"
declare -A ROWS=(
  [full]="|the whole experiment"
  [expansion]="task.expansion.neighbours=0|without graph expansion"
  [side_graph]="task.side_graphs.items=0 task.side_graphs.biases=false|without the item graph"
  [side_vectors]="task.side_graphs.biases=false|the item graph on the vectors only (biases not smoothed)"
  [biases]="$NO_BIASES|without the mean and biases"
  [head]="model.head=sigmoid|the sigmoid head instead of the linear one"
  [init]="model.init_std=1|N(0, 1) initial embeddings (FedGNN's)"
  [l2]="task.weight_decay=0|without L2"
  [residual]="model.residual=false|without the residual layers"
  [mean_init]="task.mean_init=false|mu starting at 0, not the mean training rating"
)
fresh_out "$OUT"
{  # what scripts/ablation_table.py tabulates: the experiment and every row's overrides, then each row's folder,
   # label and overrides
  printf '%s\t%s\n' "fedpergnn_$DATASET" "$*"
  for part in $PARTS; do printf '%s\t%s\t%s\n' "$part" "${ROWS[$part]#*|}" "${ROWS[$part]%%|*}"; done
} > "$OUT/rows.tsv"
row() {  # row PART [OVERRIDES...]: one multirun over the seeds into OUT/PART
  local part=$1; shift
  # shellcheck disable=SC2086  # a row's overrides are words
  $PY train.py -m +experiment="fedpergnn_$DATASET" ${ROWS[$part]%%|*} seed="$SEEDS" plots=false \
    logger.tensorboard=false "$@" hydra.sweep.dir="$OUT/$part" > "$OUT/$part.log" 2>&1 || echo "$part" >> "$OUT/FAILED"
}
for part in $PARTS; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 2; done
  row "$part" "$@" &
done
wait
status=0  # a failed row keeps its place in the table, with the seeds that finished
$PY scripts/ablation_table.py "$OUT" || status=$?
if [ -f "$OUT/FAILED" ]; then
  fail "failed rows (see their .log files in $OUT): $(tr '\n' ' ' < "$OUT/FAILED")"
fi
exit "$status"
