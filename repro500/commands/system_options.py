"""Options every system measurement command shares (``repro500 ops``, ``roofline``, ``io``):
where the run directory goes and how it is tracked, as ``repro500 run`` spells them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


def run_options(func: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--repeats", "-n", type=click.IntRange(min=1), default=3, help="Repeats of the whole measurement."),
        click.option("--seed", type=click.IntRange(min=0), default=0, help="Seed of the inputs the measurement draws."),
        click.option("--threads", type=click.IntRange(min=1), default=None,
                     help="CPU threads torch uses (default: torch's own choice)."),
        click.option("--out", "out_dir", default="runs", type=click.Path(file_okay=False),
                     help="Where run directories are created."),
        click.option("--run-id", help="Name of the run directory (default: UTC time, name and a random suffix)."),
        click.option("--tracking/--no-tracking", default=None,
                     help="Log to MLflow (MLFLOW_TRACKING_URI, default sqlite:///mlflow.db). Default: on."),
        click.option("--experiment", help="MLflow experiment name (default: repro500/<name>)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def pairs(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, list[str]]:
    """``OP=VALUE`` options (repeatable) as {OP: [VALUE, ...]}."""
    out: dict[str, list[str]] = {}
    for text in values:
        key, sep, value = text.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise click.BadParameter(f"{text!r} is not OP=VALUE")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def finish(outcome: Any) -> None:
    import sys

    sys.exit(outcome.exit_code)


def resolve_device(requested: str) -> str:
    """``--device`` resolved as the runner resolves ``mutable.device``, the error in this command's words."""
    from repro500.errors import InvalidInput
    from repro500.runner.plan import resolve_device as plan_device

    try:
        return plan_device(requested)
    except InvalidInput:
        raise InvalidInput("--device cuda: this machine has no usable CUDA device (torch.cuda.is_available() is "
                           "false); use --device cpu or --device auto") from None
