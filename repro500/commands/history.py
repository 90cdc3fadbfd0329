"""``repro500 history``: a metric across earlier runs, with the provenance changes where it moved."""

from __future__ import annotations

import json
from pathlib import Path

import click

from repro500.statuses import DEFAULT_ALPHA
from repro500.untrusted import record_console


@click.command()
@click.argument("source", metavar="SOURCE")
@click.argument("metric")
@click.option("--recipe", default=None, help="The recipe whose runs to show, where SOURCE holds runs of several.")
@click.option("--plot", "plot_path", metavar="FILE.png", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw the metric across the runs (intervals, one colour per system, moves marked).")
@click.option("--alpha", type=click.FloatRange(0.0, 0.5, min_open=True, max_open=True), default=DEFAULT_ALPHA,
              show_default=True, help="Level of the intervals and of the test that says the metric moved.")
@click.option("--json", "as_json", is_flag=True, help="Print the history as JSON (schema repro500/history/v1).")
def history(source: str, metric: str, recipe: str | None, plot_path: Path | None, alpha: float, as_json: bool) -> None:
    """Show METRIC across the runs SOURCE holds, oldest first, and what changed where it moved.

    SOURCE is a directory of run directories (runs, runs/dvc), an MLflow experiment's name
    (repro500/<recipe> by default) or mlflow:FILTER (MLflow's search syntax, every experiment of
    the store; MLFLOW_TRACKING_URI selects it). A run in MLflow whose run directory is not here
    (or holds another run now) is read from the sealed run the store keeps, as verify reads
    mlflow:RUN_ID. Each run is compared with the previous run on the same
    system of the same benchmark: "better"/"worse" when Welch's t-test says the metric moved at
    --alpha, and what changed between the two: the recipe's keys first (--set overrides), then
    the result-relevant provenance differences (packages, driver, commit, data). A run with other
    fixed keys (--set fixed.KEY in the open division) measured another benchmark: it starts a
    series of its own (B2, ...) and is not compared with the runs before it.
    `repro500 verify RUN --against history:SOURCE` decides whether RUN is a regression.

    \b
    Exit codes: 0 shown, 2 usage error (several recipes, unknown metric), 4 no readable run.
    """
    from repro500.untrusted import plain
    from repro500.verify import trend

    found = trend.build(source, metric, alpha, recipe)
    if plot_path is not None:
        trend.plot(found, plot_path)
    if as_json:
        click.echo(json.dumps(found.to_dict(), indent=2, sort_keys=True, allow_nan=False))
    else:
        _render(found)
    if plot_path is not None:
        click.echo(f"plot: {plain(plot_path)}", err=as_json)


def _render(found) -> None:  # noqa: ANN001 - trend.Trend, imported lazily
    from rich.table import Table

    from repro500.untrusted import SENTENCE_CHARS, shown
    from repro500.verify import trend
    from repro500.verify.diff import short

    console = record_console()
    better = "higher" if found.direction == "higher" else "lower"
    several = len(found.benchmarks) > 1  # then each run says which benchmark it measured
    # every string of a run (its id, system, benchmark, what changed) goes through shown(): rich
    # would otherwise read '[bold]' in a run id as markup, and a stray '[/x]' as an error
    table = Table(title=f"{shown(found.recipe)}: {shown(found.metric)} across {len(found.rows)} run(s) of "
                        f"{shown(found.source)} ({better} is better)", title_justify="left")
    for column in ("run", "created", "system", *(("benchmark",) if several else ()), "n", "mean",
                   f"{1 - found.alpha:.0%} CI", "vs previous", "result-relevant changes since the previous run"):
        table.add_column(column, overflow="fold")
    for r in found.rows:
        ci = "-" if r.ci_low is None else f"[{r.ci_low:.4g}, {r.ci_high:.4g}]"
        if r.other_benchmark:
            moved = f"[yellow]another benchmark[/] than {shown(r.other_benchmark['run'])}: not compared"
        elif r.previous is None:
            moved = "first"
        elif r.moved:
            moved = f"[{'green' if r.moved == 'better' else 'red'}]{r.moved}[/] (p={r.p_value:.2g})"
        else:
            moved = "same" if r.p_value is not None else "untested (n<2)"
        changes = "; ".join(shown(f"{c['key']}: {short(c['before'], 20)} -> {short(c['after'], 20)}"
                                  + (" (moved: the same bytes)" if c.get("moved") else ""))
                            for c in r.changes[:trend.MAX_CHANGES]) or ("-" if r.previous or r.other_benchmark else "")
        if len(r.changes) > trend.MAX_CHANGES:
            changes += f"; +{len(r.changes) - trend.MAX_CHANGES} more (--json)"
        table.add_row(shown(r.run_id), shown(r.created), shown(r.system), *((shown(r.benchmark),) if several else ()),
                      shown(r.n),
                      "-" if r.mean is None else f"{r.mean:.4g}", ci, moved, changes)
    console.print(table)
    for label, key in found.systems.items():
        described = ", ".join(f"{k.split('.', 1)[1]}={v}" for k, v in key.items() if v is not None)
        console.print(f"  [dim]{shown(label)}: {shown(described, SENTENCE_CHARS)}[/]", highlight=False)
    if several:
        for label, described in found.benchmarks.items():
            console.print(f"  [dim]{shown(label)}: {shown(described, SENTENCE_CHARS)}[/]", highlight=False)
    if found.skipped:
        console.print(f"  [dim]{len(found.skipped)} run(s) left out: "
                      + "; ".join(shown(f"{s['run']}: {s['why']}", SENTENCE_CHARS) for s in found.skipped[:3]) + "[/]", highlight=False)
