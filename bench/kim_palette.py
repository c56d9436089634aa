"""Where `--palette kim` comes from: Kim et al.'s Colored MNIST, decoded from public images.

Kim et al.'s data files (`mnist_10color_jitter_var_*.npy`) cannot be downloaded here. Two
public sources show images of them, both in hushon/learning-not-to-learn-tensorflow (bring it
here with the search tool's `fetch`; pass its git directory as --repo):
- `dataset_inspector.ipynb`: revision cbc6cf1 shows the first 10 training and the first 10
  test images of one file, revision beeb3e4 the first 10 training images of another, as
  28x28 PNGs (base64 in the notebook's JSON);
- `colored-mnist-example.png`: Kim et al.'s figure, 4 training digits of every class (and 2
  rows of test digits), resized.

This script decodes them, checks the stroke against MNIST's grey digits (--root), estimates
each class's mean and the within-class spread, and prints what KIM_COLOURS (in
unbiased/benchmarks/digits/data.py) and docs/MEASURED.md rest on. With --csv it writes every
decoded colour (source, image, label, r, g, b on 0-255).

    .venv/bin/python bench/kim_palette.py --root ../shared/data/mnist \\
        --repo /work/.mirror/hushon+learning-not-to-learn-tensorflow/repo \\
        --csv bench/results/kim_decoded/colours.csv
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# MNIST's first labels (train and test): the notebook shows the first 10 images of each split.
TRAIN_LABELS = [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
TEST_LABELS = [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
# Revisions of dataset_inspector.ipynb whose outputs show images, and the code cell that
# displays dataset['train_image'][:10] / dataset['test_image'][:10] in each.
NOTEBOOK_CELLS = {"A_train": ("cbc6cf1", 6), "A_test": ("cbc6cf1", 7), "B_train": ("beeb3e4", 5)}
FIGURE = "colored-mnist-example.png"
# The figure's digit cells (pixel rows and columns), found from its white separators.
FIGURE_ROWS = [(22, 58), (62, 99), (103, 140), (145, 181)]  # the 4 training rows
FIGURE_COLS = [(5, 42), (44, 80), (82, 119), (120, 157), (159, 195), (197, 234), (235, 272),
               (274, 310), (312, 349), (351, 387)]


def git_show(repo: Path, spec: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), "show", spec], capture_output=True,
                          check=True).stdout


def notebook_images(repo: Path, rev: str, cell: int) -> list[np.ndarray]:
    """The cell's image outputs (its printed outputs in between are skipped)."""
    from PIL import Image

    nb = json.loads(git_show(repo, f"{rev}:dataset_inspector.ipynb"))
    outs = [o for o in nb["cells"][cell]["outputs"] if "image/png" in o.get("data", {})]
    pngs = [base64.b64decode(o["data"]["image/png"]) for o in outs]
    return [np.array(Image.open(io.BytesIO(p)).convert("RGB")) for p in pngs]


def figure_colours(repo: Path) -> np.ndarray:
    """(4, 10, 3): each training cell's colour, the median of its pixels within 15% of the
    brightest (the stroke's interior; its edges are blended with black by the resize)."""
    from PIL import Image

    img = np.array(Image.open(io.BytesIO(git_show(repo, f"HEAD:{FIGURE}"))).convert("RGB"),
                   dtype=float)
    out = np.zeros((len(FIGURE_ROWS), len(FIGURE_COLS), 3))
    for i, (r0, r1) in enumerate(FIGURE_ROWS):
        for j, (c0, c1) in enumerate(FIGURE_COLS):
            cell = img[r0 + 2:r1 - 2, c0 + 2:c1 - 2].reshape(-1, 3)
            norm = np.linalg.norm(cell, axis=1)
            out[i, j] = np.median(cell[norm >= 0.85 * norm.max()], axis=0)
    return out


def pooled_std(x: np.ndarray, y: np.ndarray) -> float:
    ss, dof = 0.0, 0
    for k in np.unique(y):
        s = x[y == k]
        if len(s) > 1:
            ss += float(((s - s.mean(0)) ** 2).sum())
            dof += s.shape[1] * (len(s) - 1)
    return (ss / dof) ** 0.5


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, required=True,
                   help="git directory of hushon/learning-not-to-learn-tensorflow")
    p.add_argument("--root", type=Path, help="full MNIST root: check the stroke mask")
    p.add_argument("--csv", type=Path, help="write every decoded colour here")
    p.add_argument("--sims", type=int, default=3000)
    a = p.parse_args()

    rows = []  # (source, index, label, r, g, b)
    images = {}
    for name, (rev, cell) in NOTEBOOK_CELLS.items():
        imgs = notebook_images(a.repo, rev, cell)
        labels = TEST_LABELS if name.endswith("test") else TRAIN_LABELS
        images[name] = imgs
        for i, (img, label) in enumerate(zip(imgs, labels, strict=True)):
            fg = img.max(-1) > 0
            colours = np.unique(img[fg], axis=0)
            assert len(colours) == 1, f"{name}[{i}] is not one flat colour"
            rows.append((f"notebook {rev} {name}", i, label, *colours[0].tolist()))
    fig = figure_colours(a.repo)
    for i in range(fig.shape[0]):
        for k in range(10):
            rows.append(("figure train row", i, k, *np.round(fig[i, k]).astype(int).tolist()))

    if a.root is not None:
        from unbiased.benchmarks.digits.data import FLAT_THRESHOLD, load_mnist

        digits = load_mnist(a.root)
        for name, imgs in images.items():
            grey = (digits.test_x if name.endswith("test") else digits.train_x)[:10]
            grey = (grey * 255).round().numpy()
            same = [np.array_equal(img.max(-1) > 0, g > FLAT_THRESHOLD)
                    for img, g in zip(imgs, grey, strict=True)]
            black = all((img[g <= FLAT_THRESHOLD] == 0).all()
                        for img, g in zip(imgs, grey, strict=True))
            print(f"{name}: coloured pixels == grey > {FLAT_THRESHOLD}: {sum(same)}/10; "
                  f"every other pixel exactly 0: {black}")

    table = np.array([r[3:] for r in rows], dtype=float) / 255
    labels = np.array([r[2] for r in rows])
    src = np.array([r[0] for r in rows])
    train = ~np.char.endswith(src.astype(str), "A_test")
    nb = np.char.startswith(src.astype(str), "notebook") & train
    figure = np.char.startswith(src.astype(str), "figure")
    print("\nclass  notebook mean (n)         figure mean (n=4)          pooled (KIM_COLOURS)")
    means = np.zeros((10, 3))
    for k in range(10):
        sel_nb, sel_fig, sel = nb & (labels == k), figure & (labels == k), train & (labels == k)
        means[k] = table[sel].mean(0)
        nb_text = (f"{np.round(table[sel_nb].mean(0), 3)} ({sel_nb.sum()})" if sel_nb.any()
                   else "not shown")
        print(f"{k}      {nb_text:26s} {np.round(table[sel_fig].mean(0), 3)!s:26s} "
              f"{np.round(means[k], 3)}")
    both = [k for k in range(10) if (nb & (labels == k)).any()]
    diff = np.array([table[nb & (labels == k)].mean(0) - table[figure & (labels == k)].mean(0)
                     for k in both])
    spread_nb = pooled_std(table[nb], labels[nb])
    print(f"\nwithin-class std (pooled over channels): notebook {spread_nb:.3f}, figure "
          f"{pooled_std(table[figure], labels[figure]):.3f}, both "
          f"{pooled_std(table[train], labels[train]):.3f}")
    print(f"notebook vs figure class means (classes {both}): RMS difference "
          f"{np.sqrt((diff ** 2).mean()):.3f}")

    # Which noise std makes 20 draws (the notebook's labels, these means, clipped to [0, 1]
    # and rounded to 0-255) look like the notebook's spread?
    rng = np.random.default_rng(0)
    y_nb = labels[nb]
    print("\nnoise std -> P(simulated pooled std <= notebook's); var = std^2")
    for std in (0.05, 0.08, 0.09, 0.10, 0.11, 0.12, 0.141, 0.173, 0.224):
        sims = np.array([pooled_std(np.round(np.clip(means[y_nb] + rng.normal(0, std, (
            len(y_nb), 3)), 0, 1) * 255) / 255, y_nb) for _ in range(a.sims)])
        print(f"  std {std:.3f} (var {std * std:.4f}): median {np.median(sims):.3f}, "
              f"P = {np.mean(sims <= spread_nb):.3f}")

    # Colour alone on the decoded training digits: the nearest class mean, each digit
    # left out of its own class's mean.
    hits = []
    for i in np.flatnonzero(nb):
        loo = means.copy()
        k = labels[i]
        others = train & (labels == k)
        others[i] = False
        loo[k] = table[others].mean(0)
        hits.append(int(np.argmin(np.linalg.norm(loo - table[i], axis=1)) == k))
    print(f"\ncolour alone on the notebook's {len(hits)} training digits (nearest class mean, "
          f"leave-one-out): {np.mean(hits):.2f}")
    # 1.5e-3: the CSV keeps the figure's colours rounded to 0-255.
    print(f"KIM_COLOURS in the module: {np.allclose(_module_palette(), means, atol=1.5e-3)}")

    if a.csv is not None:
        import pandas as pd

        from analysis.io import atomic_write_text

        a.csv.parent.mkdir(parents=True, exist_ok=True)
        frame = pd.DataFrame(rows, columns=["source", "index", "label", "r", "g", "b"])
        atomic_write_text(a.csv, frame.to_csv(index=False))
        print(f"wrote {a.csv}")
    return 0


def _module_palette() -> np.ndarray:
    from unbiased.benchmarks.digits.data import KIM_COLOURS

    return KIM_COLOURS.numpy()


if __name__ == "__main__":
    sys.exit(main())
