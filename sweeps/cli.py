"""One argument surface for every sweep driver.

Presets give every value; flags override single values. Bad values exit with status 2 and one
argparse-style line naming the flag, never a traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from unbiased.stopping import SELECT_EPOCH_RULES  # imports nothing heavy (no torch)


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


def _finite(v: float) -> str | None:
    return None if math.isfinite(v) else "must be finite"


def _nonneg(v: float) -> str | None:
    return _finite(v) or (None if v >= 0 else "must be >= 0")


def _positive(v: float) -> str | None:
    return _finite(v) or (None if v > 0 else "must be > 0")


def _at_least_one(v: float) -> str | None:
    return None if v >= 1 else "must be >= 1"


def _unit_open(v: float) -> str | None:
    return _finite(v) or (None if 0 < v < 1 else "must be in (0, 1)")


def _known_method(name: str) -> str | None:
    from unbiased.methods import METHODS

    return None if name in METHODS else f"unknown method; choose from {', '.join(METHODS)}"


METHOD_LIST = _list_of(str, _known_method)
LAM_LIST = _list_of(float, _nonneg)
K_LIST = _list_of(int, _at_least_one)
SIGMA_LIST = _list_of(float, _unit_open)
SEED_LIST = _list_of(int, lambda v: None if v >= 0 else "must be >= 0")
POS_INT = _one(int, _at_least_one)
POS_FLOAT = _one(float, _positive)
NONNEG_FLOAT = _one(float, _nonneg)
POS_FLOAT_LIST = _list_of(float, _positive)
NONNEG_INT = _one(int, lambda v: None if v >= 0 else "must be >= 0")
EMA_RATE = _one(float, lambda v: _finite(v) or (None if 0 <= v <= 1 else "must be in [0, 1]"))
TRACKER_NAMES = ("mlflow", "wandb")  # sweeps/trackers: TRACKERS has one entry each


def method_lams(text: str) -> tuple[str, list[float]]:
    """METHOD=L1,L2 (--lam-of): the lambdas of one method."""
    name, sep, lams = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected METHOD=LAM[,LAM...], got {text!r}")
    problem = _known_method(name.strip())
    if problem:
        raise argparse.ArgumentTypeError(f"{name.strip()}: {problem}")
    return name.strip(), LAM_LIST(lams)


def tracker_list(text: str) -> tuple[str, ...]:
    """--tracker: none, or trackers comma-separated (mlflow,wandb)."""
    if text.strip() == "none":
        return ()
    names = _list_of(str, lambda v: None if v in TRACKER_NAMES else
                     f"unknown tracker; choose none or from {', '.join(TRACKER_NAMES)}")(text)
    return tuple(dict.fromkeys(names))


IMDB_SPLITS = ("EB1", "EB2")


def split_name(text: str) -> str:
    return text.upper()


SPLIT_LIST = _list_of(split_name, lambda v: None if v in IMDB_SPLITS
                      else f"must be one of {','.join(IMDB_SPLITS)}")

# Where --storage-path comes from when the flag is absent: cluster.yaml sets it on every node.
STORAGE_ENV = "UNBIASED_STORAGE_PATH"
SCHEDULERS = ("fifo", "asha")
# Values a preset may leave out.
_FALLBACKS: dict[str, object] = {"device": "auto", "scheduler": "fifo",
                                 "method": ["mi_backprop"], "mi_eval_every": 1,
                                 "deterministic": False}


@dataclass
class SweepArgs:
    """Resolved settings of one sweep: the preset's values with the flags applied."""

    benchmark: str
    preset: str
    values: dict[str, object]
    out: Path
    address: str | None = None
    storage_path: str | None = None
    resume: bool = False
    overwrite: bool = False
    dry_run: bool = False  # print the trials and settings, start nothing
    done: Path | None = None  # --done: an earlier run's per-epoch rows (sweeps/done.py)
    tracker: tuple[str, ...] = ()  # sweeps/trackers: the trackers asked for (or resumed)
    tracking_uri: str | None = None
    wandb_project: str | None = None
    # More fields for OUT/experiment.json (a re-run records the sweep it re-runs).
    extra: dict[str, object] = field(default_factory=dict)
    # The keys set by a flag on the command line (the rest came from the preset).
    explicit: frozenset[str] = frozenset()

    def __getitem__(self, key: str) -> object:
        return self.values[key]


# flag dest -> preset key
_OVERRIDES = {
    "method": "method", "sigma": "sigma", "lam": "lam", "K": "K", "seeds": "seeds",
    "epochs": "epochs", "batch_size": "batch_size", "lr": "lr", "lr_schedule": "lr_schedule",
    "mine_lr": "mine_lr", "mi_lr": "mi_lr", "root": "root",
    "cpus_per_trial": "cpus_per_trial", "gpus_per_trial": "gpus_per_trial",
    "inner_z": "inner_z", "mine_optimizer": "mine_optimizer", "device": "device",
    "mi_eval_steps": "mi_eval_steps", "bank_refresh": "bank_refresh",
    "bank_size": "bank_size", "amp": "amp", "compile": "compile",
    "channels_last": "channels_last", "theta_update": "theta_update",
    "mine_ema_rate": "mine_ema_rate", "mine_hidden": "mine_hidden",
    "mine_standardize": "mine_standardize", "mi_guard": "mi_guard",
    "mine_hidden_layers": "mine_hidden_layers", "head_hidden": "head_hidden",
    "head_lr": "head_lr", "hsic_bandwidth": "hsic_bandwidth", "mu": "mu",
    "eval_batch_size": "eval_batch_size", "train_eval_rows": "train_eval_rows",
    "rescale_mi_grad": "rescale_mi_grad", "select_epoch": "select_epoch",
    "mi_eval_every": "mi_eval_every", "deterministic": "deterministic",
    "z_relu": "z_relu", "width": "width", "palette": "palette", "stroke": "stroke",
    "scheduler": "scheduler", "samples": "samples", "lam_range": "lam_range",
    # IMDB only (build_parser(imdb=True))
    "train_split": "train_split", "weights": "weights", "arch": "arch",
    "train_subset": "train_subset", "max_eval": "max_eval", "workers": "num_workers",
    "image_size": "image_size",
}


# Method hyper-parameters that are one number each: flag, parser, help.
_SIZE_FLAGS = (
    ("--mine-hidden", POS_INT, "hidden units per layer of the statistics network T"),
    ("--mine-hidden-layers", POS_INT, "hidden layers of the statistics network T"),
    ("--head-hidden", NONNEG_INT,
     "grad_reversal, confusion, lntl: hidden units of the bias head (0 = linear)"),
    ("--head-lr", POS_FLOAT,
     "grad_reversal, confusion, lntl: Adam learning rate of the bias head (default: --lr)"),
    ("--mu", NONNEG_FLOAT,
     "lntl: scale of the bias heads' gradient reversed into g (Kim et al.'s 0.1)"),
    ("--hsic-bandwidth", POS_FLOAT,
     "hsic: Gaussian kernel width on z (default: the batch's median pairwise distance)"),
    ("--eval-batch-size", POS_INT, "rows per forward pass when evaluating a whole split"),
    ("--train-eval-rows", NONNEG_INT,
     "training rows train_acc, mi and mi_eval are measured on each epoch: a fixed random "
     "subset of this many (0 = every row)"),
)


def build_parser(prog: str, description: str, presets: dict[str, dict[str, object]],
                 uses_sigma: bool = True, search: bool = False, imdb: bool = False
                 ) -> argparse.ArgumentParser:
    """`search`: the driver samples lambda and K (lambda_search.py) instead of a grid, so it
    takes --samples and --lam-range, and --K lists the choices. `imdb`: the face images
    flags (training split, backbone, weights, data loading)."""
    preset_help = "\n".join(
        textwrap.fill(f"{name}: " + ", ".join(f"{k}={_show(v)}" for k, v in values.items()),
                      width=79, initial_indent="  ", subsequent_indent="    ")
        for name, values in presets.items())
    p = argparse.ArgumentParser(
        prog=prog, description=description,
        epilog="Presets: every value a flag marked '(default: from --preset)' leaves out\n"
               f"comes from the chosen preset; a flag replaces that one value.\n{preset_help}",
        formatter_class=_HelpFormatter)
    p.add_argument("--preset", choices=sorted(presets), default="quick",
                   help="defaults for every value below")
    p.add_argument("--method", type=METHOD_LIST,
                   help="methods, comma-separated: mi_backprop (the paper's), lntl (Kim et al.), "
                        "confusion (Alvi et al.), grad_reversal, hsic (unbiased/methods/); "
                        "lam = 0 is plain ERM for each, so it runs once, under the first "
                        "method")
    if uses_sigma:
        p.add_argument("--sigma", type=SIGMA_LIST,
                       help="colour variances, comma-separated (paper: 0.02..0.05)")
    if search:
        p.add_argument("--lam-range", type=POS_FLOAT_LIST,
                       help="LOW,HIGH: lambda is sampled log-uniformly in this range")
        p.add_argument("--samples", type=POS_INT,
                       help="Optuna trials per (sigma, seed) study")
        p.add_argument("--K", type=K_LIST, help="MINE steps per model step: the choices the "
                                                "search picks from, comma-separated")
    else:
        p.add_argument("--lam", type=LAM_LIST,
                       help="lambda values (each method's penalty weight), comma-separated; "
                            "0 = plain ERM, run once")
        p.add_argument("--lam-of", type=method_lams, action="append", metavar="METHOD=LAMS",
                       help="this method's lambdas instead of --lam's non-zero ones, "
                            "e.g. lntl=0.01,0.1; repeat per method (default: from --preset)")
        p.add_argument("--K", type=K_LIST, help="MINE steps per model step, comma-separated")
    p.add_argument("--seeds", type=SEED_LIST, help="seeds, comma-separated")
    if imdb:
        _imdb_flags(p)
    p.add_argument("--epochs", type=POS_INT, help="epochs per trial")
    p.add_argument("--batch-size", type=POS_INT, help="mini-batch size")
    p.add_argument("--lr", type=POS_FLOAT, help="Adam learning rate of g and f")
    p.add_argument("--lr-schedule", choices=["constant", "cosine"],
                   help="g and f's lr held, or decayed to 0 by a half cosine over --epochs "
                        "(critics and bias heads keep theirs)")
    p.add_argument("--mine-lr", type=POS_FLOAT, help="learning rate of the statistics network")
    p.add_argument("--mi-lr", type=POS_FLOAT,
                   help="theta's MI Adam learning rate under --theta-update separate "
                        "(default: --lr x lam, the authors')")
    p.add_argument("--mine-optimizer", choices=["adam", "sgd"], help="optimiser of MINE")
    p.add_argument("--inner-z", choices=["fresh", "batch", "bank", "first_k"],
                   help="z of the K inner MINE steps: fresh mini-batches through g "
                        "(Algorithm 1), the current batch's z reused, mini-batches from a "
                        "bank of training-set z recomputed every --bank-refresh steps "
                        "(cheap, but a stale bank let the model fool MINE on digits: "
                        "see bench/RESULTS.md, section 2), or the authors' digit_trainer.py "
                        "(first_k: a MINE pass over each epoch, then K steps on fresh "
                        "forwards of the epoch's first K batches after every theta step)")
    p.add_argument("--bank-refresh", type=POS_INT,
                   help="outer steps between recomputations of the z bank (--inner-z bank)")
    p.add_argument("--bank-size", type=POS_INT,
                   help="z bank of a random pool of this many training rows instead of the "
                        "whole set (--inner-z bank)")
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 autocast for the feature extractor (GPU; off by default)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the feature extractor and T (off by default)")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                   help="channels-last memory format for conv feature extractors")
    p.add_argument("--theta-update", choices=["separate", "joint"],
                   help="separate: the task gradient through Adam(lr) and the rescaled MI "
                        "gradient through a second Adam(lr * lam), as the authors' code; "
                        "joint: one Adam step on their sum (fades on full MNIST, docs/MEASURED.md)")
    p.add_argument("--mine-ema-rate", type=EMA_RATE,
                   help="MINE's bias-corrected gradient: moving-average rate of E[exp T] "
                        "(0 = the plain DV gradient)")
    for flag, kind, text in _SIZE_FLAGS:
        p.add_argument(flag, type=kind, help=text)
    p.add_argument("--mine-standardize", action=argparse.BooleanOptionalAction, default=None,
                   help="ours: T reads z standardised per dimension by the statistics of the "
                        "rows it scores, so rescaling z cannot carry it out of T's reach")
    p.add_argument("--mi-guard", action=argparse.BooleanOptionalAction, default=None,
                   help="ours: no MI step of theta on a batch whose DV estimate is below 0 "
                        "(T worse than a constant); reports guarded_frac each epoch")
    p.add_argument("--rescale-mi-grad", action=argparse.BooleanOptionalAction, default=None,
                   help="scale theta's MI gradient per tensor to norm min(|g_task|, |g_MI|)")
    p.add_argument("--select-epoch", choices=list(SELECT_EPOCH_RULES),
                   help="which epoch a trial reports: last, or lowest_mi / lowest_mi_cond "
                        "(label-free stopping rules: mi_eval / mi_eval_cond every epoch, "
                        "the lowest among epochs that fit the training data and read above "
                        "their prediction floor; its row gets selected = True)")
    if uses_sigma:
        p.add_argument("--z-relu", action=argparse.BooleanOptionalAction, default=None,
                       help="z = ReLU(fc2) as in the authors' digit code (default: linear z)")
        p.add_argument("--width", type=POS_INT,
                       help="channels of the LeNet's two convolutions (paper: 64)")
        p.add_argument("--palette", choices=["separated", "distinct", "kim"],
                       help="class colours: separated (every pair >= 0.5 apart in some "
                            "channel), distinct (closer pairs, a weaker shortcut) or kim (Kim "
                            "et al.'s, estimated from public images of their files)")
        p.add_argument("--stroke", choices=["scaled", "flat"],
                       help="scaled: the colour times the grey digit; flat: the flat colour "
                            "where the grey digit is > 128 of 255, black elsewhere (Kim's files)")
    p.add_argument("--mi-eval-steps", type=POS_INT,
                   help="training steps of the fresh statistics network behind mi_eval")
    p.add_argument("--mi-eval-every", type=POS_INT,
                   help="with a label-free --select-epoch: re-estimate MI every N epochs "
                        "(and at the last) and pick among those epochs")
    p.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=None,
                   help="deterministic cuDNN and algorithms, TF32 off: on a GPU the same "
                        "config and seed then repeat their numbers, as on CPU (slower)")
    p.add_argument("--root", help="data root (downloads land here; offline files are read "
                                  "from here)")
    p.add_argument("--cpus-per-trial", type=POS_FLOAT, help="CPUs per trial (also torch threads)")
    p.add_argument("--gpus-per-trial", type=NONNEG_FLOAT,
                   help="GPUs per trial; fractions pack several trials on one GPU")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None,
                   help="training device (auto: cuda when the trial has a GPU)")
    p.add_argument("--scheduler", choices=SCHEDULERS,
                   help="fifo: every trial runs all epochs. asha: Async Successive Halving "
                        "stops trials whose train_acc trails at epochs grace, 3*grace, ... "
                        "(grace = epochs/4); train accuracy, not test accuracy or MI, because "
                        "it is label-free for the bias and the lowest-MI rule rejects "
                        "lambdas that do not fit the training data anyway (MI alone would "
                        "reward trials that learn nothing)")
    p.add_argument("--address", help="Ray cluster to join ('auto' on a cluster head); default: "
                                     "start a local Ray")
    p.add_argument("--storage-path",
                   help="where Tune keeps trial state (shared storage or s3:// URI on a "
                        "multi-node cluster; the sweep goes to STORAGE/<name of OUT>/); "
                        f"default: ${STORAGE_ENV} when set (cluster.yaml sets it), else "
                        "OUT/tune")
    p.add_argument("--out", type=Path, help="results directory (results.parquet, tables, "
                                            "figures); default: results/<sweep>_<preset>")
    tracker_flags(p)
    p.add_argument("--dry-run", action="store_true",
                   help="print every trial's grid point and the settings they share, then "
                        "exit: no data loaded, no Ray started, nothing written")
    if not search:
        p.add_argument("--done", type=Path, metavar="CSV",
                       help="per-epoch rows of an earlier run of this grid (the CSV "
                            "bench/export_epochs.py writes): trials with all their epochs in "
                            "CSV are not run again and their rows join the results; for a "
                            "grid whose Tune state is gone with its machine (else --resume)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true",
                       help="continue an interrupted sweep in OUT")
    group.add_argument("--overwrite", action="store_true",
                       help="replace the results of an earlier sweep in OUT")
    return p


def tracker_flags(p: argparse.ArgumentParser) -> None:
    """--tracker and its settings (every driver and the re-run)."""
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


def _imdb_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--train-split", type=SPLIT_LIST,
                   help="training splits, comma-separated: EB1 (women 0-29, men 40+), EB2 "
                        "(men 0-29, women 40+)")
    p.add_argument("--weights",
                   help="backbone weights: 'imagenet' (torchvision's, from the torch hub "
                        "cache, downloaded once), 'none' (random init) or a state_dict PATH")
    p.add_argument("--arch", choices=["resnet50", "resnet18"],
                   help="backbone (the paper's is resnet50; resnet18 for fast checks)")
    p.add_argument("--train-subset", type=NONNEG_INT,
                   help="train on the first N images of the split (paper: 2000); 0 = all")
    p.add_argument("--max-eval", type=NONNEG_INT,
                   help="evaluate on at most N images per evaluation split; 0 = all")
    p.add_argument("--workers", type=NONNEG_INT,
                   help="DataLoader worker processes per trial decoding JPEGs")
    p.add_argument("--image-size", type=POS_INT, help="input crop size (ImageNet: 224)")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the preset listing's line breaks; says where each unset value comes from."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.dest in _OVERRIDES and action.default is None:
            fallback = _FALLBACKS.get(action.dest)
            return text + " (default: from --preset" + (f", else {_show(fallback)})" if fallback
                                                        else ")")
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            return text + " (default: %(default)s)"
        return text


def resolve(parser: argparse.ArgumentParser, benchmark: str,
            presets: dict[str, dict[str, object]], argv: Sequence[str] | None = None,
            name: str | None = None) -> SweepArgs:
    """`name` names the default OUT (results/<name>_<preset>); the benchmark by default."""
    ns = parser.parse_args(argv)
    values = dict(presets[ns.preset])
    explicit = set()
    for dest, key in _OVERRIDES.items():
        v = getattr(ns, dest, None)
        if v is not None:
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
    lam_of = getattr(ns, "lam_of", None)
    if lam_of:
        methods = values.get("method") or ["mi_backprop"]
        stray = [name for name, _ in lam_of if name not in methods]
        if stray:
            parser.error(f"argument --lam-of: {', '.join(stray)} is not in this sweep's "
                         f"--method ({', '.join(methods)})")
        values["method_lam"] = {**dict(values.get("method_lam") or {}), **dict(lam_of)}
        explicit.add("method_lam")
    gpus = float(values.get("gpus_per_trial", 0))
    if gpus > 1 and gpus != int(gpus):
        parser.error(f"argument --gpus-per-trial: {gpus} must be <= 1 or a whole number")
    root = getattr(ns, "root", None)
    if root is not None and not Path(root).expanduser().exists():
        # A typo in --root would otherwise surface as a download into a new directory.
        parser.error(f"argument --root: {root} does not exist")
    if values.get("source") == "mnist" and not values.get("root"):
        values["root"] = "data"
    done = getattr(ns, "done", None)
    if done is not None and ns.resume:
        parser.error("argument --done: starts a new run of the grid; --resume continues "
                     "OUT's own (which keeps the rows an earlier --done took)")
    if done is not None and not done.is_file():
        parser.error(f"argument --done: {done} is not a file")
    check_tracker_flags(parser, ns)
    out = ns.out if ns.out is not None else Path("results") / f"{name or benchmark}_{ns.preset}"
    storage = ns.storage_path or os.environ.get(STORAGE_ENV) or None
    return SweepArgs(benchmark=benchmark, preset=ns.preset, values=values, out=out,
                     address=ns.address, storage_path=storage, resume=ns.resume,
                     overwrite=ns.overwrite, dry_run=ns.dry_run, done=done,
                     tracker=ns.tracker,
                     wandb_project=ns.wandb_project,
                     tracking_uri=ns.tracking_uri, explicit=frozenset(explicit))


def flag_of(key: str) -> str:
    """The command-line flag that sets preset key `key`."""
    dest = next((d for d, k in _OVERRIDES.items() if k == key), key)
    return "--" + dest.replace("_", "-")


def _show(v: object) -> str:
    if isinstance(v, list):
        return ",".join(str(x) for x in v)
    return str(v)
