#!/usr/bin/env bash
# The field's protocol on full MNIST (the `tune` presets; docs/MEASURED.md, "The field's
# protocol"): each benchmark's screen on seed 0 (8 arms x 5 draws), then every rule's pick of
# every arm on seeds 1-3, then the comparison of both. A finished sweep is skipped, an
# unfinished one continued (--resume): run the script again to continue after a stop. Run it
# from a worktree at a fixed commit.
#
#   bench/tune_protocol.sh ROOT OUT [screen|rows|compare]   # e.g. ../shared/data/mnist runs/tune
set -euo pipefail
root=${1:?usage: bench/tune_protocol.sh MNIST_ROOT OUT [screen|rows|compare]}
out=${2:?usage: bench/tune_protocol.sh MNIST_ROOT OUT [screen|rows|compare]}
part=${3:-screen}
python=${PYTHON:-python}

# shellcheck source=bench/sweep_step.sh
. "$(dirname "$0")/sweep_step.sh"  # sweep OUT_DIR ARGS...

for bench in ${BENCHES:-biased_mnist digits}; do
  case "$part" in
    screen) sweep "$out/$bench/screen" "$bench" --preset tune ;;
    rows)
      # shellcheck disable=SC2046  # the flags are words
      sweep "$out/$bench/rows" "$bench" --preset tune --seeds 1,2,3 \
        $("$python" -m analysis.comparison "$out/$bench/screen" --rows-flags) ;;
    compare)
      "$python" -m analysis.comparison "$out/$bench/screen" "$out/$bench/rows" \
        --out "$out/$bench" ;;
    *) echo "error: part must be screen, rows or compare, got $part" >&2; exit 2 ;;
  esac
done
