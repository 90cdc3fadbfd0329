"""The models a recipe can name, built by one factory: ``build_model(name, ...)``.

A name is a model registered under the ``repro500.models`` entry-point group (repro500's own
built-ins are registered there, in ``builtin.py``) or a plug-in's ``module:callable``
(``repro500.workloads.plugins``).  Every built-in is a plain, randomly initialised
``torch.nn.Module``; nothing is ever downloaded (no pretrained weights).  ``model_task(name)``
says which evaluation a built-in needs.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

from repro500.errors import InvalidInput, UsageError
from repro500.workloads import plugins

TASKS = ("classification", "detection", "regression")


def model_names() -> list[str]:
    """Every registered model name (repro500's built-ins and installed plug-ins)."""
    return sorted(plugins.registered("model"))


def find_builder(name: str) -> Callable[..., Any]:
    """The builder ``name`` refers to: a registered name or a plug-in's ``module:callable``."""
    if not plugins.is_import_path(name) and name not in plugins.registered("model"):
        raise UsageError(f"unknown model {name!r}; valid models: {', '.join(model_names())}; "
                         "a plug-in is named as module:callable.")
    return plugins.resolve("model", name, key="fixed.model")  # a broken plug-in: InvalidInput, exit 4


def model_task(name: str) -> str | None:
    """``"classification"``, ``"detection"`` or ``"regression"`` when the builder declares its
    task (the built-ins do); ``None`` for a plug-in that leaves it to ``fixed.workload``."""
    task = getattr(find_builder(name), "task", None)
    return task if task in TASKS else None


def model_options(name: str) -> dict[str, Any]:
    """The options ``build_model(name, **options)`` accepts, with their defaults (None where a
    parameter has none): every parameter that can be passed by keyword, as the builder is called
    with keywords only (``def build(num_classes=4, width=16)`` takes ``width``); a builder that
    takes ``**kwargs`` accepts any (its own code then decides)."""
    parameters = inspect.signature(find_builder(name)).parameters
    keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return {
        key: None if param.default is inspect.Parameter.empty else param.default
        for key, param in parameters.items()
        if param.kind in keyword and key not in ("num_classes", "in_channels")
    }


def takes_any_options(builder: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(builder).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


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


def _check_options(name: str, builder: Callable[..., Any], options: dict[str, Any]) -> None:
    if takes_any_options(builder):
        return
    valid = model_options(name)
    func = builder.func if isinstance(builder, functools.partial) else builder
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # noqa: BLE001 - a plug-in's unresolvable annotation only loses the type check
        hints = {}
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

    ``name`` is a registered model or a plug-in's ``module:callable``.  ``num_classes``:
    classes for classifiers, classes *including background* for detectors, regressed outputs
    for ``cosmoflow``.  ``in_channels``: input channels.  ``None`` keeps the model's natural
    value.  Other options are model-specific (``model_options(name)``); unknown ones raise
    ``UsageError``.  A plug-in receives ``num_classes`` / ``in_channels`` only if it takes them.
    """
    builder = find_builder(name)
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
    if getattr(builder, "task", None) in TASKS:  # repro500's own: its errors are already sentences
        return builder(**options)
    model = plugins.call(builder, "fixed.model", name, **options)
    import torch

    if not isinstance(model, torch.nn.Module):
        raise InvalidInput(f"fixed.model: {name!r} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


__all__ = [
    "TASKS",
    "build_model",
    "model_names",
    "model_options",
    "model_task",
]
