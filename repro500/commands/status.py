"""``repro500 status``: where a run stands, repeat by repeat; it reads and never writes."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("run_dir", metavar="RUN", type=click.Path(path_type=Path))
def status(run_dir: Path) -> None:
    """Say where RUN stands: each repeat finished, failed or killed, or, for a run whose head left
    its repeats to SLURM (run --detach), queued, running on a node, or ended with its result not
    yet collected; and the command that completes the run.  Nothing is collected or written.

    \b
    Exit codes: 0 said; 4 RUN is not a run directory (no run.json) or its records cannot be read.
    """
    from repro500.errors import InvalidInput
    from repro500.rundir import layout
    from repro500.runner.fanout import arrays, detached_jobs, standing
    from repro500.statuses import RUN_COMPLETED, RUN_SUBMITTED
    from repro500.untrusted import count, plain

    run = layout.RunDir(run_dir)
    if not run.is_run():
        raise InvalidInput(f"{run_dir} is not a repro500 run directory (no run.json)")
    meta = run.meta()
    planned = count(meta.get("repeats"), f"{run.file(layout.RUN_JSON)}'s planned repeats", least=1)
    state = meta.get("status")
    left = detached_jobs(meta.get("launcher") or {})
    said = f"run {plain(meta.get('run_id'))} ({run_dir}): {plain(state)}"
    if left:
        said += f"; {len(left[1])} repeat(s) are SLURM's (job array {', '.join(arrays(left[1].values()))}), not yet collected"
    click.echo(said)
    for k, where in standing(run, meta, planned):
        click.echo(f"  repeat {k}: {plain(where)}")
    if state == RUN_COMPLETED and not left:
        click.echo(f"verify it with: repro500 verify {run_dir}")
    else:
        what = "collect them and conclude the run" if left or state == RUN_SUBMITTED else "complete the run"
        click.echo(f"{what} with: repro500 run --resume {run_dir}")
