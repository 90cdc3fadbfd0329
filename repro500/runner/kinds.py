"""The one place that picks a recipe's kind of workload: the interface (:mod:`workload`) never
imports its implementations, each of which builds on it.  Each kind is imported when a recipe
picks it: a wrapped command's run does not load the trainer's models, data sets and plug-in
registry (0.1 s before its first repeat)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from repro500.recipe import load as recipes
    from repro500.workloads.workload import Workload


def make(recipe: recipes.Recipe, *, device: str = "cpu", engine: str = "local", rendezvous: dict[str, Any] | None = None,
         search_paths: list[str] | None = None, tracking: bool = True) -> Workload:
    """The workload a recipe describes (the one place that branches on the kind)."""
    if recipe.is_command:
        from repro500.workloads.command.workload import CommandWorkload

        return CommandWorkload(recipe, tracking=tracking)
    if recipe.kind == "system":
        from repro500.system.workload import SystemWorkload

        return SystemWorkload(recipe, device=device, engine=engine)
    from repro500.workloads.trainer.workload import TrainedWorkload

    return TrainedWorkload(recipe, device=device, engine=engine, rendezvous=rendezvous,
                           search_paths=search_paths or [])
