"""Feature extractors g_theta (x -> z) and classifiers f_psi (z -> logits): a benchmark's own
(its `make_features`, with a linear f), or a network of another protocol from `MODELS`."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from unbiased.data import DataError, DataMissing


class LeNetFeatures(nn.Module):
    """g for Colored MNIST (the authors' code; `z_relu`: their slim's default)."""

    def __init__(self, z_dim: int = 64, in_channels: int = 3, z_relu: bool = False,
                 width: int = 64):
        super().__init__()
        # width 32 costs about a third of the compute but lost its debiasing gain sooner on
        # full MNIST (bench/RESULTS.md).
        self.conv = nn.Sequential(
            nn.Conv2d(in_channels, width, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, width, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(width * 4 * 4, 512), nn.ReLU(),
                                nn.Linear(512, z_dim), *([nn.ReLU()] if z_relu else []))
        self.z_dim = z_dim

    def forward(self, x):
        return self.fc(self.conv(x))


class MLPFeatures(nn.Module):
    def __init__(self, in_features: int, z_dim: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, z_dim), nn.ReLU())
        self.z_dim = z_dim

    def forward(self, x):
        return self.net(x)


# name -> (builder, weights enum). resnet50 is the paper's; resnet18 keeps CPU tests fast.
RESNETS: dict[str, tuple[str, str]] = {
    "resnet18": ("resnet18", "ResNet18_Weights"),
    "resnet50": ("resnet50", "ResNet50_Weights"),
}


def imagenet_weights_url(arch: str) -> str:
    """IMAGENET1K_V1: the pretrained=True weights of the paper's time."""
    import torchvision.models as tvm

    return getattr(tvm, RESNETS[arch][1]).IMAGENET1K_V1.url


def resolve_imagenet_weights(arch: str, weights: str | None) -> str | None:
    """None / 'none' -> None; 'imagenet' -> torchvision's file, downloaded once; else a path."""
    if arch not in RESNETS:
        raise ValueError(f"arch must be one of {sorted(RESNETS)}, got {arch!r}")
    if weights is None or weights == "none":
        return None
    if weights != "imagenet":
        if not os.path.isfile(weights):
            raise DataError(f"weights file {weights} not found: pass a torchvision {arch} "
                            f"state_dict (e.g. {imagenet_weights_url(arch)}), 'imagenet' or "
                            f"'none'")
        return weights
    url = imagenet_weights_url(arch)
    path = os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(url))
    if not os.path.isfile(path):
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            torch.hub.download_url_to_file(url, path, progress=False)
        except Exception as exc:  # urllib, socket and OS errors alike: offline is common
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DataMissing(f"ImageNet weights for {arch} are not in {path} and could not "
                              f"be downloaded ({reason}): fetch {url} on a machine with "
                              f"network and pass --weights PATH, or --weights none to train "
                              f"from scratch", fetched_to=path) from None
    return path


class ResNetFeatures(nn.Module):
    """g for IMDB faces: a ResNet, then a layer to z (128-d: a narrow z eases I(z; c))."""

    def __init__(self, arch: str = "resnet50", z_dim: int = 128,
                 weights_path: str | None = None):
        super().__init__()
        import torchvision.models as tvm

        if arch not in RESNETS:
            raise ValueError(f"arch must be one of {sorted(RESNETS)}, got {arch!r}")
        net = getattr(tvm, RESNETS[arch][0])(weights=None)
        if weights_path is not None:
            _load_backbone(net, weights_path, arch)
        width = net.fc.in_features
        net.fc = nn.Identity()
        self.backbone = net
        self.head = nn.Linear(width, z_dim)
        self.z_dim = z_dim

    def forward(self, x):
        return self.head(self.backbone(x))


def _load_backbone(net: nn.Module, path: str, arch: str) -> None:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise DataError(f"cannot read weights file {path}: {type(exc).__name__}") from None
    state = {k: v for k, v in state.items() if not k.startswith("fc.")}
    try:
        missing, unexpected = net.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # tensor shapes of another architecture
        first = str(exc).strip().splitlines()[-1].strip()
        raise DataError(f"weights file {path} does not fit torchvision's {arch}: {first}"
                        ) from None
    missing = [k for k in missing if not k.startswith("fc.")]
    if missing or unexpected:
        first = (missing or unexpected)[0]
        raise DataError(f"weights file {path} does not fit torchvision's {arch}: "
                        f"{len(missing)} missing and {len(unexpected)} unexpected keys "
                        f"(first: {first})")


# Per-channel mean and std, applied after rounding to uint8 levels. "cifar10": Kim et al.'s
# data_loader.py normalises Colored MNIST with CIFAR-10's.
INPUT_NORMS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
}


def uint8_levels(x: torch.Tensor) -> torch.Tensor:
    return (x * 255).round().clamp(0, 255)


class InputNorm(nn.Module):
    """As ToTensor then Normalize read an image file. Not part of the data so that x stays
    the image (lntl's pixel targets read it); no parameters, so checkpoints hold nothing new."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (uint8_levels(x) / 255 - self.mean) / self.std


def kim_init(module: nn.Module) -> None:
    """Kim et al.'s trainer.py:70-78: conv weights N(0, sqrt(2 / (k*k*out))), BN weight 1 and
    bias 0; conv biases and linear layers keep PyTorch's default."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
            with torch.no_grad():
                m.weight.normal_(0, math.sqrt(2.0 / n))
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


KIM_MAP_CHANNELS = 32


class KimFeatures(nn.Module):
    """g of Kim et al.'s `convnet`; z is the 32x14x14 map their colour heads read."""

    def __init__(self, in_channels: int = 3):
        super().__init__()
        self.bn0 = nn.BatchNorm2d(in_channels)
        self.conv1 = nn.Conv2d(in_channels, 32, kernel_size=5, stride=1, padding=2)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(32, KIM_MAP_CHANNELS, kernel_size=3, stride=1, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv2(self.maxpool(F.relu(self.conv1(self.bn0(x))))))


class KimClassifier(nn.Module):
    def __init__(self, num_classes: int):
        super().__init__()
        self.conv3 = nn.Conv2d(KIM_MAP_CHANNELS, 64, kernel_size=3, stride=2, padding=1)
        self.conv4 = nn.Conv2d(64, 64, kernel_size=3, stride=1, padding=1)
        self.avgpool = nn.AvgPool2d(7, stride=1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv4(F.relu(self.conv3(z))))
        return self.fc(self.avgpool(h).flatten(1))


def kim_convnet(in_channels: int, num_classes: int) -> tuple[nn.Module, nn.Module]:
    # Both built before either is initialised: the draws of Kim's one-module network, in its
    # order (PyTorch's defaults layer by layer, then the conv weights again).
    g, f = KimFeatures(in_channels), KimClassifier(num_classes)
    kim_init(g)
    kim_init(f)
    return g, f


@dataclass(frozen=True)
class Model:
    """A network of another protocol. `map_channels` > 0: z is a feature map."""

    build: Callable[[int, int], tuple[nn.Module, nn.Module]]
    map_channels: int = 0


# `model` "benchmark" (the default) is the benchmark's own g with a linear f.
MODELS: dict[str, Model] = {
    "kim_convnet": Model(kim_convnet, map_channels=KIM_MAP_CHANNELS),
}


def map_channels(model: str) -> int:
    return MODELS[model].map_channels if model in MODELS else 0
