"""``repro500 diff``: a thin click command over repro500.verify.diff."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("diff")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the differences as JSON.")
@click.option("--all", "show_all", is_flag=True, help="Show every low-impact difference too.")
@click.pass_context
def diff(ctx: click.Context, a: Path, b: Path, as_json: bool, show_all: bool) -> None:
    """Compare two manifests or run directories, most result-relevant first.

    \b
    Exit codes: 0 no result-relevant difference; 1 at least one;
    4 a manifest is missing, corrupt or was edited after capture.
    """
    from repro500.capture.inputs import comparable
    from repro500.capture.manifest import load_manifest
    from repro500.errors import EXIT_FAIL, EXIT_OK
    from repro500.rundir import layout as rundir
    from repro500.verify.diff import diff_manifests, is_result_relevant, render, to_json

    def view(path: Path) -> dict:
        # a run directory's manifest with what its command was seen to read (inputs.json)
        observed = rundir.read_optional_json(path / rundir.INPUTS) if path.is_dir() else {}
        return comparable(load_manifest(path), observed) or {}

    diffs = diff_manifests(view(a), view(b))
    if as_json:
        click.echo(json.dumps(to_json(diffs, str(a), str(b)), indent=2, default=str))
    else:
        render(diffs, str(a), str(b), show_all=show_all)
    ctx.exit(EXIT_FAIL if any(is_result_relevant(d) for d in diffs) else EXIT_OK)
