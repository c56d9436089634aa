#!/bin/sh
# Is $1 (the Makefile's PYTHON) a Python this project runs on (3.10+, pyproject.toml)? Silent,
# exit status 0, if it is; else one `error:` line saying how to name another, exit status 2.
# Run by the Makefile before it creates a venv, so a login node's old python3 (RHEL/Rocky 8:
# 3.6) stops before anything is downloaded.
python=${1:-python3}
version=$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)
if [ -z "$version" ]; then
  echo "error: PYTHON=$python does not run: this project needs Python 3.10+; give one, e.g. make PYTHON=python3.11 ... (on a cluster, \`module load\` a Python first: docs/CLUSTER.md)" >&2
  exit 2
fi
major=${version%%.*}
rest=${version#*.}
minor=${rest%%.*}
if [ "$major" -gt 3 ] || { [ "$major" -eq 3 ] && [ "$minor" -ge 10 ]; }; then
  exit 0
fi
echo "error: PYTHON=$python is Python $version: this project needs 3.10+; give another, e.g. make PYTHON=python3.11 ... (on a cluster, \`module load\` a Python first: docs/CLUSTER.md)" >&2
exit 2
