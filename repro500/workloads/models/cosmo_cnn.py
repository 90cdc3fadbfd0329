"""A CosmoFlow-style 3D CNN that regresses cosmological parameters from matter-density volumes.

The shape follows the MLPerf HPC CosmoFlow reference model (Mathuriya et al., SC'18):
``depth`` blocks of [Conv3d ("same" padding) -> LeakyReLU(0.3) -> MaxPool3d(2)] whose
channel count doubles from ``base_channels``, then Dense(fc1) -> Dense(fc2) -> Dense(outputs),
with optional dropout, and an output of ``1.2 * tanh`` so targets normalised to [-1, 1]
(or [0, 1]) are reachable without saturating.  Defaults are the reference's (16 channels,
kernel 2, 5 blocks, 128 and 64 hidden units, 128^3 crops); ``base_channels=8, depth=3,
crop_size=32`` trains on a CPU.
"""

from __future__ import annotations

import torch
from torch import nn

from repro500.errors import UsageError

LEAKY_RELU_SLOPE = 0.3  # Keras' LeakyReLU default, used by the reference model
OUTPUT_SCALE = 1.2  # the reference's scale on tanh, so +-1 targets are not at saturation
OUTPUT_ACTIVATIONS = ("scaled_tanh", "none")


def _same_conv3d(in_channels: int, out_channels: int, kernel_size: int) -> list[nn.Module]:
    """A "same"-padded convolution; even kernels pad one more at the end, as Keras does.

    torch's ``padding="same"`` also works for even kernels but copies the input on every
    call and warns each time; an explicit pad layer says what happens.
    """
    if kernel_size % 2:
        return [nn.Conv3d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)]
    before, after = (kernel_size - 1) // 2, kernel_size // 2
    return [
        nn.ConstantPad3d((before, after) * 3, 0.0),
        nn.Conv3d(in_channels, out_channels, kernel_size),
    ]


class CosmoFlowNet(nn.Module):
    def __init__(
        self,
        *,
        in_channels: int = 4,
        num_outputs: int = 4,
        crop_size: int = 128,
        base_channels: int = 16,
        depth: int = 5,
        kernel_size: int = 2,
        fc1_size: int = 128,
        fc2_size: int = 64,
        dropout: float = 0.0,
        output_activation: str = "scaled_tanh",
    ) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        channels, edge = in_channels, crop_size
        for index in range(depth):
            out_channels = base_channels * 2**index
            blocks += [
                *_same_conv3d(channels, out_channels, kernel_size),
                nn.LeakyReLU(LEAKY_RELU_SLOPE),
                nn.MaxPool3d(2),
            ]
            channels, edge = out_channels, edge // 2
        self.features = nn.Sequential(*blocks)
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels * edge**3, fc1_size),
            nn.LeakyReLU(LEAKY_RELU_SLOPE),
            nn.Dropout(dropout),
            nn.Linear(fc1_size, fc2_size),
            nn.LeakyReLU(LEAKY_RELU_SLOPE),
            nn.Dropout(dropout),
            nn.Linear(fc2_size, num_outputs),
        )
        self.scaled_tanh = output_activation == "scaled_tanh"
        self.crop_size = crop_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: (batch, channels, D, H, W) with D = H = W = ``crop_size``."""
        out = self.head(self.features(x))
        return OUTPUT_SCALE * torch.tanh(out) if self.scaled_tanh else out


def cosmoflow(
    *,
    num_classes: int = 4,
    in_channels: int = 4,
    crop_size: int = 128,
    base_channels: int = 16,
    depth: int = 5,
    kernel_size: int = 2,
    fc1_size: int = 128,
    fc2_size: int = 64,
    dropout: float = 0.0,
    output_activation: str = "scaled_tanh",
) -> CosmoFlowNet:
    """Build the CosmoFlow CNN; ``num_classes`` is the number of regressed parameters (4)."""
    if depth < 1 or crop_size < 2**depth:
        raise UsageError(
            f"cosmoflow: crop_size {crop_size} is too small for depth {depth} "
            f"(each block halves it; need crop_size >= {2 ** max(depth, 1)})."
        )
    if output_activation not in OUTPUT_ACTIVATIONS:
        raise UsageError(
            f"cosmoflow: output_activation {output_activation!r} is not one of {', '.join(OUTPUT_ACTIVATIONS)}."
        )
    if not 0.0 <= dropout < 1.0:
        raise UsageError(f"cosmoflow: dropout must be in [0, 1), got {dropout}.")
    return CosmoFlowNet(
        in_channels=in_channels,
        num_outputs=num_classes,
        crop_size=crop_size,
        base_channels=base_channels,
        depth=depth,
        kernel_size=kernel_size,
        fc1_size=fc1_size,
        fc2_size=fc2_size,
        dropout=dropout,
        output_activation=output_activation,
    )
