"""The ``repro500`` command line.

Thin by design: each sub-command lives in ``repro500/commands/<name>.py``, parses its
arguments and calls library functions.  Sub-commands are imported only when invoked, so
``repro500 --help`` never pays for torch, mlflow or scipy (it must start in < 0.3 s).
"""

from __future__ import annotations

import importlib
import sys

import click

from repro500 import __version__

# name -> (module, attribute, one-line help shown by ``repro500 --help``)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "capture": ("repro500.commands.capture", "capture", "Snapshot code, environment, seeds, data and hardware into a manifest."),
    "diff": ("repro500.commands.capture", "diff", "Compare two manifests or run directories, most result-relevant first."),
    "data": ("repro500.commands.data", "data", "Generate synthetic scientific datasets and check dataset files."),
    "run": ("repro500.commands.run", "run", "Run a benchmark recipe several times with full provenance."),
    "verify": ("repro500.commands.verify", "verify", "Decide statistically whether a run holds or reproduces a reference."),
    "pack": ("repro500.commands.verify", "pack", "Pack a run directory into one archive that verifies anywhere."),
    "unpack": ("repro500.commands.verify", "unpack", "Unpack a packed run safely into a directory."),
    "report": ("repro500.commands.report", "report", "Write a self-contained HTML report of a run."),
    "publish": ("repro500.commands.publish", "publish", "Write a self-contained publication of a run for others to reproduce."),
    "reproduce": ("repro500.commands.publish", "reproduce", "Rerun a published result and verify it against the publication."),
    "model": ("repro500.commands.model", "model", "Predict step time and scaling efficiency with a fitted alpha-beta model."),
    "ui": ("repro500.commands.ui", "ui", "Start the MLflow UI on the configured tracking store."),
}


class LazyGroup(click.Group):
    """A click group that imports a sub-command's module only when it is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module_name, attr, _ = COMMANDS[cmd_name]
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, _, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):  # noqa: ANN201 - click's signature
        # Library errors become one line and their documented exit code (errors.py).
        from repro500.errors import EXIT_INTERRUPTED, ReproError

        try:
            return super().invoke(ctx)
        except ReproError as err:
            click.echo(f"repro500: error: {err}", err=True)
            ctx.exit(err.exit_code)
        except KeyboardInterrupt:
            click.echo("repro500: interrupted; finished work is kept on disk.", err=True)
            ctx.exit(EXIT_INTERRUPTED)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(__version__, prog_name="repro500")
def cli() -> None:
    """repro500: deep-learning benchmark results you can check.

    \b
    Typical flow:
      repro500 run experiments/quickstart.yaml      # capture + repeats + MLflow
      repro500 verify runs/<run-id>                  # statistical verdict
      repro500 report runs/<run-id>                  # report.html

    Exit codes: 0 pass/reproduced, 1 fail/not reproduced, 2 usage error,
    3 inconclusive, 4 invalid input (missing, corrupt, tampered).
    """


def main() -> None:
    cli(prog_name="repro500")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
