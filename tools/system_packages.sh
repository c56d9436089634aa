#!/usr/bin/env bash
# The system packages the test suite runs: rsync (`ray up` ships files with it:
# tests/test_cluster_files.py), Slurm and munge (tests/test_slurm.py starts a Slurm of its
# own). Installed with apt-get where this runs as root, else one line naming them and the
# command, and exit status 1: `make test` stops before the suite.
set -uo pipefail
declare -A package_of=([rsync]=rsync [munged]=munge [slurmctld]=slurmctld [slurmd]=slurmd
                       [sbatch]=slurm-client)
missing=()
for program in rsync munged slurmctld slurmd sbatch; do
  command -v "$program" >/dev/null || [[ -x /usr/sbin/$program ]] \
    || missing+=("${package_of[$program]}")
done
(( ${#missing[@]} == 0 )) && exit 0
command="apt-get install -y ${missing[*]}"
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  echo "installing the system packages the tests need: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # A fresh image has no package lists: update only when the install cannot find them.
  if apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 \
           && apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; }; then
    exit 0
  fi
  echo "error: the tests need the system packages ${missing[*]}, and $command failed" >&2
  exit 1
fi
echo "error: the tests need the system packages ${missing[*]}: sudo $command (Debian, Ubuntu)" >&2
exit 1
