"""One piece of a grid on a machine lent for minutes: the next whole trials that fit a time
budget, run without Ray, their per-epoch rows written for `--done`.

A GPU lent for ten minutes at a time, keeping nothing between runs but the rows committed
from them, cannot hold a sweep, but it can finish a few trials whole. A piece decides what is
done as a sweep's launch does (`--done CSV` and, with `--resume`, OUT's records: both at
once), takes the next trials in grid order and bundles them so that each bundle finishes
inside what is left of `--budget`, by the measured costs of `--costs` (`Shape.seconds`). Each
trial runs the sweep's own trial loop with the config a sweep of the same flags would give it;
after each bundle every whole trial's rows go to OUT/epochs.csv, so a run cut off keeps them.

    python -m sweeps piece --preset paper --root DATA --done bench/results/paper_gpu/epochs.csv \\
        --budget 540 --out results/piece
    python -m sweeps export results/piece/epochs.csv bench/results/paper_gpu/epochs.csv

The second command merges the piece's rows into the committed CSV; the next piece then moves
on, and `digits_grid.py --preset paper --done CSV` builds the tables from them.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pandas as pd

from analysis.io import atomic_write_text
from sweeps.cli import build_parser, driver_command, resolve
from sweeps.common import SweepError, fail
from sweeps.core import GridSpec, bundle_points, check_local_gpu, take_done
from sweeps.export_epochs import export_frame
from sweeps.finished_trials import point_records, split_done
from sweeps.results_frame import results_frame
from trainables.record import RecordStore, StoreSession
from unbiased.settings import MEMBERS_KEY, POINT_KEY

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_COSTS = ROOT / "bench" / "results" / "gpu" / "piece_costs.json"
ROWS_FILE = "epochs.csv"  # OUT/<this>: the piece's finished trials, in export's format
PLAN_FILE = "piece.json"  # OUT/<this>: budget, bundles, estimates against seconds taken
# A piece runs in this process, without Ray, on a machine that keeps nothing.
_NOT_READ = {"address": "--address", "storage_path": "--storage-path", "tracker": "--tracker"}


@dataclass(frozen=True)
class Costs:
    """What a bundle of B members costs on one device (the costs file)."""

    device: str
    settings: dict[str, object]  # the step the milliseconds were measured at
    step_ms: dict[str, dict[int, float]]  # precision -> B -> ms per outer step
    setup_s: float  # a bundle's start: data built on the device, graphs captured
    epoch_s: float  # a member's evaluation and checkpoint, per epoch
    estimate_s: float  # a member's re-estimate of MI (the stopping rule's fresh critics)

    @classmethod
    def read(cls, path: Path) -> Costs:
        try:
            raw = json.loads(path.read_text())
            return cls(device=str(raw["device"]), settings=dict(raw["settings"]),
                       step_ms={p: {int(b): float(ms) for b, ms in by_b.items()}
                                for p, by_b in raw["step_ms"].items()},
                       setup_s=float(raw["setup_s"]), epoch_s=float(raw["epoch_s"]),
                       estimate_s=float(raw["estimate_s"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SweepError(f"--costs {path}: cannot read it ({type(exc).__name__}: {exc}); "
                             f"expected the JSON of bench/results/gpu/piece_costs.json") from None

    def step(self, precision: str, members: int) -> float:
        """ms per outer step of a bundle of `members`, linear between measured sizes."""
        table = self.step_ms[precision]
        sizes = sorted(table)
        if members <= sizes[0]:
            return table[sizes[0]]
        i = bisect.bisect_left(sizes, members)
        lo, hi = sizes[i - 1], sizes[i]
        return table[lo] + (table[hi] - table[lo]) * (members - lo) / (hi - lo)

    def largest(self, precision: str) -> int:
        """The measured bundle size with the lowest cost a member."""
        table = self.step_ms[precision]
        return min(table, key=lambda b: (table[b] / b, -b))


@dataclass(frozen=True)
class Shape:
    """What every trial of the piece shares that its cost depends on."""

    epochs: int
    steps: int  # outer steps an epoch
    estimates: tuple[int, int]  # re-estimates of MI of a lam = 0 trial, of a lam > 0 trial
    precision: str

    def seconds(self, costs: Costs, members: list[dict]) -> float:
        training = self.epochs * self.steps * costs.step(self.precision, len(members)) / 1000
        estimates = sum(self.estimates[float(p.get("lam", 0)) > 0] for p in members)
        return (costs.setup_s + training + len(members) * self.epochs * costs.epoch_s
                + estimates * costs.estimate_s)


def plan_size(todo: list[dict], left_s: float, shape: Shape, costs: Costs, most: int,
              scale: float = 1.0) -> int:
    """How many of `todo`'s first (up to `most`) fit in `left_s`, scaled; 0: not one."""
    for members in range(min(most, len(todo)), 0, -1):
        if shape.seconds(costs, todo[:members]) * scale <= left_s:
            return members
    return 0


class PieceSession(StoreSession):
    """A record's session that prints every tenth epoch and stamps every row."""

    def __init__(self, records: RecordStore, config: dict, epochs: int,
                 stamp: dict[str, str]) -> None:
        super().__init__(records, config)
        self.epochs, self.stamp = epochs, stamp
        self.started = time.perf_counter()

    def report(self, metrics: dict, checkpoint: dict[str, bytes] | None = None) -> None:
        super().report(metrics, checkpoint)
        epoch = int(metrics.get("epoch", 0))
        if epoch == 1 or epoch % 10 == 0 or epoch == self.epochs:
            took = time.perf_counter() - self.started
            print(f"  {self.key}: epoch {epoch}/{self.epochs}, {took:.0f} s", flush=True)

    def where(self) -> dict[str, str]:
        return {**super().where(), **self.stamp}


def versions() -> dict[str, str]:
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    return {"torch": torch.__version__, "cuda": torch.version.cuda or "", "gpu": gpu}


def trial_shape(spec: GridSpec, config: dict, loaded: dict, precision: str) -> Shape:
    """The piece's trials' shape, from the first point's (a grid's points share their size)."""
    from unbiased.methods import method_config
    from unbiased.trial import Plan

    bench = spec.bench.build({**config, "device": "cpu"}, **loaded)  # its size, anywhere
    batch = int(method_config(str(config.get("method", "mi_backprop")), config).batch_size)

    def estimates(lam: float) -> int:  # as run_trial's plan: ERM reports its last epoch
        plan = Plan.of({**config, "lam": lam}).for_lam(lam)
        return (sum(plan.estimates_at(e) for e in range(1, plan.epochs + 1))
                + int(plan.stopping))  # the selected epoch's own re-estimate

    plan = Plan.of(config)
    return Shape(epochs=plan.epochs, steps=math.ceil(len(bench.train) / batch),
                 estimates=(estimates(0.0), estimates(1.0)), precision=precision)


def trial_precision(config: dict) -> str:
    """The precision a trial of `config` reports (the costs file's key), with torch's TF32
    flags set as start_trial will set them."""
    import torch

    from unbiased.trial import precision

    requested = str(config.get("device", "auto"))
    cuda = requested.startswith("cuda") or (requested == "auto" and torch.cuda.is_available())
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = bool(config.get("tf32", False))
    if config.get("deterministic"):
        torch.backends.cudnn.allow_tf32 = False
    try:
        return precision(config, torch.device("cuda" if cuda else "cpu"))
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def finished_rows(spec: GridSpec, records: RecordStore, points: list[dict], fixed: dict
                  ) -> pd.DataFrame:
    """The rows, in export's format, of every point the records hold whole (what --done
    takes)."""
    trials = [(rows, config, key, None) for key, (rows, config, _, ended)
              in point_records(records, fixed, points).items() if ended]
    if not trials:
        return pd.DataFrame()
    rows = results_frame(trials, spec.experiment, spec.bench.name, spec.result_columns())
    ok = rows[rows["status"].astype(str).str.startswith("ok")]
    whole = split_done(Path(ROWS_FILE), ok, points, fixed)[1]
    return export_frame(pd.concat([own for _, own in whole])) if whole else pd.DataFrame()


def parse(spec: GridSpec, argv: list[str] | None):
    parser = build_parser("python -m sweeps piece", __doc__.splitlines()[0], spec.bench.presets,
                          benchmark=spec.bench)
    piece = parser.add_argument_group("a piece (sweeps/piece.py)")
    piece.add_argument("--budget", type=float, required=True, metavar="SECONDS",
                       help="wall seconds this piece may take: no bundle starts that its "
                            "estimate says would end later")
    piece.add_argument("--costs", type=Path, default=DEFAULT_COSTS,
                       help="measured step costs (JSON; default: %(default)s)")
    piece.add_argument("--max-members", type=int, metavar="B",
                       help="largest bundle (default: the costs file's size with the lowest "
                            "cost a member)")
    piece.add_argument("--margin", type=float, default=0.1,
                       help="keep this fraction of each estimate in reserve (default: 0.1)")
    ns = parser.parse_args(argv)
    for key, flag in _NOT_READ.items():
        if getattr(ns, key):
            parser.error(f"argument {flag}: a piece runs its trials in this process, "
                         f"without Ray")
    if ns.bundle != 1:
        parser.error("argument --bundle: a piece sizes its bundles itself (--max-members)")
    if ns.budget <= 0 or not math.isfinite(ns.budget):
        parser.error(f"argument --budget: {ns.budget:g}: must be > 0")
    if not 0 <= ns.margin < 1:
        parser.error(f"argument --margin: {ns.margin:g}: must be in [0, 1)")
    if ns.max_members is not None and ns.max_members < 1:
        parser.error(f"argument --max-members: {ns.max_members}: must be >= 1")
    args = resolve(parser, spec.bench.name, spec.bench.presets, argv, name="piece",
                   command=driver_command(spec.prog))
    return args, ns


def effective(spec: GridSpec, config: dict) -> dict:
    """A trial's every value: its config, then its method's defaults, then its benchmark's."""
    from unbiased.methods import method_config

    settings = spec.bench.settings
    defaults = {f.name: f.default for f in fields(settings)} if settings is not None else {}
    method = asdict(method_config(str(config.get("method", "mi_backprop")), config))
    return {**defaults, **method, **config}


def check_costs(costs: Costs, values: dict, precision: str) -> None:
    """The costs were measured for this step and precision, or the estimates mean nothing."""
    differ = [f"{k}={values.get(k)} (costs: {v})" for k, v in costs.settings.items()
              if values.get(k) != v]
    if differ:
        raise SweepError(f"--costs: measured for another step: this piece has "
                         f"{', '.join(differ)}; measure this one (bench/outer_step.py) or "
                         f"give --costs for it")
    if precision not in costs.step_ms:
        raise SweepError(f"--costs: no step measured at precision {precision} (measured: "
                         f"{', '.join(sorted(costs.step_ms))})")


def main(argv: list[str] | None = None, spec: GridSpec | None = None) -> int:
    if spec is None:
        from sweeps.digits_grid import GRID as spec
    args, ns = parse(spec, argv)
    spec = spec.for_preset(args.preset)
    deadline = time.monotonic() + ns.budget
    try:
        points = spec.validate(args.values)
        fixed = spec.fixed_values(args.values)
        if args.values.get("warm_start"):
            raise SweepError("--warm-start (preset " + args.preset + "): a piece runs its "
                             "trials without the baselines' launch a warm start needs; run "
                             "it as a sweep")
        # OUT/tune whatever the storage settings: the piece's machine keeps nothing else.
        records = RecordStore.at(str((args.out / "tune").resolve()), spec.experiment)
        todo, done_lines, _ = take_done(spec, args, records, points)
        costs = Costs.read(ns.costs)
        config = {**fixed, "num_threads": max(1, int(float(args.values["cpus_per_trial"])))}
        precision = trial_precision(config)
        if todo:
            check_costs(costs, effective(spec, {**config, **todo[0]}), precision)
        out_rows = args.out / ROWS_FILE
        if not args.dry_run:
            check_local_gpu(args)
            if (out_rows.exists() or records.keys()) and not (args.overwrite or args.resume):
                raise SweepError(f"{args.out} holds an earlier run's trials (a piece's: merge "
                                 f"its rows with `python -m sweeps export {out_rows} CSV`); "
                                 f"give --resume to go on from its records, --overwrite to "
                                 f"replace them, or another --out")
        loaded, said = spec.load(args) if todo else ({}, "")
    except SweepError as exc:
        fail(str(exc))
    most = min(ns.max_members or costs.largest(precision), max(costs.step_ms[precision]))
    for line in done_lines:
        print(f"piece: {line}", flush=True)
    print(f"piece: preset {args.preset}, {len(todo)} of {len(points)} trials to run; budget "
          f"{ns.budget:.0f} s; costs {ns.costs} ({costs.device}, precision {precision}, "
          f"bundles of up to {most})", flush=True)
    if not todo:
        print("piece: every trial of the grid is whole: nothing to run")
        return 0
    shape = trial_shape(spec, {**config, **todo[0]}, loaded, precision)
    stamp = versions()
    print(f"piece: {said}; {shape.epochs} epochs of {shape.steps} steps and "
          f"{shape.estimates} re-estimates a trial; torch {stamp['torch']}, CUDA "
          f"{stamp['cuda'] or '-'}, {stamp['gpu'] or 'no GPU'}", flush=True)
    if args.dry_run:
        dry_plan(spec, todo, fixed, shape, costs, most, ns)
        return 0
    if not args.resume:
        records.clear()  # a new piece: an earlier one's trials are not its own
    records.begin()
    return run_piece(spec, args, ns, records, points, todo, config, loaded, shape, costs, most,
                     stamp, deadline)


def dry_plan(spec: GridSpec, todo: list[dict], fixed: dict, shape: Shape, costs: Costs,
             most: int, ns: argparse.Namespace) -> None:
    """The bundles a piece would run if every one took its estimate."""
    left = ns.budget
    while todo:
        size = plan_size(todo, left, shape, costs, most, 1 + ns.margin)
        if size == 0:
            break
        members = _members(bundle_points(todo, size, fixed)[0])
        estimate = shape.seconds(costs, members)
        left -= estimate
        print(f"would run {len(members)} trials, ~{estimate:.0f} s: "
              + ", ".join(_point(spec, p) for p in members))
        ran = {id(p) for p in members}
        todo = [p for p in todo if id(p) not in ran]
    print(f"piece: dry run: nothing started; {len(todo)} trials would be left")


def run_piece(spec: GridSpec, args, ns: argparse.Namespace, records: RecordStore,
              points: list[dict], todo: list[dict], config: dict, loaded: dict, shape: Shape,
              costs: Costs, most: int, stamp: dict[str, str], deadline: float) -> int:
    """Run bundles of `todo` while the next fits in the time left, writing the whole rows
    after each."""
    from unbiased.trial import run_bundle, run_trial

    fixed = spec.fixed_values(args.values)
    log: list[dict] = []
    took_s = estimated_s = 0.0
    status = 0
    started = time.monotonic()
    while todo:
        # Later bundles are scaled by what the earlier ones took against their estimates.
        scale = max(took_s / estimated_s, 1.0) if estimated_s else 1.0
        left = deadline - time.monotonic()
        size = plan_size(todo, left, shape, costs, most, scale * (1 + ns.margin))
        if size == 0:
            need = shape.seconds(costs, todo[:1]) * scale * (1 + ns.margin)
            print(f"piece: the next trial needs ~{need:.0f} s with its reserve and "
                  f"{left:.0f} s are left: not started", flush=True)
            break
        trial = bundle_points(todo, size, fixed)[0]
        members = _members(trial)
        estimate = shape.seconds(costs, members) * scale
        session = PieceSession(records, {**config, POINT_KEY: trial}, shape.epochs, stamp)
        print(f"piece: {session.key}: {len(members)} trials ("
              + ", ".join(_point(spec, p) for p in members) + f"), ~{estimate:.0f} s",
              flush=True)
        began = time.monotonic()
        run = run_bundle if MEMBERS_KEY in trial else run_trial
        run(dict(session.config), lambda cfg: spec.bench.build(cfg, **loaded), session)
        records.end(session.key, "ended")
        seconds = time.monotonic() - began
        took_s += seconds
        estimated_s += estimate / scale
        rows = finished_rows(spec, records, points, fixed)
        whole = len(split_done(Path(ROWS_FILE), rows, members, fixed)[1]) if len(rows) else 0
        if whole < len(members):
            status = 1
            print(f"piece: {len(members) - whole} of its trials did not finish (an error, or "
                  f"diverged): --done takes only whole trials", flush=True)
        if not rows.empty:
            atomic_write_text(args.out / ROWS_FILE, rows.to_csv(index=False))
        log.append({"trial_id": session.key, "members": len(members), "whole": whole,
                    "left_s": round(left, 2), "estimate_s": round(estimate, 2),
                    "reserve": ns.margin, "seconds": round(seconds, 1),
                    "points": members})
        _write_plan(args.out, ns, stamp, shape, log, time.monotonic() - started)
        print(f"piece: {session.key} done in {seconds:.0f} s (estimate {estimate:.0f} s); "
              f"{args.out / ROWS_FILE} holds {sum(b['whole'] for b in log)} trials", flush=True)
        ran = {id(p) for p in members}
        todo = [p for p in todo if id(p) not in ran]
    print(f"piece: {sum(b['whole'] for b in log)} trials whole in {len(log)} runs, "
          f"{time.monotonic() - started:.0f} s of {ns.budget:.0f}; {len(todo)} trials of "
          f"the grid left", flush=True)
    if log:
        print(f"merge them: python -m sweeps export {args.out / ROWS_FILE} "
              f"{args.done or 'CSV'}")
    return status


def _members(trial: dict) -> list[dict]:
    return list(trial.get(MEMBERS_KEY, [trial]))


def _point(spec: GridSpec, point: dict) -> str:
    return " ".join(f"{k} {point[k]:g}" if isinstance(point[k], float) else f"{k} {point[k]}"
                    for k in (*spec.data_axes, "lam", "seed") if k in point)


def _write_plan(out: Path, ns: argparse.Namespace, stamp: dict, shape: Shape,
                log: list[dict], elapsed: float) -> None:
    plan = {"budget_s": ns.budget, "elapsed_s": round(elapsed, 1), "costs": str(ns.costs),
            "precision": shape.precision, **stamp, "epochs": shape.epochs,
            "steps": shape.steps, "estimates": shape.estimates, "runs": log}
    atomic_write_text(out / PLAN_FILE, json.dumps(plan, indent=1, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
