"""``repro500 plan``: how many repeats a decision needs, before running them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click

from repro500.commands.options import parse_margins
from repro500.statuses import DEFAULT_ALPHA
from repro500.untrusted import record_console


def _parse_cvs(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict[str, float]:
    cvs: dict[str, float] = {}
    for item in value:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not METRIC=CV (e.g. accuracy=0.01 for 1%)")
        try:
            number = float(text.rstrip("%")) / (100.0 if text.endswith("%") else 1.0)
        except ValueError:
            raise click.BadParameter(f"{item!r}: {text!r} is not a number") from None
        if not (math.isfinite(number) and number > 0):
            raise click.BadParameter(f"{item!r}: the CV must be a number > 0")
        cvs[name] = number
    return cvs


@click.command()
@click.argument("source", metavar="RUN_OR_RECIPE", type=click.Path(path_type=Path))
@click.option("--margin", "margins", multiple=True, metavar="METRIC=DELTA", callback=parse_margins,
              help="Equivalence margin to plan a reproduction for (repeatable; default: the acceptance tolerances).")
@click.option("--cv", "cvs", multiple=True, metavar="METRIC=CV", callback=_parse_cvs,
              help="State the spread as a coefficient of variation (0.01 or 1%) instead of the run's observed one; "
                   "needed for a recipe (repeatable).")
@click.option("--power", type=click.FloatRange(0.5, 1.0, max_open=True), default=0.8, show_default=True,
              help="Probability that the test decides, if the assumptions hold.")
@click.option("--alpha", type=click.FloatRange(0.0, 0.5, min_open=True, max_open=True), default=DEFAULT_ALPHA,
              show_default=True, help="Significance level, as for verify.")
@click.option("--spending", type=click.Choice(["obrien-fleming", "pocock"]), default="obrien-fleming",
              show_default=True, help="The spending function of the run --until-decided the plan sizes.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(source: Path, margins: dict[str, float], cvs: dict[str, float], power: float, alpha: float,
         spending: str, as_json: bool) -> None:
    """Say how many repeats the bands and the equivalence test need.

    RUN_OR_RECIPE is a run directory (or a packed run, or a publication), whose per-repeat spread is used, or
    a recipe, whose spread you state with --cv. For each metric with an acceptance band or a
    margin: the repeats for the band's bound to decide it, and for a reproduction to show
    equivalence within the margin (both sides fresh, and against this run's own repeats); and
    the --max-repeats a `run --until-decided` needs to decide the same question with the same
    power (column "until decided"). The assumptions are printed with the figures.

    \b
    Exit codes: 0 planned, 2 nothing to plan or a metric without a spread, 4 unreadable input.
    """
    from repro500.verify.planning import build

    result = build(source, margins, cvs, alpha, power, spending=spending)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, sort_keys=True, allow_nan=False))
        return
    _render(result)


def _n(value: Any) -> str:
    return "not reachable" if value is None else str(value)


def _sequential(found: dict[str, Any] | None) -> str:
    """--max-repeats N and the repeats it expects to stop after, for the "until decided" column."""
    if not found:
        return "-"
    if found.get("max_repeats") is None:
        return "not reachable"
    from rich.markup import escape

    return escape(f"{found['max_repeats']} (E[n] {found['expected_repeats']:.1f})")


def _render(result: Any) -> None:
    from rich.table import Table

    from repro500.untrusted import SENTENCE_CHARS, shown

    # the recipe's and the run's names and notes are data, never markup

    console = record_console()
    table = Table(title=f"Repeats needed ({shown(result.kind)} {shown(result.source)}; alpha {result.alpha:g}, "
                        f"power {result.power:.0%})")
    for column in ("metric", "spread (sd)", "decision", "repeats", "conservative", "until decided"):
        table.add_column(column, justify="left" if column in ("metric", "spread (sd)", "decision") else "right")
    for m in result.metrics:
        spread = f"{m.sd:.4g}"
        conservative = m.n_spread is not None
        if m.band:
            side = "<=" if m.band["direction"] == "lower" else ">="
            table.add_row(shown(m.metric), spread, f"band {side} {m.band['threshold']:.6g}", _n(m.band["repeats"]),
                          _n(m.band["conservative"]) if conservative else "-", _sequential(m.band.get("until_decided")))
        if m.equivalence:
            e = m.equivalence
            first = not m.band
            table.add_row(shown(m.metric) if first else "", spread if first else "", f"within +/-{e['margin']:g}, fresh",
                          _n(e["fresh"]), _n(e["conservative"]) if conservative else "-", "-")
            if "against_this_run" in e:
                table.add_row("", "", f"within +/-{e['margin']:g}, vs this run", _n(e["against_this_run"]), "-",
                              _sequential(e.get("until_decided")))
    console.print(table)
    for m in result.metrics:
        for what, found in (("band", (m.band or {}).get("until_decided")),
                            ("vs this run", (m.equivalence or {}).get("until_decided"))):
            if found and found.get("max_repeats") is None and found.get("reason"):
                console.print(f"[yellow]until decided, {shown(m.metric)} {what}:[/] {shown(found['reason'], SENTENCE_CHARS)}")
    for m in result.metrics:
        where = f"spread of {shown(m.metric)}: {shown(m.spread_from)}"
        if m.equivalence:
            where += f"; margin {m.equivalence['margin']:g} from the {shown(m.equivalence['margin_source'])}"
        console.print(where)
    console.print("'fresh': a reproduction where both sides run that many repeats; 'vs this run': the reproduction's "
                  "repeats against this run's own; 'conservative': if the spread is at its upper 80% bound; "
                  "'until decided': the --max-repeats of run --until-decided for the same question and power, "
                  "and E\\[n], the repeats it is expected to stop after.")
    for m in result.metrics:
        for note in m.notes:
            console.print(f"[yellow]note:[/] {shown(note, SENTENCE_CHARS)}")
    console.print("Assumptions:")
    for line in result.assumptions:
        console.print(f"  - {shown(line, SENTENCE_CHARS)}")
