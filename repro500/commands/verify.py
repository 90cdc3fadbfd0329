"""``repro500 verify``: a thin click command over repro500.verify.judge."""

from __future__ import annotations

import json
from pathlib import Path

import click

from repro500.commands.options import parse_margins
from repro500.statuses import DEFAULT_ALPHA
from repro500.untrusted import record_console


@click.command()
@click.argument("run_dir", metavar="RUN", type=click.Path(path_type=Path))
@click.option("--against", "-a", metavar="REF", type=click.Path(path_type=Path), default=None,
              help="Reference: another run directory, a packed .tar.gz, a publication directory, a published-results .yaml/.json file, a run in MLflow (mlflow:RUN_ID), or history:SOURCE (earlier runs of the recipe on this system: a directory of runs or an MLflow experiment).")
@click.option("--alpha", type=click.FloatRange(0.0, 0.5, min_open=True, max_open=True), default=DEFAULT_ALPHA,
              show_default=True, help="Significance level: bands use (1-alpha) bounds, equivalence (1-2 alpha) intervals.")
@click.option("--margin", "margins", multiple=True, metavar="METRIC=DELTA", callback=parse_margins,
              help="Equivalence margin for a metric (repeatable); overrides the published or acceptance margin.")
@click.option("--json", "as_json", is_flag=True, help="Print verdict.json to stdout instead of the summary.")
@click.option("--expect-sums", metavar="SHA256", default=None,
              help="SHA-256 of the run's own SHA256SUMS, kept elsewhere: pack's 'SHA256SUMS sha256', publish's "
                   "'run SHA256SUMS sha256' (sums_digest in publication.json and verdict.json); not the archive's "
                   "sha256 nor the publication's SHA256SUMS. Any other digest makes the run INVALID.")
@click.option("--no-write", is_flag=True, help="Do not write verdict.json into the run directory.")
@click.option("--metrics", "metrics_path", metavar="FILE", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the verdict's numbers as flat JSON for `dvc metrics show/diff` (docs/dvc.md).")
@click.option("--trust", metavar="ALLOWED_SIGNERS", type=click.Path(path_type=Path), default=None,
              help="git's allowed_signers file: the run must be signed by a key it trusts, with its repeat chain intact (docs/trust.md).")
@click.option("--check-tracking", is_flag=True,
              help="Compare each repeat's metrics with those the run's MLflow store recorded (docs/trust.md).")
@click.option("--across-benchmarks", is_flag=True,
              help="Compare with a reference of another benchmark (recipe, fixed keys) anyway; the verdict's first "
                   "line says so. Without it such a comparison is refused (exit 4).")
@click.pass_context
def verify(ctx: click.Context, run_dir: Path, against: Path | None, alpha: float, margins: dict[str, float],
           as_json: bool, expect_sums: str | None, no_write: bool, metrics_path: Path | None,
           trust: Path | None, check_tracking: bool, across_benchmarks: bool) -> None:
    """Decide whether RUN holds (its acceptance bands) or reproduces a reference.

    RUN is a run directory (runs/<run-id>), an archive made by `repro500 pack`, a
    publication directory made by `repro500 publish` (files it left out are not carried, not missing),
    or a run in the MLflow store (MLFLOW_TRACKING_URI): mlflow:RUN_ID or runs:/RUN_ID, the sealed
    run its parent holds downloaded and verified (a repeat's run leads to its parent).
    Writes RUN/verdict.json (not with --no-write, nor for an archive or a publication).
    With --trust or --check-tracking, or when RUN has a repeat chain, a broken chain, a missing,
    untrusted or forged signature, or a disagreement with MLflow makes the verdict INVALID.

    A reference of another benchmark than RUN's (another recipe it names, other fixed keys,
    fixed keys set in the open division) is refused unless --across-benchmarks is given.

    \b
    Exit codes: 0 pass/reproduced, 1 fail/not reproduced, 2 usage error,
                3 inconclusive, 4 invalid input (missing, corrupt, tampered,
                a reference of another benchmark).
    """
    from repro500.verify.judge import judge

    def warn(text: str) -> None:
        click.echo(f"repro500: warning: {text}", err=True)

    verdict = judge(run_dir, against=against, alpha=alpha, margins=margins or None, expect_sums_digest=expect_sums,
                    across_benchmarks=across_benchmarks, trust=trust, check_tracking=check_tracking,
                    write=not no_write, metrics_path=metrics_path, warn=warn)
    if as_json:
        click.echo(json.dumps(verdict.to_dict(), indent=2, sort_keys=True, allow_nan=False))
    else:

        from repro500.verify.render import render

        render(verdict, record_console())
    ctx.exit(verdict.exit_code)
