"""Options shared by several commands: one parser each, so that ``--margin`` means the same
everywhere it is taken (verify, run, plan, publish, reproduce, report)."""

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
