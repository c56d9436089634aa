"""Re-run, on new seeds, the configurations each label-free rule picked in a finished sweep.

    python -m sweeps rerun results/digits_cpu --seeds 3,4,5 [--out NEW]

Everything but the seeds is the source sweep's recorded config (OUT/experiment.json); ERM
(lambda = 0) runs too, as the reference. NEW (default OUT_rerun) gets the usual outputs and
rerun.md / rerun.parquet: each pick beside the numbers it was chosen on.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pandas as pd

from analysis.io import atomic_write_parquet, atomic_write_text
from analysis.rerun import picks, rerun_table
from analysis.results import ResultsError, final_rows, load_results
from sweeps.cli import (
    SEED_LIST,
    STORAGE_ENV,
    SweepArgs,
    check_tracker_flags,
    tracker_flags,
)
from sweeps.common import SweepError, fail, ray_job_address
from sweeps.core import GridSpec, benchmark_grid, has_key, run_points
from sweeps.outputs import EXPERIMENT_FILE
from unbiased.benchmarks import registered

PROG = "python -m sweeps rerun"
# A lambda search's picks re-run as a digits grid.
SEARCHES = {"lambda_search": "digits"}


def specs() -> dict[str, GridSpec]:
    """The grid of each experiment a sweep records: each registered benchmark's, and the
    experiments its presets name (digits' ablations)."""
    out: dict[str, GridSpec] = {}
    for name in registered():
        grid = benchmark_grid(name)
        out[grid.experiment] = grid
        for preset, values in grid.bench.presets.items():
            if "experiment" in values:
                out.setdefault(str(values["experiment"]), grid.for_preset(preset))
    return {**out, **{search: out[f"{bench}_grid"] for search, bench in SEARCHES.items()}}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path, help="OUT of a finished sweep (its experiment.json and "
                                             "results.parquet)")
    p.add_argument("--seeds", type=SEED_LIST, required=True,
                   help="the new seeds, comma-separated")
    p.add_argument("--out", type=Path, help="results directory of the re-run (default: "
                                            "SOURCE_rerun)")
    p.add_argument("--address", help="Ray cluster to join ('auto' on a cluster head); "
                                     "default: start a local Ray")
    p.add_argument("--storage-path", help=f"as the drivers' (default: ${STORAGE_ENV} when "
                                          "set, else OUT/tune)")
    tracker_flags(p)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help="continue an interrupted re-run")
    group.add_argument("--overwrite", action="store_true",
                       help="replace the results of an earlier re-run in OUT")
    return p


def _record(source: Path) -> dict:
    path = source / EXPERIMENT_FILE
    if not path.is_file():
        raise SweepError(f"{source} holds no {EXPERIMENT_FILE}: not the OUT of a "
                         f"finished sweep")
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SweepError(f"{path}: not JSON ({exc.msg})") from None
    if record.get("experiment") not in specs():
        raise SweepError(f"{path}: experiment {record.get('experiment')!r} cannot be re-run; "
                         f"these can: {', '.join(specs())}")
    return record


def _points(spec: GridSpec, chosen: pd.DataFrame, seeds: list[int]) -> list[dict]:
    points, seen = [], set()
    for pick in chosen.to_dict("records"):
        point: dict[str, object] = {k: pick[k] for k in spec.data_axes}
        point.update(method=str(pick["method"]), lam=float(pick["lam"]))
        if has_key(point["method"], "K"):
            point["K"] = int(pick["K"])
        key = json.dumps(point, sort_keys=True)
        if key in seen:
            continue  # two rules chose the same configuration: it runs once
        seen.add(key)
        points += [{**point, "seed": int(seed)} for seed in seeds]
    return points


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    check_tracker_flags(parser, ns)
    source = ns.source
    try:
        record = _record(source)
        spec = specs()[record["experiment"]]
        try:
            finals = final_rows(load_results(source))
        except (FileNotFoundError, ResultsError) as exc:
            raise SweepError(str(exc)) from None
        chosen = picks(finals, spec.data_axes)
        if chosen.empty:
            raise SweepError(f"{source}: no label-free pick to re-run (every trial excluded)")
    except SweepError as exc:
        fail(str(exc))
    values = dict(record["values"])
    values["seeds"] = list(ns.seeds)
    # The lambdas and Ks that run (the grid's own lists only label the sweep's config).
    values["lam"] = sorted({float(v) for v in chosen["lam"]})
    values["K"] = sorted({int(v) for v in chosen["K"] if v})  or values.get("K")
    values["method"] = list(dict.fromkeys(chosen["method"].astype(str)))
    out = ns.out or source.with_name(source.name + "_rerun")
    label = str(source)
    args = SweepArgs(
        benchmark=record["benchmark"], preset=record["preset"], values=values, out=out,
        address=ns.address or ray_job_address(),
        storage_path=ns.storage_path or os.environ.get(STORAGE_ENV) or None,
        resume=ns.resume, overwrite=ns.overwrite, tracker=ns.tracker,
        tracking_uri=ns.tracking_uri, wandb_project=ns.wandb_project,
        extra={"rerun_of": {"source": str(source.resolve()),
                            "source_experiment": record["experiment"],
                            "source_git_commit": record.get("git_commit"),
                            "rules": sorted(set(chosen["rule"]))}})
    points = _points(spec, chosen, list(ns.seeds))
    print(f"rerun: {len(chosen)} picks of {source} ({len(points) // len(ns.seeds)} "
          f"configurations) x seeds {','.join(map(str, ns.seeds))}", flush=True)

    def write_rerun(args: SweepArgs, df: pd.DataFrame) -> list[Path]:
        tidy, text = rerun_table(chosen, final_rows(df), spec.data_axes, label)
        print(text, flush=True)
        return [atomic_write_text(args.out / "rerun.md", text),
                atomic_write_parquet(tidy, args.out / "rerun.parquet")]

    return run_points(spec, args, points, after=write_rerun)


if __name__ == "__main__":
    from sweeps.ending import end_driver  # leaves Ray, then ends the process

    end_driver(main)
