"""The recipes ``repro500 ops``, ``roofline`` and ``io`` write: ``fixed.workload: system``.

Like ``repro500 run --command`` (workloads/adhoc.py), each command turns its options into the
recipe a user could have written; the runner stores it as the run's ``recipe.yaml``, so
``--resume``, ``verify``, ``publish`` and ``reproduce`` read it like any other.  The acceptance is
the measurement's own check, computed here from the cases that will run: operator errors within
their tolerances (ops), ceilings corroborated by an independent tool (roofline), outputs close to
float64 (inference), every sample read back as written (io).
"""

from __future__ import annotations

from typing import Any

from repro500.recipe.schema import SCHEMA
from repro500.system import dataio, inference, ops, roofline


def measure_mutable(device: str | None = None, threads: int | None = None, nproc: int | None = None) -> dict[str, Any]:
    """A measurement's ``mutable`` from its command's options (what is not given is left out):
    with more than one process it measures through the ``ddp`` engine (the all-reduce operator,
    the interconnect's timings)."""
    mutable = {"device": device, "threads": threads, "nproc": nproc,
               "engine": "ddp" if nproc and nproc > 1 else None}
    return {k: v for k, v in mutable.items() if v is not None}


def _recipe(name: str, measure: str, system: dict[str, Any], mutable: dict[str, Any],
            acceptance: dict[str, Any], repeats: int, seed: int, description: str) -> dict[str, Any]:
    return {"schema": SCHEMA, "name": name, "description": description,
            "fixed": {"workload": "system", "measure": measure, "system": system},
            "mutable": {k: v for k, v in mutable.items() if v is not None}, "acceptance": acceptance,
            "repeats": repeats, "seed": seed}


def ops_recipe(system: dict[str, Any], mutable: dict[str, Any], *, device: str, repeats: int = 3,
               seed: int = 0) -> dict[str, Any]:
    """An ops recipe whose acceptance bounds every case's error by its tolerance."""
    config = ops.OpsConfig.from_recipe(system, mutable, device)
    cases = ops.check(config)
    return _recipe("ops", "ops", system, mutable, ops.acceptance(cases, config), repeats, seed,
                   "written by repro500 ops: operator time, FLOP/s, bytes/s and error against float64")


def roofline_recipe(system: dict[str, Any], mutable: dict[str, Any], *, device: str, repeats: int = 3,
                    seed: int = 0) -> dict[str, Any]:
    config = roofline.RooflineConfig.from_recipe(system, mutable, device)
    roofline.check(config)
    return _recipe("roofline", "roofline", system, mutable, roofline.acceptance(config), repeats, seed,
                   "written by repro500 roofline: peak FLOP/s, memory bandwidth and interconnect, cross-checked")


def inference_recipe(system: dict[str, Any], mutable: dict[str, Any], *, device: str, name: str, repeats: int = 3,
                     seed: int = 0) -> dict[str, Any]:
    config = inference.InferenceConfig.from_recipe(system, mutable, device)
    inference.check(config)
    return _recipe(f"inference-{name}", "inference", system, mutable, inference.acceptance(config), repeats, seed,
                   f"written by repro500 ops --inference: latency and throughput of {name}'s model")


def io_recipe(system: dict[str, Any], mutable: dict[str, Any], *, repeats: int = 3, seed: int = 0) -> dict[str, Any]:
    config = dataio.IoConfig.from_recipe(system, mutable)
    dataio.check(config)
    return _recipe("io", "io", system, mutable, dataio.acceptance(config), repeats, seed,
                   "written by repro500 io: read throughput of repro500's data formats against a raw read")
