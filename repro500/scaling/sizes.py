"""Trainable parameter counts of known models, for ``repro500 model --model NAME``.

The numbers are the models at their default options, counted as
``sum(p.numel() for p in model.parameters() if p.requires_grad)`` with torch 2.14 and
torchvision 0.29 (tests recount the models of repro500's registry).  A table rather than
building the model: the scaling package never imports the training code, and a prediction
should not wait for torchvision to build a network.
"""

from __future__ import annotations

from repro500.errors import UsageError

KNOWN_PARAMS: dict[str, int] = {
    # repro500's model registry (repro500.workloads.models), default options
    "resnet20": 269_722,
    "resnet32": 464_154,
    "resnet44": 658_586,
    "resnet56": 853_018,
    "resnet110": 1_727_962,
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "fasterrcnn_resnet18_fpn": 28_339_624,
    "fasterrcnn_resnet50_fpn": 41_408_424,
    "fasterrcnn_mobilenet_v3_fpn": 18_971_876,
    "cosmoflow": 2_454_964,
    # other torchvision classifiers often used in scaling studies
    "resnet152": 60_192_808,
    "alexnet": 61_100_840,
    "vgg16": 138_357_544,
    "vit_b_16": 86_567_656,
    "densenet121": 7_978_856,
    "mobilenet_v3_large": 5_483_032,
    "efficientnet_b0": 5_288_548,
}


def params_of(name: str) -> int:
    """Trainable parameters of model *name* (UsageError naming the known ones otherwise)."""
    key = name.strip().lower()
    if key not in KNOWN_PARAMS:
        raise UsageError(f"no parameter count is known for model {name!r}; use --params N, or one of: "
                         f"{', '.join(KNOWN_PARAMS)}")
    return KNOWN_PARAMS[key]
