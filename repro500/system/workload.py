"""The ``system`` workload: a measurement of the machine, run by the runner like any experiment.

A recipe with ``fixed.workload: system`` names what it measures in ``fixed.measure`` (ops,
roofline, inference, io) and its options in ``fixed.system``; ``repro500 ops``, ``roofline`` and
``io`` write such recipes (``recipes.py``), and a recipe file runs the same way through
``repro500 run``.  Each repeat measures once and reports flat metrics, so the run directory,
its manifest, MLflow, ``repro500 verify`` (bands, and ``--against`` another machine's run) and
the report treat it like any other run.  The repeat's full record goes to ``system.json``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from repro500.recipe import load as recipes
from repro500.rundir import atomic, layout
from repro500.rundir.sums import REPEAT_SUMMARY_SCHEMA
from repro500.statuses import REPEAT_COMPLETED
from repro500.system import dataio
from repro500.system.dataio import IoConfig
from repro500.system.inference import InferenceConfig
from repro500.system.ops import OpsConfig
from repro500.system.roofline import RooflineConfig
from repro500.workloads.workload import Repeat, check_acceptance, expand_paths


class SystemWorkload:
    kind = "system"

    def __init__(self, recipe: recipes.Recipe, *, device: str = "cpu", engine: str = "local") -> None:
        self.recipe = recipe
        self.device = device
        self.engine = engine
        self.measure = str(recipe.fixed["measure"])
        self.options: dict[str, Any] = dict(recipe.fixed.get("system") or {})
        self.imported: list[tuple[str, str]] = []
        self._metrics: list[str] | None = None

    # ----- what the runner asks before the run ---------------------------------------------
    def data_paths(self) -> list[str]:
        if self.measure != "inference":
            return []
        dataset = self.options.get("dataset") or {}
        paths = [p for key in ("path", "eval_path") for p in _as_list(dataset.get(key))]
        return expand_paths(paths, "fixed.system.dataset.path")

    def input_paths(self) -> list[str]:
        return []

    def metric_names(self) -> list[str]:
        if self._metrics is None:
            self.check()
        return list(self._metrics or [])

    def check(self) -> None:
        """Everything the measurement can refuse, before the run directory exists."""
        if self.measure == "ops":
            from repro500.system import ops

            self._metrics = ops.metric_names(ops.check(self._ops_config()))
        elif self.measure == "roofline":
            from repro500.system import roofline

            self._metrics = roofline.check(self._roofline_config())
        elif self.measure == "inference":
            from repro500.system import inference

            self._metrics = inference.check(self._inference_config())
        else:
            from repro500.system import dataio

            self._metrics = dataio.check(self._io_config())
        self._metrics = [*self._metrics, "total_time_s"]
        check_acceptance(self.recipe, self._metrics)

    # ----- configurations ------------------------------------------------------------------
    def _ops_config(self) -> Any:
        return OpsConfig.from_recipe(self.options, self.recipe.mutable, self.device)

    def _roofline_config(self) -> Any:
        return RooflineConfig.from_recipe(self.options, self.recipe.mutable, self.device)

    def _inference_config(self) -> Any:
        return InferenceConfig.from_recipe(self.options, self.recipe.mutable, self.device)

    def _io_config(self) -> Any:
        return IoConfig.from_recipe(self.options, self.recipe.mutable)

    # ----- one repeat ----------------------------------------------------------------------
    def run_repeat(self, repeat: Repeat) -> dict[str, Any]:
        import torch

        threads = self.recipe.mutable.get("threads")
        if threads:
            torch.set_num_threads(int(threads))
        seed = repeat.seeds.torch % 2**31 if self.measure == "inference" else self.recipe.seed
        started = time.perf_counter()
        metrics, record = self._measure(seed, Path(repeat.out_dir), repeat.k)
        total_s = time.perf_counter() - started
        out = Path(repeat.out_dir)
        atomic.write_json(out / layout.SYSTEM_RECORD, {"schema": SYSTEM_RECORD_SCHEMA, **record})
        summary = {"schema": REPEAT_SUMMARY_SCHEMA, "repeat": repeat.k, "status": REPEAT_COMPLETED,
                   "seeds": repeat.seeds.as_dict(), "measure": self.measure, "total_time_s": total_s,
                   "metrics": {**metrics, "total_time_s": total_s}, "error": None}
        atomic.write_json(out / layout.REPEAT_SUMMARY, summary)
        return summary

    def _measure(self, seed: int, out: Path, k: int) -> tuple[dict[str, Any], dict[str, Any]]:
        if self.measure == "ops":
            from repro500.system import ops

            return ops.run(self._ops_config(), seed)
        if self.measure == "roofline":
            from repro500.system import roofline

            return roofline.run(self._roofline_config(), seed)
        if self.measure == "inference":
            from repro500.system import inference

            return inference.run(self._inference_config(), seed)

        return dataio.run(self._io_config(), seed, first=k == 0)

    # ----- for the manifest ----------------------------------------------------------------
    def source(self, exclude: list[Path]) -> tuple[Path, list[str]] | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "measure": self.measure, "options": self.options}


SYSTEM_RECORD_SCHEMA = "repro500/system-record/v1"


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]
