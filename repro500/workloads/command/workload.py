"""The command workload behind the :class:`~repro500.workloads.workload.Workload` interface: any
program, once per repeat in its own directory, metrics read from what it produces
(``command.py`` runs it, ``metric_sources.py`` reads the metrics; docs/command.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repro500.capture import source
from repro500.recipe import load as recipes
from repro500.untrusted import terminal_safe
from repro500.workloads.command import recipe as command
from repro500.workloads.command import repeat as command_repeat
from repro500.workloads.command.metric_sources import implausible
from repro500.workloads.workload import COMMAND_METRICS, Repeat, check_acceptance


class CommandWorkload:
    kind = "command"
    imported: list[tuple[str, str]] = []  # a command's modules are its own process's: its files are in source/

    def __init__(self, recipe: recipes.Recipe, *, tracking: bool = True) -> None:
        self.recipe = recipe
        self.tracking = tracking
        self._warned: set[str] = set()  # metrics already warned about (implausible): once a run
        self.spec = command.CommandSpec.from_recipe(recipe.fixed, recipe.metrics, recipe.mutable, source=recipe.source)

    def data_paths(self) -> list[str]:
        return []  # nothing is placed for a command: what it reads is its inputs, read where they are

    def input_paths(self) -> list[str]:
        return command.input_paths(self.spec)

    def metric_names(self) -> list[str]:
        return [*command.declared_metrics(self.spec), *COMMAND_METRICS]

    def check(self) -> None:
        command.check(self.spec, tracking=self.tracking)
        check_acceptance(self.recipe, self.metric_names())

    def run_repeat(self, repeat: Repeat) -> dict[str, Any]:
        context = command_repeat.RepeatContext(
            run_id=repeat.run_id, deterministic=bool(self.recipe.mutable.get("deterministic")), mlflow=repeat.mlflow,
            exclude=list(repeat.own_outputs), source_files=repeat.source_files, echo=repeat.progress.on_line,
            started=repeat.progress.on_started)
        summary = command_repeat.run_repeat(self.spec, repeat.k, repeat.seeds, Path(repeat.out_dir), context)
        self._warn_implausible(summary.get("metrics") or {})
        return summary

    def _warn_implausible(self, measured: dict[str, Any]) -> None:
        """One line on stderr, once a run per metric, when a value is off its band's scale."""
        import sys


        for name, band in self.recipe.acceptance.items():
            value = measured.get(name)
            if name in self._warned or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            sentence = implausible(name, float(value), band if isinstance(band, dict) else {})
            if sentence:
                self._warned.add(name)
                print(f"repro500: warning: {terminal_safe(sentence)}", file=sys.stderr, flush=True)

    def source(self, exclude: list[Path]) -> tuple[Path, list[str]] | None:
        """The experiment source to keep with the run: the working directory's files (not the
        run directories, nor the tracking store, under it)."""
        root = Path(self.recipe.fixed.get("workdir") or ".").resolve()
        return root, source.candidates(root, exclude=exclude)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "command": list(self.recipe.fixed["command"]),
                "workdir": str(Path(self.recipe.fixed.get("workdir") or ".").resolve()),
                "metrics": dict(self.recipe.metrics)}
