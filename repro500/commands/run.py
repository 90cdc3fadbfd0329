"""``repro500 run``: thin CLI over :func:`repro500.runner.run`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from repro500.commands.options import parse_margins, parse_scales
from repro500.errors import UsageError  # loaded with the CLI already (repro500.untrusted)


@click.command(context_settings={"show_default": True})
@click.argument("recipe", required=False, nargs=-1)
@click.option("--command", "as_command", is_flag=True,
              help="Run the program given after -- (repro500 run --command [OPTIONS] -- python train.py ...) as the experiment.")
@click.option("--metric", "metrics", multiple=True, metavar="NAME=SOURCE[:ARG]",
              help="With --command: where a metric comes from: regex:PATTERN, mlflow[:KEY], mllog[:KEY], json[:KEY], or NAME alone (auto).")
@click.option("--scale", "scales", multiple=True, metavar="NAME=FACTOR", callback=parse_scales,
              help="With --command: multiply a --metric's values by FACTOR, e.g. accuracy=0.01 for a printed "
                   "percentage against a band of fractions (a recipe's scale:).")
@click.option("--accept", "accepts", multiple=True, metavar="NAME>=TARGET[±TOL]",
              help="With --command: an acceptance band, e.g. 'accuracy>=0.9±0.02' or 'loss<=0.5'.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), help="With --command: seconds a repeat may take.")
@click.option("--name", help="With --command: the experiment's name (default: the script's).")
@click.option("--input", "inputs", multiple=True, metavar="PATH",
              help="With --command: a file or directory the command reads, hashed like a data set ({mutable.KEY} allowed; repeatable).")
@click.option("--trace-inputs", is_flag=True,
              help="Find the files a command reads with strace (any program), not only in its Python processes.")
@click.option("--repeats", "-n", type=click.IntRange(min=1), help="Number of repeats (default: the recipe's).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a mutable key, e.g. --set batch_size=128 --set optimizer.lr=0.05. Fixed keys need --open-division.")
@click.option("--params", "params_file", type=click.Path(dir_okay=False),
              help="A DVC params.yaml whose 'run' section (repeats, seed, mutable) overrides the recipe.")
@click.option("--out", "out_dir", default="runs", type=click.Path(file_okay=False), help="Where run directories are created.")
@click.option("--run-id", help="Name of the run directory (default: UTC time, recipe name and a random suffix).")
@click.option("--run-id-from-dvc", is_flag=True,
              help="Name the run directory after the DVC experiment that runs it (dvc exp run's DVC_EXP_NAME, "
                   "normalised; refused if that run exists), else the default id: what repro500 init's stage passes.")
@click.option("--metrics", "metrics_path", metavar="FILE", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the verdict's numbers as flat JSON for `dvc metrics show/diff` (as verify --metrics).")
@click.option("--report", "report_path", metavar="FILE", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the run's HTML report to FILE once it is judged (as repro500 report RUN --out FILE): "
                   "a pipeline stage's report of the run it made, whatever its run id.")
@click.option("--plots", "plots_dir", metavar="DIR", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also write the run's values for `dvc plots show`: DIR/repeats.json (a record per repeat) and "
                   "DIR/epochs.json (a record per epoch of each repeat).")
@click.option("--deterministic", is_flag=True, help="Use torch's deterministic algorithms (recorded in the manifest).")
@click.option("--same-seed", is_flag=True, help="Give every repeat repeat 0's seeds: a determinism check.")
@click.option("--open-division", is_flag=True, help="Allow overriding fixed keys; recorded with the results.")
@click.option("--nproc", type=click.IntRange(min=1), help="Ranks per node for a distributed engine (implies engine=ddp).")
@click.option("--nnodes", default=1, type=click.IntRange(min=1), help="Nodes of a multi-node ddp run (torchrun rendezvous).")
@click.option("--node-rank", default=0, type=click.IntRange(min=0), help="This node's rank; node 0 writes the run directory and logs to MLflow.")
@click.option("--rdzv-endpoint", metavar="HOST:PORT", help="torchrun rendezvous endpoint for --nnodes > 1 (usually node 0).")
@click.option("--resume", type=click.Path(file_okay=False, exists=False), metavar="RUN_DIR",
              help="Complete an interrupted run: rerun only its missing repeats, with the same seeds.")
@click.option("--run-code", is_flag=True,
              help="With --resume: consent to run the code of a run this machine's repro500 did not make (unpacked, "
                   "extracted, downloaded or copied; docs/trust.md). Read its recipe.yaml and source/ first.")
@click.option("--tracking/--no-tracking", default=None,
              help="Log to MLflow (MLFLOW_TRACKING_URI, default sqlite:///mlflow.db). Default: on, or the --params file's "
                   "run.tracking; a resumed run keeps its own choice (a contrary flag is refused).")
@click.option("--experiment", help="MLflow experiment name (default: repro500/<recipe name>).")
@click.option("--artifacts", metavar="URI", help="Where a new MLflow experiment keeps its artifacts (a directory or "
                                               "an MLflow artifact URI). Default: mlartifacts/ beside a SQLite store; "
                                               "a tracking server's own setting.")
@click.option("--sign-key", envvar="REPRO500_SIGNING_KEY", type=click.Path(dir_okay=False),
              help="Sign the finished run with this OpenSSH Ed25519 key (env REPRO500_SIGNING_KEY; docs/trust.md).")
@click.option("--sign-principal", metavar="NAME", help="Who signs, as named in the verifier's allowed_signers (e.g. an email).")
@click.option("--until-decided", is_flag=True,
              help="Run repeats one at a time and stop once the verdict is decided (group-sequential tests; docs/verify.md).")
@click.option("--max-repeats", type=click.IntRange(min=3),
              help="With --until-decided: at most this many repeats [default: as many as 80% power needs against "
                   "--against's spread (repro500 plan), else 10]. With --vary: a cap on the factorial's size.")
@click.option("--spending", type=click.Choice(["obrien-fleming", "pocock"]), default="obrien-fleming",
              help="With --until-decided: how alpha is spent over the looks.")
@click.option("--against", metavar="REF", help="Verify against this reference (a run, a packed run or a published file); "
                                               "with --until-decided the equivalence test decides when to stop.")
@click.option("--margin", "margins", multiple=True, metavar="METRIC=DELTA", callback=parse_margins,
              help="With --against: equivalence margin for a metric (repeatable; default: the acceptance tolerances).")
@click.option("--vary", metavar="SOURCES", help="A factorial run: vary each named source of randomness alone (seed, init, "
                                              "data_order, kernels; comma-separated), to attribute the variance.")
@click.option("--repeats-per-cell", type=click.IntRange(min=2), help="With --vary: repeats per source.  [default: 3]")
@click.option("--sandbox", "sandboxed", is_flag=True,
              help="Run your code in bubblewrap, as reproduce --run-code runs a publication's: the working directory "
                   "and inputs read-only, --out and the MLflow store writable, an empty HOME, no network.")
@click.option("--network", is_flag=True, help="With --sandbox: give the run the network.")
@click.option("--sandbox-ro", "sandbox_ro", multiple=True, metavar="PATH",
              help="With --sandbox: also let the run read PATH (read-only; repeatable).")
@click.option("--launcher", type=click.Choice(["local", "slurm"]),
              help="Run the repeats side by side: local (this node, each on its own CPU set or GPU) or slurm "
                   "(one SLURM job array; docs/distributed.md, \"Repeats side by side\").")
@click.option("--parallel", type=int, metavar="K",
              help="With --launcher: repeats at once.  [default: one per GPU, else per CPU core, at most the repeats; "
                   "slurm: every repeat]")
@click.option("--slurm", "slurm", multiple=True, metavar="KEY=VALUE",
              help="With --launcher slurm: a task's resources, repeatable: partition=NAME, time=MINUTES, cpus=N, "
                   "gpus=N, mem=8G, account=NAME, qos=NAME.  [default: the default partition, its time limit, 1 CPU]")
@click.option("--detach", is_flag=True,
              help="With --launcher slurm: return once SLURM has queued the repeats (exit 0); repro500 run --resume "
                   "RUN_DIR later collects them and concludes the run.")
def run(recipe: tuple[str, ...], as_command: bool, metrics: tuple[str, ...], scales: dict[str, float], accepts: tuple[str, ...],
        timeout_s: float | None, name: str | None, inputs: tuple[str, ...], trace_inputs: bool, repeats: int | None, overrides: tuple[str, ...], params_file: str | None, out_dir: str,
        run_id: str | None, run_id_from_dvc: bool, metrics_path: Path | None, report_path: Path | None, plots_dir: Path | None, deterministic: bool, same_seed: bool, open_division: bool, nproc: int | None,
        nnodes: int, node_rank: int, rdzv_endpoint: str | None, resume: str | None, run_code: bool,
        tracking: bool | None,
        experiment: str | None, artifacts: str | None, sign_key: str | None, sign_principal: str | None, until_decided: bool,
        max_repeats: int | None, spending: str, against: str | None, margins: dict[str, float], vary: str | None,
        repeats_per_cell: int | None, sandboxed: bool, network: bool, sandbox_ro: tuple[str, ...],
        launcher: str | None, parallel: int | None, slurm: tuple[str, ...], detach: bool) -> None:
    """Run a benchmark RECIPE several times with full provenance, then verify it.

    Or run your own program: repro500 run --command --metric 'accuracy=regex:Acc ([0-9.]+)'
    --scale accuracy=0.01 --accept 'accuracy>=0.9' -- python train.py --lr 0.1 (docs/command.md).

    Exit code: the verdict's (0 pass, 1 fail, 3 inconclusive), 2 for a usage error (a bad
    option or --set value), 4 for invalid input (recipe, data, metric names, device, an
    unwritable --out), 130 when interrupted (finished repeats are kept; complete with --resume).
    With --detach: 0 once SLURM has queued the repeats (the verdict comes from --resume).
    """
    import time

    # the MLflow parent's start: when the user's command reached repro500, not when the run's
    # records land (they are queued behind the run, docs/contracts.md "MLflow")
    started_ms = int(time.time() * 1000)
    from repro500.runner import RunOptions
    from repro500.runner import run as run_recipe

    ctx = click.get_current_context()
    if as_command:
        recipe_path, adhoc = None, _command_recipe(recipe, metrics=metrics, scales=scales, accepts=accepts,
                                                   timeout_s=timeout_s, name=name, inputs=inputs)
    else:
        recipe_path, adhoc = _recipe_file(recipe, ctx), None
    if artifacts is not None and tracking is False:
        raise UsageError("--artifacts says where MLflow keeps a run's artifacts: it does not go with --no-tracking")
    if resume and (recipe_path or adhoc):
        raise UsageError("give either a RECIPE or --resume RUN_DIR, not both")
    if resume:
        _refuse_with_resume(ctx)
    elif run_code:
        raise UsageError("--run-code goes with --resume: it consents to a run directory that this machine's repro500 "
                         "did not make (your own recipe needs no consent)")
    options = RunOptions(recipe=recipe_path, adhoc=adhoc, repeats=repeats, overrides=list(overrides), params_file=params_file,
                         out_dir=out_dir, deterministic=deterministic, same_seed=same_seed,
                         open_division=open_division, resume=resume, run_code=run_code, nproc=nproc,
                         tracking=tracking,
                         experiment=experiment, artifacts=artifacts, run_id=run_id, run_id_from_dvc=run_id_from_dvc, nnodes=nnodes, node_rank=node_rank,
                         rdzv_endpoint=rdzv_endpoint, argv=["repro500", *sys.argv[1:]],
                         sign_key=sign_key, sign_principal=sign_principal, trace_inputs=trace_inputs,
                         until_decided=until_decided, max_repeats=max_repeats, spending=spending, against=against,
                         margins=margins, repeats_per_cell=repeats_per_cell, launcher=launcher, parallel=parallel, slurm=slurm,
                         detach=detach,
                         vary=[name.strip() for name in vary.split(",")] if vary is not None else None,
                         started_ms=started_ms)
    if sandboxed or network or sandbox_ro:
        _sandboxed(ctx, recipe_path, adhoc is not None, options)
    outcome = run_recipe(options)
    if outcome.verdict is not None:
        _write_views(outcome, metrics_path, plots_dir, report_path)
    sys.exit(outcome.exit_code)


def _write_views(outcome: Any, metrics_path: Path | None, plots_dir: Path | None, report_path: Path | None) -> None:
    """What a pipeline stage asked for besides the run: the verdict's numbers for DVC, the repeats'
    values for DVC's plots, the run's HTML report."""
    from repro500.rundir.dvcmetrics import write_metrics, write_plots

    if metrics_path is not None:
        write_metrics(outcome.verdict.to_dict(), metrics_path)
    if plots_dir is not None:
        write_plots(outcome.run_dir, plots_dir)
    if report_path is not None:
        from repro500.report import write_report

        write_report(outcome.run_dir, out=report_path)


# The options that describe a program run with --command, by flag and parameter name.
_COMMAND_ONLY = (("--metric", "metrics"), ("--scale", "scales"), ("--accept", "accepts"), ("--timeout", "timeout_s"),
                 ("--name", "name"), ("--input", "inputs"))
# What --resume takes from the run directory instead: given again, they would silently not apply.
_RECORDED_IN_THE_RUN = (
    ("--set", "overrides"), ("--params", "params_file"), ("--repeats", "repeats"), ("--nproc", "nproc"),
    ("--deterministic", "deterministic"), ("--same-seed", "same_seed"), ("--open-division", "open_division"),
    ("--run-id", "run_id"), ("--run-id-from-dvc", "run_id_from_dvc"), ("--experiment", "experiment"), ("--trace-inputs", "trace_inputs"),
    ("--until-decided", "until_decided"), ("--max-repeats", "max_repeats"), ("--against", "against"),
    ("--margin", "margins"), ("--vary", "vary"), ("--repeats-per-cell", "repeats_per_cell"),
)


def _command_recipe(argv: tuple[str, ...], *, metrics: tuple[str, ...], scales: dict[str, float],
                    accepts: tuple[str, ...], timeout_s: float | None, name: str | None,
                    inputs: tuple[str, ...]) -> dict[str, Any]:
    """The ad-hoc recipe of ``run --command -- PROGRAM ...``."""
    from repro500.workloads.command.adhoc import recipe_data

    return recipe_data(list(argv), metrics=list(metrics), accept=list(accepts), name=name, timeout_s=timeout_s,
                       inputs=list(inputs) or None, scales=scales)


def _recipe_file(recipe: tuple[str, ...], ctx: click.Context) -> str | None:
    """The one RECIPE file given, if any; the options of --command are refused without it."""
    stray = [flag for flag, param in _COMMAND_ONLY if ctx.params[param]]
    if stray:
        raise UsageError(f"{', '.join(stray)} go{'es' if len(stray) == 1 else ''} with --command")
    if len(recipe) > 1:
        raise UsageError(f"give one RECIPE file, not {len(recipe)} arguments (to run a program, use --command -- PROGRAM ...)")
    return recipe[0] if recipe else None


def _sandboxed(ctx: click.Context, recipe_path: str | None, adhoc: bool, options: Any) -> None:
    """``--sandbox``: this run started again inside bubblewrap (repro500.runner.sandboxed), unless it
    is that run; exits with its status.  The options and recipe are checked here first."""
    from repro500.runner import check_run
    from repro500.runner import sandboxed as box

    p = ctx.params
    if box.inside():
        return
    given = ctx.get_parameter_source("sign_key") is click.core.ParameterSource.COMMANDLINE
    box.check(p["sandboxed"], p["network"], p["sandbox_ro"], given)
    check_run(options)
    if p["sign_key"] and not given:
        print("note: REPRO500_SIGNING_KEY is not passed into the sandbox: sign the run afterwards with "
              "repro500 sign RUN", file=sys.stderr)
    program = [p["recipe"][0]] if adhoc and p["recipe"] and "/" in p["recipe"][0] else []
    granted = box.grants(out_dir=p["out_dir"], resume=p["resume"], tracking=p["tracking"], artifacts=p["artifacts"],
                         reads=[recipe_path, p["params_file"], p["against"], *p["inputs"], *program],
                         network=p["network"], extra=p["sandbox_ro"])
    sys.exit(box.run_again_inside(granted))


def _refuse_with_resume(ctx: click.Context) -> None:
    """--resume reruns a run exactly as recorded: refuse the options it would ignore."""
    given = [flag for flag, param in _RECORDED_IN_THE_RUN if ctx.params[param]]
    if ctx.get_parameter_source("out_dir") is not click.core.ParameterSource.DEFAULT:
        given.append("--out")
    if given:
        raise UsageError(f"--resume reruns a run exactly as recorded (its recipe, seeds, determinism and "
                         f"MLflow parent); {', '.join(given)} do{'es' if len(given) == 1 else ''} not apply")
