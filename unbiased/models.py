"""Feature extractors g_theta (x -> z) and classifiers f_psi (z -> logits)."""

from __future__ import annotations

from torch import nn


class LeNetFeatures(nn.Module):
    """g for Colored MNIST: conv5x5x64-ReLU-maxpool2, conv5x5x64-ReLU-maxpool2, FC512-ReLU,
    FC z_dim (the authors' code uses z of 64). Input: 3x28x28. `z_relu`: z = ReLU(FC z_dim),
    as in the authors' code (slim's default activation); off = a linear z."""

    def __init__(self, z_dim: int = 64, in_channels: int = 3, z_relu: bool = False,
                 width: int = 64):
        super().__init__()
        # width: channels of both convolutions (the paper's 64; 32 costs about a third of
        # the compute but lost its debiasing gain sooner on full MNIST, bench/RESULTS.md).
        self.conv = nn.Sequential(
            nn.Conv2d(in_channels, width, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, width, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(width * 4 * 4, 512), nn.ReLU(),
                                nn.Linear(512, z_dim), *([nn.ReLU()] if z_relu else []))
        self.z_dim = z_dim

    def forward(self, x):
        return self.fc(self.conv(x))


def linear_classifier(z_dim: int, num_classes: int) -> nn.Module:
    """f: the shallow logit layer on z."""
    return nn.Linear(z_dim, num_classes)


class MLPFeatures(nn.Module):
    """g for tabular data (German credit): one hidden layer, z = its ReLU activations."""

    def __init__(self, in_features: int, z_dim: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, z_dim), nn.ReLU())
        self.z_dim = z_dim

    def forward(self, x):
        return self.net(x)


# ImageNet-pretrained torchvision ResNets for the IMDB faces benchmark: name -> (builder
# attribute, weights enum attribute). resnet50 is the paper's; resnet18 keeps CPU tests fast.
RESNETS: dict[str, tuple[str, str]] = {
    "resnet18": ("resnet18", "ResNet18_Weights"),
    "resnet50": ("resnet50", "ResNet50_Weights"),
}


def imagenet_weights_url(arch: str) -> str:
    """Download address of torchvision's ImageNet weights (IMAGENET1K_V1, the pretrained=True
    weights of the paper's time) for `arch`."""
    import torchvision.models as tvm

    return getattr(tvm, RESNETS[arch][1]).IMAGENET1K_V1.url


def resolve_imagenet_weights(arch: str, weights: str | None) -> str | None:
    """A local weights file for `weights`: None / "none" -> None (random init); "imagenet" ->
    torchvision's file in the torch hub cache, downloaded there once when missing; anything
    else is a path to a state_dict. Missing weights are a one-line DataError."""
    import os

    import torch

    from unbiased.data import DataError

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
            raise DataError(f"ImageNet weights for {arch} are not in {path} and could not be "
                            f"downloaded ({reason}): fetch {url} on a machine with network and "
                            f"pass --weights PATH, or --weights none to train from scratch"
                            ) from None
    return path


class ResNetFeatures(nn.Module):
    """g for IMDB faces: a torchvision ResNet without its ImageNet classifier, then a fully
    connected layer to z (128-d in the paper: a narrow z eases estimating I(z; c)).
    `weights_path`: a state_dict of the torchvision model (its `fc.*` entries are ignored);
    None = random init."""

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
    import torch

    from unbiased.data import DataError

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
