"""Two small classifiers for CIFAR-sized images (``in_channels`` x 32 x 32 by default).

Both are plain builder functions with keyword-only options, returning a ``torch.nn.Module``
that maps a batch ``(N, C, H, W)`` to logits ``(N, num_classes)``.
"""

from torch import nn


def tiny_mlp(*, num_classes=10, in_channels=3, image_size=32, hidden=128, layers=1, dropout=0.0):
    """A multi-layer perceptron on the flattened image: ``layers`` hidden layers of ``hidden`` units."""
    if layers < 1 or hidden < 1:
        raise ValueError(f"tiny_mlp needs layers >= 1 and hidden >= 1, got layers={layers}, hidden={hidden}")
    blocks = [nn.Flatten()]
    width = in_channels * image_size * image_size
    for _ in range(layers):
        blocks += [nn.Linear(width, hidden), nn.ReLU(inplace=True)]
        if dropout:
            blocks.append(nn.Dropout(dropout))
        width = hidden
    blocks.append(nn.Linear(width, num_classes))
    return nn.Sequential(*blocks)


def tiny_cnn(*, num_classes=10, in_channels=3, width=16):
    """Two 3x3 convolutions with batch norm and pooling, then global pooling and a linear layer."""
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1, bias=False),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, num_classes),
    )
