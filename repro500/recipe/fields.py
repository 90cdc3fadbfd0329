"""Which keys of a resolved recipe are the schema's own fields, and which are names a user chose.

A run directory's ``recipe.yaml`` is read back by ``run --resume``, ``verify``, ``publish`` and
``reproduce``, so it must say exactly what ran.  Secrets are kept out of it by value and by
content (:func:`repro500.redact.scrub`) everywhere, but by *name* only where a name was chosen by
someone: an environment variable in ``fixed.env``, a model or data set option, a command's own
``mutable`` key.  A schema field never hides its value for its name: ``metrics.f1.key`` is the
JSON key the metric is read from, and ``[REDACTED]`` there is a recipe that can no longer run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import yaml

from repro500 import redact
from repro500.recipe.schema import MUTABLE_SCHEMA, is_command_fixed

# Under these fixed keys, every key is an option of a plug-in or a variable's name.
_CHOSEN_UNDER_FIXED = frozenset({"env", "model_options", "system"})


def chosen_names(data: Mapping[str, Any]) -> Callable[[tuple[str, ...]], bool]:
    """``named`` for :func:`repro500.redact.scrub` over the recipe *data* (``Recipe.to_dict()``)."""
    command = is_command_fixed(data.get("fixed") or {})

    def named(path: tuple[str, ...]) -> bool:
        section, rest = path[0], path[1:]
        if section == "overrides" and rest:  # ``mutable.api_key``: the path it overrode decides
            return named((*rest[0].split("."), *rest[1:]))
        if section == "fixed" and len(rest) >= 2:
            return rest[0] in _CHOSEN_UNDER_FIXED or (rest[:2] == ("dataset", "params") and len(rest) >= 3)
        if section == "mutable" and rest:
            # a command's mutable keys are all its own; a trained workload's are the schema's,
            # except the options of a compressor given as a mapping
            return command or rest[0] not in MUTABLE_SCHEMA or (rest[0] == "compressor" and len(rest) >= 2)
        return False  # the top level, acceptance and metrics: the schema's fields and metric names

    return named


def scrub_recipe(data: Mapping[str, Any]) -> Any:
    """A recipe ready to be written: secrets out by value and content, chosen names by name."""
    return redact.scrub(data, named=chosen_names(data))


def recipe_yaml(data: Mapping[str, Any]) -> str:
    """A run directory's ``recipe.yaml`` for the resolved recipe *data* (``Recipe.to_dict()``)."""
    return yaml.safe_dump(scrub_recipe(data), sort_keys=False)
