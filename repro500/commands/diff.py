"""``repro500 diff``: a thin click command over repro500.verify.diff."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import click


@click.command("diff")
@click.argument("a")
@click.argument("b")
@click.option("--json", "as_json", is_flag=True, help="Print the differences as JSON.")
@click.option("--all", "show_all", is_flag=True, help="Show every low-impact difference too.")
@click.pass_context
def diff(ctx: click.Context, a: str, b: str, as_json: bool, show_all: bool) -> None:
    """Compare two runs (or manifests), most result-relevant first.

    Run directories are compared as every command compares them: manifests, recipes, plan,
    seeds, environment lock and declared outputs (docs/verify.md, "One comparison of two runs").
    A run in the MLflow store (MLFLOW_TRACKING_URI) is named mlflow:RUN_ID or runs:/RUN_ID, as
    for verify: its sealed run is downloaded for the comparison.

    \b
    Exit codes: 0 no result-relevant difference; 1 at least one;
    4 a manifest is missing, corrupt or was edited after capture.
    """
    from repro500.capture.inputs import comparable
    from repro500.capture.manifest import load_manifest
    from repro500.errors import EXIT_FAIL, EXIT_OK, ReproError
    from repro500.rundir import layout as rundir
    from repro500.verify import compare, from_mlflow
    from repro500.verify.diff import render, to_json
    from repro500.verify.rundir import load_run

    def view(path: Path) -> dict:
        # a run directory's manifest with what its command was seen to read (inputs.json)
        observed = rundir.read_inputs(path / rundir.INPUTS) if path.is_dir() else {}
        return comparable(load_manifest(path), observed) or {}

    def run_of(path: Path):  # noqa: ANN202 - RunData, or None for a bare manifest
        if not path.is_dir():
            return None
        try:
            return load_run(path)
        except ReproError:
            return None  # a directory with a manifest alone: its manifest is compared

    with contextlib.ExitStack() as stack:
        # a run in MLflow (mlflow:ID) is its sealed run, downloaded and unpacked for the comparison
        paths = [stack.enter_context(from_mlflow.opened(ref)) if from_mlflow.is_reference(ref) else Path(ref)
                 for ref in (a, b)]
        manifests = view(paths[0]), view(paths[1])  # checked first: a missing, corrupt or edited manifest is exit 4
        runs = run_of(paths[0]), run_of(paths[1])
        found = (compare.compare_runs(runs[0], runs[1], manifest_b=manifests[1]) if runs[0] and runs[1]
                 else compare.compare_manifests(*manifests))
    diffs = found.differences
    if as_json:
        click.echo(json.dumps(to_json(diffs, str(a), str(b)), indent=2, default=str))
    else:
        render(diffs, str(a), str(b), show_all=show_all)
    ctx.exit(EXIT_FAIL if found.relevant else EXIT_OK)
