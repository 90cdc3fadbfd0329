"""``repro500 capture``: a thin click command over repro500.capture."""

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
