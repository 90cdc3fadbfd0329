"""``repro500 run``: plan -> open -> capture -> track -> repeats -> summaries -> seal -> verify.

The run directory is the source of truth (docs/contracts.md); MLflow mirrors it.  The stages
live in ``session.py``; this module opens a new or resumed run and hands it over.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from repro500 import priority, redact, untrusted
from repro500.errors import REPRODUCTION_ENV, InvalidInput, UsageError
from repro500.recipe import load as recipes
from repro500.recipe.fields import recipe_yaml, scrub_recipe
from repro500.rundir import layout, ownership
from repro500.runner import decide, dvcexp, fanout, multinode
from repro500.runner.plan import (
    RunOptions,
    check_options,
    design_repeats,
    load_recipe,
    make_plan,
    preflight,
    recorded_plan,
    tracking_choice,
)
from repro500.runner.session import RunOutcome, Session
from repro500.runner.summaries import aggregate, new_run_id, utc
from repro500.runner.track import now_ms
from repro500.statuses import RUN_COMPLETED, RUN_RUNNING
from repro500.tracking import process as tracking_process
from repro500.untrusted import record_console
from repro500.workloads.command import launchenv
from repro500.workloads.workload import SUMMARY_METRICS

__all__ = ["SUMMARY_METRICS", "RunOptions", "RunOutcome", "aggregate", "preflight", "run", "run_data"]


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a batch system's preemption) is handled like Ctrl-C: keep what finished."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _new(options: RunOptions, console: Console) -> Session:
    options = design_repeats(options)
    recipe = load_recipe(options)
    options = replace(options, tracking=tracking_choice(options, recipe))
    _prestart_tracking(options)
    plan = make_plan(recipe, options)
    design, reference, loaded = decide.prepare(options, recipe)
    if design is not None:
        console.print(decide.describe_max(design))
    experiment = dvcexp.current()
    named = experiment if options.run_id_from_dvc else None  # None under a plain `dvc repro`
    run_id = options.run_id or (dvcexp.run_id(named) if named else new_run_id(recipe.name))
    run = layout.RunDir(Path(options.out_dir) / run_id)
    if run.exists() and named:  # another experiment's name normalised alike (or the same name again)
        held = (_meta_or_none(run) or {}).get("dvc")
        raise dvcexp.taken(named, str(run), held.get("experiment") if isinstance(held, dict) else None)
    if run.exists():
        resume = ""
        if run.is_run():
            resume = f", or complete it with: repro500 run --resume {run}"
            with_meta = _meta_or_none(run)
            if with_meta and with_meta.get("status") == RUN_COMPLETED:
                resume = f"; it is complete (repro500 verify {run})"
        raise InvalidInput(f"run directory {run} already exists; choose another --run-id{resume}")
    multinode.agree(plan, run_id, list(range(recipe.repeats)), str(run.path.resolve()),  # before anything is written
                    options.until_decided)
    meta: dict[str, Any] = {
        "schema": layout.RUN_SCHEMA, "run_id": run_id, "status": RUN_RUNNING, "created_utc": utc(),
        "finished_utc": None, "argv": redact.scrub(list(options.argv)),
        "recipe_path": str(options.recipe) if options.recipe else None,
        "recipe_name": recipe.name, "workload": plan.workload.kind, "repeats": recipe.repeats,
        "same_seed": bool(options.same_seed), "deterministic": plan.deterministic,
        "open_division": recipe.open_division, "overrides": scrub_recipe(recipe.to_dict())["overrides"],
        "engine": plan.engine, "world_size": plan.world_size, "nnodes": plan.nnodes,
        "compressor": plan.compressor, "tracking": options.tracking, "mlflow": None, "resumes": [],
    }
    if experiment:  # which DVC experiment this run is, its name as DVC gave it (the run id may normalise it)
        meta["dvc"] = experiment.record()
    if plan.vary:
        design = {"kind": "factorial", "sources": plan.vary, "per_cell": plan.per_cell,
                  "cells": [plan.cell(k) for k in range(recipe.repeats)]}
    launch = fanout.prepare(options, plan, recipe.repeats)
    if launch is not None and design and design.get("kind") == "sequential":  # looked at after each batch
        design = decide.in_batches(design, launch.parallel)
    meta.update({key: value for key, value in (("design", design), ("reference", reference)) if value})
    _prepare_tracking(options)
    run.create(_recipe_yaml(recipe), meta)
    session = Session(plan, run, meta, console, resumed=False, tracking=options.tracking,
                      experiment=options.experiment, artifacts=options.artifacts,
                      source_name=str(options.recipe or options.adhoc_source), sign=_signing(options),
                      started_ms=options.started_ms)
    session.reference, session.launch, session.detach = loaded, launch, options.detach
    return session


def _recipe_yaml(recipe: recipes.Recipe) -> str:
    # By value and content; by name only where a user chose the name: a schema field such as
    # metrics.f1.key must read back as what ran, or --resume and reproduce cannot run it.
    return recipe_yaml(recipe.to_dict())


def _meta_or_none(run: layout.RunDir) -> dict[str, Any] | None:
    try:
        return run.meta()
    except InvalidInput:
        return None


def _resume_consent(run: layout.RunDir, run_code: bool) -> None:
    """A run directory that this machine's repro500 did not seal (unpacked, extracted, downloaded,
    copied: repro500.rundir.ownership.origin_of) is somebody else's: resuming it runs its code (a wrapped
    command, plug-ins) only with ``--run-code``, as reproduce and locate ask for theirs."""
    origin = ownership.origin_of(run.path)
    if origin == untrusted.OWN_RUN:
        return
    code = layout.own_code(run.path)
    runs = f"runs its own code when resumed ({layout.own_code_said(code)})" if code else None
    untrusted.consent(run_code, runs, origin=origin, review="it (its recipe.yaml and source/)")


def _resumed(options: RunOptions, console: Console, reproduction: str | None = None) -> Session:
    run = layout.RunDir(options.resume or "")
    if not run.is_run():
        raise InvalidInput(f"{run} is not a repro500 run directory (no run.json); nothing to resume")
    meta = run.meta()
    recipe = recipes.from_run_dir(run.path)
    refuse_complete(run, meta, recipe.repeats)
    if not reproduction:  # a reproduction's rerun: reproduce asked the consent for it
        _resume_consent(run, options.run_code)
    loaded = decide.reload(meta)  # the same question goes on being decided
    # A resume keeps the run's own choice: half a run's repeats in an MLflow parent that never
    # sees the other half, or a parent whose last repeats never arrive, is a record that lies.
    recorded = bool(meta.get("tracking", meta.get("mlflow") is not None))
    if options.tracking is not None and options.tracking != recorded:
        was = "tracked in MLflow" if recorded else "run with --no-tracking"
        raise UsageError(f"run {run} was {was}, and a resume keeps that choice; drop "
                         f"--{'' if options.tracking else 'no-'}tracking (or start a new run)")
    options = replace(options, tracking=recorded)
    _prestart_tracking(options)
    options = fanout.collecting(options, meta.get("launcher") or {})
    if options.launcher == "slurm" and options.nnodes == 1:  # the repeats stay tasks of the run's node count
        options = replace(options, nnodes=int(meta.get("nnodes") or 1))
    plan = recorded_plan(recipe, meta, tracking=bool(options.tracking), nnodes=options.nnodes,
                         rdzv_endpoint=options.rdzv_endpoint, run_id=meta.get("run_id"), launcher=options.launcher)
    multinode.check_resume(run, meta, options, plan)
    finished = run.summaries(recipe.repeats, finished_only=True)
    multinode.agree(plan, str(meta.get("run_id")), [k for k in range(recipe.repeats) if k not in finished],
                    str(run.path.resolve()), (meta.get("design") or {}).get("kind") == "sequential")
    if options.detach and options.launcher != "slurm":
        raise UsageError(f"--detach leaves the repeats to SLURM's queue and returns; run {run} has none there: "
                         "resume it with --launcher slurm --detach")
    launch = fanout.prepare(options, plan, recipe.repeats - len(finished))
    meta["status"] = RUN_RUNNING
    _prepare_tracking(options)
    try:
        run.write_meta(meta)
    except OSError as err:
        raise InvalidInput(f"cannot write the run directory {run} ({err.strerror or err})") from None
    session = Session(plan, run, meta, console, resumed=True, tracking=options.tracking, experiment=options.experiment,
                      artifacts=options.artifacts,
                      source_name=str(meta.get("recipe_path") or "--command"), sign=_signing(options))
    session.reference, session.launch, session.detach = loaded, launch, options.detach
    return session


def refuse_complete(run: layout.RunDir, meta: dict[str, Any], planned: int) -> None:
    """``--resume`` of a run that has nothing left to run must not rewrite run.json and the digest
    list people quote."""
    finished = run.summaries(planned, finished_only=True)
    stopped = (meta.get("design") or {}).get("stopped_at")  # a sequential run that stopped when decided
    if meta.get("status") == RUN_COMPLETED and len(finished) == (stopped or planned):
        raise UsageError(f"run {run} is already complete ({planned} of {planned} repeats finished); nothing to "
                         f"resume. Verify it with: repro500 verify {run}")


def _signing(options: RunOptions) -> tuple[str, str | None] | None:
    return (options.sign_key, options.sign_principal) if options.sign_key else None


def _prestart_tracking(options: RunOptions) -> None:
    """MLflow's import, in a process of its own, while this one plans the run and imports torch;
    started once the recipe has been read and says the run logs (a run refused for its recipe or
    its options, or untracked, never pays for it), and stopped by run() if no run takes it."""
    if options.tracking and options.node_rank == 0:
        tracking_process.prestart()


def _prepare_tracking(options: RunOptions) -> None:
    # Set before CUDA initialises: cuBLAS needs a fixed workspace for deterministic GEMMs.  Set
    # here, not through the trainer, so that a wrapped command's run never imports torch (2-3 s).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if options.tracking:
        from repro500.tracking import store as mlflow_store

        mlflow_store.check_usable()  # MLflow itself is imported beside the first repeat
        mlflow_store.sealed_limit_mb()  # a bad REPRO500_MLFLOW_SEALED_MAX_MB is said now, not after the repeats


def run(options: RunOptions, console: Console | None = None) -> RunOutcome:
    """Run a recipe (or resume a run); the library entry point behind ``repro500 run``."""
    # a rerun that `repro500 reproduce` started: read once, and kept from the experiment's environment
    reproduction = os.environ.pop(REPRODUCTION_ENV, None) or None
    if options.started_ms is None:  # the MLflow parent starts here: planning (torch's import) is the run's too
        options = replace(options, started_ms=now_ms())
    try:
        return _run(options, console or record_console(), reproduction)
    finally:
        tracking_process.discard()


def check_run(options: RunOptions) -> None:
    """What a run refuses from its options and recipe alone, before anything is written: checked
    again by :func:`run`; ``run --sandbox`` asks first, so that a bad recipe or option is said
    before the sandbox is set up and the run started again inside it."""
    check_options(options)
    priority.niceness()
    if not options.resume:
        load_recipe(options)


def run_data(data: dict[str, Any], *, source: str, out_dir: str = "runs", run_id: str | None = None,
             tracking: bool | None = None, experiment: str | None = None, nproc: int | None = None,
             argv: list[str] | None = None) -> RunOutcome:
    """Run a recipe given as data (what ``repro500 ops``, ``roofline`` and ``io`` build) as
    ``repro500 run`` runs a recipe file: capture, repeats, MLflow, seal, verify."""
    options = RunOptions(adhoc=data, adhoc_source=source, out_dir=out_dir, run_id=run_id, tracking=tracking,
                         experiment=experiment, nproc=nproc, argv=list(argv or sys.argv))
    return run(options)


def _run(options: RunOptions, console: Console, reproduction: str | None = None) -> RunOutcome:
    check_options(options)
    priority.niceness()  # a bad REPRO500_HELPER_NICENESS is refused here, before anything is written
    if options.node_rank > 0:
        from repro500.runner.follower import follow_node

        return follow_node(options, console)
    if options.resume and (options.recipe or options.adhoc):
        raise UsageError("give either a RECIPE or --resume RUN_DIR, not both")
    with launchenv.frozen():  # what a wrapped command gets: nothing repro500 sets for itself
        session = _resumed(options, console, reproduction) if options.resume else _new(options, console)
        session.reproduction = reproduction
        with _sigterm_as_interrupt():
            return session.execute()
