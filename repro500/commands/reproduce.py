"""``repro500 reproduce``: a thin click command over repro500.publish.reproduce."""

from __future__ import annotations

from pathlib import Path

import click

from repro500.commands.options import parse_margins
from repro500.statuses import DEFAULT_ALPHA


@click.command()
@click.argument("source", metavar="SOURCE")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Working directory for the data, the rerun and verdict.json (default: reproductions/<run-id>).")
@click.option("--repeats", "-n", type=click.IntRange(min=1), default=None,
              help="Repeats of the rerun (default: the published number).")
@click.option("--rev", help="git SOURCE: branch, tag or commit to reproduce (default: HEAD).")
@click.option("--path", "subpath", metavar="DIR",
              help="The publication's directory inside SOURCE (needed when a repository holds several).")
@click.option("--alpha", type=click.FloatRange(0.0, 0.5, min_open=True, max_open=True), default=DEFAULT_ALPHA,
              show_default=True, help="Significance level of the verdict.")
@click.option("--margin", "margins", multiple=True, metavar="METRIC=DELTA", callback=parse_margins,
              help="Override a published equivalence margin (repeatable).")
@click.option("--data-root", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              envvar="REPRO500_DATA_ROOT", show_envvar=True,
              help="Where to look for data that cannot be regenerated (copied when its md5 matches); a publication's "
                   "dvc.yaml stage takes it from REPRO500_DATA_ROOT.")
@click.option("--tracking/--no-tracking", default=None,
              help="Log the rerun to MLflow (MLFLOW_TRACKING_URI, default OUT/mlflow.db); on by itself when the "
                   "publication reads a metric from MLflow.  [default: no-tracking]")
@click.option("--run-code", is_flag=True,
              help="Allow the code the publication chose to run: its own experiment (a wrapped command, a plug-in; "
                   "review OUT/source first) and, with --env venv, the build of its environment.")
@click.option("--allow-data-differences", is_flag=True,
              help="Rerun even when the data the command read differs here from the published digests (each is named).")
@click.option("--until-decided", is_flag=True,
              help="Rerun repeats one at a time until the equivalence test against the publication decides.")
@click.option("--max-repeats", type=click.IntRange(min=3),
              help="With --until-decided: at most this many repeats [default: as many as 80% power needs against "
                   "the publication's spread (repro500 plan), else 10].")
@click.option("--env", "env_mode", type=click.Choice(["current", "venv"]), default="current", show_default=True,
              help="current: rerun in this Python as it is; venv: rebuild the publication's locked environment "
                   "in OUT/env (uv if installed, else pip) and rerun in it; needs --run-code (its build runs code "
                   "the publication chose).")
@click.option("--find-links", multiple=True, metavar="DIR",
              help="With --env venv: a directory of wheels for a locked distribution no index serves (repeatable).")
@click.option("--index", "indexes", multiple=True, metavar="URL",
              help="With --env venv: also install from this package index (repeatable). Packages come from your "
                   "own indexes (PIP_INDEX_URL / UV_DEFAULT_INDEX, else PyPI); an index the publication's lock "
                   "names is asked only when given here.")
@click.option("--network", is_flag=True,
              help="With --run-code: give the sandboxed code the network (it has none by default).")
@click.option("--sandbox-ro", "sandbox_ro", multiple=True, metavar="PATH",
              type=click.Path(path_type=Path),
              help="With --run-code: also let the sandboxed code read PATH (read-only; repeatable).")
@click.option("--no-sandbox", is_flag=True,
              help="With --run-code: run the publication's code unconfined, with your user's rights (a second "
                   "consent, recorded in the rerun's manifest and said with the verdict).")
@click.option("--launcher", type=click.Choice(["local", "slurm"]),
              help="Run the rerun's repeats side by side, as repro500 run --launcher does.")
@click.option("--parallel", type=int, metavar="K", help="With --launcher: the rerun's repeats at once.")
@click.option("--slurm", "slurm", multiple=True, metavar="KEY=VALUE",
              help="With --launcher slurm: a task's resources, as repro500 run --slurm takes them.")
@click.option("--metrics", "metrics_path", metavar="FILE", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the verdict's numbers as flat JSON for `dvc metrics show/diff` (as verify --metrics).")
@click.option("--plots", "plots_dir", metavar="DIR", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also write the rerun's values for `dvc plots show` (as repro500 run --plots).")
@click.pass_context
def reproduce(ctx: click.Context, source: str, out: Path | None, repeats: int | None, rev: str | None,
              subpath: str | None, alpha: float, margins: dict[str, float], data_root: Path, tracking: bool | None,
              run_code: bool, allow_data_differences: bool, until_decided: bool, max_repeats: int | None,
              env_mode: str, find_links: tuple[str, ...], indexes: tuple[str, ...], network: bool,
              sandbox_ro: tuple[Path, ...], no_sandbox: bool, launcher: str | None, parallel: int | None,
              slurm: tuple[str, ...], metrics_path: Path | None, plots_dir: Path | None) -> None:
    """Rerun a published result from SOURCE and verify it against the publication.

    SOURCE is a publication directory (repro500 publish), a git URL or repository path
    holding one (cloned bare: no hooks, no LFS or other filters run), a packed run, or a
    run in the MLflow store (mlflow:RUN_ID or runs:/RUN_ID: the sealed run its parent holds).
    The data is regenerated from its recorded generator parameters (or copied, or pulled
    with DVC), the recipe rerun with the published seed and repeats, and the rerun verified
    against the published values; the verdict is printed with the provenance diff.

    With --run-code the publication's code runs in a sandbox (bubblewrap): it reads the
    system, its interpreter, the publication, OUT/source and the checked data; writes only
    OUT and a private /tmp; has an empty HOME, no network (--network) and a cleared
    environment (docs/trust.md).

    \b
    Exit codes: 0 REPRODUCED, 1 NOT REPRODUCED, 3 INCONCLUSIVE,
                2 usage error (also: the publication's code would run without
                --run-code, and --env venv builds run its code),
                4 invalid input: a tampered or incomplete publication, an unsafe archive,
                data that cannot be recreated, inputs that differ (without
                --allow-data-differences); with --env venv: the recorded Python
                minor version not found here, a locked distribution no index
                serves; with --run-code: bwrap missing or unable to sandbox here
                (install bubblewrap, or pass --no-sandbox); 130 interrupted.
    """
    from repro500.publish.reproduce import reproduce as run_reproduce
    from repro500.runner.plan import RunOptions, check_launcher

    check_launcher(RunOptions(launcher=launcher, parallel=parallel, until_decided=until_decided, slurm=slurm))  # before anything is written
    launch = [*(["--launcher", launcher] if launcher else []), *(["--parallel", str(parallel)] if parallel else []),
              *[arg for pair in slurm for arg in ("--slurm", pair)]]
    result = run_reproduce(source, out=out, repeats=repeats, rev=rev, subpath=subpath, alpha=alpha,
                           margins=margins or None, data_root=data_root, tracking=tracking, run_code=run_code,
                           allow_data_differences=allow_data_differences, until_decided=until_decided,
                           max_repeats=max_repeats, env_mode=env_mode, find_links=list(find_links),
                           indexes=list(indexes), no_sandbox=no_sandbox, network=network,
                           sandbox_ro=[str(p) for p in sandbox_ro], launch=launch)
    from repro500.rundir.dvcmetrics import write_metrics, write_plots

    if metrics_path is not None:
        write_metrics(result.verdict.to_dict(), metrics_path)
    if plots_dir is not None:
        write_plots(result.rerun, plots_dir)
    ctx.exit(result.exit_code)
