"""Checkpoint restore across devices (cpu->cpu, cuda->cuda, cuda->cpu, cpu->cuda).

On a machine without CUDA the device pairs are reached through what a checkpoint from another
device looks like: RNG states that are not CPU byte tensors, and a CUDA generator's state (16
bytes: seed and offset) where a CPU one (5,056 bytes) is expected. The CUDA tests run where
CUDA is (`make gpu-check`).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from unbiased.methods import make_method
from unbiased.methods.base import METHOD_SEED_OFFSET, RESEED_EPOCH_STRIDE

CUDA = torch.cuda.is_available()
# cuBLAS reads it when it first starts (the deterministic cuda->cuda restore needs it).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
VALUES = {"batch_size": 64, "lr": 1e-3, "mine_lr": 1e-3, "K": 2, "inner_z": "batch",
          "lam": 1.0}


def _bench(grey_digits, device="cpu"):
    from unbiased.benchmarks.digits.data import GreyDigits, build

    d = grey_digits
    digits = GreyDigits(d.train_x[:256], d.train_y[:256], d.test_x[:128], d.test_y[:128],
                        "mnist5k")
    return build(digits, 0.02, seed=0, device=device)


def _weights(algo) -> list[torch.Tensor]:
    return [p.detach().cpu() for m in algo.modules().values() for p in m.parameters()] + [
        p.detach().cpu() for p in algo.mine.parameters()]


def _trained(grey_digits, device="cpu"):
    torch.set_num_threads(1)
    algo = make_method("mi_backprop", _bench(grey_digits, device), VALUES, seed=1,
                       device=device)
    algo.run_epoch()
    return algo


def test_rng_states_mapped_to_another_device_are_reseeded_with_a_note(grey_digits):
    # As torch.load(map_location=<another device>) leaves them: set_state takes only CPU
    # byte tensors ("RNG state must be a torch.ByteTensor"). "meta" stands in for a device
    # this machine does not have.
    state = _trained(grey_digits).state_dict()
    for key in ("gen", "method_gen"):
        state[key] = state[key].to("meta")
    resumed = make_method("mi_backprop", _bench(grey_digits), VALUES, seed=1)
    notes = resumed.load_state_dict(state)
    assert len(notes) == 2 and all("re-seeded from the seed and epoch 1" in n for n in notes)
    expected = torch.Generator().manual_seed(1 + RESEED_EPOCH_STRIDE * 1)
    assert torch.equal(resumed.gen.get_state(), expected.get_state())
    expected.manual_seed(1 + METHOD_SEED_OFFSET + RESEED_EPOCH_STRIDE)
    assert torch.equal(resumed.method_gen.get_state(), expected.get_state())
    resumed.run_epoch()  # and it trains on
    assert resumed.epoch == 2


def test_a_cuda_generators_state_restores_on_cpu_deterministically(grey_digits):
    state = _trained(grey_digits).state_dict()
    cuda_sized = torch.zeros(16, dtype=torch.uint8)  # a CUDA generator's seed and offset
    state.update(gen=cuda_sized, method_gen=cuda_sized.clone(), rng_device="cuda")
    runs = []
    for _ in range(2):
        resumed = make_method("mi_backprop", _bench(grey_digits), VALUES, seed=1)
        # A copy each time: the optimisers take over the state's tensors and train them on.
        notes = resumed.load_state_dict(copy.deepcopy(state))
        assert [n.split(":")[0] for n in notes] == ["gen", "method_gen"]
        assert "from a cuda device, this trial runs on cpu" in notes[0]
        resumed.run_epoch()
        runs.append(_weights(resumed))
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_same_device_restore_takes_the_states_over_exactly(grey_digits):
    straight = _trained(grey_digits)
    state = straight.state_dict()
    straight.run_epoch()
    resumed = make_method("mi_backprop", _bench(grey_digits), VALUES, seed=99)
    assert resumed.load_state_dict(state) == []
    resumed.run_epoch()
    assert all(torch.equal(a, b) for a, b in zip(_weights(straight), _weights(resumed),
                                                 strict=True))


def _round_trip(tmp_path, state):
    path = tmp_path / "state.pt"
    torch.save(state, path)
    return torch.load(path, map_location="cpu", weights_only=False)  # as run_trial loads


@pytest.fixture
def deterministic():
    """--deterministic for the test (default cuDNN kernels need not repeat on a GPU)."""
    from unbiased.trial import set_deterministic

    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
              torch.backends.cudnn.allow_tf32)
    set_deterministic(torch.device("cuda"))
    yield
    torch.use_deterministic_algorithms(before[0])
    (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
     torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) = before[1:]


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("pair", ["cuda->cuda", "cuda->cpu", "cpu->cuda"])
def test_restore_between_devices(pair, grey_digits, tmp_path, deterministic):
    source, target = pair.split("->")
    straight = _trained(grey_digits, source)
    state = _round_trip(tmp_path, straight.state_dict())
    resumed = make_method("mi_backprop", _bench(grey_digits, target), VALUES, seed=99,
                          device=target)
    notes = resumed.load_state_dict(state)
    assert (notes == []) == (source == target)
    resumed.run_epoch()
    assert resumed.epoch == 2
    assert all(p.device.type == target for p in resumed.g.parameters())
    if source == target:  # the same streams: exactly the uninterrupted run
        straight.run_epoch()
        assert all(torch.equal(a, b) for a, b in zip(_weights(straight), _weights(resumed),
                                                     strict=True))
