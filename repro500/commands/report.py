"""``repro500 report``: a thin click command over repro500.report.write_report."""

from __future__ import annotations

from pathlib import Path

import click

from repro500.commands.options import parse_margins


@click.command()
@click.argument("run_ref", metavar="RUN")
@click.option("--against", "-a", metavar="REF", type=click.Path(path_type=Path), default=None,
              help="Compare with a reference: another run directory, a packed .tar.gz, or a published-results "
                   ".yaml/.json file (the verdict is computed now).")
@click.option("--out", "-o", metavar="PATH", type=click.Path(path_type=Path), default=None,
              help="Where to write the report (default: RUN/report.html; <run-id>.report.html next to an "
                   "archive; a directory gets report.html).")
@click.option("--alpha", type=click.FloatRange(0.0, 0.5, min_open=True, max_open=True), default=None,
              help="Significance level when the verdict is computed (default: the stored verdict's, else 0.05).")
@click.option("--margin", "margins", multiple=True, metavar="METRIC=DELTA", callback=parse_margins,
              help="Equivalence margin for a metric (repeatable); needs --against.")
@click.option("--roofline", metavar="ROOFLINE_RUN", type=click.Path(path_type=Path), default=None,
              help="A repro500 roofline run whose ceilings RUN is placed under (default: the newest one beside RUN "
                   "measured on the same CPU and GPU model).")
@click.option("--across-benchmarks", is_flag=True,
              help="With --against: compare with a reference of another benchmark anyway (the verdict says so).")
@click.option("--open", "open_browser", is_flag=True, help="Open the written report in the default web browser.")
@click.pass_context
def report(ctx: click.Context, run_ref: str, against: Path | None, out: Path | None, alpha: float | None,
           margins: dict[str, float], roofline: Path | None, across_benchmarks: bool, open_browser: bool) -> None:
    """Write one self-contained HTML report of RUN and print its path.

    RUN is a run directory (runs/<run-id>), an archive made by `repro500 pack`, or a run in the
    MLflow store named mlflow:RUN_ID or runs:/RUN_ID as for verify (its sealed run, downloaded for
    the report, written as <run-id>.report.html here unless --out says otherwise). The page
    shows convergence curves with a confidence band, per-metric distributions against the
    acceptance band (and the reference), the step-time breakdown, bytes on the wire, the
    scaling model when present, energy, utilization, data wait and the run on the roofline
    (docs/system.md), provenance and the verdict. Plots are embedded; the page has
    no scripts and loads nothing from elsewhere.

    \b
    Exit codes: 0 written, 2 usage error, 4 RUN or REF missing or unreadable
                (a run failing its integrity check still gets a report, with exit 4).
    """
    import contextlib
    import tempfile

    from repro500.errors import EXIT_OK
    from repro500.report import write_report
    from repro500.untrusted import plain
    from repro500.verify import check_comparison_options, from_mlflow

    check_comparison_options(margins, against, across_benchmarks)
    with contextlib.ExitStack() as stack:
        run_dir = Path(run_ref)
        if from_mlflow.is_reference(run_ref):  # the sealed run the store holds, gone after the report
            run_dir = from_mlflow.download(run_ref, Path(stack.enter_context(tempfile.TemporaryDirectory(
                prefix="repro500-mlflow-"))))
            out = out if out is not None else Path(run_dir.name.removesuffix(".tar.gz") + ".report.html")
        result = write_report(run_dir, out=out, against=against, alpha=alpha, margins=margins or None,
                              roofline=roofline, across_benchmarks=across_benchmarks)
        run_dir = Path(run_ref)  # named as the user named it
    click.echo(plain(result.path))
    if result.exit_code != EXIT_OK:
        click.echo(f"repro500: error: {plain(run_dir)} fails its integrity check (verdict {plain(result.status)}); "
                   "the report lists the problems", err=True)
    if open_browser:
        import webbrowser

        webbrowser.open(result.path.resolve().as_uri())
    ctx.exit(result.exit_code)
