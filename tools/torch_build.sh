#!/bin/sh
# Is $1 a torch build that TORCH_CUDA may name (the first words of tools/torch_builds.txt)?
# Silent, exit status 0, if it is; else one `error:` line naming the builds, exit status 2.
# Run by the Makefile (with TORCH_CUDA set), the Dockerfile and cluster.yaml's GPU workers,
# each before it installs anything.
list="$(dirname "$0")/torch_builds.txt"
builds=$(awk '!/^[[:space:]]*(#|$)/ {printf "%s%s", sep, $1; sep = ", "}' "$list" 2>/dev/null)
if [ -z "$builds" ]; then
  echo "error: no torch builds listed in $list" >&2
  exit 2
fi
if [ -n "$1" ] && awk -v b="$1" '!/^[[:space:]]*#/ && $1 == b {found = 1} END {exit !found}' "$list"
then
  exit 0
fi
echo "error: TORCH_CUDA=$1 is not a torch build: one of $builds (tools/torch_builds.txt)" >&2
exit 2
