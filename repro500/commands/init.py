"""``repro500 init``: thin CLI over :func:`repro500.workloads.command.init.init`."""

from __future__ import annotations

from pathlib import Path

import click

from repro500.commands.options import parse_scales


@click.command()
@click.argument("command", nargs=-1, required=True)
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="The experiment's directory (where the three files are written).")
@click.option("--metric", "metrics", multiple=True, metavar="NAME=SOURCE[:ARG]",
              help="Where a metric comes from: regex:PATTERN, mlflow[:KEY], mllog[:KEY], json[:KEY], or NAME alone.")
@click.option("--scale", "scales", multiple=True, metavar="NAME=FACTOR", callback=parse_scales,
              help="Multiply a --metric's values by FACTOR (e.g. accuracy=0.01: a printed percentage as a fraction).")
@click.option("--accept", "accepts", multiple=True, metavar="NAME>=TARGET[±TOL]", help="An acceptance band.")
@click.option("--set", "values", multiple=True, metavar="KEY=VALUE",
              help="A mutable value the command uses as {mutable.KEY} (dvc exp run -S run.mutable.KEY=... varies it).")
@click.option("--input", "inputs", multiple=True, metavar="PATH",
              help="A file or directory the command reads (repeatable; {mutable.KEY} allowed): hashed by every run "
                   "(fixed.inputs) and a dependency of the DVC run stage.")
@click.option("--name", help="The experiment's name (default: the script's).")
@click.option("--repeats", "-n", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), help="Seconds a repeat may take.")
@click.option("--tracking/--no-tracking", default=True, show_default=True,
              help="Whether the runs log to MLflow (params.yaml run.tracking; MLFLOW_TRACKING_URI, default ./mlflow.db).")
@click.option("--force", is_flag=True, help="Replace existing repro500.yaml, params.yaml and dvc.yaml.")
def init(command: tuple[str, ...], directory: Path, metrics: tuple[str, ...], scales: dict[str, float], accepts: tuple[str, ...],
         values: tuple[str, ...], inputs: tuple[str, ...], name: str | None, repeats: int, timeout_s: float | None,
         tracking: bool, force: bool) -> None:
    """Put your own experiment under repro500 and DVC: writes repro500.yaml, params.yaml, dvc.yaml.

    \b
      repro500 init --metric 'accuracy=mlflow' --accept 'accuracy>=0.9±0.02' \\
                    --set lr=0.1 -- python train.py --lr '{mutable.lr}' --seed '{seed}'
      dvc repro && dvc metrics show
      dvc exp run -S run.mutable.lr=0.05

    With tracking (the default), MLflow's local store files are appended to .gitignore where
    missing. Exit codes: 0 written, 2 usage error, 4 invalid input or a file exists (nothing written).
    """
    from repro500.recipe.load import parse_assignment
    from repro500.workloads.command.adhoc import recipe_data
    from repro500.workloads.command.init import init as write

    data = recipe_data(list(command), metrics=list(metrics), accept=list(accepts), name=name, timeout_s=timeout_s,
                       repeats=repeats, inputs=list(inputs), scales=scales)
    data["mutable"] = dict(parse_assignment(v) for v in values)
    data["description"] = "written by repro500 init"
    for line in write(directory, data, force=force, tracking=tracking).lines():
        click.echo(line)
    click.echo("next: dvc init (once, if this is not a DVC project yet), then dvc repro; dvc metrics show")
