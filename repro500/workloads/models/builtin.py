"""repro500's own models, registered under the ``repro500.models`` entry-point group in
``pyproject.toml`` exactly as a user's package registers theirs (docs/workloads.md).

Each builder is a ``functools.partial`` of the family's function with its leading argument
(depth or variant) bound, so its keyword-only options stay introspectable; ``task`` and
``description`` travel as attributes (a plug-in may set them too; ``fixed.workload`` decides).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from repro500.workloads.models.cifar_resnet import cifar_resnet
from repro500.workloads.models.cosmo_cnn import cosmoflow as _cosmoflow
from repro500.workloads.models.detection import faster_rcnn
from repro500.workloads.models.imagenet_resnet import torchvision_resnet


def _named(task: str, description: str, function: Callable[..., Any], *args: Any) -> Any:
    builder = functools.partial(function, *args)
    builder.task = task  # type: ignore[attr-defined]
    builder.description = description  # type: ignore[attr-defined]
    return builder


resnet20 = _named("classification", "CIFAR-style ResNet-20 (option-A shortcuts)", cifar_resnet, 20)
resnet32 = _named("classification", "CIFAR-style ResNet-32 (option-A shortcuts)", cifar_resnet, 32)
resnet44 = _named("classification", "CIFAR-style ResNet-44 (option-A shortcuts)", cifar_resnet, 44)
resnet56 = _named("classification", "CIFAR-style ResNet-56 (option-A shortcuts)", cifar_resnet, 56)
resnet110 = _named("classification", "CIFAR-style ResNet-110 (option-A shortcuts)", cifar_resnet, 110)
resnet18 = _named("classification", "torchvision resnet18", torchvision_resnet, "resnet18")
resnet34 = _named("classification", "torchvision resnet34", torchvision_resnet, "resnet34")
resnet50 = _named("classification", "torchvision resnet50", torchvision_resnet, "resnet50")
resnet101 = _named("classification", "torchvision resnet101", torchvision_resnet, "resnet101")
fasterrcnn_resnet18_fpn = _named("detection", "torchvision Faster R-CNN, ResNet-18 FPN backbone",
                                 faster_rcnn, "fasterrcnn_resnet18_fpn")
fasterrcnn_resnet50_fpn = _named("detection", "torchvision Faster R-CNN, ResNet-50 FPN backbone",
                                 faster_rcnn, "fasterrcnn_resnet50_fpn")
fasterrcnn_mobilenet_v3_fpn = _named("detection", "torchvision Faster R-CNN, MobileNetV3-Large FPN backbone",
                                     faster_rcnn, "fasterrcnn_mobilenet_v3_fpn")
cosmoflow = _named("regression", "CosmoFlow-style 3D CNN (4 cosmological parameters)", _cosmoflow)
