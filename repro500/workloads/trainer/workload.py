"""The trained workload: repro500's trainer on a recipe's model, data set and evaluator, each a
built-in or a plug-in (the same door), on the local, DDP or Horovod engine."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from repro500.capture.source import PYPROJECT, REQUIREMENTS
from repro500.data.loaders import H5_DATASETS
from repro500.errors import InvalidInput, UsageError
from repro500.mlperf.logger import run_division
from repro500.recipe import load as recipes
from repro500.rundir import atomic, layout
from repro500.statuses import REPEAT_FINISHED
from repro500.workloads import parts, plugins
from repro500.workloads.models import find_builder, model_options, model_task, takes_any_options
from repro500.workloads.trainer import epochs
from repro500.workloads.workload import (
    SUMMARY_METRICS,
    Repeat,
    check_acceptance,
    expand_paths,
    unknown_metric,
)


class TrainedWorkload:
    kind = "trained"

    def __init__(self, recipe: recipes.Recipe, *, device: str, engine: str,
                 rendezvous: dict[str, Any] | None = None, search_paths: list[str] | None = None) -> None:
        self.recipe = recipe
        self.device = device
        self.engine = engine
        self.rendezvous = rendezvous
        self.search_paths = plugins.search_paths(search_paths or [])
        self.info: dict[str, Any] = {}
        self.train_samples: int | None = None  # known after check(): the plan's step count needs it
        self.imported: list[tuple[str, str]] = []  # (import root, file) of the plug-ins' own modules
        self._intensity: dict[str, Any] | None = None  # the training step's arithmetic intensity (system.intensity)

    @property
    def fixed(self) -> dict[str, Any]:
        return self.recipe.fixed

    def spec(self) -> Any:
        from repro500.workloads.trainer import train

        spec = train.TrainSpec.from_recipe(self.recipe.fixed, self.recipe.mutable)
        # the logs say the division export labels the run with: one rule (an overridden recipe is open)
        spec.mlperf_division, _ = run_division(self.fixed.get("mlperf_division"), bool(self.recipe.open_division))
        spec.device = self.device  # resolved once by the plan: no second "auto" decision
        spec.search_paths = list(self.search_paths)
        return spec

    def data_paths(self) -> list[str]:
        ds = self.fixed["dataset"]
        paths: list[str] = []
        for key in ("path", "eval_path"):
            value = ds.get(key)
            if isinstance(value, str):
                paths.append(value)
            elif isinstance(value, list):
                paths.extend(str(v) for v in value)
        return expand_paths(paths, "fixed.dataset.path")

    def input_paths(self) -> list[str]:
        return []  # a trained workload's data are its data paths

    def metric_names(self) -> list[str]:
        evaluated = parts.evaluation_metrics(self.fixed["workload"], self.fixed.get("evaluate"), self.info,
                                             paths=self.search_paths)
        return [*evaluated, *SUMMARY_METRICS]

    def check(self) -> None:
        """Model, data set, data paths and metric names, before anything is written."""
        source, fixed = self.recipe.source, self.fixed
        before = set(sys.modules)
        try:
            task = model_task(fixed["model"])
            options = model_options(fixed["model"])
        except UsageError as err:  # a recipe's content is input, not command-line usage: exit 4
            raise InvalidInput(f"{source}: fixed.model: {err}") from None
        if task is not None and task != fixed["workload"]:
            raise InvalidInput(f"{source}: model {fixed['model']} is a {task} model but fixed.workload is {fixed['workload']}")
        self._check_options(options)
        self._check_data(self.data_paths())
        dataset = parts.open_data(fixed["dataset"], "train", paths=self.search_paths)
        self.info = dict(getattr(dataset, "info", {}) or {})
        try:
            self.train_samples = len(dataset)
        except TypeError:  # an iterable plug-in dataset has no length
            self.train_samples = None
        if self.info.get("task") and self.info["task"] != fixed["workload"]:
            name = parts.dataset_ref(fixed["dataset"])[1]
            raise InvalidInput(f"{source}: dataset {name} is for {self.info['task']}, but fixed.workload is {fixed['workload']}")
        self._check_eval_split()
        evaluated = parts.evaluation_metrics(fixed["workload"], fixed.get("evaluate"), self.info, paths=self.search_paths)
        target = fixed["target"]["metric"]
        if target not in evaluated:
            raise unknown_metric(f"{source}: fixed.target.metric", target, evaluated, "an evaluation metric of this workload")
        check_acceptance(self.recipe, [*evaluated, *SUMMARY_METRICS])
        if task is None:
            # A plug-in's builder is built once here: a wrong return type or an exception while
            # building is one sentence now, not a failed repeat after the run directory exists.
            from repro500.workloads.trainer import train

            train.build_model(self.spec(), self.info)
        self.imported = plugins.source_modules(before)

    def _check_options(self, options: dict[str, Any]) -> None:
        """An unknown model option is caught here, not after the run directory exists; the
        message names the --set at fault when one set it (not 13 s into the run)."""
        if takes_any_options(find_builder(self.fixed["model"])):
            return
        for key in self.fixed.get("model_options") or {}:
            if key not in options:
                origin = next((f"--set {k}={v}" for k, v in self.recipe.overrides.items()
                               if k == f"fixed.model_options.{key}"), f"{self.recipe.source}: fixed.model_options")
                listed = ", ".join(options) or "none"
                raise UsageError(f"{origin}: model {self.fixed['model']!r} has no option {key!r}; its options are: {listed}")

    def _check_data(self, paths: list[str]) -> None:
        """NaN in the training data used to surface as a "diverged" repeat with no hint; the quick
        data check (every target, 16 evenly spaced samples per file) names it in a second."""
        if parts.dataset_ref(self.fixed["dataset"])[1] not in H5_DATASETS:
            return
        from repro500.data import h5files
        from repro500.data.check import check_file

        for path in paths:
            if Path(path).is_file() and Path(path).suffix.lower() in h5files.H5_SUFFIXES:
                try:
                    check_file(path, quick=True)
                except InvalidInput as err:
                    raise InvalidInput(f"{self.recipe.source}: the recipe's data failed the quick check: {err} "
                                       f"(repro500 data check {path} scans every sample)") from None

    def _check_eval_split(self) -> None:
        """An eval_path whose file holds training data would score the model on what it learnt."""
        ds = self.fixed["dataset"]
        if not ds.get("eval_path") or parts.dataset_ref(ds)[1] not in H5_DATASETS:
            return
        try:
            import h5py

            with h5py.File(ds["eval_path"], "r") as f:
                split = f.attrs.get("split")
        except (OSError, TypeError):
            return  # not one file (a list or a glob): the data check reports layout problems
        if isinstance(split, bytes):
            split = split.decode()
        if split == "train":
            raise InvalidInput(f"{self.recipe.source}: fixed.dataset.eval_path {ds['eval_path']} holds training data "
                               "(its split attribute is 'train'); generate an eval split (repro500 data generate ... --split eval)")

    def run_repeat(self, repeat: Repeat) -> dict[str, Any]:
        spec = self.spec()
        if repeat.deterministic is not None and repeat.deterministic != spec.deterministic:
            spec = dataclasses.replace(spec, deterministic=repeat.deterministic)
        # energy, utilization and data wait per epoch, beside the trainer (repro500.workloads.trainer.epochs)
        metered = epochs.EpochMeter(Path(repeat.out_dir))
        try:
            summary = self._train(spec, repeat, metered.wrap(repeat.progress))
        finally:
            metered.stop()
        if summary.get("status") in REPEAT_FINISHED:
            if self._intensity is None:  # the step's intensity is the run's: estimated once
                self._intensity = epochs.intensity_of(spec)
            summary = metered.finish(summary, self._intensity)
            atomic.write_json(Path(repeat.out_dir) / layout.REPEAT_SUMMARY, summary)
        return summary

    def _train(self, spec: Any, repeat: Repeat, progress: Any) -> dict[str, Any]:
        from repro500.workloads.trainer import train

        # the trainer reports through the hooks every workload has (workload.Progress)
        if self.engine == "local":
            return train.train_repeat(spec, repeat.k, repeat.seeds, repeat.out_dir, callbacks=progress)
        from repro500.workloads.engines import launch

        return launch.run_distributed(self.engine, int(self.recipe.mutable.get("nproc", 1)), spec, repeat.k,
                                      repeat.seeds, repeat.out_dir,
                                      callbacks=progress, rendezvous=self.rendezvous, varied=repeat.varied)

    def source(self, exclude: list[Path]) -> tuple[Path, list[str]] | None:
        """The experiment source to keep with the run: the plug-ins' own modules, relative to the
        import root most of them came from (None for built-ins only)."""
        if not self.imported:
            return None
        roots = [root for root, _ in self.imported]
        root = max(set(roots), key=roots.count)
        files = sorted(os.path.relpath(path, root) for r, path in self.imported if r == root)
        requirement_files = [n for n in (REQUIREMENTS, PYPROJECT) if (Path(root) / n).is_file()]
        return Path(root), sorted({*files, *requirement_files})

    def describe(self) -> dict[str, Any]:
        """For the manifest: what this workload is, and which source files it imported."""
        return {"kind": self.kind, "model": self.fixed["model"], "dataset": parts.dataset_ref(self.fixed["dataset"])[1],
                "evaluate": self.fixed.get("evaluate") or self.fixed["workload"],
                "plugins": self._distributions()}

    def _distributions(self) -> dict[str, str]:
        """The installed distributions that provide the registered names this recipe uses
        (``pip install NAME==VERSION`` recreates them elsewhere)."""
        out = {}
        refs = [("model", self.fixed["model"]), ("dataset", parts.dataset_ref(self.fixed["dataset"])[1])]
        if self.fixed.get("evaluate"):
            refs.append(("evaluator", self.fixed["evaluate"]))
        for kind, ref in refs:
            entry = plugins.registered(kind).get(ref)
            dist = getattr(entry, "dist", None)
            if dist is not None and dist.metadata["Name"] != "repro500":
                out[dist.metadata["Name"]] = dist.version
        return out
