"""``repro500 diff``: a thin click command over repro500.verify.diff."""

from __future__ import annotations

import json

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
    from repro500.errors import EXIT_FAIL, EXIT_OK
    from repro500.verify.compare import compare_sources
    from repro500.verify.diff import render, to_json

    found = compare_sources(a, b)
    diffs = found.differences
    if as_json:
        click.echo(json.dumps(to_json(diffs, str(a), str(b)), indent=2, default=str))
    else:
        render(diffs, str(a), str(b), show_all=show_all)
    ctx.exit(EXIT_FAIL if found.relevant else EXIT_OK)
