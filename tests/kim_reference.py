"""Kim et al.'s LNTL fine-tune as their code writes it (feidfoe/learning-not-to-learn, commit
fad2ec8: models.py, trainer.py, data_loader.py), kept here only as the reference the tests
hold our `lntl` with `--preset kim`'s settings to. Their network and three separate colour
heads, their losses as written (softmax * log(softmax), CrossEntropyLoss(ignore_index=255)),
and their two steps per mini-batch, one SGD for the network and one per head."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = 255  # trainer.py:45-46, data_loader.py:49
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)  # data_loader.py:31-32


class KimNet(nn.Module):
    """models.py:11-44 `convnet`; forward returns (logits, the 32x14x14 map after conv2's
    ReLU); trainer.py:70-78's init."""

    def __init__(self):
        super().__init__()
        self.bn0 = nn.BatchNorm2d(3)
        self.conv1 = nn.Conv2d(3, 32, kernel_size=5, stride=1, padding=2)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(32, 32, kernel_size=3, stride=1, padding=1)
        self.conv3 = nn.Conv2d(32, 64, kernel_size=3, stride=2, padding=1)
        self.conv4 = nn.Conv2d(64, 64, kernel_size=3, stride=1, padding=1)
        self.avgpool = nn.AvgPool2d(7, stride=1)
        self.fc = nn.Linear(64, 10)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                with torch.no_grad():
                    m.weight.normal_(0, math.sqrt(2.0 / n))
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feat = F.relu(self.conv2(self.maxpool(F.relu(self.conv1(self.bn0(x))))))
        h = F.relu(self.conv4(F.relu(self.conv3(feat))))
        return self.fc(self.avgpool(h).flatten(1)), feat


class Predictor(nn.Module):
    """models.py:47-65: one colour channel's head on the map."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(32, 32, kernel_size=3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 8, kernel_size=3, padding=1)

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        return self.conv2(F.relu(self.bn1(self.conv1(feat))))


class GradReverse(torch.autograd.Function):
    """trainer.py:15-25."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.neg() * ctx.scale, None


def normalise(x: torch.Tensor) -> torch.Tensor:
    """data_loader.py:29-33 on images in [0, 1]: ToTensor of the uint8 image, Normalize."""
    levels = (x * 255).round().clamp(0, 255)
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    return (levels / 255 - mean) / std


def label_image(image: np.ndarray) -> torch.Tensor:
    """data_loader.py:44-52 on one HxWx3 uint8 image (old torch's integer ByteTensor division
    written as a floor division)."""
    from PIL import Image

    small = Image.fromarray(image).resize((14, 14), Image.NEAREST)
    small_t = torch.from_numpy(np.transpose(np.asarray(small), (2, 0, 1)).copy())
    mask = torch.lt(small_t.float() - 0.00001, 0.0).long() * 255
    return torch.div(small_t.long(), 32, rounding_mode="floor") + mask


def labels(x: torch.Tensor) -> torch.Tensor:
    levels = (x * 255).round().clamp(0, 255).to(torch.uint8)
    return torch.stack([label_image(img.permute(1, 2, 0).numpy()) for img in levels])


def finetune(net: KimNet, heads: list[Predictor], x: torch.Tensor, y: torch.Tensor, *,
             epochs: int, seed: int, lr: float, lam: float, mu: float, batch: int = 128,
             momentum: float = 0.9, weight_decay: float = 5e-4) -> None:
    """trainer.py:106-166, `epochs` passes over (x, y) in the order a CPU generator seeded
    `seed` draws, at a constant lr (their schedule's first 40 epochs); in place."""
    inputs, targets = normalise(x), labels(x)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum,
                          weight_decay=weight_decay)
    opt_heads = [torch.optim.SGD(h.parameters(), lr=lr, momentum=momentum,
                                 weight_decay=weight_decay) for h in heads]
    ce_colour = nn.CrossEntropyLoss(ignore_index=IGNORE_INDEX)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y), batch):
            rows = order[i:i + batch]
            xb, yb, tb = inputs[rows], y[rows], targets[rows]
            # 1. the task plus lam x the heads' negative entropy; the network steps
            logits, feat = net(xb)
            loss_pred = F.cross_entropy(logits, yb)
            probs = [F.softmax(h(feat), dim=1) for h in heads]
            entropy = sum(torch.mean(torch.sum(p * torch.log(p), 1)) for p in probs) / 3.0
            opt.zero_grad()
            for o in opt_heads:
                o.zero_grad()
            (loss_pred + lam * entropy).backward()
            opt.step()
            # 2. the heads on the colours, reversed (x mu) into the network; all step
            opt.zero_grad()
            for o in opt_heads:
                o.zero_grad()
            _, feat = net(xb)
            feat = GradReverse.apply(feat, mu)
            loss_colour = sum(ce_colour(h(feat), tb[:, c]) for c, h in enumerate(heads))
            loss_colour.backward()
            opt.step()
            for o in opt_heads:
                o.step()
