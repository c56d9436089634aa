"""A trial given a device it cannot use: one clear line, stopped once (a configuration fault is
not a lost node), and locally the driver says so before Ray starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ray import tune

from sweeps.lambda_search import LAMBDA_SEARCH
from tests.drivers import Ran, run_main
from trainables.record import records_root
from unbiased.benchmarks.digits.spec import DIGITS
from unbiased.benchmarks.imdb.spec import IMDB
from unbiased.settings import RECORDS_KEY
from unbiased.trial import DeviceError, pick_device

ROOT = Path(__file__).resolve().parents[1]
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


@pytest.mark.ray
@NO_CUDA
@pytest.mark.parametrize("flags", [["--device", "cuda"], ["--gpus-per-trial", "0.25"],
                                   ["--preset", "paper", "--root", str(ROOT)]])
def test_a_local_gpu_sweep_without_cuda_is_one_line_before_ray(flags, tmp_path):
    out = tmp_path / "out"
    proc = run_main("digits_grid", *flags, "--out", str(out))  # in this process: no Ray
    _is_the_no_cuda_line(proc, out)


@pytest.mark.ray
@NO_CUDA
def test_from_the_shell_the_no_cuda_line_is_all_of_stderr(tmp_path):
    # As a process: nothing else on stderr (a warning of torch's CUDA probe would show here).
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "sweeps" / "digits_grid.py"),
                           "--device", "cuda", "--out", str(out)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    _is_the_no_cuda_line(proc, out)


def _is_the_no_cuda_line(proc: Ran | subprocess.CompletedProcess, out: Path) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "torch sees no CUDA device" in lines[0] and torch.__version__ in lines[0]
    assert "Ray" not in proc.stdout and not out.exists()


def test_the_gpu_presets_name_their_device():
    for preset in (DIGITS["paper"], DIGITS["k_ablation_paper"], LAMBDA_SEARCH["paper"],
                   IMDB["paper"]):
        assert preset["gpus_per_trial"] > 0 and preset["device"] == "cuda"


@NO_CUDA
@pytest.mark.parametrize(("requested", "gpu_ids"), [("auto", [0]), ("cuda", []),
                                                    ("cuda:1", [1])])
def test_a_gpu_trial_that_torch_cannot_see_is_a_device_error(requested, gpu_ids):
    # gpu_ids: what Ray reports as the trial's GPUs (ray.get_gpu_ids()).
    with pytest.raises(DeviceError) as info:
        pick_device(requested, gpu_ids)
    text = str(info.value)
    assert f"device {requested!r}" in text and "torch " + torch.__version__ in text
    assert ("CUDA " in text and " build" in text) or "CPU-only build" in text
    assert (f"GPUs {gpu_ids} from Ray" if gpu_ids else "no GPU from Ray") in text


def test_without_gpus_auto_is_the_cpu_and_cpu_is_always_usable():
    assert pick_device("auto", []).type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert pick_device("cpu", [0]).type == "cpu"


@pytest.mark.ray
@NO_CUDA
def test_a_trial_on_a_device_it_cannot_use_stops_once_with_one_line(ray_local, tiny_digits,
                                                                     tmp_path):
    from sweeps.results_frame import results_frame
    from trainables.tune_trial import trainable_for

    config = {"sigma": 0.03, "lam": 1.0, "K": 2, "seed": 0, "epochs": 2, "batch_size": 64,
              "lr": 1e-3, "mine_lr": 1e-3, "inner_z": "batch", "device": "cuda",
              "num_threads": 1, "mi_eval_steps": 20}
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(trainable_for("digits"), digits=tiny_digits),
                            {"cpu": 1}),
        param_space={**config, RECORDS_KEY: records_root(str(tmp_path), "device")},
        run_config=tune.RunConfig(name="device", storage_path=str(tmp_path), verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=2)))
    grid = tuner.fit()
    assert grid[0].error is None  # reported, not raised: Tune does not retry it
    rows = grid[0].metrics_dataframe
    assert len(rows) == 1 and "device 'cuda'" in rows["device_error"].iloc[0]
    df = results_frame([(rows, config, "t", grid[0].error)], "digits_grid", "digits",
                       {"sigma": "sigma", "lam": "lam", "K": "K", "seed": "seed",
                        "epochs": "epochs"})
    assert df["status"].iloc[0].startswith("error: device 'cuda' with no GPU from Ray, but ")


def test_a_gpu_that_cuda_reports_available_but_cannot_start_is_a_device_error(monkeypatch):
    # A build without kernels for the device, or a GPU in another process's exclusive mode:
    # is_available() says yes, the first tensor fails.
    real_ones = torch.ones

    def ones(*args, device=None, **kwargs):
        if device is not None and torch.device(device).type == "cuda":
            raise RuntimeError("CUDA error: no kernel image is available for execution\nmore")
        return real_ones(*args, device=device, **kwargs)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "ones", ones)
    with pytest.raises(DeviceError, match=r"CUDA cannot start on cuda \(CUDA error: no "
                                          r"kernel image is available for execution\)"):
        pick_device("auto", [0])
    assert pick_device("cpu", [0]).type == "cpu"


def _progress_after(records, device_error: bool) -> None:
    """The sweep's progress callback over one trial that reports, then completes."""
    from types import SimpleNamespace

    from sweeps.runner import progress_callback

    config = {"epochs": 1, "point": {"lam": 1.0, "seed": 0}}
    records.start("lam=1.0_seed=0", {"epochs": 1, "lam": 1.0, "seed": 0})
    trial = SimpleNamespace(trial_id="t1", config=config, status="TERMINATED",
                            TERMINATED="TERMINATED")
    progress = progress_callback(("lam", "seed"), 1, records=records)
    result = ({"epoch": 0, "device_error": "device 'cuda': CUDA cannot start"} if device_error
              else {"epoch": 1, "train_acc": 0.9})
    progress.on_trial_result(0, [trial], trial, result)
    progress.on_trial_complete(0, [trial], trial)


@pytest.mark.parametrize("device_error", [False, True])
def test_a_trial_whose_device_could_not_start_is_not_ended_so_resume_runs_it(tmp_path,
                                                                            device_error):
    from trainables.record import RecordStore

    records = RecordStore.at(str(tmp_path), "grid")
    _progress_after(records, device_error)
    ended = records.read("lam=1.0_seed=0").ended
    assert (ended is None) if device_error else (ended == "ended")


NODE = ROOT / "slurm" / "ray_node.py"


def _stand_in_torch(where: Path, available: bool, tensor_error: str = "") -> Path:
    """A torch that counts 2 GPUs (as NVML does) with CUDA that does not start (available
    False), or that starts and fails at its first tensor."""
    package = where / "torch"
    package.mkdir(parents=True)
    fail = f"raise RuntimeError({tensor_error!r})" if tensor_error else "return Tensor()"
    package.joinpath("__init__.py").write_text(f'''
__version__ = "2.14.1+cu130"
class version:
    cuda = "13.0"
class Tensor:
    def sum(self):
        return 2.0
def ones(*args, device=None):
    {fail}
class cuda:
    device_count = staticmethod(lambda: 2)
    is_available = staticmethod(lambda: {available})
''')
    return where


@pytest.mark.parametrize(("available", "tensor_error", "says"), [
    (False, "", "counts 2 but cannot start CUDA (torch.cuda.is_available() is False)"),
    (True, "CUDA error: no kernel image is available", "started CUDA on 0 of them (CUDA "
                                                       "error: no kernel image is available)"),
])
def test_the_slurm_node_check_asks_cuda_itself_not_the_gpu_count(tmp_path, available,
                                                                  tensor_error, says):
    fake = _stand_in_torch(tmp_path / "site", available, tensor_error)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(fake), "CUDA_VISIBLE_DEVICES": "0,1",
           "SLURMD_NODENAME": "n1"}
    proc = subprocess.run([sys.executable, str(NODE), "check-gpus"], env=env,
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: n1: Slurm gave this job 2 GPUs here, torch 2.14.1+cu130 "
                               f"(a CUDA 13.0 build) {says}; NVIDIA driver: "), lines[0]
    ok = subprocess.run([sys.executable, str(NODE), "check-gpus"],
                        env={**env, "PYTHONPATH": str(_stand_in_torch(tmp_path / "ok", True))},
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "started CUDA on the 2 GPUs Slurm gave" in ok.stdout, ok


def test_gres_without_device_files_is_no_gpu(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("ray_node", NODE)
    node = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(node)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "NoDevFiles")
    assert node.given_gpus() == [] and node.check_gpus("n1") == 0
    assert node.slurm_resources()[0][2:4] == ["--num-gpus", "0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert node.given_gpus() == ["0", "1"]
