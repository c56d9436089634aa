#!/usr/bin/env bash
# Group DRO's and balanced MI's screens on full MNIST, seed 0, one sweep after another (docs/MEASURED.md, "Group
# DRO as published, and balanced MI"): Group DRO as published at each (eta, weight decay) of
# the grid, then mi_backprop under group-balanced MI at lam 0 / .3 / 1 / 3, on Biased MNIST
# (rho .997) and Colored MNIST (sigma .030). PARTS="dro" or "balanced" runs one of them;
# PARTS="dro_rows balanced_rows" runs the three-seed rows at the screens' picks (ROW_ETA,
# ROW_DECAY; ROW_LAM_biased_mnist, ROW_LAM_digits; ROW_SUFFIX names another pick's rows, e.g.
# ROW_SUFFIX=_lam0.3 writes OUT/BENCH/balanced_rows_lam0.3); PARTS=reweight_rows runs
# group_reweight's (ROW_LAM_REWEIGHT, 1) on the same groups. A sweep whose results are written is
# skipped, an unfinished one continued (--resume): run the script again to continue after a stop.
#
#   bench/group_screen.sh ROOT OUT        # e.g. ../shared/data/mnist runs/group_screen
set -euo pipefail
root=${1:?usage: bench/group_screen.sh MNIST_ROOT OUT}
out=${2:?usage: bench/group_screen.sh MNIST_ROOT OUT}
python=${PYTHON:-python}
# eta: Sagawa et al.'s default and ten times it (SubpopBench searches 1e-3..1e-1); weight
# decay: none, and 1e-2 (coupled L2 under Adam at lr 1e-3: about the size of the task gradient
# once the training set is fitted).
etas=${DRO_ETAS:-0.01 0.1}
decays=${DRO_DECAYS:-0 0.01}

# shellcheck source=bench/sweep_step.sh
. "$(dirname "$0")/sweep_step.sh"  # sweep OUT_DIR ARGS...

parts=${PARTS:-dro balanced}  # which screens, in this order
for part in $parts; do
  for bench in ${BENCHES:-biased_mnist digits}; do  # BENCHES: which, in this order
    if [ "$part" = balanced ]; then
      sweep "$out/$bench/balanced_screen" "$bench" --preset balanced_screen
      continue
    fi
    if [ "$part" = dro_rows ]; then  # seeds 0-2 at the screen's (eta, weight decay)
      sweep "$out/$bench/dro_rows${ROW_SUFFIX:-}" "$bench" --preset balanced_rows --method group_dro \
        --dro-step "${ROW_ETA:?set ROW_ETA}" --weight-decay "${ROW_DECAY:?set ROW_DECAY}"
      continue
    fi
    if [ "$part" = reweight_rows ]; then  # seeds 0-2, group_reweight on the same groups
      sweep "$out/$bench/reweight_rows${ROW_SUFFIX:-}" "$bench" --preset balanced_rows \
        --method group_reweight --lam "${ROW_LAM_REWEIGHT:-1}"
      continue
    fi
    if [ "$part" = balanced_rows ]; then  # seeds 0-2 at the screen's lambda, per benchmark
      lam_var="ROW_LAM_${bench}"
      sweep "$out/$bench/balanced_rows${ROW_SUFFIX:-}" "$bench" --preset balanced_rows \
        --method mi_backprop --lam "${!lam_var:?set $lam_var}"
      continue
    fi
    for eta in $etas; do
      for wd in $decays; do
        # One trial a sweep: both cores to it.
        sweep "$out/$bench/dro_eta${eta}_wd${wd}" "$bench" --preset dro_screen \
          --dro-step "$eta" --weight-decay "$wd" --cpus-per-trial 2
      done
    done
  done
done
