#!/usr/bin/env bash
# Reproduce Fig. 2 and Fig. 4 of Liu et al. (FCLUB, UAI 2022): the 8 methods (CDP-FCLUB-DC, FCLUB-DC, FCLUB, SCLUB,
# CLUB, LinUCB, Homo-DC, Homo) x SEEDS seeds (batched as replicates) x T = STEPS rounds, under both conventions
# presets (paper, authors), as one Hydra multirun (16 jobs, one subfolder each, named by its overrides), where the
# authors' preset runs CDP-FCLUB-DC with their code's noise placement (protocol.noise_placement=trigger: the tree
# noise only in the upload trigger, NOT differentially private); plus one run of CDP-FCLUB-DC under the authors'
# preset with the noise in the shared statistics (noise_placement=statistics, the paper's) beside it; then the
# ε study: CDP-FCLUB-DC with ε in {0.25, 0.5, 1, 2, 4, 8, 64, 100, ∞} (paper conventions; ∞ is the
# noise-free private path, i.e. FCLUB-DC), under the paper's node noise and under the accountant's calibration
# (privacy.calibration=accountant: the whole run spends at most ε). Draws the figures into the sweep
# folders and writes the tables (OUT_DIR/table.md, OUT_DIR/table_epsilon_{paper,accountant}.md), printing them too.
# Usage: bash scripts/reproduce_fclub.sh [OUT_DIR] [SEEDS] [STEPS] [DATASET]
#   SEEDS: replicates per run (default 10); STEPS: T (default 100000, a multiple of 10: the tables report the regret
#   at T/10); DATASET: fclub_synthetic (default) | fclub_movielens | fclub_yelp, or the env var FCLUB_DATASET.
# One metrics row every T/50 rounds (T/10 if 50 does not divide T). Time on this 2-core machine with the defaults,
# estimated from T = 1e4 / 3e4 / 1e5 runs: about 2 minutes per conventions value for the comparison and 1 minute
# for the ε study (printed as it goes); add ~2 minutes when numba must recompile the kernels after a source edit.
set -euo pipefail
OUT=${1:-reproductions/fclub}
R=${2:-10}
T=${3:-100000}
DATASET=${4:-${FCLUB_DATASET:-fclub_synthetic}}
source "$(dirname "$0")/lib.sh"
positive_int SEEDS "$R"
positive_int STEPS "$T"
SPR=$(fclub_rows "$T") || exit 2
case $DATASET in
  fclub_synthetic|fclub_movielens|fclub_yelp) ;;
  *) fail "DATASET must be fclub_synthetic, fclub_movielens or fclub_yelp, got '$DATASET'" ;;
esac
OUT=$(absolute "$OUT")  # relative to where the script was called from
cd "$(dirname "$0")/.."
PY=.venv/bin/python
fresh_out "$OUT"
excluded=experiment,replicates,task.steps,task.steps_per_round,trainer.enable_progress_bar,logger.tensorboard,plots
common=(+experiment="$DATASET" replicates="$R" task.steps="$T" task.steps_per_round="$SPR"
        "hydra.sweep.subdir=\${hydra.job.override_dirname}" trainer.enable_progress_bar=false logger.tensorboard=false
        plots=false)

echo "comparison: $DATASET, 8 methods x 2 conventions, $R seeds, T = $T (log: $OUT/compare.log)"
start=$SECONDS
logged "$OUT/compare.log" $PY train.py -m "${common[@]}" hydra.sweep.dir="$OUT/compare" \
  "hydra.job.config.override_dirname.exclude_keys=[$excluded]" \
  protocol=cdp_fclub_dc,fclub_dc,fclub,sclub,club,linucb_per_user,homo_dc,homo protocol.conventions=paper,authors
echo "comparison: $((SECONDS - start)) s"
echo "CDP-FCLUB-DC, authors' conventions, noise in the shared statistics (log: $OUT/compare_statistics.log)"
start=$SECONDS
logged "$OUT/compare_statistics.log" $PY train.py "${common[@]}" protocol=cdp_fclub_dc protocol.conventions=authors \
  protocol.noise_placement=statistics \
  "hydra.run.dir='$OUT/compare/protocol.conventions=authors,protocol.noise_placement=statistics,protocol=cdp_fclub_dc'"
echo "CDP-FCLUB-DC statistics placement: $((SECONDS - start)) s"
$PY scripts/fclub_figure.py "$OUT/compare" > "$OUT/table.md"
cat "$OUT/table.md"

for calibration in paper accountant; do  # the paper's node noise, and the accountant's for the whole run
  echo
  echo "ε study: CDP-FCLUB-DC, paper conventions, $calibration calibration, $R seeds, T = $T (log: $OUT/epsilon_$calibration.log)"
  start=$SECONDS
  logged "$OUT/epsilon_$calibration.log" $PY train.py -m "${common[@]}" hydra.sweep.dir="$OUT/epsilon_$calibration" \
    "hydra.job.config.override_dirname.exclude_keys=[$excluded,protocol,protocol.conventions,privacy.calibration]" \
    protocol=cdp_fclub_dc protocol.conventions=paper privacy.calibration=$calibration \
    privacy.epsilon=0.25,0.5,1,2,4,8,64,100,inf
  echo "ε study: $((SECONDS - start)) s"
  $PY scripts/fclub_figure.py --epsilon "$OUT/epsilon_$calibration" > "$OUT/table_epsilon_$calibration.md"
  cat "$OUT/table_epsilon_$calibration.md"
done
echo "done: $OUT (figures: compare/fclub_fig2_regret.png, compare/fclub_fig4_communication.png,"\
  "epsilon_{paper,accountant}/fclub_epsilon.png)"
