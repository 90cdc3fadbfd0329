"""Compressor specs: the valid names and parameters, checked and resolved without torch.

A spec is a name (``"topk"``) or a mapping with ``name``, parameters and ``memory``.
:func:`resolve` checks it and fills in every default: the result is what a run records
(manifest, run.json, MLflow) and what :func:`repro500.ext.compressors.get` builds from, so
``compressors.get(spec).spec() == resolve(spec)``.  This module imports no torch, so the plan
(before anything is written) and ``repro500 diff`` (comparing recorded specs) can use it
cheaply.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from repro500.errors import UsageError

# name -> {parameter: (kind, default, description)}; kinds are checked by check_value().
PARAMETERS: dict[str, dict[str, tuple[str, Any, str]]] = {
    "none": {},
    "fp16": {},
    "bf16": {},
    "topk": {"ratio": ("ratio", 0.01, "fraction of elements kept, in (0, 1]")},
    "randomk": {
        "ratio": ("ratio", 0.01, "fraction of elements kept, in (0, 1]"),
        "seed": ("int>=0", 0, "seed of the shared random positions"),
    },
    "qsgd": {
        "levels": ("levels", 127, "quantization levels s per sign, 1..127"),
        "bucket_size": ("int>=1", 512, "elements per L2-norm bucket"),
        "seed": ("int>=0", 0, "seed of the stochastic rounding"),
    },
    "terngrad": {
        "clip_sigmas": ("float>0|null", 2.5, "clip at this many standard deviations (null: off)"),
        "bucket_size": ("int>=1", 4096, "elements per max-norm scale"),
        "seed": ("int>=0", 0, "seed of the stochastic rounding"),
    },
    "efsignsgd": {},
    "powersgd": {
        "rank": ("int>=1", 1, "matrix approximation rank r"),
        "start_iter": ("int>=2", 10, "steps of plain allreduce before compressing"),
        "min_compression_rate": ("float>0", 2.0, "compress a matrix only if it saves this factor"),
        "warm_start": ("bool", True, "reuse Q from the previous step"),
        "error_feedback": ("bool", True, "carry the approximation error to the next step"),
        "seed": ("int>=0", 0, "seed of the initial Q"),
    },
}
MEMORIES = ("none", "residual", "efsign")
# The error feedback each compressor gets unless the spec names one (the classes read it here).
DEFAULT_MEMORY: dict[str, str] = {
    "none": "none",
    "fp16": "none",
    "bf16": "none",
    "topk": "residual",
    "randomk": "residual",
    "qsgd": "none",  # unbiased: no error feedback needed
    "terngrad": "none",
    "efsignsgd": "efsign",
    "powersgd": "none",  # error feedback lives inside torch's PowerSGDState
}
# (engine, compressor) pairs that cannot run, and why: the plan says it before anything is
# written, and the Horovod adapter says it again to a library caller.
UNSUPPORTED: dict[tuple[str, str], str] = {
    ("horovod", "powersgd"): "the powersgd compressor works only with the ddp engine; "
                             "choose another compressor for horovod.",
    ("horovod", "bf16"): "Horovod 0.28.1 cannot reduce bfloat16 tensors; use fp16 with horovod, "
                         "or bf16 with the ddp engine.",
}


def names() -> list[str]:
    return list(PARAMETERS)


def check_value(name: str, key: str, kind: str, value: Any) -> Any:
    """*value* of parameter *key* of compressor *name*, checked against *kind* (UsageError)."""

    def bad(expect: str) -> UsageError:
        return UsageError(f"compressor {name!r}: {key}={value!r} is invalid; expected {expect}.")

    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "ratio":
        if not is_number or not 0 < value <= 1:
            raise bad("a ratio in (0, 1], e.g. 0.01")
        return float(value)
    if kind == "levels":
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 127:
            raise bad("an integer number of levels in 1..127 (codes are int8)")
        return value
    if kind.startswith("int>="):
        low = int(kind[5:])
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise bad(f"an integer >= {low}")
        return value
    if kind == "float>0":
        if not is_number or not value > 0 or not math.isfinite(value):
            raise bad("a positive number")
        return float(value)
    if kind == "float>0|null":
        if value is None:
            return None
        return check_value(name, key, "float>0", value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    raise AssertionError(f"unknown parameter kind {kind}")


def resolve(spec: str | Mapping[str, Any] | None, *, seed_per_repeat: bool = False) -> dict[str, Any]:
    """``{"name": ..., <every parameter, defaults filled in>, "memory": ...}`` for *spec*.

    Raises :class:`repro500.errors.UsageError` (one sentence listing the valid choices) for an
    unknown name, an unknown parameter or a value out of range.

    *seed_per_repeat*: the spec is a recipe's, whose trainer draws an unset ``seed`` from each
    repeat's seed (repro500.workloads.trainer.records.compressor_spec) rather than using the default 0;
    such a seed is resolved to None ("derived per repeat"), so what is recorded is what ran.
    """
    if spec is None:
        spec = "none"
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping):
        raise UsageError(
            f"compressor spec {spec!r} is neither a name nor a mapping; use e.g. "
            "'topk' or {name: topk, ratio: 0.01}."
        )
    params = dict(spec)
    name = str(params.pop("name", "")).strip().lower()
    if name not in PARAMETERS:
        raise UsageError(
            f"unknown compressor {name!r}; valid compressors: {', '.join(PARAMETERS)}."
        )
    memory = params.pop("memory", None)
    if memory is not None and memory not in MEMORIES:
        raise UsageError(
            f"compressor {name!r}: memory={memory!r} is unknown; "
            f"valid memories: {', '.join(MEMORIES)}."
        )
    schema = PARAMETERS[name]
    unknown = sorted(set(params) - set(schema))
    if unknown:
        valid = ", ".join(schema) or "none besides name and memory"
        raise UsageError(
            f"compressor {name!r} has no parameter {unknown[0]!r}; valid parameters: {valid}."
        )
    out: dict[str, Any] = {"name": name}
    for key, (kind, default, _) in schema.items():
        if key == "seed" and seed_per_repeat and params.get(key) is None:
            out[key] = None
        else:
            out[key] = check_value(name, key, kind, params.get(key, default))
    out["memory"] = memory or DEFAULT_MEMORY[name]
    return out


def canonical(recorded: Any) -> Any:
    """A compressor spec as a run recorded it, resolved: older runs recorded the recipe's
    spelling (``"topk"``), newer ones the resolved spec (``{"name": "topk", "ratio": 0.01,
    "memory": "residual"}``), and both must compare equal.  A recorded value this version cannot
    resolve is returned as it is."""
    try:
        return resolve(recorded, seed_per_repeat=True)
    except UsageError:
        return recorded
