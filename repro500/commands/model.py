"""``repro500 model``: a thin click command over repro500.scaling (docs/scaling.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

DEFAULT_P = "8,16,32,64,128,256,512,1024"


def _p_list(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    from repro500.errors import UsageError
    from repro500.scaling.predict import parse_p_list

    try:
        return tuple(parse_p_list(value))
    except UsageError as err:
        raise click.BadParameter(str(err)) from None


def _compressor(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """A name ("topk") or a YAML/JSON mapping ("{name: topk, ratio: 0.001}")."""
    if value is None:
        return None
    import yaml

    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        raise click.BadParameter(f"{value!r} is neither a compressor name nor a mapping such as "
                                 "'{name: topk, ratio: 0.001}'") from None
    return parsed if isinstance(parsed, dict) else value


@click.command()
@click.argument("run_dir", metavar="[RUN_DIR]", required=False, type=click.Path(path_type=Path))
@click.option("--params", "params", type=click.IntRange(min=1), default=None,
              help="Model size in (trainable) parameters. Default: from RUN_DIR.")
@click.option("--model", "model_name", metavar="NAME", default=None,
              help="Model size from the table of known models (resnet20, resnet50, vgg16, vit_b_16, ...).")
@click.option("--compressor", metavar="SPEC", callback=_compressor, default=None,
              help="Gradient compressor: a name (topk) or a mapping ('{name: topk, ratio: 0.001}'). "
                   "Default: the run's, else none.")
@click.option("--compute-s", "compute_s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Compute time per step of one rank in seconds (forward+backward+optimizer). Default: from RUN_DIR.")
@click.option("--compute-from", "compute_run", metavar="RUN1", type=click.Path(path_type=Path), default=None,
              help="A single-rank run directory (same per-rank batch and threads) whose step records give the "
                   "compute time. Default: RUN_DIR.")
@click.option("--p", "p_values", metavar="LIST", callback=_p_list, default=DEFAULT_P,
              help="Process counts to predict, comma-separated.")
@click.option("--overlap", type=click.FloatRange(0.0, 1.0), default=0.0,
              help="Fraction of the communication time hidden behind computation (0: none, an upper bound).")
@click.option("--json", "as_json", is_flag=True, help="Print the scaling document as JSON instead of the table.")
@click.option("--write", "write_doc", is_flag=True, help="Write RUN_DIR/derived/scaling.json (needs RUN_DIR).")
@click.option("--check", "check", is_flag=True,
              help="Exit 1 when the prediction at RUN_DIR's process count is OUTSIDE tolerance (needs a multi-rank "
                   "RUN_DIR run with the compressor predicted).")
@click.option("--remeasure", is_flag=True, help="Time the collectives again instead of using the cached timings.")
@click.option("--measure-p", "measure_p", metavar="LIST", callback=_p_list, default=None,
              help="Process counts to time the collectives on (default 2; more than the CPU cores oversubscribes).")
@click.option("--measure-max-bytes", type=click.IntRange(min=16), default=None,
              help="Largest message to time, in bytes (default 67108864, i.e. 64 MiB).")
@click.option("--measure-reps", type=click.IntRange(min=1), default=None,
              help="Timed repetitions per message size, at least (default 5; the median is used).")
def model(run_dir: Path | None, params: int | None, model_name: str | None, compressor: Any,
          compute_s: float | None, compute_run: Path | None, p_values: tuple[int, ...], overlap: float, as_json: bool, write_doc: bool,
          check: bool, remeasure: bool, measure_p: tuple[int, ...] | None, measure_max_bytes: int | None,
          measure_reps: int | None) -> None:
    """Predict step time and parallel efficiency at many process counts.

    Fits the alpha-beta model (allreduce T = 2 L log2 P + 2 gamma m (P-1)/P, allgather
    T = L log2 P + gamma m (P-1)) to Gloo collectives timed on this machine (cached per
    host and torch version), then predicts weak scaling for a model size and compressor.
    With a multi-rank RUN_DIR it also checks the prediction at the run's process count:
    the communication cost of a step (step time less data, compute and compression),
    measured against predicted, within +-50% (printed as within / OUTSIDE tolerance).

    \b
    Examples:
      repro500 model runs/<run-id>                      # everything from a run
      repro500 model runs/<run-id> --write              # + RUN_DIR/derived/scaling.json
      repro500 model runs/<2-rank> --compute-from runs/<1-rank>   # an independent check at P = 2
      repro500 model --model resnet50 --compute-s 0.25 --compressor '{name: topk, ratio: 0.01}'

    \b
    Exit codes: 0 predicted, 1 with --check, the check is OUTSIDE tolerance,
                5 the collectives could not be timed, 2 usage error (unknown compressor, missing
                size or compute time, --check without a check to make), 4 invalid input
                (no such run directory, a run without step records).
    """
    from repro500.errors import EXIT_FAIL, UsageError
    from repro500.scaling import document, measure

    if write_doc and run_dir is None:
        raise UsageError("--write stores RUN_DIR/derived/scaling.json: give a RUN_DIR")
    if check and run_dir is None:
        raise UsageError("--check compares the prediction with a multi-rank run: give its RUN_DIR")
    settings = measure.settings_given(p_values=measure_p, max_bytes=measure_max_bytes, reps=measure_reps)
    inputs = document.Inputs(run_dir=run_dir, params=params, model_name=model_name, compressor=compressor,
                             compute_time_s=compute_s, compute_run_dir=compute_run, p_values=p_values, overlap=overlap)
    doc = document.build(inputs, settings=settings, remeasure=remeasure)
    _print(doc, as_json)
    if write_doc:
        path = document.write(run_dir, doc)
        click.echo(f"wrote {path}", err=as_json)
    if check:
        measured = document.measured_check(doc, run_dir)
        if not measured["within_tolerance"]:
            click.echo(f"repro500: the prediction at P = {measured['p']} is OUTSIDE its tolerance "
                       f"(±{measured['tolerance']:.0%} on the communication cost)", err=True)
            click.get_current_context().exit(EXIT_FAIL)


def _print(doc: dict[str, Any], as_json: bool) -> None:
    """The scaling document as JSON, or as the table."""
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        from repro500.scaling.render import render

        render(doc)
