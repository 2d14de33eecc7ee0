#!/usr/bin/env bash
# Reproduce BGTplanner's Table II (ML-100K and FilmTrust; ML-1M too if its file is in the data directory) under
# both privacy conventions, and Figure 3, as Hydra multiruns; then write the tables (Markdown + CSV) and the figure.
# Usage: bash scripts/reproduce_bgtplanner.sh [OUT_DIR] [SEEDS] [JOBS]
#   SEEDS: Hydra list of seeds (default 0,1,2,3,4: the paper's five runs); JOBS: sweeps run side by side (2).
#   CONVENTIONS="paper authors" (default both): paper -> OUT/table2.md, authors (privacy.conventions=authors:
#   the authors' accounting, test-set reward, per-round Adam) -> OUT/table2_authors.md. FIG3=0 skips Figure 3.
# Time on this 2-core machine with the defaults: about 50 minutes for both conventions and Figure 3.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-reproductions/bgtplanner}
SEEDS=${2:-0,1,2,3,4}
JOBS=${3:-2}
FIG3_SEEDS=${FIG3_SEEDS:-0}  # Figure 3 grid: 5 budgets x 4 planners x 2 mechanisms per seed
FIG3=${FIG3:-1}
CONVENTIONS=${CONVENTIONS:-paper authors}
PY=.venv/bin/python
DATA=${FEDREC_DATA_DIR:-data}
source scripts/lib.sh
fresh_out "$OUT"
QUIET=(plots=false logger.tensorboard=false)
sweep() {  # name, then train.py arguments
  local name=$1; shift
  $PY train.py -m "$@" "${QUIET[@]}" hydra.sweep.dir="$OUT/$name" > "$OUT/$name.log" 2>&1 \
    || echo "$name" >> "$OUT/FAILED"
}
datasets=(ml100k filmtrust)
[ -f "$DATA/ml-1m/ratings.dat" ] && datasets+=(ml1m)
jobs=()
for conv in $CONVENTIONS; do
  case $conv in
    # the same 10% validation hold-out as the DP runs, so FedSGD trains on the same ratings
    paper) prefix=""; fedsgd=(data.val_fraction=0.1) ;;
    # the authors train on every training rating and rebuild Adam every round, FedSGD included
    authors) prefix="authors/"; fedsgd=(task.optimizer_state=reset); mkdir -p "$OUT/authors" ;;
    *) fail "CONVENTIONS: expected paper and/or authors, got '$conv'" ;;
  esac
  for ds in "${datasets[@]}"; do
    jobs+=("sweep ${prefix}fedsgd_$ds +experiment=fedgnn_$ds ${fedsgd[*]} seed=$SEEDS")
    for mech in gaussian laplace; do
      jobs+=("sweep ${prefix}table2_${ds}_$mech +experiment=bgtplanner_$ds privacy=$mech privacy.conventions=$conv planner=uniform,adpml,adap,bgtplanner seed=$SEEDS")
    done
  done
done
# Figure 3: ML-100K, final RMSE and F1 against the total budget
if [ "$FIG3" = 1 ]; then
  for mech in gaussian laplace; do
    jobs+=("sweep fig3_$mech +experiment=bgtplanner_ml100k privacy=$mech privacy.epsilon=2,4,6,8,10 planner=uniform,adpml,adap,bgtplanner seed=$FIG3_SEEDS")
  done
fi
for job in "${jobs[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 2; done
  eval "$job" &
done
wait
for conv in $CONVENTIONS; do
  if [ "$conv" = paper ]; then
    $PY scripts/bgtplanner_table.py "$OUT"/table2_* "$OUT"/fedsgd_* --out "$OUT/table2"
  else
    $PY scripts/bgtplanner_table.py "$OUT"/authors/table2_* "$OUT"/authors/fedsgd_* --out "$OUT/table2_authors"
  fi
done
if [ "$FIG3" = 1 ]; then
  $PY scripts/bgtplanner_fig3.py "$OUT"/fig3_* --out "$OUT/fig3.png"
fi
if [ -f "$OUT/FAILED" ]; then
  echo "failed sweeps (see their .log files): $(tr '\n' ' ' < "$OUT/FAILED")" >&2
  exit 1
fi
