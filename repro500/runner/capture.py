"""Stage: capture.  The manifest of a run: every registered facet, plus what only the run knows —
the runtime state, the distributed plan and the experiment itself (its repository, the source
files its plug-ins imported, repro500's own version kept apart)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rich.console import Console

from repro500 import __version__
from repro500 import rundir as layout
from repro500.digest import file_digest
from repro500.runner.plan import Plan
from repro500.runner.summaries import utc


def experiment_facet(plan: Plan) -> dict[str, Any]:
    """The experiment's own provenance, apart from repro500's (MLflow issue 2115 asks for the
    imported files): its repository (the command's working directory, else the recipe's), the
    modules outside site-packages its plug-ins loaded, each with a digest."""
    from repro500.capture.code import describe_repo
    from repro500.capture.source import package_digest

    work = plan.workload
    describe = work.describe()
    where = Path(plan.recipe.fixed.get("workdir") or ".") if plan.recipe.is_command else Path(plan.recipe.source).parent
    repository, _ = describe_repo(where if where.is_dir() else Path.cwd())
    imported = []
    for _, path in work.imported:
        try:
            imported.append({"path": path, "sha256": file_digest(path)})
        except OSError as err:
            imported.append({"path": path, "sha256": None, "skipped": err.strerror or type(err).__name__})
    return {"workload": describe, "repository": repository, "imported_sources": imported,
            "repro500": {"version": __version__, "source_sha256": package_digest(Path(__file__).resolve().parents[1])}}


def keep_source(plan: Plan, run: layout.RunDir) -> dict[str, Any] | None:
    """Copy the experiment's source into the run (``source/``, ``source.json``): a publication then
    reruns on a machine that has only the publication (repro500.capture.source)."""
    import shutil

    from repro500.capture import source

    found = plan.workload.source([run.path.parent])
    if not found or not found[1]:
        return None
    shutil.rmtree(run.file(source.DIR), ignore_errors=True)  # an earlier attempt's copy is redone
    root, files = found
    kept = source.snapshot(root, files, run.path)
    kept["requirements"] = source.requirements(files)
    return kept


def _facets(plan: Plan, meta: dict[str, Any], kept: dict[str, Any] | None) -> dict[str, Any]:
    from repro500.capture import env as env_facet
    from repro500.workloads.engines.ranks import rank_plan

    facets: dict[str, Any] = {"experiment": {**experiment_facet(plan), "source": kept}}
    if plan.recipe.is_command:
        facets["runtime"] = {}  # the command's own runtime is its business; repro500 set only its seeds' env
        facets["distributed"] = {"engine": "command", "world_size": 1, "backend": None, "compressor": "none"}
        return facets
    from repro500.workloads import train

    train.set_determinism(plan.deterministic)
    facets["runtime"] = env_facet.runtime_state()
    train.set_determinism(False)
    facets["distributed"] = {
        "engine": plan.engine, "world_size": plan.world_size, "backend": plan.backend, "compressor": plan.compressor,
        "comm_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "GLOO_"))},
        "rank_plan": rank_plan(plan.nproc, plan.nnodes, plan.node_rank, plan.device),
    }
    return facets


def capture(plan: Plan, run: layout.RunDir, meta: dict[str, Any], console: Console, *, resumed: bool) -> dict[str, Any]:
    """Write the manifest (first attempt), or compare the environment with it (resume)."""
    from repro500.capture.manifest import build_manifest, write_manifest
    from repro500.publish.datafiles import record_specs

    first = not (resumed and run.manifest_path().is_file())
    kept = keep_source(plan, run) if first else None
    manifest, artifacts = build_manifest(
        plan.workload.data_paths(), extra_facets=_facets(plan, meta, kept), progress=True, seed=plan.recipe.seed,
        repeats=plan.recipe.repeats, world_size=plan.world_size, same_seed=plan.same_seed)
    if not first:
        _record_resume(run, meta, manifest, console)
        return json.loads(run.manifest_path().read_text(encoding="utf-8"))
    if resumed:  # the first attempt stopped before its capture finished: this one is the run's
        meta.setdefault("resumes", []).append({
            "utc": utc(), "manifest_digest": manifest["digest"]["value"], "result_relevant_differences": []})
    write_manifest(manifest, artifacts, run.path)
    record_specs(manifest, run.path)  # while the data is here: how to recreate it elsewhere
    return manifest


def _record_resume(run: layout.RunDir, meta: dict[str, Any], manifest: dict[str, Any], console: Console) -> None:
    from repro500.capture.manifest import load_manifest
    from repro500.verify.diff import diff_manifests, is_result_relevant

    original = load_manifest(run.manifest_path())
    relevant = [d for d in diff_manifests(original, manifest) if is_result_relevant(d)]
    if relevant:
        shown = "; ".join(f"{d.facet}.{d.key}: {d.a!r} -> {d.b!r}" for d in relevant[:3])
        console.print(f"[yellow]warning:[/] the environment changed since the run started: {shown}")
    meta.setdefault("resumes", []).append({
        "utc": utc(), "manifest_digest": manifest["digest"]["value"],
        "result_relevant_differences": [f"{d.facet}.{d.key}" for d in relevant],
    })
