"""Options shared by several commands: one parser each, so that ``--margin`` means the same
everywhere it is taken (verify, run, plan, publish, reproduce, report), and ``--scale`` the same
in ``run --command`` and ``init``."""

from __future__ import annotations

import math

import click


def parse_margins(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict[str, float]:
    """``--margin METRIC=DELTA`` (repeatable) as ``{metric: delta}``; click callback."""
    margins: dict[str, float] = {}
    for item in value:
        name, sep, delta = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not METRIC=DELTA (e.g. accuracy=0.01)")
        try:
            number = float(delta)
        except ValueError:
            raise click.BadParameter(f"{item!r}: {delta!r} is not a number") from None
        if not (math.isfinite(number) and number > 0):
            raise click.BadParameter(f"{item!r}: the margin must be a number > 0")
        if name in margins:
            raise click.BadParameter(f"{name!r} is given twice")
        margins[name] = number
    return margins


def parse_scales(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict[str, float]:
    """``--scale METRIC=FACTOR`` (repeatable) as ``{metric: factor}``; click callback.  The factor
    multiplies every value read for the metric (0.01: a printed percentage becomes a fraction)."""
    scales: dict[str, float] = {}
    for item in value:
        name, sep, factor = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not METRIC=FACTOR (e.g. accuracy=0.01)")
        try:
            number = float(factor)
        except ValueError:
            raise click.BadParameter(f"{item!r}: {factor.strip()!r} is not a number") from None
        if not math.isfinite(number) or number == 0:
            raise click.BadParameter(f"{item!r}: the factor must be a finite number other than 0")
        if name in scales:
            raise click.BadParameter(f"{name!r} is given twice")
        scales[name] = number
    return scales
