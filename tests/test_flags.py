"""The method and training flags are generated from the config fields' metadata
(unbiased/settings.py): every flag the hand-written parsers had is still there and parses,
refuses and resolves as it did (tests/fixtures/flags_before.json, recorded from them), and a
setting cannot be added without the metadata its flag is made from."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

import flag_surface  # noqa: E402

# Fields of a flag's record that changed on purpose: (driver or "*", flag) -> fields.
CHANGED = {
    # The help formatter no longer appends "(default: ())" to --tracker, whose help already
    # ends "(default: none)".
    ("*", "--tracker"): {"default_note", "help"},
    # export_epochs moved from bench/ to sweeps/, beside finished_trials.py.
    ("*", "--done"): {"help"},
    # The flags now refuse what the configs always refused (a bound of the setting, checked
    # wherever a config is built): a batch of 1, a bank of 1 row; --epochs has no default of
    # its own (None: every preset gives one).
    ("*", "--batch-size"): {"probes"},
    ("*", "--bank-size"): {"probes"},
    ("*", "--epochs"): {"default_note", "help"},
    # Every flag a preset sets says its own default and each preset that differs from it,
    # where it said "(default: from --preset)"; --method's help lists the method catalogue.
    ("*", "*"): {"default_note"},
    # ... and an unknown method's error lists it too (group_reweight, group_dro joined it).
    ("*", "--method"): {"help", "probes"},
    ("*", "--lam-of"): {"help", "probes"},
    # --address's help says a sweep started as a Ray job joins the job's cluster.
    ("*", "--address"): {"help"},
    # Kim et al.'s step decay is a schedule; g and f's and a bias head's optimiser is
    # --optimizer's kind, not Adam always.
    ("*", "--lr-schedule"): {"choices", "probes", "help"},
    ("*", "--head-lr"): {"help"},
    ("*", "--lr"): {"help"},
    # The digits benchmark's `kim` preset: Kim et al.'s protocol.
    ("digits_grid", "--preset"): {"choices", "probes"},
    # The ablations' drivers are digits' presets: digits' --preset is theirs.
    ("k_ablation", "--preset"): {"choices", "probes"},
    ("critic_ablation", "--preset"): {"choices", "probes"},
}

# The ablations' drivers became presets of digits: a record of theirs is checked
# against digits_grid's flags, and their preset P against digits' <driver>_P.
ABLATIONS = ("k_ablation", "critic_ablation")


def now_case(case: str) -> str:
    """The case of `python -m sweeps digits` a recorded case is now ("k_ablation/cpu/flags"
    -> "digits_grid/k_ablation_cpu/flags")."""
    driver, preset, label = case.split("/")
    if driver in ABLATIONS:
        return f"digits_grid/{driver}_{preset}/{label}"
    return case


def now_driver(driver: str) -> str:
    return "digits_grid" if driver in ABLATIONS else driver


# Values a preset gained on purpose: (the case's driver/preset, key) -> the value now. The
# digits paper presets replay their trials' steps as CUDA graphs (docs/MEASURED.md, "CUDA
# graphs of the outer step, on an H200").
ADDED = {(f"{driver}/paper/", "cuda_graphs"): True
         for driver in ("digits_grid", "k_ablation", "lambda_search")}


# Presets added since the record (their cases are new, the others' must not change).
NEW_PRESETS = ("digits_grid/kim/", "digits_grid/group_screen/", "digits_grid/groups/",
               "digits_grid/dro_screen/", "digits_grid/balanced_screen/",
               "digits_grid/balanced_rows/", "digits_grid/tune/", "digits_grid/tune_quick/")


@pytest.fixture(scope="module")
def before() -> dict:
    return json.loads(flag_surface.FIXTURE.read_text())


@pytest.fixture(scope="module")
def now() -> dict:
    return json.loads(json.dumps(flag_surface.surface()))


def test_every_flag_of_before_is_still_there_and_parses_the_same(before, now):
    assert set(now["flags"]) == set(before["flags"]) - set(ABLATIONS)
    for driver, flags in before["flags"].items():
        current = now["flags"][now_driver(driver)]
        # New flags may come (a new setting is one field); none of the recorded may go.
        for flag, record in flags.items():
            assert flag in current, (driver, flag)
            changed = (CHANGED.get((driver, flag), set()) | CHANGED.get(("*", flag), set())
                       | CHANGED[("*", "*")])
            for field, value in record.items():
                if field == "help" and "default_note" in changed:  # the help before its note
                    now_help = current[flag]["help"]
                    assert (now_help[:len(now_help) - len(current[flag]["default_note"])]
                            == value[:len(value) - len(record["default_note"])]
                            or field in changed), (driver, flag, field)
                elif field not in changed:
                    assert current[flag][field] == value, (driver, flag, field)


def test_resolved_preset_values_are_unchanged(before, now):
    """What each driver's presets (with and without a set of flags) resolve to: the values
    --dry-run shows and the trials get; the ablations' as digits' presets of their names,
    default OUT included."""
    cases = {now_case(case): case for case in before["resolved"]}
    new = set(now["resolved"]) - set(cases)
    assert set(cases) <= set(now["resolved"])
    assert all(case.startswith(NEW_PRESETS) for case in new), new
    for case, record in before["resolved"].items():
        expected = {**record, "values": dict(record["values"])}
        for (part, key), value in ADDED.items():
            if case.startswith(part):
                expected["values"][key] = value
        if now_case(case) != case:  # the preset's name in the command line
            expected["argv"] = [record["argv"][0], now_case(case).split("/")[1],
                                *record["argv"][2:]]
        assert now["resolved"][now_case(case)] == expected, case


@pytest.fixture(scope="module")
def digits_parser() -> argparse.ArgumentParser:
    return flag_surface.parsers()["digits_grid"][0]


def _parse_error(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[int, list[str]]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        parser.parse_args(argv)
    return exc.value.code, err.getvalue().strip().splitlines()


@pytest.mark.parametrize("argv, line", [
    (["--lr", "-1"], "argument --lr: -1: must be > 0"),
    (["--mine-ema-rate", "2"], "argument --mine-ema-rate: 2: must be in [0, 1]"),
    (["--mine-ema-rate", "nan"], "argument --mine-ema-rate: nan: must be finite"),
    (["--inner-z", "nope"], "argument --inner-z: invalid choice: 'nope'"),
    (["--head-hidden", "-1"], "argument --head-hidden: -1: must be >= 0"),
    (["--mi-eval-every", "0"], "argument --mi-eval-every: 0: must be >= 1"),
    (["--mu", "x"], "argument --mu: 'x' is not a valid float"),
    (["--select-epoch", "best_test"], "argument --select-epoch: invalid choice"),
    (["--device", "tpu"], "argument --device: invalid choice"),
])
def test_bad_value_is_one_error_line_naming_the_flag(digits_parser, argv, line):
    code, lines = _parse_error(digits_parser, argv)
    assert code == 2
    errors = [text for text in lines if "error:" in text]
    assert errors == [lines[-1]] and line in lines[-1], lines


@pytest.mark.ray
def test_bad_value_exits_2_from_the_command_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sweeps", "german", "--lr", "-1", "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert [text for text in lines if "error:" in text] == [lines[-1]]
    assert lines[-1].endswith("error: argument --lr: -1: must be > 0")
    assert not (tmp_path / "out").exists()


@pytest.mark.ray
def test_tf32_with_deterministic_is_one_error_line_before_anything_runs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sweeps", "digits", "--tf32",
                           "--deterministic", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert [text for text in lines if "error:" in text] == [lines[-1]]
    assert "--tf32" in lines[-1] and "--deterministic" in lines[-1]
    assert not (tmp_path / "out").exists()


def _config_classes() -> list[type]:
    from unbiased.methods import METHODS
    from unbiased.settings import TrialSettings

    return [*(cls.Config for cls in METHODS.values()), TrialSettings]


def test_every_setting_carries_its_help_and_a_parseable_kind():
    from unbiased.settings import kind_of, setting_of

    for cls in _config_classes():
        for f in dataclasses.fields(cls):
            meta = setting_of(f)
            assert meta is not None and meta.help.strip(), (cls.__name__, f.name)
            kind = kind_of(f)
            if meta.choices is not None:
                assert kind is str and f.default in meta.choices, (cls.__name__, f.name)


def test_every_setting_has_its_flag_on_every_grid_driver():
    from unbiased.settings import setting_of

    for name, (parser, _) in flag_surface.parsers().items():
        if name == "rerun":
            continue
        actions = {a.dest: a for a in parser._actions}
        for cls in _config_classes():
            for f in dataclasses.fields(cls):
                meta = setting_of(f)
                if meta.axis:  # the drivers' list flags (tests/test_digits_grid.py)
                    continue
                action = actions[f.name]
                assert getattr(action, "preset_key", None) == f.name, (name, f.name)
                assert action.help == meta.help, (name, f.name)
                choices = None if action.choices is None else tuple(action.choices)
                assert choices == meta.choices, (name, f.name)


def test_a_setting_without_metadata_has_no_flag_and_is_refused(monkeypatch):
    """A config field added without `setting(...)` fails every parser's construction instead
    of going without a flag."""
    from sweeps.cli import build_parser
    from unbiased.methods import METHODS, TrainConfig
    from unbiased.methods.base import ERM

    @dataclasses.dataclass
    class BareConfig(TrainConfig):
        bare: int = 3

    class Bare(ERM):
        name = "bare"
        Config = BareConfig

    monkeypatch.setitem(METHODS, "bare", Bare)
    with pytest.raises(TypeError, match="BareConfig.bare has no setting metadata"):
        build_parser("p", "d", {"quick": {}})


def test_bounds_and_renames():
    from sweeps.cli import flag_of
    from unbiased.settings import Setting

    assert Setting("h", gt=0).problem(0.0) == "must be > 0"
    assert Setting("h", ge=0, le=1).problem(1.5) == "must be in [0, 1]"
    assert Setting("h", gt=0, lt=1).problem(1.0) == "must be in (0, 1)"
    assert Setting("h", le=2).problem(3) == "must be <= 2"
    assert Setting("h", ge=1).problem(float("inf")) == "must be finite"
    assert Setting("h", ge=1).problem(1) is None
    assert flag_of("num_workers") == "--workers"
    assert flag_of("mine_ema_rate") == "--mine-ema-rate" and flag_of("K") == "--K"
