"""The models a recipe can name, built by one factory: ``build_model(name, ...)``.

Every model is a plain, randomly initialised ``torch.nn.Module``; nothing is ever
downloaded (no pretrained weights).  ``model_task(name)`` says which evaluation applies
(``repro500.workloads.evaluation``).  torch and torchvision are imported only when a model
is built, so importing this package is cheap.
"""

from __future__ import annotations

import collections.abc
import functools
import importlib
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from repro500.errors import UsageError

TASKS = ("classification", "detection", "regression")


@dataclass(frozen=True)
class ModelSpec:
    task: str
    module: str  # imported only when the model is built (it imports torch)
    function: str  # keyword options: num_classes, in_channels and the model's own
    args: tuple[Any, ...]  # leading positional arguments, e.g. the depth
    description: str

    def builder(self) -> Callable[..., Any]:
        function = getattr(
            importlib.import_module(f"repro500.workloads.models.{self.module}"), self.function
        )
        return functools.partial(function, *self.args)


MODELS: dict[str, ModelSpec] = {
    **{
        f"resnet{depth}": ModelSpec(
            "classification",
            "cifar_resnet",
            "cifar_resnet",
            (depth,),
            f"CIFAR-style ResNet-{depth} (option-A shortcuts)",
        )
        for depth in (20, 32, 44, 56, 110)
    },
    **{
        name: ModelSpec(
            "classification",
            "imagenet_resnet",
            "torchvision_resnet",
            (name,),
            f"torchvision {name}",
        )
        for name in ("resnet18", "resnet34", "resnet50", "resnet101")
    },
    **{
        name: ModelSpec(
            "detection",
            "detection",
            "faster_rcnn",
            (name,),
            f"torchvision Faster R-CNN, {backbone} FPN backbone",
        )
        for name, backbone in (
            ("fasterrcnn_resnet18_fpn", "ResNet-18"),
            ("fasterrcnn_resnet50_fpn", "ResNet-50"),
            ("fasterrcnn_mobilenet_v3_fpn", "MobileNetV3-Large"),
        )
    },
    "cosmoflow": ModelSpec(
        "regression",
        "cosmo_cnn",
        "cosmoflow",
        (),
        "CosmoFlow-style 3D CNN (4 cosmological parameters)",
    ),
}


def model_names() -> list[str]:
    return list(MODELS)


def _spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise UsageError(f"unknown model {name!r}; valid models: {', '.join(MODELS)}.") from None


def model_task(name: str) -> str:
    """``"classification"``, ``"detection"`` or ``"regression"`` for model ``name``."""
    return _spec(name).task


def model_options(name: str) -> dict[str, Any]:
    """The options ``build_model(name, **options)`` accepts, with their defaults."""
    parameters = inspect.signature(_spec(name).builder()).parameters
    return {
        key: param.default
        for key, param in parameters.items()
        if param.kind is inspect.Parameter.KEYWORD_ONLY
        and key not in ("num_classes", "in_channels")
    }


def _matches(value: Any, hint: Any) -> bool:
    """Whether a recipe value fits a builder's annotation (the few shapes builders use)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if origin in (collections.abc.Sequence, list, tuple):
        (item,) = typing.get_args(hint)[:1] or (Any,)
        return isinstance(value, list | tuple) and all(
            item is Any or _matches(v, item) for v in value
        )
    if hint is Any:
        return True
    return isinstance(value, hint)


def _type_name(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("collections.abc.", "")


def _check_options(name: str, builder: functools.partial, options: dict[str, Any]) -> None:
    valid = model_options(name)
    hints = typing.get_type_hints(builder.func)
    for key, value in options.items():
        if key not in valid:
            listed = ", ".join(valid) or "none"
            raise UsageError(f"model {name!r} has no option {key!r}; its options are: {listed}.")
        if key in hints and not _matches(value, hints[key]):
            expected = _type_name(hints[key])
            raise UsageError(f"model {name!r} option {key!r} must be {expected}, got {value!r}.")


def build_model(
    name: str, *, num_classes: int | None = None, in_channels: int | None = None, **options: Any
) -> Any:
    """Build model ``name`` (a ``torch.nn.Module``), randomly initialised.

    ``num_classes``: classes for classifiers, classes *including background* for detectors,
    regressed outputs for ``cosmoflow``.  ``in_channels``: input channels.  ``None`` keeps
    the model's natural value (10 or 1000 classes and 3 channels for ResNets, 5 classes and
    16 channels for Faster R-CNN, 4 outputs and 4 channels for CosmoFlow).  Other options
    are model-specific (``model_options(name)``); unknown ones raise ``UsageError``.
    """
    builder = _spec(name).builder()
    _check_options(name, builder, options)
    for label, value in (("num_classes", num_classes), ("in_channels", in_channels)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise UsageError(f"model {name!r}: {label} must be a positive integer, got {value!r}.")
    if num_classes is not None:
        options["num_classes"] = num_classes
    if in_channels is not None:
        options["in_channels"] = in_channels
    return builder(**options)


__all__ = [
    "MODELS",
    "TASKS",
    "ModelSpec",
    "build_model",
    "model_names",
    "model_options",
    "model_task",
]
