"""``repro500 capture`` and ``repro500 diff``: thin click commands over repro500.capture."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


@click.command("capture")
@click.option("-o", "--output", type=click.Path(dir_okay=True, path_type=Path), default=None,
              help="Write the manifest to this .json file (or DIR/manifest.json); artifacts "
                   "such as code.diff go next to it. Default: print only, write nothing.")
@click.option("--data", "data_paths", multiple=True, metavar="PATH",
              help="A data file or directory to digest (DVC-compatible md5). Repeatable.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the whole manifest as JSON instead of the summary.")
@click.option("--runtime", is_flag=True,
              help="Also import torch and record its live build and determinism state "
                   "(costs the torch import, seconds).")
@click.option("--seed", type=int, default=None,
              help="Master seed whose derived per-repeat, per-rank seeds are recorded.")
@click.option("--repeats", type=int, default=1, help="Repeats to derive seeds for (with --seed).")
@click.option("--world-size", type=int, default=1, help="Ranks to derive seeds for (with --seed).")
@click.option("--repo", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory inside the git work tree to describe. Default: the current one.")
@click.option("--no-cache", is_flag=True,
              help="Re-read every data file instead of trusting the hash cache.")
def capture(output: Path | None, data_paths: tuple[str, ...], as_json: bool, runtime: bool,
            seed: int | None, repeats: int, world_size: int, repo: Path | None,
            no_cache: bool) -> None:
    """Snapshot code, environment, seeds, data and hardware into a manifest.

    \b
    Examples:
      repro500 capture
      repro500 capture -o runs/manual/manifest.json --data data/cifar10
      repro500 capture --json --runtime > manifest.json

    \b
    Exit codes: 0 captured; 2 bad option values; 4 a --data path is missing or
    unreadable, the --repo directory does not exist, or the output cannot be written.
    """
    from repro500.capture.manifest import build_manifest, write_manifest

    manifest, artifacts = build_manifest(
        data_paths, repo_dir=repo, progress=sys.stderr.isatty(), runtime=runtime,
        use_cache=not no_cache, seed=seed, repeats=repeats, world_size=world_size,
    )
    written = None
    if output is not None:
        path = write_manifest(manifest, artifacts, output)
        written = str(path) + (f" (+ {', '.join(sorted(artifacts))})" if artifacts else "")
    if as_json:
        click.echo(json.dumps(manifest, indent=2, sort_keys=True))
        if written:
            click.echo(f"written: {written}", err=True)
        return
    from repro500.capture.summary import render_summary

    render_summary(manifest, written=written)


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
