"""``repro500 locate``: the first step and the first operator where two runs part, and why.

Thin: what it does is repro500.locate.locate's, how the answer reads repro500.locate.render's; this
parses the options and prints (progress on stderr, a line a step; the answer on stdout).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from repro500.locate import render
from repro500.untrusted import record_console


@click.command()
@click.argument("a", metavar="A", type=click.Path(path_type=Path))
@click.argument("b", metavar="[B]", type=click.Path(path_type=Path), required=False)
@click.option("--repeat", "repeat", type=click.IntRange(0), default=None,
              help="A's repeat (default: the first that shares a seed with one of B's).")
@click.option("--other-repeat", "other_repeat", type=click.IntRange(0), default=None,
              help="B's repeat (default: the one sharing A's repeat's seed, the same index first).")
@click.option("--steps", type=click.IntRange(1), default=None,
              help="Replay this many steps (default: up to the first step the records part at).")
@click.option("--rtol", type=click.FloatRange(0.0, 1.0, min_open=True), default=None,
              help="Relative tolerance for the first step whose difference is beyond rounding (default 1e-3).")
@click.option("--python-a", metavar="PYTHON", default=None,
              help="The interpreter A's replay runs in (default: the venv reproduce --env venv built for A, else "
                   "this one).")
@click.option("--python-b", metavar="PYTHON", default=None, help="The interpreter B's replay runs in.")
@click.option("--run-code", is_flag=True,
              help="Let the own experiment code (a plug-in model or data set) of a packed run or a publication "
                   "run in its replay; without it, such a run is refused.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1.0), default=600.0, show_default=True,
              help="Seconds one replay may take.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@click.option("--network", is_flag=True,
              help="With --run-code: give the sandboxed replays the network (they have none by default).")
@click.option("--sandbox-ro", "sandbox_ro", multiple=True, metavar="PATH", type=click.Path(path_type=Path),
              help="With --run-code: also let the sandboxed replays read PATH (read-only; repeatable).")
@click.option("--no-sandbox", is_flag=True,
              help="With --run-code: replay the runs' own code unconfined, with your user's rights (a second "
                   "consent, said in the answer).")
@click.pass_context
def locate(ctx: click.Context, a: Path, b: Path | None, repeat: int | None, other_repeat: int | None,
           steps: int | None, rtol: float | None, python_a: str | None, python_b: str | None, run_code: bool,
           timeout_s: float, as_json: bool, network: bool, sandbox_ro: tuple[Path, ...], no_sandbox: bool) -> None:
    """Say where runs A and B part: the first step, the first operator, and the likely cause.

    A and B are run directories, packed runs or publications (a rerun and its publication);
    with A alone, two of its repeats that share a seed (repro500 run --same-seed). The
    per-step records give the first step where the pair's loss (or any other per-step
    quantity) is not bitwise equal. Both repeats are then replayed from their recorded seeds
    up to that step, each in its own process with its run's recorded thread and kernel
    settings (OMP_*, MKL_*, DNNL_*, ...) and, for a reproduction made with reproduce --env venv,
    in the venv it was built in, under a mode that hashes every operator's output;
    the answer is the first operator whose inputs agree and whose output does not: its name,
    the module it ran in, forward/backward/optimizer, the step, and the largest absolute and
    relative difference. Nothing is claimed past it. The replays run the runs' training
    code: the own code (plug-ins) of a packed run or a publication only with --run-code,
    and then in a sandbox (bubblewrap; docs/trust.md) unless --no-sandbox.

    \b
    Exit codes: 0 located (or the runs do not part), 2 usage error (also: a packed
                run's or publication's own code would run without --run-code),
                3 the replays do not part where the records do (not reproduced here),
                4 invalid input (missing, corrupt or tampered runs, no shared seed; with
                --run-code: bwrap missing or unable to sandbox here).
    """
    from repro500.locate import locate as locating

    found = locating(a, b, repeat=repeat, other_repeat=other_repeat, steps=steps, rtol=rtol, python_a=python_a,
                     python_b=python_b, run_code=run_code, timeout_s=timeout_s, progress=_progress,
                     no_sandbox=no_sandbox, network=network, sandbox_ro=[str(p) for p in sandbox_ro])
    if as_json:
        click.echo(json.dumps(found.answer, indent=2, sort_keys=True, allow_nan=False, default=str))
    else:
        render.show(found.answer, found.plan, record_console())
    if found.exit_code:
        ctx.exit(found.exit_code)


def _progress(text: str) -> None:
    """A step as it happens, on stderr: stdout stays the answer."""
    from repro500.untrusted import SENTENCE_CHARS, plain

    click.echo(f"repro500 locate: {plain(text, SENTENCE_CHARS)}", err=True)
