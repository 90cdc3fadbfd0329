"""``repro500 export mlperf``: thin click commands over repro500.verify.vouching.export_mlperf."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def export() -> None:
    """Export a run in another project's format."""


@export.command("mlperf")
@click.argument("run_dir", metavar="RUN", type=click.Path(path_type=Path))
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory to write the submission tree into (must not exist, or be empty).")
@click.option("--submitter", help="MLPerf submitter (organisation) name  [default: the logs' submission_org]")
@click.option("--system", help="System name for systems/<system>.json  [default: made from the run's hardware]")
@click.option("--ruleset", help="MLPerf ruleset version  [default: training 4.0.0 for ResNet, HPC 3.0.0 for CosmoFlow]")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Run MLPerf's package_checker, result_summarizer and rcp_checker on the tree.")
@click.pass_context
def mlperf(ctx: click.Context, run_dir: Path, out: Path, submitter: str | None, system: str | None,
           ruleset: str | None, check: bool) -> None:
    """Write RUN's MLPerf logs as an MLPerf submission tree into --out.

    RUN is a run directory (runs/<run-id>) or a packed run.
    The tree holds systems/<system>.json (from the run's manifest) and one
    results/<system>/<benchmark>/result_<k>.txt per repeat (HPC benchmarks under
    results/<system>/strong/); closed division when the run kept its recipe's fixed keys,
    open otherwise. MLPerf's package_checker and result_summarizer then judge it, and
    its rcp_checker where RCPs exist for the benchmark and batch size (docs/mlperf.md).

    \b
    Exit codes: 0 written (and accepted by package_checker and result_summarizer);
                1 written, but one of them rejected it; 2 usage error (a ruleset
                without rules for the benchmark, a bad name); 4 RUN is not an untouched
                repro500 run (or packed run) with MLPerf logs, or --out is not empty.
    """
    from repro500.untrusted import SENTENCE_CHARS, plain
    from repro500.verify.vouching import export_mlperf

    # each line may quote the run (a path, a benchmark, what a checker said of its logs): one line, no controls
    def progress(line: str) -> None:
        click.echo(plain(line, SENTENCE_CHARS), err=True)

    tree = export_mlperf(run_dir, out, submitter=submitter, system=system, ruleset=ruleset, progress=progress)
    click.echo(f"exported {len(tree.results)} results of {plain(tree.benchmark)} ({plain(tree.division)} division, "
               f"{plain(tree.usage)} {plain(tree.ruleset)}) -> {plain(tree.path)}")
    if not check:
        return
    from repro500.mlperf.checkers import check_tree, rejected_by

    outcomes = check_tree(tree, progress)
    for outcome in outcomes:
        click.echo(plain(outcome.line, SENTENCE_CHARS))
    rejected = rejected_by(outcomes)
    if rejected:
        click.echo(f"not accepted by {' and '.join(rejected)}; the tree is kept in {plain(tree.path)}", err=True)
        from repro500.errors import EXIT_FAIL

        ctx.exit(EXIT_FAIL)  # the checkers' verdict: the tree is not accepted
