"""The command line starts fast and turns library errors into one line and an exit code."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from repro500 import cli, errors
from repro500.rundir import sums as bundle


def test_help_lists_every_command_without_importing_them():
    out = subprocess.run(
        # printed at exit: main() leaves the process without the interpreter's teardown
        [sys.executable, "-c", "import atexit, sys; from repro500.cli import main; sys.argv=['repro500','--help']\n"
         "atexit.register(lambda: print('HEAVY', sorted(m for m in ('torch','mlflow','scipy') if m in sys.modules)))\n"
         "main()\n"],
        capture_output=True, text=True, check=True,
    ).stdout
    for name in cli.COMMANDS:
        assert name in out
    assert "HEAVY []" in out


def test_repro_error_becomes_one_line_and_its_exit_code(monkeypatch):
    import click

    @click.command()
    def boom() -> None:
        raise errors.InvalidInput("the bundle is truncated")

    monkeypatch.setitem(cli.COMMANDS, "boom", ("tests.test_cli_skeleton", "boom", "x"))
    monkeypatch.setattr(cli.LazyGroup, "get_command", lambda self, ctx, name: boom if name == "boom" else None)
    result = CliRunner().invoke(cli.cli, ["boom"])
    assert result.exit_code == errors.EXIT_INVALID
    assert result.output.strip() == "repro500: error: the bundle is truncated"


def test_sums_detect_edit_missing_and_extra(tmp_path):
    (tmp_path / "repeats" / "0").mkdir(parents=True)
    (tmp_path / "summary.json").write_text('{"a": 1}\n')
    (tmp_path / "repeats" / "0" / "summary.json").write_text('{"b": 2}\n')
    (tmp_path / "verdict.json").write_text("{}")  # derived: not covered
    bundle.write_sums(tmp_path)
    assert bundle.check_sums(tmp_path).ok
    (tmp_path / "summary.json").write_text('{"a": 2}\n')
    (tmp_path / "repeats" / "0" / "summary.json").unlink()
    (tmp_path / "new.txt").write_text("x")
    report = bundle.check_sums(tmp_path)
    assert report.modified == ["summary.json"]
    assert report.missing == ["repeats/0/summary.json"]
    assert report.extra == ["new.txt"]
