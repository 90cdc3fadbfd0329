"""``repro500 publish``: a thin click command over repro500.publish."""

from __future__ import annotations

from pathlib import Path

import click

from repro500.commands.options import parse_margins


@click.command()
@click.argument("run_dir", metavar="RUN", type=click.Path(path_type=Path))
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory to write the publication into (must not exist, or be empty, unless --force).")
@click.option("--benchmark", help="What was measured, as published.yaml states it (default: recipe name and run id).")
@click.option("--citation", help="Where the result is reported, e.g. a paper (default: the run id and today's date).")
@click.option("--url", help="A URL for the result (paper, repository, leaderboard).")
@click.option("--margin", "margins", multiple=True, metavar="METRIC=DELTA", callback=parse_margins,
              help="Equivalence margin for an acceptance metric (repeatable); default: its acceptance tolerance.")
@click.option("--data-root", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              help="Directory the run ran in; used only for runs without data-specs.json (made before it existed): "
                   "their relative data paths are read there for their generator parameters.")
@click.option("--exclude", "exclude", multiple=True, metavar="GLOB",
              help="Leave the run's files matching GLOB (relative to the run directory, e.g. 'repeats/*/checkpoint.pt') "
                   "out of the archive, their digests recorded in publication.json (repeatable). Only the "
                   "experiment's own outputs under repeats/<k>/ can be left out.")
@click.option("--force", is_flag=True, help="Replace an existing publication directory (only once the new one is complete).")
def publish(run_dir: Path, out: Path, benchmark: str | None, citation: str | None, url: str | None,
            margins: dict[str, float], data_root: Path, exclude: tuple[str, ...], force: bool) -> None:
    """Write a self-contained publication of RUN into --out for others to reproduce.

    RUN is a run directory (runs/<run-id>) or a packed run. The publication holds the packed
    run, published.yaml (per-repeat values, margins from the acceptance tolerances), the
    recipe, params.yaml (how to regenerate the data), dvc.yaml, a README with the exact
    commands, and SHA256SUMS.

    \b
    Exit codes: 0 written; 2 usage error (an --exclude that matches nothing or a file
                repro500 needs); 4 RUN missing, incomplete or tampered, or --out exists
                (without --force).
    """
    from repro500.publish.publication import publish as write_publication
    from repro500.untrusted import SENTENCE_CHARS, plain

    # the run's names, notes and the --benchmark/--citation text are printed through plain(): one line each

    result = write_publication(run_dir, out, benchmark=benchmark, citation=citation, url=url,
                               margins=margins or None, data_root=data_root, force=force, exclude=exclude)
    click.echo(f"published {plain(run_dir)} -> {plain(result.path)} (metrics: {plain(', '.join(result.metrics))}; "
               f"the run's own verdict: {plain(result.status)})")
    for note in result.notes:
        click.echo(f"note: {plain(note, SENTENCE_CHARS)}")
    # Three digests, each checked a different way: only the run's own goes to --expect-sums.
    click.echo(f"run SHA256SUMS sha256: {result.sums_digest} "
               f"(repro500 verify {result.archive.name} --expect-sums {result.sums_digest})")
    click.echo(f"archive sha256: {result.archive_sha256} (sha256sum {result.archive.name})")
    click.echo(f"publication SHA256SUMS sha256: {result.publication_digest} (sha256sum SHA256SUMS in {result.path})")
    consent = " --run-code" if result.runs_code else ""
    click.echo(f"\nTo reproduce and verify it (also in {plain(result.path / 'README.md')}):\n"
               f"  repro500 reproduce {plain(result.path)}{consent}\n"
               f"  repro500 reproduce <git URL> --path <its directory in the repository>{consent}   # once committed")
    if result.runs_code:
        click.echo(f"  (--run-code: the experiment runs its own code ({plain(result.runs_code)}); a reproducer reads it "
                   "first)")
