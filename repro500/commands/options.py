"""Options shared by several commands: one parser each, so that ``--margin`` means the same
everywhere it is taken (verify, run, plan, publish, reproduce, report), and ``--scale`` the same
in ``run --command`` and ``init``."""

from __future__ import annotations

import math
from collections.abc import Callable

import click


def _metric_numbers(value: tuple[str, ...], form: str, valid: Callable[[float], bool], rule: str,
                    *, stripped: bool = False) -> dict[str, float]:
    """Repeatable ``METRIC=NUMBER`` options as ``{metric: number}``: *form* names the syntax in
    errors, *valid* and *rule* what a number must be; a metric given twice is an error."""
    numbers: dict[str, float] = {}
    for item in value:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not {form}")
        try:
            number = float(text)
        except ValueError:
            raise click.BadParameter(f"{item!r}: {(text.strip() if stripped else text)!r} is not a number") from None
        if not valid(number):
            raise click.BadParameter(f"{item!r}: {rule}")
        if name in numbers:
            raise click.BadParameter(f"{name!r} is given twice")
        numbers[name] = number
    return numbers


def parse_margins(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict[str, float]:
    """``--margin METRIC=DELTA`` (repeatable) as ``{metric: delta}``; click callback."""
    return _metric_numbers(value, "METRIC=DELTA (e.g. accuracy=0.01)", lambda n: math.isfinite(n) and n > 0,
                           "the margin must be a number > 0")


def parse_scales(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict[str, float]:
    """``--scale METRIC=FACTOR`` (repeatable) as ``{metric: factor}``; click callback.  The factor
    multiplies every value read for the metric (0.01: a printed percentage becomes a fraction)."""
    return _metric_numbers(value, "METRIC=FACTOR (e.g. accuracy=0.01)", lambda n: math.isfinite(n) and n != 0,
                           "the factor must be a finite number other than 0", stripped=True)
