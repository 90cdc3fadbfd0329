"""torchvision's ResNet-18/50, randomly initialised, adapted to other inputs.

Never pretrained: ``weights=None`` always, nothing is downloaded.  Two adaptations:
``in_channels != 3`` replaces the stem convolution (same shape otherwise), and
``small_input=True`` uses a 3x3 stride-1 stem without max pooling, the usual variant for
32x32 images (the 7x7/2 stem plus pooling would shrink them to 8x8 before the first stage).
"""

from __future__ import annotations

from torch import nn

from repro500.errors import UsageError

TORCHVISION_RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101")


def _init_conv(conv: nn.Conv2d) -> nn.Conv2d:
    # Same initialisation torchvision applies to every convolution of its ResNets.
    nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
    return conv


def torchvision_resnet(
    name: str,
    *,
    num_classes: int = 1000,
    in_channels: int = 3,
    small_input: bool = False,
    zero_init_residual: bool = False,
) -> nn.Module:
    """Build torchvision's ResNet ``name`` with a stem for ``in_channels`` input channels."""
    import torchvision

    if name not in TORCHVISION_RESNETS:
        raise UsageError(
            f"unknown torchvision ResNet {name!r}; choose one of {', '.join(TORCHVISION_RESNETS)}."
        )
    factory = getattr(torchvision.models, name)
    model = factory(weights=None, num_classes=num_classes, zero_init_residual=zero_init_residual)
    if small_input:
        model.conv1 = _init_conv(
            nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        )
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = _init_conv(
            nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        )
    return model
