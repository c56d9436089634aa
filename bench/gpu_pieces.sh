#!/usr/bin/env bash
# Table 1 under the paper's protocol on a lent GPU (the `device` tool's `run`), one step
# after another, committing what comes back after each call. The device machine has torch, pandas, pyarrow and
# torchvision, no Ray and no network: the code runs without Ray (sweeps/piece.py), and MNIST
# travels gzipped in the ignored folder .gpu. Once, here, from the project root:
#
#   mkdir -p .gpu && tar czf .gpu/mnist.tar.gz -C ../shared/data/mnist MNIST
#   mkdir -p .git/info; grep -qx '/.gpu/' .git/info/exclude || echo /.gpu/ >> .git/info/exclude
#
# Then, one device call each (carry [".gpu"]):
#   bash bench/gpu_pieces.sh measure        # ~3 min: bench/precision.py, step times and slices
#   bash bench/gpu_pieces.sh piece 500      # the next whole paper trials that fit 500 s
# and here, after each: copy $OUT's files back (files_at) as the lines it prints say, e.g.
#   python -m sweeps export FILES/piece/epochs.csv bench/results/paper_gpu/epochs.csv
set -euo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
out=${OUT:-results/gpu_pieces}
root=/tmp/mnist
if [ ! -d "$root/MNIST/raw" ]; then
  [ -f .gpu/mnist.tar.gz ] || { echo "error: .gpu/mnist.tar.gz missing: make it (this file's header) and carry .gpu" >&2; exit 2; }
  mkdir -p "$root" && tar xzf .gpu/mnist.tar.gz -C "$root"
fi
python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
case "${1:-}" in
  measure)
    mkdir -p "$out/gpu"
    cp bench/results/gpu/piece_costs.json "$out/gpu/piece_costs.json"
    python3 bench/precision.py --root "$root" --report "$out/gpu" --costs "$out/gpu/piece_costs.json"
    ;;
  piece)
    python3 -m sweeps piece --preset paper --root "$root" \
      --done bench/results/paper_gpu/epochs.csv --budget "${2:-500}" --out "$out/piece" "${@:3}"
    ;;
  *)
    echo "usage: bash bench/gpu_pieces.sh measure | piece [BUDGET_S [piece flags]]" >&2
    exit 2
    ;;
esac
