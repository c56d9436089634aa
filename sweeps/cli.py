"""One argument surface for every sweep driver: presets give every value, flags override
single values, and a bad value is one argparse-style line naming the flag (exit 2).

The settings' flags are generated from their config fields' metadata (unbiased/settings.py);
written here are the sweep axes and the driver's own flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sweeps.common import ray_job_address, storage_uri_problem
from unbiased.benchmarks import benchmark_spec
from unbiased.benchmarks.spec import BenchmarkSpec  # nothing heavy (no torch)
from unbiased.method_catalogue import DEFAULT_METHOD, methods_help
from unbiased.search import ARMS
from unbiased.settings import TrialSettings, bounds, kind_of, setting_of, trial_rule_problems


def _list_of(kind: Callable[[str], float | int], check: Callable[[float], str | None]
             ) -> Callable[[str], list]:
    def parse(text: str) -> list:
        items = [t.strip() for t in text.split(",")]
        if not text.strip() or any(not t for t in items):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        values = []
        for t in items:
            try:
                v = kind(t)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"{t!r} is not a valid {kind.__name__} (in {text!r})") from None
            problem = check(v)
            if problem:
                raise argparse.ArgumentTypeError(f"{t}: {problem}")
            if v in values:
                # Run twice, the same trial would count as two seeds (or lambdas) in a table.
                raise argparse.ArgumentTypeError(f"{t} is listed twice in {text!r}: a value "
                                                 f"runs once")
            values.append(v)
        return values
    return parse


def _one(kind: Callable[[str], float | int], check: Callable[[float], str | None]
         ) -> Callable[[str], float | int]:
    parse_list = _list_of(kind, check)

    def parse(text: str) -> float | int:
        values = parse_list(text)
        if len(values) != 1:
            raise argparse.ArgumentTypeError(f"expected one value, got {text!r}")
        return values[0]
    return parse


def _known_method(name: str) -> str | None:
    from unbiased.methods import METHODS

    return None if name in METHODS else f"unknown method; choose from {', '.join(METHODS)}"


METHOD_LIST = _list_of(str, _known_method)
LAM_LIST = _list_of(float, bounds(ge=0))
K_LIST = _list_of(int, bounds(ge=1))
SEED_LIST = _list_of(int, bounds(ge=0))
POS_INT = _one(int, bounds(ge=1))
POS_FLOAT = _one(float, bounds(gt=0))
NONNEG_FLOAT = _one(float, bounds(ge=0))
POS_FLOAT_LIST = _list_of(float, bounds(gt=0))
NONNEG_INT = _one(int, bounds(ge=0))
TRACKER_NAMES = ("mlflow", "wandb")  # sweeps/trackers: TRACKERS has one entry each


def _named_list(text: str, what: str, known: Callable[[str], str | None],
                items: Callable[[str], list]) -> tuple[str, list]:
    """NAME=V1,V2: a name `known` accepts and its values, each read by `items`."""
    name, sep, values = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    problem = known(name.strip())
    if problem:
        raise argparse.ArgumentTypeError(f"{name.strip()}: {problem}")
    return name.strip(), items(values)


def method_lams(text: str) -> tuple[str, list[float]]:
    return _named_list(text, "METHOD=LAM[,LAM...]", _known_method, LAM_LIST)


def _known_arm(name: str) -> str | None:
    return None if name in ARMS else f"unknown arm; choose from {', '.join(ARMS)}"


ARM_LIST = _list_of(str, _known_arm)


def arm_draws(text: str) -> tuple[str, list[int]]:
    return _named_list(text, "ARM=DRAW[,DRAW...]", _known_arm, SEED_LIST)


def tracker_list(text: str) -> tuple[str, ...]:
    if text.strip() == "none":
        return ()
    names = _list_of(str, lambda v: None if v in TRACKER_NAMES else
                     f"unknown tracker; choose none or from {', '.join(TRACKER_NAMES)}")(text)
    return tuple(dict.fromkeys(names))


# Where --storage-path comes from when the flag is absent: cluster.yaml sets it on every node.
STORAGE_ENV = "UNBIASED_STORAGE_PATH"
# Restarts of a failed trial: a local failure is a bug or a kill (2); a cluster's spot nodes
# are reclaimed, an epoch lost each time, several times over a long trial (10).
MAX_FAILURES_LOCAL, MAX_FAILURES_CLUSTER = 2, 10
SCHEDULERS = ("fifo", "asha")
# Values a preset may leave out: the trial settings' own defaults where a trial config has
# always carried the key (the others, absent, take the same default in the trainable).
_TRIAL = TrialSettings()
_FALLBACKS: dict[str, object] = {"device": _TRIAL.device, "scheduler": "fifo",
                                 "method": [DEFAULT_METHOD],
                                 "mi_eval_every": _TRIAL.mi_eval_every,
                                 "deterministic": _TRIAL.deterministic}


@dataclass
class SweepArgs:
    """Resolved settings of one sweep: the preset's values with the flags applied."""

    benchmark: str
    preset: str
    values: dict[str, object]
    out: Path
    address: str | None = None
    storage_path: str | None = None
    max_failures: int = MAX_FAILURES_LOCAL
    resume: bool = False
    overwrite: bool = False
    dry_run: bool = False
    done: Path | None = None
    bundle: int = 1
    tracker: tuple[str, ...] = ()  # asked for, or resumed
    tracking_uri: str | None = None
    wandb_project: str | None = None
    extra: dict[str, object] = field(default_factory=dict)  # for OUT/experiment.json
    explicit: frozenset[str] = frozenset()  # the keys set by a flag, not the preset
    fetch_command: str = ""  # --fetch-data's command, for a missing-data error

    def __getitem__(self, key: str) -> object:
        return self.values[key]


# Preset keys that say which grid it is, not what its trials get (GridSpec.for_preset).
GRID_KEYS = ("experiment", "data_axes")

# Preset keys whose flag is not `--` + the key with dashes.
_RENAMES = {"num_workers": "workers"}

_NO_DEFAULT = object()  # a flag whose unset value only a preset gives


def _preset_value(p: argparse._ActionsContainer, flag: str, key: str | None = None,
                  setting_default: object = _NO_DEFAULT, **kwargs) -> argparse.Action:
    """A flag that replaces preset value `key` (default: the dest), whose setting defaults
    to `setting_default`."""
    action = p.add_argument(flag, **kwargs)
    action.preset_key = key or action.dest  # type: ignore[attr-defined]
    action.setting_default = setting_default  # type: ignore[attr-defined]
    return action


def setting_flags(p: argparse.ArgumentParser) -> None:
    """A flag for every setting of every method's config and of the trial, grouped by the
    config class that declares it."""
    from unbiased.methods import METHODS
    from unbiased.settings import own_fields

    sections: list[tuple[type, str]] = []  # each config class once, base classes first
    for method in METHODS.values():
        for cls in reversed(method.Config.__mro__):
            if dataclasses.is_dataclass(cls) and cls not in dict(sections):
                readers = [name for name, m in METHODS.items() if issubclass(m.Config, cls)]
                sections.append((cls, "settings of " + ("every method" if len(readers) ==
                                                        len(METHODS) else ", ".join(readers))))
    sections.append((TrialSettings, "settings of each trial"))
    for cls, title in sections:
        field_flags(p.add_argument_group(title), cls, own_fields(cls))


def field_flags(group: argparse._ActionsContainer, cls: type,
                fields: Sequence[dataclasses.Field]) -> None:
    """A flag per field of a settings dataclass, from its metadata; a `many` field (a data
    axis) takes a list, an `axis` field is a driver's own list flag."""
    for f in fields:
        meta = setting_of(f)
        if meta is None:
            raise TypeError(f"{cls.__name__}.{f.name} has no setting metadata "
                            f"(unbiased.settings.setting): it would have no flag")
        if meta.axis:
            continue
        kind = kind_of(f)
        options: dict[str, object] = {"help": meta.help, "key": f.name, "setting_default":
                                      list(f.default) if isinstance(f.default, tuple)
                                      else f.default}
        if meta.many:
            check = meta.problem if meta.choices is None else (
                lambda v, c=meta.choices: None if v in c else f"must be one of {','.join(c)}")
            options["type"] = _list_of(meta.convert or kind, check)
        elif kind is bool:
            options.update(action=argparse.BooleanOptionalAction, default=None)
        elif meta.choices is not None:
            options["choices"] = list(meta.choices)
        elif kind is not str:
            options["type"] = _one(kind, meta.problem)
        _preset_value(group, flag_of(f.name), **options)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but a bad flag's error line follows one short usage line and a
    pointer to --help, not the whole usage (35 lines) that buried it."""

    presets: dict[str, dict] = {}

    def _get_formatter(self) -> argparse.HelpFormatter:
        formatter = super()._get_formatter()
        formatter.presets = self.presets  # type: ignore[attr-defined]
        return formatter

    def error(self, message: str):
        self.exit(2, f"usage: {self.prog} [flags]  (--help lists every flag and preset)\n"
                     f"{self.prog}: error: {message}\n")


def build_parser(prog: str, description: str, presets: dict[str, dict[str, object]],
                 search: bool = False, benchmark: BenchmarkSpec | None = None
                 ) -> argparse.ArgumentParser:
    """`search`: lambda and K are sampled (lambda_search.py), not a grid."""
    preset_help = "\n".join(
        textwrap.fill(f"{name}: " + ", ".join(f"{k}={_show(v)}" for k, v in values.items()),
                      width=79, initial_indent="  ", subsequent_indent="    ")
        for name, values in presets.items())
    p = _Parser(
        prog=prog, description=description,
        epilog="Presets: a flag left out takes the chosen preset's value (each flag's help\n"
               "lists the presets that differ from its default); a flag replaces that one "
               f"value.\n{preset_help}",
        formatter_class=_HelpFormatter)
    p.presets = presets
    p.add_argument("--preset", choices=sorted(presets), default="quick",
                   help="defaults for every value below")
    _preset_value(p, "--method", type=METHOD_LIST,
                  help=f"methods, comma-separated: {methods_help()} (unbiased/methods/); "
                       "lam = 0 is plain ERM for each, so it runs once, under the first "
                       "method")
    if search:
        _preset_value(p, "--lam-range", type=POS_FLOAT_LIST,
                      help="LOW,HIGH: lambda is sampled log-uniformly in this range")
        _preset_value(p, "--samples", type=POS_INT,
                      help="Optuna trials per (sigma, seed) study")
        _preset_value(p, "--K", type=K_LIST, help="MINE steps per model step: the choices "
                                                  "the search picks from, comma-separated")
    else:
        _preset_value(p, "--lam", type=LAM_LIST,
                      help="lambda values (each method's penalty weight), comma-separated; "
                           "0 = plain ERM, run once")
        p.add_argument("--lam-of", type=method_lams, action="append", metavar="METHOD=LAMS",
                       help="this method's lambdas instead of --lam's non-zero ones, "
                            "e.g. lntl=0.01,0.1; repeat per method (default: the preset's "
                            "method_lam)")
        _preset_value(p, "--K", type=K_LIST, help="MINE steps per model step, comma-separated")
    _preset_value(p, "--seeds", type=SEED_LIST, help="seeds, comma-separated")
    if not search:
        tuning = p.add_argument_group(
            "an equal tuning budget (unbiased/search.py; the `tune` presets): every arm the "
            "same number of draws from its method's distributions, instead of --method, "
            "--lam and --K's grid")
        _preset_value(tuning, "--arms", type=ARM_LIST,
                      help=f"arms, comma-separated: {', '.join(ARMS)}")
        _preset_value(tuning, "--draws", type=POS_INT, help="draws per arm")
        _preset_value(tuning, "--search-seed", type=NONNEG_INT,
                      help="the seed of the draws (not of the trials: --seeds)")
        tuning.add_argument("--draw-of", type=arm_draws, action="append", metavar="ARM=DRAWS",
                            help="run only these draws of an arm (indices from 0, e.g. "
                                 "group_dro=3: a rule's pick on new seeds); repeat per arm")
    if benchmark is not None and benchmark.settings is not None:
        field_flags(p.add_argument_group(benchmark.title), benchmark.settings,
                    dataclasses.fields(benchmark.settings))
    setting_flags(p)
    run = p.add_argument_group("running the sweep")
    _preset_value(run, "--root", help="data root (downloads land here; offline files are "
                                      "read from here)")
    _preset_value(run, "--cpus-per-trial", type=POS_FLOAT,
                  help="CPUs per trial (also torch threads)")
    _preset_value(run, "--gpus-per-trial", type=NONNEG_FLOAT,
                  help="GPUs per trial; fractions pack several trials on one GPU")
    _preset_value(run, "--scheduler", choices=SCHEDULERS,
                  help="fifo: every trial runs all epochs. asha: Async Successive Halving "
                       "stops trials whose train_acc trails at epochs grace, 3*grace, ... "
                       "(grace = epochs/4); train accuracy, not test accuracy or MI, because "
                       "it is label-free for the bias and the lowest-MI rule rejects "
                       "lambdas that do not fit the training data anyway (MI alone would "
                       "reward trials that learn nothing)")
    run.add_argument("--address", help="Ray cluster to join ('auto' on a cluster head); "
                                       "default: the cluster of the Ray job the sweep runs "
                                       "as (`ray job submit`), else a local Ray of its own")
    run.add_argument("--storage-path",
                     help="where Tune keeps trial state (shared storage or s3:// URI on a "
                          "multi-node cluster; the sweep goes to STORAGE/<name of OUT>/); "
                          f"default: ${STORAGE_ENV} when set (cluster.yaml sets it), else "
                          "OUT/tune")
    run.add_argument("--max-failures", type=NONNEG_INT, metavar="N",
                     help=f"restarts of a failed trial from its last checkpoint (default: "
                          f"{MAX_FAILURES_LOCAL}; with --address {MAX_FAILURES_CLUSTER}: spot "
                          f"nodes are reclaimed)")
    run.add_argument("--shared-storage", action="store_true",
                     help="the --storage-path (or OUT/tune) is a directory every node of the "
                          "--address cluster mounts (else a cluster needs a storage URI)")
    run.add_argument("--out", type=Path, help="results directory (results.parquet, tables, "
                                              "figures); default: results/<sweep>_<preset>")
    tracker_flags(run)
    run.add_argument("--dry-run", action="store_true",
                     help="print every trial's grid point and the settings they share, then "
                          "exit: no data loaded, no Ray started, nothing written")
    run.add_argument("--fetch-data", action="store_true",
                     help="download the data these settings read into --root (or check it "
                          "there), print what is there and exit: for a machine with network "
                          "(a cluster's login node) before sweeps on nodes without; no Ray "
                          "started, no OUT written")
    if not search:
        run.add_argument("--bundle", type=POS_INT, default=1, metavar="N",
                         help="train up to N grid points of mi_backprop with inner z 'batch' "
                              "that share K and every other setting but lam, lr, mi_lr, "
                              "mine_lr, seed and the data axes as one trial, vectorised "
                              "(torch.func) in one process: each keeps its own rows, "
                              "stopping rule and checkpoint. For GPUs, where a trial waits "
                              "on kernel launches; on a CPU a bundle is slower than its "
                              "points one by one (bench/RESULTS.md). --scheduler asha and "
                              "lambda_search.py keep one point per trial (default: 1, no "
                              "bundles)")
        run.add_argument("--done", type=Path, metavar="CSV",
                         help="per-epoch rows of an earlier run of this grid (the CSV "
                              "sweeps/export_epochs.py writes): trials with all their epochs "
                              "in CSV are not run again and their rows join the results; for "
                              "a grid whose trial records are gone with its machine (else "
                              "--resume)")
    group = run.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true",
                       help="continue an interrupted sweep in OUT")
    group.add_argument("--overwrite", action="store_true",
                       help="replace the results of an earlier sweep in OUT")
    return p


def tracker_flags(p: argparse._ActionsContainer) -> None:
    p.add_argument("--tracker", type=tracker_list, default=(),
                   help="also log the sweep to experiment trackers, comma-separated: mlflow "
                        "(one run per trial, nested under a run of the sweep), wandb (one W&B "
                        "run per trial, grouped under the sweep; WANDB_MODE=offline keeps "
                        "them in OUT/wandb); each needs its extra: pip install "
                        "'unbiased-mi[mlflow]' / 'unbiased-mi[wandb]' (default: none)")
    p.add_argument("--tracking-uri",
                   help="MLflow tracking URI (a server's http://host:port, or a database); "
                        "default: sqlite:///OUT/mlflow.db")
    p.add_argument("--wandb-project",
                   help="W&B project of the sweep's runs (default: the name of OUT)")


def check_tracker_flags(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    if ns.tracking_uri and "mlflow" not in ns.tracker:
        parser.error("argument --tracking-uri: only read with --tracker mlflow")
    if ns.wandb_project and "wandb" not in ns.tracker:
        parser.error("argument --wandb-project: only read with --tracker wandb")


def _preset_note(key: str, action: argparse.Action, presets: dict[str, dict]) -> str:
    """Where a preset flag's unset value comes from, and the presets that differ."""
    default = getattr(action, "setting_default", _NO_DEFAULT)
    if default is _NO_DEFAULT:
        default = _FALLBACKS.get(key, _NO_DEFAULT)
    others = [f"{name} {_show(values[key])}" for name, values in presets.items()
              if key in values and (default is _NO_DEFAULT or values[key] != default)]
    said = "set by --preset" if default is _NO_DEFAULT else f"default: {_show(default)}"
    return said + (f"; presets: {', '.join(others)}" if others else "")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the preset listing's line breaks; says where each unset value comes from."""

    presets: dict[str, dict] = {}

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        key = getattr(action, "preset_key", None)
        if key is not None and action.default is None:
            return f"{text} ({_preset_note(key, action, self.presets)})".replace("%", "%%")
        # () is --tracker's: its help says "(default: none)" itself.
        if action.option_strings and action.default not in (None, False, (),
                                                             argparse.SUPPRESS):
            return text + " (default: %(default)s)"
        return text


def driver_command(prog: str) -> str:
    """`python -m sweeps NAME` of the driver whose parser is named `prog` (digits_grid.py is
    `digits`)."""
    if prog.startswith("python"):
        return prog
    return "python -m sweeps " + prog.removesuffix(".py").removesuffix("_grid")


def fetch_command(command: str, benchmark: str, preset: str, values: dict,
                  explicit: set[str]) -> str:
    """The `--fetch-data` command of this sweep: its driver, preset, the flags given of the
    benchmark's fetch_keys, and its --root."""
    words = [command, "--preset", shlex.quote(preset)]
    for key in benchmark_spec(benchmark).fetch_keys:
        if key in explicit and values.get(key) is not None:
            words += [flag_of(key), shlex.quote(_show(values[key]))]
    words.append("--fetch-data")
    if values.get("root"):
        words += ["--root", shlex.quote(str(values["root"]))]
    return " ".join(words)


def resolve(parser: argparse.ArgumentParser, benchmark: str,
            presets: dict[str, dict[str, object]], argv: Sequence[str] | None = None,
            name: str | None = None, command: str | None = None) -> SweepArgs:
    """`name` names the default OUT (results/<name>_<preset>); `command` is the driver's
    in the fetch command (default: from the parser's prog). --fetch-data fetches and exits."""
    ns = parser.parse_args(argv)
    preset = presets[ns.preset]
    values = {k: v for k, v in preset.items() if k not in GRID_KEYS}
    explicit = set()
    for action in parser._actions:
        key = getattr(action, "preset_key", None)
        v = getattr(ns, action.dest, None)
        if key is not None and v is not None:
            values[key] = v
            explicit.add(key)
    for key, fallback in _FALLBACKS.items():
        values.setdefault(key, fallback)
    lam_range = values.get("lam_range")
    if lam_range is not None and (len(lam_range) != 2 or lam_range[0] >= lam_range[1]):
        parser.error(f"argument --lam-range: expected LOW,HIGH with LOW < HIGH, got "
                     f"{_show(lam_range)}")
    if values.get("mine_ema_rate") == 0:
        values["mine_ema_rate"] = None  # 0 on the command line: the plain DV gradient
    if isinstance(values.get("K"), int):
        values["K"] = [values["K"]]
    if lam_of := getattr(ns, "lam_of", None):
        methods = values.get("method") or ["mi_backprop"]
        stray = [name for name, _ in lam_of if name not in methods]
        if stray:
            parser.error(f"argument --lam-of: {', '.join(stray)} is not in this sweep's "
                         f"--method ({', '.join(methods)})")
        values["method_lam"] = {**dict(values.get("method_lam") or {}), **dict(lam_of)}
        explicit.add("method_lam")
    check_tuning(parser, values, getattr(ns, "draw_of", None), explicit)
    gpus = float(values.get("gpus_per_trial", 0))
    if gpus > 1 and gpus != int(gpus):
        parser.error(f"argument --gpus-per-trial: {gpus} must be <= 1 or a whole number")
    if values.get("source") == "mnist" and not values.get("root"):
        values["root"] = "data"
    fetch = fetch_command(command or driver_command(parser.prog), benchmark, ns.preset, values,
                          explicit)
    if getattr(ns, "fetch_data", False):
        from sweeps.fetch import run_fetch

        raise SystemExit(run_fetch(benchmark, ns.preset, values, fetch))
    root = getattr(ns, "root", None)
    if root is not None and not Path(root).expanduser().exists():
        # A typo in --root would otherwise surface as a download into a new directory.
        parser.error(f"argument --root: {root} does not exist (a typo? `{fetch}`, where "
                     f"there is network, fetches the sweep's data into it or says where to "
                     f"get it)")
    done = getattr(ns, "done", None)
    if done is not None and ns.resume and name != "piece":  # a piece reads both, imports none
        parser.error("argument --done: starts a new run of the grid; --resume continues "
                     "OUT's own (which keeps the rows an earlier --done took)")
    if done is not None and not done.is_file():
        parser.error(f"argument --done: {done} is not a file")
    for problem in trial_rule_problems(values):
        parser.error(problem)
    check_tracker_flags(parser, ns)
    bundle = getattr(ns, "bundle", 1)
    if bundle > 1 and values.get("scheduler") == "asha":
        parser.error("argument --bundle: ASHA stops trials one by one and a bundle is one "
                     "trial: use --scheduler fifo, or leave out --bundle")
    # A preset of an experiment of its own is named after it (k_ablation_cpu) and names OUT.
    default_out = (f"{name}_{ns.preset}" if name else ns.preset if "experiment" in preset
                   else f"{benchmark}_{ns.preset}")
    out = ns.out if ns.out is not None else Path("results") / default_out
    storage = ns.storage_path or os.environ.get(STORAGE_ENV) or None
    address = ns.address or ray_job_address()
    check_storage_flags(parser, ns, address, storage, out)
    return SweepArgs(benchmark=benchmark, preset=ns.preset, values=values, out=out,
                     address=address, storage_path=storage, resume=ns.resume,
                     max_failures=(ns.max_failures if ns.max_failures is not None else
                                   MAX_FAILURES_CLUSTER if address else MAX_FAILURES_LOCAL),
                     overwrite=ns.overwrite, dry_run=ns.dry_run, done=done,
                     bundle=bundle, tracker=ns.tracker,
                     wandb_project=ns.wandb_project,
                     tracking_uri=ns.tracking_uri, explicit=frozenset(explicit),
                     fetch_command=fetch)


def check_tuning(parser: argparse.ArgumentParser, values: dict,
                 draw_of: list[tuple[str, list[int]]] | None, explicit: set[str]) -> None:
    """A tuning sweep's arms, draws and --draw-of agree; --draw-of goes into `draw_of`."""
    arms = values.get("arms")
    if not arms:
        given = [k for k in ("draws", "search_seed") if k in explicit] + (
            ["draw_of"] if draw_of else [])
        if given:
            parser.error(f"argument {flag_of(given[0])}: only a tuning sweep (--arms, the "
                         f"`tune` presets) draws its points")
        return
    if not values.get("draws"):
        parser.error("argument --arms: a tuning sweep needs --draws (draws per arm)")
    if not draw_of:
        return
    chosen = dict(values.get("draw_of") or {})
    for arm, draws in draw_of:
        if arm not in arms:
            parser.error(f"argument --draw-of: {arm} is not in this sweep's --arms "
                         f"({', '.join(arms)})")
        beyond = [d for d in draws if d >= int(values["draws"])]
        if beyond:
            parser.error(f"argument --draw-of: {arm}={_show(beyond)}: draws are numbered "
                         f"0..{int(values['draws']) - 1} (--draws {values['draws']})")
        chosen[arm] = sorted(set(draws))
    values["draw_of"] = chosen
    explicit.add("draw_of")


def check_storage_flags(parser: argparse.ArgumentParser, ns: argparse.Namespace,
                        address: str | None, storage: str | None, out: Path) -> None:
    """On a cluster, trial state every node can reach: a storage URI, or --shared-storage."""
    if storage is not None and (problem := storage_uri_problem(storage)):
        parser.error(f"argument --storage-path: {storage}: {problem}")
    if address and (storage is None or "://" not in storage) and not ns.shared_storage:
        where = storage or f"{out / 'tune'} (the default)"
        cluster = "--address cluster" if ns.address else "Ray job's cluster"
        parser.error(f"argument --storage-path: {where} is a directory of this machine, and "
                     f"the trials of the {cluster} may run on nodes that cannot see "
                     f"it: give a storage URI (s3://BUCKET/PATH; cluster.yaml sets "
                     f"{STORAGE_ENV}), or --shared-storage if every node mounts it")


def flag_of(key: str) -> str:
    return "--" + _RENAMES.get(key, key).replace("_", "-")


def _show(v: object) -> str:
    if v is None:
        return "none"
    if isinstance(v, list):
        return ",".join(str(x) for x in v)
    return str(v)
