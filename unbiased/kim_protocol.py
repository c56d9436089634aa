"""Kim et al. (CVPR 2019, "Learning Not to Learn") on Colored MNIST, as their code trains it:
their network, their pixel-wise colour heads, their schedule. A standalone reference (torch
only, no Ray) for telling our `lntl` row's gap to their published row apart into protocol
and bug; bench/kim_protocol.py runs it.

What follows their code, with the file and line of feidfoe/learning-not-to-learn (commit
fad2ec8) each piece comes from:
- The network (models.py:11-44, `convnet`): BatchNorm2d(3) on the input; conv 5x5 3->32
  (padding 2), ReLU; max-pool 3, stride 2, padding 1 (28 -> 14); conv 3x3 32->32 (padding 1),
  ReLU: this map, 32x14x14 *after* its ReLU, is the feature map the heads read (`feat_out`,
  models.py:33); conv 3x3 32->64 stride 2 (padding 1, 14 -> 7), ReLU; conv 3x3 64->64
  (padding 1), ReLU; AvgPool2d(7); Linear 64->10. Every conv has a bias; BN only at the input.
- Initialisation (trainer.py:70-81, applied to the network only): conv weights
  N(0, sqrt(2 / (k*k*out_channels))) (He, fan-out), BN weight 1 / bias 0; conv biases and the
  Linear layer keep PyTorch's default. The colour heads keep PyTorch's default entirely.
- Colour heads (models.py:47-65, trainer.py:41-43): one per RGB channel, each conv 3x3 32->32
  (padding 1) -> BatchNorm2d -> ReLU -> conv 3x3 32->8 (padding 1), predicting the channel's
  8-bin value at each of the 14x14 pixels.
- Pixel labels (data_loader.py:44-52): the uint8 image resized to 14x14 with PIL NEAREST (for
  28 -> 14 that picks rows/columns 1, 3, ..., 27: torch's "nearest-exact", not "nearest"),
  each channel's value v -> v // 32 (bins 0..7), and 255 (the ignore index, trainer.py:45-46)
  where v == 0 (`v - 1e-5 < 0`). The background is black, so it is ignored per channel.
- Input (data_loader.py:29-33, 56): ToTensor (uint8 / 255) then Normalize with the CIFAR-10
  mean (0.4914, 0.4822, 0.4465) and std (0.2023, 0.1994, 0.2010), before the network's own
  input BN.
- Optimisers (trainer.py:57-68, option.py:10-17): SGD, momentum 0.9, weight decay 5e-4, batch
  128 (DataLoader shuffle=True, last partial batch kept: main.py:46-49); one SGD for the
  network and one per head, all with the same lr and a LambdaLR stepped once per epoch:
  lr_e = lr * 0.1 ** (e // 40) (trainer.py:64, 282-285), 100 epochs (option.py:16).
- Baseline (trainer.py:174-186, baseline_train.sh:15): cross-entropy only, lr 0.01.
- LNTL (trainer.py:106-166; train.sh:11: lr 0.001, fine-tuned from the baseline checkpoint,
  100 epochs by option.py's default), per mini-batch:
  1. network forward; the heads' softmax on the (not detached) feature map; loss =
     CE(task) + 0.01 * (mean over the 3 heads of mean over images and all 14x14 pixels,
     background included, of sum_k p_k log p_k) (trainer.py:107, 131-137); backward; the
     network's SGD steps (the heads get gradients here that are zeroed before they step).
  2. a second network forward of the same batch; the feature map through a gradient
     reversal scaled by 0.1 (trainer.py:15-25); the sum over the 3 heads of each head's
     pixel cross-entropy (mean over its non-ignored pixels) (trainer.py:156-160); backward;
     the network's SGD steps again (gradient: -0.1 x the heads' loss gradient, plus weight
     decay and the momentum carried from step 1), then the heads' SGDs step.
  The heads are new (trained from scratch during the fine-tune). Resuming from the baseline
  checkpoint loads the network's weights *and its optimizer state* (trainer.py:264-267): the
  momentum buffers, and the param-group lr the baseline had after its last scheduler step
  (0.01 * 0.1 ** (100 // 40) = 1e-4). The fine-tune's LambdaLR was built before that load
  (base lr 0.001), so the network's first fine-tune epoch runs at 1e-4 and the schedule takes
  over from the first scheduler step: 1e-3 for epochs 1-39, 1e-4 to 79, 1e-5 after. The
  heads' optimizers are not loaded: 1e-3 from epoch 0. `KimConfig.resume_optimizer` (default
  on) reproduces this.
- Evaluation (trainer.py:197-234): the network in eval mode (BN running statistics) over the
  test split. Their test.sh:11 evaluates the LNTL checkpoint of step 90 (the 91st epoch).

Where this differs from their code, and why (none changes the mathematics of a step):
- The three heads are one module: a conv 32->96, BatchNorm2d(96), ReLU, a grouped conv
  96->24 (3 groups). BN is per channel and each group sees only its own head's channels, so
  this computes exactly the three heads; one SGD over the fused parameters is exactly three
  SGDs with the same hyper-parameters (SGD is element-wise). The default init draws each
  head's weights from the same distribution as theirs (same fan-in), not the same numbers.
  Fewer, larger kernels: the GPU step is launch-bound.
- sum_k p log p is computed as softmax * log_softmax (theirs: softmax * log(softmax), which
  gives NaN once a probability underflows to 0); equal wherever theirs is finite.
- Each head's loss is sum / count over its non-ignored pixels with the count clamped at 1:
  equal to CrossEntropyLoss(ignore_index=255) except in a batch with no valid pixel for a
  channel, where theirs is NaN and ours 0.
- Step 1 backpropagates into the network's parameters only (`backward(inputs=...)`): the
  heads' gradients, which their step 1 computes, are zeroed unused before their step.
- Step 2's second forward stops at the feature map: the layers after it (no BN among them)
  do not reach the heads' loss, so skipping them changes nothing.
- Images: ours come from unbiased/benchmarks/colored_mnist.py as floats; they are rounded to
  the uint8 levels Kim's files store (round(255 x)) before both the input normalisation and
  the pixel labels. Their files round or truncate: unknown.
- Logging: the train loss is the mean over the epoch's mini-batches (train-mode BN, as theirs
  logs per batch); train_acc is eval-mode accuracy on a fixed subset of the training set
  (the first `train_eval_size` rows); test accuracy is computed every epoch, not only at
  the saved checkpoints.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from unbiased.data import TensorSplit
from unbiased.methods.grad_reversal import reverse_gradient

NUM_CLASSES = 10
COLOUR_BINS = 8  # trainer.py:38 (n_color_cls)
IGNORE_INDEX = 255  # trainer.py:45-46, data_loader.py:49
FEATURE_CHANNELS = 32
# data_loader.py:31-32: CIFAR-10's statistics, used as they are on Colored MNIST.
INPUT_MEAN = (0.4914, 0.4822, 0.4465)
INPUT_STD = (0.2023, 0.1994, 0.2010)
# Kim's README table ("Baseline", "Ours") by colour variance.
KIM_README = {0.020: (0.4055, 0.8185), 0.025: (0.4813, 0.8854), 0.030: (0.5996, 0.9137),
              0.035: (0.6626, 0.9306), 0.040: (0.7333, 0.9406), 0.045: (0.7973, 0.9555),
              0.050: (0.8450, 0.9618)}
# test.sh:11 evaluates the LNTL checkpoint saved after step (0-based epoch) 90.
KIM_EVAL_EPOCH = 91

Callback = Callable[[dict], object]


# ---------------------------------------------------------------------------------------------
# Network and heads


def kim_init(module: nn.Module) -> None:
    """trainer.py:70-78: conv weights N(0, sqrt(2 / (k*k*out))), BN weight 1 and bias 0; conv
    biases and Linear layers keep PyTorch's default."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
            with torch.no_grad():
                m.weight.normal_(0, math.sqrt(2.0 / n))
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class KimNet(nn.Module):
    """models.py `convnet`; forward returns (logits, z) with z the 32x14x14 map after conv2's
    ReLU (their forward returns the same pair in the order (z, logits))."""

    def __init__(self, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.bn0 = nn.BatchNorm2d(3)
        self.conv1 = nn.Conv2d(3, 32, kernel_size=5, stride=1, padding=2)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(32, FEATURE_CHANNELS, kernel_size=3, stride=1, padding=1)
        self.conv3 = nn.Conv2d(FEATURE_CHANNELS, 64, kernel_size=3, stride=2, padding=1)
        self.conv4 = nn.Conv2d(64, 64, kernel_size=3, stride=1, padding=1)
        self.avgpool = nn.AvgPool2d(7, stride=1)
        self.fc = nn.Linear(64, num_classes)
        kim_init(self)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The map the colour heads read: (N, 32, 14, 14), non-negative."""
        x = self.maxpool(F.relu(self.conv1(self.bn0(x))))  # 28x28 -> 14x14
        return F.relu(self.conv2(x))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.features(x)
        h = F.relu(self.conv4(F.relu(self.conv3(z))))  # 7x7
        return self.fc(self.avgpool(h).flatten(1)), z


class ColourHeads(nn.Module):
    """Kim's three `Predictor`s (one per RGB channel) as one module: channels [8i, 8i+8) of
    the output are head i's logits. forward: (N, 32, H, W) -> (N, 3, 8, H, W)."""

    def __init__(self, in_channels: int = FEATURE_CHANNELS, heads: int = 3,
                 classes: int = COLOUR_BINS):
        super().__init__()
        self.heads, self.classes = heads, classes
        self.conv1 = nn.Conv2d(in_channels, heads * in_channels, kernel_size=3, padding=1)
        self.bn1 = nn.BatchNorm2d(heads * in_channels)
        self.conv2 = nn.Conv2d(heads * in_channels, heads * classes, kernel_size=3, padding=1,
                               groups=heads)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out = self.conv2(F.relu(self.bn1(self.conv1(z))))
        return out.view(out.shape[0], self.heads, self.classes, *out.shape[2:])


def grad_reverse(x: torch.Tensor, scale: float) -> torch.Tensor:
    """trainer.py:15-22: identity forward, gradient times -scale backward (our method's)."""
    return reverse_gradient(x, scale)


# ---------------------------------------------------------------------------------------------
# Data


def uint8_levels(x: torch.Tensor) -> torch.Tensor:
    """Floats in [0, 1] -> the 0..255 levels of a uint8 image, kept as floats."""
    return (x * 255).round_().clamp_(0, 255)


def pixel_colour_targets(x: torch.Tensor) -> torch.Tensor:
    """(N, 3, H, W) images in [0, 1] -> (N, 3, H/2, W/2) int64 colour labels, as
    data_loader.py:44-52 makes them: PIL NEAREST resize (torch "nearest-exact": for 28 -> 14
    the odd rows and columns), v // 32 per channel (0..7), IGNORE_INDEX where v == 0."""
    levels = uint8_levels(x.float())
    small = F.interpolate(levels, size=(x.shape[-2] // 2, x.shape[-1] // 2),
                          mode="nearest-exact")
    bins = torch.div(small, 256 // COLOUR_BINS, rounding_mode="floor").long()
    return bins.masked_fill_(small == 0, IGNORE_INDEX)


def normalise_input(x: torch.Tensor) -> torch.Tensor:
    """data_loader.py:29-33: uint8 / 255, then Normalize with CIFAR-10's mean and std."""
    mean = torch.tensor(INPUT_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(INPUT_STD, device=x.device).view(1, 3, 1, 1)
    return (uint8_levels(x.float()) / 255 - mean) / std


@dataclass
class KimData:
    """Both splits on one device, ready for the loop: normalised inputs, labels, the training
    images' colour labels, and the rows of the fixed train_acc subset."""

    x: torch.Tensor
    y: torch.Tensor
    targets: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    eval_size: int  # train_acc / head_acc read the first eval_size training rows

    def __len__(self) -> int:
        return len(self.y)


def prepare(train: TensorSplit, test: TensorSplit, device: torch.device | str,
            train_eval_size: int = 10_000) -> KimData:
    device = torch.device(device)
    x = train.x.to(device)
    return KimData(x=normalise_input(x), y=train.y.to(device).long(),
                   targets=pixel_colour_targets(x),
                   test_x=normalise_input(test.x.to(device)), test_y=test.y.to(device).long(),
                   eval_size=min(train_eval_size, len(train.y)))


# ---------------------------------------------------------------------------------------------
# Losses


def neg_entropy(head_logits: torch.Tensor) -> torch.Tensor:
    """trainer.py:131-135: mean over heads, images and every pixel of sum_k p_k log p_k (the
    heads' pixel counts are equal, so this is their mean of per-head means). Minimum:
    -log 8 = -2.079, a uniform prediction."""
    logp = F.log_softmax(head_logits, dim=2)
    return (logp.exp() * logp).sum(2).mean()


def colour_loss(head_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """trainer.py:156-160: the sum over heads of each head's pixel cross-entropy, a mean over
    its own non-ignored pixels. head_logits (N, 3, 8, H, W), targets (N, 3, H, W)."""
    ce = F.cross_entropy(head_logits.transpose(1, 2), targets, ignore_index=IGNORE_INDEX,
                         reduction="none")  # (N, 3, H, W), 0 where ignored
    valid = (targets != IGNORE_INDEX).sum((0, 2, 3)).clamp_(min=1)
    return (ce.sum((0, 2, 3)) / valid).sum()


# ---------------------------------------------------------------------------------------------
# Training


@dataclass
class KimConfig:
    """option.py's defaults, trainer.py's constants and the shell scripts' flags."""

    batch_size: int = 128  # option.py:10
    momentum: float = 0.9  # option.py:11
    weight_decay: float = 5e-4  # option.py:15
    lr_decay_rate: float = 0.1  # option.py:13
    lr_decay_period: int = 40  # option.py:14 (epochs)
    baseline_lr: float = 0.01  # baseline_train.sh:15 (option.py:12's default)
    baseline_epochs: int = 100  # option.py:16 (max_step)
    finetune_lr: float = 0.001  # train.sh:11
    finetune_epochs: int = 100  # option.py:16; test.sh:11 evaluates epoch 91
    lam: float = 0.01  # trainer.py:107 (_lambda)
    mu: float = 0.1  # trainer.py:22 (GradReverse)
    # trainer.py:264-267: the fine-tune loads the baseline's optimizer state (momentum and
    # its last lr, which the first fine-tune epoch then runs at). False: fresh momentum and
    # the fine-tune schedule from epoch 0.
    resume_optimizer: bool = True
    train_eval_size: int = 10_000
    eval_batch: int = 1000


def scheduled_lr(base: float, epoch: int, cfg: KimConfig) -> float:
    """LambdaLR(lr_decay_rate ** (epoch // lr_decay_period)), epoch 0-based (trainer.py:64)."""
    return base * cfg.lr_decay_rate ** (epoch // cfg.lr_decay_period)


def _sgd(params, lr: float, cfg: KimConfig) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def _set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


@dataclass
class PhaseResult:
    """net (and heads for LNTL) after the phase; `optimizer_state`: the network's SGD state as
    Kim's checkpoint holds it (momentum buffers, lr after the last scheduler step)."""

    net: KimNet
    optimizer_state: dict
    history: list[dict] = field(default_factory=list)
    heads: ColourHeads | None = None
    stopped_early: bool = False


@torch.no_grad()
def evaluate(net: KimNet, x: torch.Tensor, y: torch.Tensor, batch: int = 1000
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(accuracy, mean cross-entropy) in eval mode, as 0-d tensors on x's device (no sync)."""
    was_training = net.training
    net.eval()
    correct = torch.zeros((), device=x.device)
    loss = torch.zeros((), device=x.device)
    for i in range(0, len(y), batch):
        logits, _ = net(x[i:i + batch])
        correct += (logits.argmax(1) == y[i:i + batch]).sum()
        loss += F.cross_entropy(logits, y[i:i + batch], reduction="sum")
    net.train(was_training)
    n = max(len(y), 1)
    return correct / n, loss / n


@torch.no_grad()
def head_accuracy(net: KimNet, heads: ColourHeads, x: torch.Tensor, targets: torch.Tensor,
                  batch: int = 1000) -> torch.Tensor:
    """Eval-mode pixel accuracy of the heads over the non-ignored pixels (all channels
    pooled), a 0-d tensor."""
    modes = net.training, heads.training
    net.eval()
    heads.eval()
    correct = torch.zeros((), device=x.device)
    count = torch.zeros((), device=x.device)
    for i in range(0, len(x), batch):
        t = targets[i:i + batch]
        pred = heads(net.features(x[i:i + batch])).argmax(2)
        valid = t != IGNORE_INDEX
        correct += ((pred == t) & valid).sum()
        count += valid.sum()
    net.train(modes[0])
    heads.train(modes[1])
    return correct / count.clamp(min=1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _phase_generator(seed: int, phase: str) -> torch.Generator:
    """Batch order: a CPU generator (the same order on every device), one stream per phase."""
    return torch.Generator().manual_seed(2 * seed + (phase == "lntl"))


def _run(phase: str, data: KimData, net: KimNet, epochs: int, seed: int, cfg: KimConfig,
         step: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
         metric_names: tuple[str, ...], set_lrs: Callable[[int], dict],
         extra_eval: Callable[[], dict[str, torch.Tensor]] | None,
         callback: Callback | None) -> tuple[list[dict], bool, int]:
    """The epoch loop shared by both phases. `step` returns a 1-d tensor of this batch's
    losses (named by metric_names), summed on the device; one .item() sync per epoch."""
    device = data.x.device
    gen = _phase_generator(seed, phase)
    history: list[dict] = []
    n = len(data)
    for epoch in range(epochs):
        t0 = time.perf_counter()
        lrs = set_lrs(epoch)
        net.train()
        order = torch.randperm(n, generator=gen).to(device, non_blocking=True)
        sums = torch.zeros(len(metric_names), device=device)
        batches = 0
        for i in range(0, n, cfg.batch_size):
            rows = order[i:i + cfg.batch_size]
            sums += step(data.x[rows], data.y[rows], data.targets[rows])
            batches += 1
        _sync(device)
        train_s = time.perf_counter() - t0
        k = data.eval_size
        train_acc, _ = evaluate(net, data.x[:k], data.y[:k], cfg.eval_batch)
        test_acc, test_loss = evaluate(net, data.test_x, data.test_y, cfg.eval_batch)
        extra = extra_eval() if extra_eval is not None else {}
        means = (sums / max(batches, 1)).tolist()
        metrics = {"phase": phase, "epoch": epoch + 1, **lrs,
                   **dict(zip(metric_names, means, strict=True)),
                   "train_acc": train_acc.item(), "test_acc": test_acc.item(),
                   "test_loss": test_loss.item(), **{k: v.item() for k, v in extra.items()},
                   "train_s": train_s}
        metrics["epoch_s"] = time.perf_counter() - t0
        history.append(metrics)
        if callback is not None and callback(metrics):
            return history, True, epoch + 1
    return history, False, epochs


def train_baseline(train: TensorSplit, test: TensorSplit, device: torch.device | str,
                   *, seed: int = 0, epochs: int | None = None, cfg: KimConfig | None = None,
                   callback: Callback | None = None) -> PhaseResult:
    """Kim's baseline (trainer.py:174-186): task cross-entropy, SGD at baseline_lr with the
    step decay. `callback(metrics)` after every epoch; a truthy return stops the phase."""
    cfg = cfg or KimConfig()
    epochs = cfg.baseline_epochs if epochs is None else epochs
    device = torch.device(device)
    data = prepare(train, test, device, cfg.train_eval_size)
    torch.manual_seed(seed)
    net = KimNet().to(device)  # built on the CPU: the same init on every device
    opt = _sgd(net.parameters(), cfg.baseline_lr, cfg)

    def set_lrs(epoch: int) -> dict:
        lr = scheduled_lr(cfg.baseline_lr, epoch, cfg)
        _set_lr(opt, lr)
        return {"lr": lr}

    def step(x, y, _targets):
        logits, _ = net(x)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach().view(1)

    history, stopped, done = _run("baseline", data, net, epochs, seed, cfg, step,
                                  ("train_loss",), set_lrs, None, callback)
    # What Kim's checkpoint holds: the lr after the scheduler step that ends the last epoch.
    _set_lr(opt, scheduled_lr(cfg.baseline_lr, done, cfg))
    return PhaseResult(net=net, optimizer_state=copy.deepcopy(opt.state_dict()),
                       history=history, stopped_early=stopped)


def finetune_lntl(net: KimNet, train: TensorSplit, test: TensorSplit,
                  device: torch.device | str, *, seed: int = 0, epochs: int | None = None,
                  cfg: KimConfig | None = None, optimizer_state: dict | None = None,
                  callback: Callback | None = None) -> PhaseResult:
    """Kim's LNTL (trainer.py:106-166) fine-tuned from `net` (copied, not changed), new heads.
    `optimizer_state`: the baseline's (PhaseResult.optimizer_state); with
    cfg.resume_optimizer it is loaded as Kim's resume does. Metrics add head_loss (the
    summed heads' loss of step 2), neg_entropy (step 1's term before lam) and head_acc."""
    cfg = cfg or KimConfig()
    epochs = cfg.finetune_epochs if epochs is None else epochs
    device = torch.device(device)
    data = prepare(train, test, device, cfg.train_eval_size)
    net = copy.deepcopy(net).to(device)
    torch.manual_seed(seed)
    heads = ColourHeads().to(device)
    net_params = list(net.parameters())
    opt = _sgd(net_params, cfg.finetune_lr, cfg)
    first_lr = None
    if cfg.resume_optimizer and optimizer_state is not None:
        opt.load_state_dict(optimizer_state)
        first_lr = opt.param_groups[0]["lr"]
    opt_heads = _sgd(heads.parameters(), cfg.finetune_lr, cfg)

    def set_lrs(epoch: int) -> dict:
        lr = scheduled_lr(cfg.finetune_lr, epoch, cfg)
        net_lr = first_lr if epoch == 0 and first_lr is not None else lr
        _set_lr(opt, net_lr)
        _set_lr(opt_heads, lr)
        return {"lr": net_lr, "head_lr": lr}

    def step(x, y, targets):
        # 1. g and f: task + lam * negative entropy of the heads (heads not stepped).
        logits, z = net(x)
        task = F.cross_entropy(logits, y)
        negent = neg_entropy(heads(z))
        opt.zero_grad(set_to_none=True)
        (task + cfg.lam * negent).backward(inputs=net_params)
        opt.step()
        # 2. second forward; the heads learn the colours, reversed (x mu) into the network.
        z = net.features(x)
        bias = colour_loss(heads(grad_reverse(z, cfg.mu)), targets)
        opt.zero_grad(set_to_none=True)
        opt_heads.zero_grad(set_to_none=True)
        bias.backward()
        opt.step()
        opt_heads.step()
        return torch.stack([task.detach(), negent.detach(), bias.detach()])

    def extra_eval() -> dict[str, torch.Tensor]:
        k = data.eval_size
        return {"head_acc": head_accuracy(net, heads, data.x[:k], data.targets[:k],
                                          cfg.eval_batch)}

    history, stopped, done = _run("lntl", data, net, epochs, seed, cfg, step,
                                  ("train_loss", "neg_entropy", "head_loss"), set_lrs,
                                  extra_eval, callback)
    _set_lr(opt, scheduled_lr(cfg.finetune_lr, done, cfg))
    return PhaseResult(net=net, heads=heads, optimizer_state=copy.deepcopy(opt.state_dict()),
                       history=history, stopped_early=stopped)


class FlatStop:
    """Stop once the test curve has been flat for `patience` epochs. An epoch *improves* when
    its test accuracy exceeds the reference by more than `tol`; the reference is the test
    accuracy of the last improving epoch (the first epoch always improves). Flat for N
    epochs = the last N epochs did not improve. A slow steady rise (say +0.001 per epoch at
    tol 0.002) still improves every few epochs, so it is not called flat. patience 0: never
    stop."""

    def __init__(self, patience: int, tol: float = 0.002):
        self.patience, self.tol = patience, tol
        self.reference: float | None = None
        self.since = 0

    def __call__(self, test_acc: float) -> bool:
        if self.reference is None or test_acc > self.reference + self.tol:
            self.reference, self.since = test_acc, 0
        else:
            self.since += 1
        return self.patience > 0 and self.since >= self.patience


def set_fp32_precision(tf32: bool) -> None:
    """Full fp32 convolutions and matmuls on CUDA unless `tf32` (recent torch defaults cuDNN
    convs to TF32; Kim's 2019 runs had none)."""
    mode = "tf32" if tf32 else "ieee"
    try:
        torch.backends.cudnn.conv.fp32_precision = mode
        torch.backends.cuda.matmul.fp32_precision = mode
    except AttributeError:  # torch < 2.9
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
