#!/usr/bin/env bash
# The field's protocol on full MNIST (the `tune` presets; docs/MEASURED.md, "The field's
# protocol"): each benchmark's screen on seed 0 (8 arms x 5 draws), then every rule's pick of
# every arm on seeds 1-3, then the comparison of both. A finished sweep is skipped, an
# unfinished one continued (--resume): run the script again to continue after a stop. Run it
# from a worktree at a fixed commit. On another machine (OUT gone), DONE=DIR starts each sweep
# from the rows DIR/<bench>_<part>.csv holds (--done: bench/results/tune_protocol/), and
# `python -m sweeps export OUT/<bench>/<part> DIR/<bench>_<part>.csv` keeps what finished.
#
#   bench/tune_protocol.sh ROOT OUT [screen|rows|compare]   # e.g. ../shared/data/mnist runs/tune
set -euo pipefail
root=${1:?usage: bench/tune_protocol.sh MNIST_ROOT OUT [screen|rows|compare]}
out=${2:?usage: bench/tune_protocol.sh MNIST_ROOT OUT [screen|rows|compare]}
part=${3:-screen}
python=${PYTHON:-python}

# shellcheck source=bench/sweep_step.sh
. "$(dirname "$0")/sweep_step.sh"  # sweep OUT_DIR ARGS...

done_flag() {  # BENCH PART: --done CSV for a sweep starting afresh where DONE holds its rows
  local csv="${DONE:-}/$1_$2.csv"
  if [ -n "${DONE:-}" ] && [ -f "$csv" ] && [ ! -d "$out/$1/$2/tune" ]; then
    echo "--done $csv"
  fi
}

rows_of() {  # BENCH PART: the sweep's results where they are, else DONE's CSV of them
  if [ -f "$out/$1/$2/results.parquet" ]; then echo "$out/$1/$2"; else echo "${DONE:-.}/$1_$2.csv"; fi
}

# shellcheck disable=SC2046  # done_flag and --rows-flags print flags: words
for bench in ${BENCHES:-biased_mnist digits}; do
  case "$part" in
    screen) sweep "$out/$bench/screen" "$bench" --preset tune $(done_flag "$bench" screen) ;;
    rows)
      sweep "$out/$bench/rows" "$bench" --preset tune --seeds 1,2,3 \
        $("$python" -m analysis.comparison "$(rows_of "$bench" screen)" --rows-flags) \
        $(done_flag "$bench" rows) ;;
    compare)
      "$python" -m analysis.comparison "$(rows_of "$bench" screen)" "$(rows_of "$bench" rows)" \
        --out "$out/$bench" ;;
    *) echo "error: part must be screen, rows or compare, got $part" >&2; exit 2 ;;
  esac
done
