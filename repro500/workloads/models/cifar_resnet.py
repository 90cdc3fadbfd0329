"""CIFAR-style ResNets (He et al., "Deep Residual Learning", CVPR 2016, section 4.2).

Three stages of 16, 32 and 64 channels with n basic blocks each, a 3x3 stem, global average
pooling and one linear layer: 6n + 2 weighted layers (ResNet-20: n=3, -44: n=7, -56: n=9).
Shortcuts are the paper's **option A**: identity, and where the shape changes the input is
subsampled by 2 and zero-padded in channels, so shortcuts carry no parameters. That is what
gives the paper's parameter counts (0.27M, 0.66M, 0.85M); torchvision has no CIFAR variant.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from repro500.errors import UsageError

STAGE_CHANNELS = (16, 32, 64)


class PadShortcut(nn.Module):
    """Option-A shortcut: take every second pixel and zero-pad the new channels."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.extra_channels = out_channels - in_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        # F.pad pads the last dimensions first: (W, W, H, H, C, C).
        return F.pad(x, (0, 0, 0, 0, 0, self.extra_channels))


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        if stride != 1 or in_channels != out_channels:
            self.shortcut: nn.Module = PadShortcut(in_channels, out_channels, stride)
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for small (e.g. 32x32) images."""

    def __init__(self, blocks_per_stage: int, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, STAGE_CHANNELS[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(STAGE_CHANNELS[0])
        stages = []
        channels = STAGE_CHANNELS[0]
        for index, stage_channels in enumerate(STAGE_CHANNELS):
            blocks = []
            for block in range(blocks_per_stage):
                stride = 2 if index > 0 and block == 0 else 1
                blocks.append(BasicBlock(channels, stage_channels, stride))
                channels = stage_channels
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.fc = nn.Linear(channels, num_classes)
        # He initialisation for convolutions (as in the paper); the classifier keeps
        # PyTorch's default, which starts the loss near ln(num_classes).
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


def cifar_resnet(depth: int, *, num_classes: int = 10, in_channels: int = 3) -> CifarResNet:
    """Build ResNet-``depth``; ``depth`` must be 6n + 2 (20, 32, 44, 56, 110, ...)."""
    if depth < 8 or (depth - 2) % 6:
        raise UsageError(
            f"CIFAR ResNet depth {depth} is not 6n+2 (e.g. 20, 44, 56); pick one of those."
        )
    return CifarResNet((depth - 2) // 6, num_classes=num_classes, in_channels=in_channels)
