"""Stage: capture.  The manifest of a run: every registered facet, plus what only the run knows —
the runtime state, the distributed plan and the experiment itself (its repository, the source
files its plug-ins imported, repro500's own version kept apart)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from repro500 import __version__, untrusted
from repro500.capture import env as env_facet
from repro500.capture import lock, source
from repro500.capture import source as source_index
from repro500.capture.code import GitError, describe_repo
from repro500.capture.interpreters import command_environment as describe
from repro500.capture.manifest import (
    build_manifest,
    gather_ahead,
    jsonable,
    load_manifest,
    seal,
    write_manifest,
)
from repro500.capture.outputs import artifact_roots
from repro500.capture.source import package_digest
from repro500.digest import file_digest
from repro500.publish.datafiles import record_specs
from repro500.redact import scrub
from repro500.rundir import atomic, layout
from repro500.runner.plan import Plan
from repro500.runner.summaries import utc
from repro500.tracking import store as mlflow_store
from repro500.verify.diff import diff_manifests, is_result_relevant, short
from repro500.workloads.command.launchenv import user_environ
from repro500.workloads.engines.ranks import rank_plan


def experiment_facet(plan: Plan) -> dict[str, Any]:
    """The experiment's own provenance, apart from repro500's (MLflow issue 2115 asks for the
    imported files): its repository (the command's working directory, else the recipe's), the
    modules outside site-packages its plug-ins loaded, each with a digest."""
    work = plan.workload
    describe = work.describe()
    where = Path(plan.recipe.fixed.get("workdir") or ".") if plan.recipe.is_command else Path(plan.recipe.source).parent
    try:
        repository, _ = describe_repo(where if where.is_dir() else Path.cwd())
    except GitError as err:  # a repository git refuses to read (another owner's): said, not fatal
        repository = {"in_repo": False, "reason": str(err)}
    imported = []
    for _, path in work.imported:
        try:
            imported.append({"path": path, "sha256": file_digest(path)})
        except OSError as err:
            imported.append({"path": path, "sha256": None, "skipped": err.strerror or type(err).__name__})
    # repro500's own source digest is taken beside the first repeat (gather): no run writes into it
    facet = {"workload": describe, "repository": repository, "imported_sources": imported}
    if plan.recipe.is_command:
        from repro500.capture.source import python_path

        env = {**user_environ(), **{str(k): str(v) for k, v in (plan.recipe.fixed.get("env") or {}).items()}}
        facet["pythonpath"] = python_path(env.get("PYTHONPATH"), where if where.is_dir() else Path.cwd())
    return facet


def own_outputs(run: layout.RunDir) -> list[Path]:
    """What repro500 itself writes near the experiment, never part of its source wherever it lies:
    the runs under ``--out``, the tracking store's files and its experiments' artifact roots
    (docs/command.md).  Others are recognised by what they hold (repro500.capture.outputs)."""
    store = mlflow_store.local_store_paths(mlflow_store.tracking_uri())
    roots = artifact_roots(store[0]) if store and store[0].is_file() else []
    return [run.path.parent, *store, *roots]


def keep_source(plan: Plan, run: layout.RunDir) -> dict[str, Any] | None:
    """Copy the experiment's source into the run (``source/``, ``source.json``): a publication then
    reruns on a machine that has only the publication (repro500.capture.source)."""
    import shutil


    found = plan.workload.source(own_outputs(run))
    if not found or not found[1]:
        return None
    shutil.rmtree(run.file(source.DIR), ignore_errors=True)  # an earlier attempt's copy is redone
    root, files = found
    kept = source.snapshot(root, files, run.path)
    kept["requirements"] = source.requirements(files)
    return kept


def recheck_source(plan: Plan, run: layout.RunDir) -> tuple[dict[str, Any] | None, list[str]]:
    """For a resume: the source record of the first attempt with its digest taken again over the
    same files as they are now (the copy in ``source/`` stays the first attempt's), and the files
    that differ.  Taken the way :func:`keep_source` took it, so that an unchanged experiment gives
    the same record and a resume reports no source change; a resume used to record no source at
    all, which every comparison read as a changed experiment."""
    try:
        recorded = json.loads(run.manifest_path().read_text(encoding="utf-8"))["facets"]["experiment"]["source"]
    except (OSError, ValueError, KeyError, TypeError):
        recorded = None  # no record to redo (or a damaged manifest, which the comparison itself reports)
    found = plan.workload.source(own_outputs(run))
    if not recorded or not found:
        return None, []  # no source then (a built-in recipe), or none now: the comparison says which
    again = source.recheck(found[0], run.path)
    if again is None:
        return None, []
    tree, changed = again
    return {**recorded, "tree_sha256": tree}, changed


def _facets(plan: Plan, kept: dict[str, Any] | None) -> dict[str, Any]:
    """The facets only the run knows that must be read before the repeats: the experiment (its
    git state, what the source copy kept: a command may write into its tree), and torch's runtime
    state (setting determinism flags must not race the trainer)."""
    facets: dict[str, Any] = {"experiment": {**experiment_facet(plan), "source": kept}}
    if plan.vary:  # a factorial run: each repeat's seeds vary only its cell's source (capture/seeds.py)
        from repro500.capture import seeds as seeding
        from repro500.capture.manifest import seeds_facet

        repeats = plan.recipe.repeats
        facets["seeds"] = {**seeds_facet(plan.recipe.seed, repeats, plan.world_size),
                           "plan": seeding.plan(plan.recipe.seed, repeats, plan.world_size,
                                                varied=[plan.varied(k) for k in range(repeats)]),
                           "design": {"kind": "factorial", "sources": plan.vary, "per_cell": plan.per_cell}}
    if plan.recipe.is_command:
        facets["runtime"] = {}  # the command's own runtime is its business; repro500 set only its seeds' env
        facets["distributed"] = {"engine": "command", "world_size": 1, "backend": None, "compressor": "none"}
        return facets
    from repro500.workloads.trainer import train

    train.set_determinism(plan.deterministic)
    facets["runtime"] = env_facet.runtime_state()
    train.set_determinism(False)
    facets["distributed"] = {
        "engine": plan.engine, "world_size": plan.world_size, "backend": plan.backend, "compressor": plan.compressor,
        "comm_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "GLOO_"))},
        "rank_plan": rank_plan(plan.nproc, plan.nnodes, plan.node_rank, plan.device),
    }
    return facets


@dataclass
class Prepared:
    """What the capture took before the first repeat starts: what ran (the source copy), the
    facets that touch process state (torch's runtime), and the environment as it was."""

    first: bool  # the manifest is written now, not compared with a recorded one (resume)
    facets: dict[str, Any]
    environ: dict[str, str]
    ahead: Any  # capture.manifest.Ahead: the code facet, read before a command writes into its tree
    source_changed: list[str] = field(default_factory=list)  # a resume: the experiment's files edited since
    command: bool = False  # a wrapped command: its environment is what its repeats recorded (interpreters.json)


def prepare(plan: Plan, run: layout.RunDir, *, resumed: bool) -> Prepared:
    """The part of the capture that must precede the repeats (the rest runs beside them)."""
    first = not (resumed and run.manifest_path().is_file())
    # A resume keeps the first attempt's copy (what the finished repeats ran) and checks the
    # experiment's files against it before the remaining repeats run.
    kept, changed = (keep_source(plan, run), []) if first else recheck_source(plan, run)
    # A command's environment is the one the run started with; the trainer's is this process's.
    environ = user_environ() if plan.recipe.is_command else dict(os.environ)

    return Prepared(first, _facets(plan, kept), environ, gather_ahead(["code"]), changed,
                    command=plan.recipe.is_command)


def command_environment(run: layout.RunDir, manifest: dict[str, Any]) -> dict[str, Any]:
    """*manifest* with the environment facet of the interpreter(s) the command's latest finished
    repeat ran (repro500's own kept as the tool's); unchanged when no repeat recorded one (a
    repeat that never started its program)."""
    for k in sorted(layout.repeat_indices(run.path), reverse=True):
        recorded = layout.read_optional_json(run.repeat(k) / layout.INTERPRETERS)
        if recorded:
            facets = {**manifest["facets"],
                      "environment": scrub(jsonable(describe(recorded, manifest["facets"].get("environment") or {})))}
            return seal({**manifest, "facets": facets})
    return manifest


def gather(plan: Plan, prepared: Prepared) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Every registered facet (code, environment, hardware, toolchain, data digests, seeds): the
    slow part, run beside the first repeat.  Reads only; nothing is written into the run here."""
    experiment = {**prepared.facets["experiment"], "repro500": {
        "version": __version__, "source_sha256": package_digest(Path(__file__).resolve().parents[1])}}
    return build_manifest(
        plan.workload.data_paths(), extra_facets={**prepared.facets, "experiment": experiment}, progress=False,
        seed=plan.recipe.seed,
        repeats=plan.recipe.repeats, world_size=plan.world_size, same_seed=plan.same_seed,
        input_paths=plan.workload.input_paths(), environ=prepared.environ,
        jobs=1, ahead=prepared.ahead)  # one core: a repeat runs beside it, and its timings are results


def settle(run: layout.RunDir, meta: dict[str, Any], console: Console, prepared: Prepared,
           gathered: tuple[dict[str, Any], dict[str, bytes]], *, resumed: bool) -> dict[str, Any]:
    """Write the manifest (first attempt), or compare the environment with it (resume); on the
    main thread, so that nothing writes into the run directory behind the runner's back."""
    manifest, artifacts = gathered
    if prepared.command:
        manifest = command_environment(run, manifest)
    if not prepared.first:
        _record_resume(run, meta, manifest, console, prepared.source_changed)
        return json.loads(run.manifest_path().read_text(encoding="utf-8"))
    if resumed:  # the first attempt stopped before its capture finished: this one is the run's
        meta.setdefault("resumes", []).append({
            "utc": utc(), "manifest_digest": manifest["digest"]["value"], "result_relevant_differences": []})
    write_manifest(manifest, artifacts, run.path)
    write_lock(run, manifest)
    record_specs(manifest, run.path)  # while the data is here: how to recreate it elsewhere
    return manifest


def write_lock(run: layout.RunDir, manifest: dict[str, Any]) -> None:
    """The environment as an installer can rebuild it, beside the manifest (capture/lock.py):
    built from the manifest alone, no network, so it never holds the run up."""
    source = layout.read_optional_json(run.file(source_index.INDEX))
    doc = lock.build(manifest, source_root=source.get("root"))
    atomic.write_json(run.file(layout.LOCK), doc)
    atomic.write_text(run.file(layout.LOCK_REQUIREMENTS), lock.requirements(doc))


def _record_resume(run: layout.RunDir, meta: dict[str, Any], manifest: dict[str, Any], console: Console,
                   source_changed: list[str]) -> None:
    original = load_manifest(run.manifest_path())
    relevant = [d for d in diff_manifests(original, manifest) if is_result_relevant(d)]
    if relevant:
        shown = "; ".join(f"{d.facet}.{d.key}: {short(d.a, 60)} -> {short(d.b, 60)}" for d in relevant[:3])
        if source_changed:  # a digest alone does not say which file to look at
            more = f" and {len(source_changed) - 5} more" if len(source_changed) > 5 else ""
            shown += f" (the experiment's files changed: {', '.join(source_changed[:5])}{more})"
        console.print(f"[yellow]warning:[/] the environment changed since the run started: {untrusted.shown(shown)}")
    meta.setdefault("resumes", []).append({
        "utc": utc(), "manifest_digest": manifest["digest"]["value"],
        "result_relevant_differences": [f"{d.facet}.{d.key}" for d in relevant],
        "source_changed": source_changed,
    })
