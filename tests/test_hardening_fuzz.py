"""No argument list makes ``repro500`` print a traceback.

Argument lists are drawn from each command's own options (read from click, so a new option is
fuzzed as soon as it exists), mixed with awkward values: missing, unreadable and wrong-kind
paths, a real run directory, out-of-range and non-numeric numbers.  Nothing here trains or
starts a server: ``run`` always names a recipe that does not exist and leaves out the options
that run a command, ``reproduce`` only gets sources that do not exist, ``ui`` only a store that
does not exist, ``model`` a seeded timing cache instead of timing collectives, ``data generate``
always a tiny ``--size``.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from helpers.rundirs import make_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repro500 import cli
from repro500.errors import (
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
)

PATHS = ["run", "missing", "missing.yaml", "/dev/null/x", "notes.txt", "out/x.html", "pub", "x.tar.gz",
         "run/repeats", ""]
VALUES = ["0", "1", "2", "-1", "0.5", "abc", "1e-3", "accuracy=0.1", "accuracy", "=", "a=b=c", "x.y=1",
          "{name: topk, ratio: 0.01}", "topk", "8,16", "1,x", "0/1", "2/1", "8x8", "4", "train", "gzip"]
EXCLUDED = {
    "run": {"--command", "--metric", "--accept", "--timeout", "--resume"},  # would start a command or a resume
    "ui": {"--backend-store-uri", "--host"},
    "model": {"--remeasure", "--measure-p", "--measure-max-bytes", "--measure-reps"},  # would time collectives
    "report": {"--open"},
    "reproduce": {"--tracking"},
    "io": {"--formats"},  # fixed below: an unknown format keeps it from writing and reading data
}
FIXED_FIRST = {  # positional values (and options) that keep a command away from real work
    "run": ["missing-recipe.yaml"],
    "reproduce": ["missing-publication"],
    "ops": ["--op", "nope"],  # repeatable: an unknown operator always stays among them
    "roofline": ["--dtype", "nope"],
    "io": ["--formats", "nope"],
}
EXIT_CODES = {EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INCONCLUSIVE, EXIT_INVALID, EXIT_INTERRUPTED}


def _commands() -> dict[str, click.Command]:
    """Every leaf command by its path (``data generate``), from the CLI itself."""
    out: dict[str, click.Command] = {}
    ctx = click.Context(cli.cli)
    for name in cli.cli.list_commands(ctx):
        command = cli.cli.get_command(ctx, name)
        if isinstance(command, click.Group):
            for sub in command.list_commands(ctx):
                out[f"{name} {sub}"] = command.get_command(ctx, sub)
        else:
            out[name] = command
    return out


COMMANDS = _commands()


NUMBERS = ["0", "1", "2", "-1", "0.5", "abc", "1e-3", "nan", "1e999"]


def _values(param: click.Parameter) -> list[str]:
    """Values worth trying for *param*: mostly of its type, always some that are not."""
    kind = param.type
    if isinstance(kind, click.Choice):
        return [*map(str, kind.choices), "nope"]
    if isinstance(kind, (click.types.IntParamType, click.types.FloatParamType)):
        return NUMBERS
    if isinstance(kind, click.Path):
        return PATHS
    return PATHS + VALUES


@st.composite
def argument_lists(draw: st.DrawFn) -> list[str]:
    path = draw(st.sampled_from(sorted(COMMANDS)))
    command = COMMANDS[path]
    name = path.split()[0]
    options = [p for p in command.params if isinstance(p, click.Option)
               and not set(p.opts) & EXCLUDED.get(name, set())]
    args = [*path.split(), *FIXED_FIRST.get(name, [])]
    if name not in FIXED_FIRST:
        for param in command.params:
            if isinstance(param, click.Argument) and draw(st.integers(0, 9)) > 0:
                count = 1 if param.nargs == 1 else draw(st.integers(0, 2))
                # the real run directory often, so that commands get past their first check
                pool = ["run"] * 4 + _values(param) if isinstance(param.type, click.Path) else _values(param)
                args += [draw(st.sampled_from(pool)) for _ in range(count)]
    for _ in range(draw(st.integers(0, 3))):
        if not options or draw(st.integers(0, 9)) == 0:
            args.append(draw(st.sampled_from(["--bogus", "--repets", "-z", "--json=1", "--", "-", *PATHS])))
            continue
        option = draw(st.sampled_from(options))
        args.append(draw(st.sampled_from(option.opts + option.secondary_opts)))
        if not option.is_flag and not option.count and draw(st.integers(0, 9)) > 0:
            args.append(draw(st.sampled_from(_values(option))))
    if path == "data generate":  # the default EWA size is gigabytes
        args += ["--size", draw(st.sampled_from(["8x8", "4", "abc"])), "--samples", draw(st.sampled_from(["1", "2"]))]
    return args


@pytest.fixture
def playground(tmp_path, monkeypatch, timings):  # noqa: F811
    make_run(tmp_path, "run")
    (tmp_path / "notes.txt").write_text("not a run\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'absent' / 'mlflow.db'}")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    return tmp_path


def test_the_fixed_values_keep_commands_away_from_real_work():
    assert "run" in COMMANDS and "reproduce" in COMMANDS and "data generate" in COMMANDS
    for name, excluded in EXCLUDED.items():
        known = {opt for p in COMMANDS[name].params for opt in getattr(p, "opts", [])}
        assert excluded <= known, f"{name}: {sorted(excluded - known)} no longer exist; update EXCLUDED"


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(args=argument_lists())
def test_no_argument_list_produces_a_traceback(playground, args):
    result = CliRunner().invoke(cli.cli, args, prog_name="repro500")
    shown = result.output + (result.stderr or "")
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"repro500 {' '.join(args)!r} raised {result.exception!r}")
    assert "Traceback" not in shown, f"repro500 {args}: {shown}"
    assert result.exit_code in EXIT_CODES, f"repro500 {args}: exit {result.exit_code}: {shown}"
    if result.exit_code == EXIT_USAGE:
        errors = [line for line in result.stderr.splitlines() if line.startswith("repro500: error: ")]
        assert len(errors) == 1 or "Usage: repro500" in shown, f"repro500 {args}: {shown}"
    assert os.getcwd() == str(playground) and Path("run/SHA256SUMS").is_file()
