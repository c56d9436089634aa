# Sourced by the bench scripts that run sweeps one after another (group_screen.sh,
# tune_protocol.sh): `sweep OUT_DIR ARGS...` runs `python -m sweeps ARGS --root $root --out
# OUT_DIR`, continues it (--resume) where it stopped, or skips it once its results are written.
# shellcheck shell=bash
sweep() {
  local dir=$1; shift
  if [ -f "$dir/results.parquet" ]; then echo "== $dir: done"; return; fi
  local again=()
  [ -d "$dir/tune" ] && again=(--resume)
  echo "== $dir: $*"
  "$python" -m sweeps "$@" --root "$root" --out "$dir" "${again[@]}"
}
