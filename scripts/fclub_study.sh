#!/usr/bin/env bash
# The parameter studies of Liu et al. §5 (Fig. 3, App. E.2) on clean one-factor grids:
# CDP-FCLUB-DC on the synthetic world, one factor varied at a time, the others at the defaults n = 40, m = 4, L = 5,
# d = 10, U = D = 1.01, ε = 1 (δ = 0.1, K = 10):
#   n in {20, 40, 80} (env.num_clients)        m in {2, 4, 8} (env.num_clusters)   L in {1, 2, 5, 10} (env.num_servers)
#   d in {5, 10, 20} (env.dim)                 U = D in {1.001, 1.01, 1.1, 1.5}    ε in {0.5, 1, 2, 8}
# Every grid uses the ortho-cap θ (env.theta=ortho_cap: θ_j = [q_j/√2, 1/√2], q_j orthonormal, gap 1), not the
# authors' file: that file holds exactly 4 θ for exactly 40 users, so m, n and d could not vary. Hence the default
# point differs from reproduce_fclub.sh's (theta=authors). ortho_cap needs m <= d - 1, m and L must divide n.
# One Hydra multirun per factor (OUT_DIR/<factor>/, one subfolder per value); U = D is one axis because the download
# threshold is set to the interpolation ${protocol.upload_threshold}. Then one PNG per factor
# (OUT_DIR/study_<factor>.png: regret curves, regret at T and messages at T against the factor, ±1 std over seeds)
# and the tables (OUT_DIR/study.md, printed too).
# Usage: bash scripts/fclub_study.sh [OUT_DIR] [SEEDS] [STEPS]
#   SEEDS: replicates per run (default 10); STEPS: T (default 20000, a multiple of 10); FCLUB_METHOD=fclub_dc studies
#   the non-private FCLUB-DC instead (no ε grid): at the paper's constants CDP-FCLUB-DC merges every cluster, so its
#   grids are flat, and FCLUB-DC's show how the factors act on the clustering itself; FCLUB_CONVENTIONS=authors
#   runs the grids under the authors' conventions preset instead of the paper's (for CDP-FCLUB-DC that includes their
#   noise placement, protocol.noise_placement=trigger, which is not differentially private).
set -euo pipefail
OUT=${1:-reproductions/fclub_study}
R=${2:-10}
T=${3:-20000}
CONVENTIONS=${FCLUB_CONVENTIONS:-paper}
METHOD=${FCLUB_METHOD:-cdp_fclub_dc}
source "$(dirname "$0")/lib.sh"
positive_int SEEDS "$R"
positive_int STEPS "$T"
SPR=$(fclub_rows "$T") || exit 2
case $CONVENTIONS in paper|authors) ;; *) fail "FCLUB_CONVENTIONS must be paper or authors, got '$CONVENTIONS'" ;; esac
case $METHOD in cdp_fclub_dc|fclub_dc) ;; *) fail "FCLUB_METHOD must be cdp_fclub_dc or fclub_dc, got '$METHOD'" ;; esac
OUT=$(absolute "$OUT")  # relative to where the script was called from
cd "$(dirname "$0")/.."
PY=.venv/bin/python
fresh_out "$OUT"
excluded=experiment,protocol,protocol.conventions,env.theta,protocol.download_threshold,replicates,task.steps
excluded+=,task.steps_per_round,trainer.enable_progress_bar,logger.tensorboard,plots
common=(+experiment=fclub_synthetic protocol="$METHOD" protocol.conventions="$CONVENTIONS" env.theta=ortho_cap
        replicates="$R" task.steps="$T" task.steps_per_round="$SPR" trainer.enable_progress_bar=false
        logger.tensorboard=false plots=false "hydra.sweep.subdir=\${hydra.job.override_dirname}"
        "hydra.job.config.override_dirname.exclude_keys=[$excluded]")
study() {  # study NAME OVERRIDE...: one factor's multirun into OUT/NAME
  local name=$1 start=$SECONDS
  shift
  logged "$OUT/$name.log" $PY train.py -m "${common[@]}" hydra.sweep.dir="$OUT/$name" "$@"
  echo "$name: $* -- $((SECONDS - start)) s"
}
echo "$METHOD parameter study ($CONVENTIONS conventions, theta=ortho_cap), $R seeds, T = $T: $OUT"
total=$SECONDS
study n env.num_clients=20,40,80
study m env.num_clusters=2,4,8
study L env.num_servers=1,2,5,10
study d env.dim=5,10,20
study UD protocol.upload_threshold=1.001,1.01,1.1,1.5 'protocol.download_threshold=${protocol.upload_threshold}'
if [ "$METHOD" = cdp_fclub_dc ]; then study epsilon privacy.epsilon=0.5,1,2,8; fi
echo "all runs: $((SECONDS - total)) s"
$PY scripts/fclub_figure.py --study "$OUT" > "$OUT/study.md"
cat "$OUT/study.md"
echo "done: $OUT (figures: $OUT/study_*.png)"
