"""From the command line: every failure one sentence with its exit code, nothing half-written.

Each case runs the real ``repro500`` (a subprocess, where the exit code, the pipe or the
permissions are the point) and asserts the exit code, the one-line message, that no traceback
appears, and that nothing was left behind.  Permission cases run as a user without write access
would: unprivileged as such, as root with CAP_DAC_OVERRIDE dropped (setpriv).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.rundirs import craft_run, make_run

from repro500 import cli

SETPRIV = ["setpriv", "--bounding-set=-dac_override", "--inh-caps=-dac_override"]


def _needs_dropping_privileges() -> list[str]:
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot act as a user without write access")
    return SETPRIV


def repro500(*args: object, cwd: Path, unprivileged: bool = False, env: dict[str, str] | None = None,
             **kwargs) -> subprocess.CompletedProcess:
    prefix = _needs_dropping_privileges() if unprivileged else []
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="1", DVC_NO_ANALYTICS="1", **(env or {}))
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kwargs}
    return subprocess.run([*prefix, sys.executable, "-m", "repro500.cli", *map(str, args)], cwd=cwd, env=env,
                          text=True, timeout=180, **streams)


def one_line_error(result: subprocess.CompletedProcess | object, code: int) -> str:
    """The single ``repro500: error:`` line of a failed command (asserting exit code and no traceback)."""
    returncode = getattr(result, "returncode", getattr(result, "exit_code", None))
    stderr = getattr(result, "stderr", "")
    assert returncode == code, stderr
    assert "Traceback" not in stderr and "Usage:" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("repro500: error: "), stderr
    return lines[0]


def listing(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


@pytest.fixture
def read_only(tmp_path):
    """Make directories read-only for the test, and writable again afterwards (for tmp_path's clean-up)."""
    made: list[Path] = []

    def make(path: Path) -> Path:
        for p in [path, *path.rglob("*")]:
            if p.is_dir():
                p.chmod(0o555)
                made.append(p)
        return path

    yield make
    for p in made:
        p.chmod(0o755)


# ------------------------------------------------------------------------------ unwritable outputs

def test_report_into_dev_null_is_one_sentence(tmp_path):
    run = make_run(tmp_path, "run")
    before = listing(run)
    error = one_line_error(repro500("report", run, "--out", "/dev/null/r.html", cwd=tmp_path), 4)
    assert "/dev/null/r.html" in error and "/dev/null is not a directory" in error and "--out" in error
    assert listing(run) == before


@pytest.mark.slow
def test_report_of_a_read_only_run_says_where_to_write_instead(tmp_path, read_only):
    run = make_run(tmp_path, "run")
    before = listing(run)
    read_only(run)
    error = one_line_error(repro500("report", run, cwd=tmp_path, unprivileged=True), 4)
    assert "report.html" in error and "no write permission in" in error and "--out" in error
    assert listing(run) == before  # no report.html, no .partial left behind
    elsewhere = repro500("report", run, "--out", tmp_path / "r.html", cwd=tmp_path, unprivileged=True)
    assert elsewhere.returncode == 0 and (tmp_path / "r.html").is_file()


@pytest.mark.parametrize("target", ["/dev/null/pub", "locked/pub"])
def test_publish_to_an_unwritable_place_is_one_sentence(tmp_path, read_only, target):
    run = make_run(tmp_path, "run")
    (tmp_path / "locked").mkdir()
    read_only(tmp_path / "locked")
    error = one_line_error(repro500("publish", run, "--out", target, cwd=tmp_path, unprivileged=True), 4)
    assert f"cannot write the publication {target}:" in error
    assert ("is not a directory" if target.startswith("/dev/null") else "no write permission in locked") in error
    assert list((tmp_path / "locked").iterdir()) == []  # no staging directory left behind


@pytest.mark.slow
def test_model_write_on_a_read_only_run_is_one_sentence(tmp_path, timings, read_only):  # noqa: F811
    run = craft_run(tmp_path)
    before = listing(run)
    read_only(run)
    result = repro500("model", run, "--write", "--json", cwd=tmp_path, unprivileged=True)
    error = one_line_error(result, 4)
    assert "derived/scaling.json" in error and "no write permission in" in error and "without --write" in error
    assert listing(run) == before


def test_unwritable_outputs_nobody_worded_still_get_one_sentence(tmp_path):
    """The command line's fallback for a file-system failure no command put in words."""
    import click

    @click.command()
    def boom() -> None:
        open("/dev/null/x", "w")  # noqa: SIM115 - the failure is the point

    runner = CliRunner()
    original = cli.LazyGroup.get_command
    try:
        cli.LazyGroup.get_command = lambda self, ctx, name: boom if name == "boom" else original(self, ctx, name)
        result = runner.invoke(cli.cli, ["boom"])
    finally:
        cli.LazyGroup.get_command = original
    assert result.exit_code == 4
    assert result.output.strip() == "repro500: error: cannot use /dev/null/x: not a directory"


# ------------------------------------------------------------------------------ click's own errors

@pytest.mark.parametrize("args, expected", [
    (["run", "--repets", "3", "x.yaml"], ["No such option '--repets'", "--repeats", "repro500 run --help"]),
    (["run", "x.yaml", "--repeats", "abc"], ["'--repeats'", "'abc' is not a valid integer", "repro500 run --help"]),
    (["verify", "x", "--alpha", "2"], ["'--alpha'", "not in the range", "repro500 verify --help"]),
    (["report", "x", "--alpah", "0.1"], ["No such option '--alpah'", "--alpha"]),
    (["frobnicate"], ["No such command 'frobnicate'", "repro500 --help"]),
    (["--bogus"], ["No such option '--bogus'"]),
    (["verify"], ["Missing argument 'RUN'"]),
    (["data", "generate", "nope"], ["'nope' is not one of", "repro500 data generate --help"]),
    (["model", "--p", "1,x"], ["'--p'", "not a positive integer"]),
])
def test_click_errors_are_one_line_with_exit_2(tmp_path, args, expected):
    error = one_line_error(repro500(*args, cwd=tmp_path), 2)
    for text in expected:
        assert text in error


def test_help_without_arguments_is_still_the_help_page(tmp_path):
    result = repro500("data", cwd=tmp_path)
    assert "Usage: repro500 data" in result.stdout + result.stderr and "Traceback" not in result.stderr


def test_report_margin_without_against_is_a_usage_error(tmp_path):
    run = make_run(tmp_path, "run")
    error = one_line_error(repro500("report", run, "--margin", "accuracy=0.1", cwd=tmp_path), 2)
    assert "--against" in error
    assert not (run / "report.html").exists()


# ------------------------------------------------------------------------------ a reader that leaves

@pytest.mark.parametrize("values, code", [([0.93, 0.94, 0.935], 0), ([0.70, 0.71, 0.72], 1), ([0.95], 3)])
def test_verify_into_a_closed_pipe_exits_as_the_verdict(tmp_path, values, code):
    run = make_run(tmp_path, "run", values={"accuracy": values})
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first line: every write meets a closed pipe
    try:
        result = repro500("verify", run, cwd=tmp_path, stdout=write)
    finally:
        os.close(write)
    assert result.returncode == code, result.stderr
    assert result.stderr == ""


def test_verify_piped_into_head_keeps_the_verdicts_exit_code(tmp_path):
    run = make_run(tmp_path, "run", values={"accuracy": [0.70, 0.71, 0.72]})
    script = f'"{sys.executable}" -m repro500.cli verify "{run}" 2>err.txt | head -1; echo "rc=${{PIPESTATUS[0]}}"'
    result = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.stdout.splitlines()[-1] == "rc=1"
    assert (tmp_path / "err.txt").read_text() == ""



# ------------------------------------------------------------------------------ secrets by value

@pytest.mark.slow
def test_report_and_publication_never_show_a_secret_value(tmp_path):
    """A secret's value that reached the run (here: the recipe's name) is scrubbed from the pages
    and files repro500 writes from it, whatever key it sits under."""
    run = make_run(tmp_path, "run")  # its recipe is named "quickstart"
    env = {"WANDB_API_KEY": "quickstart"}
    report = repro500("report", run, "--out", tmp_path / "r.html", cwd=tmp_path, env=env)
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "r.html").read_text()
    assert "quickstart" not in page and "[REDACTED]" in page
    published = repro500("publish", run, "--out", tmp_path / "pub", cwd=tmp_path, env=env)
    assert published.returncode == 0, published.stderr
    for name in ("published.yaml", "recipe.yaml", "README.md", "params.yaml", "dvc.yaml"):
        assert "quickstart" not in (tmp_path / "pub" / name).read_text(), name
    assert "quickstart" not in published.stdout + published.stderr


PLANTED_BUG = """
import sys
from repro500 import cli

cli.COMMANDS["plan"] = ("planted_bug", "boom", "a command with a bug in it")
sys.argv = ["repro500", "plan"]
cli.main()
"""


def test_a_bug_in_a_command_exits_70_with_one_line_and_the_traceback_in_a_file(tmp_path):
    (tmp_path / "planted_bug.py").write_text(
        "import click\n\n@click.command()\ndef boom():\n"
        "    token = 'ghp_' + 'x' * 36\n"
        "    raise RuntimeError('the planted bug ' + token)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "REPRO500_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", PLANTED_BUG], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 70, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("repro500: error: internal error (a bug in repro500, please report it): RuntimeError: the planted bug")
    [written] = (tmp_path / "cache" / "crashes").iterdir()
    assert str(written) in line
    traceback = written.read_text()
    assert "Traceback" in traceback and "planted_bug.py" in traceback and "raise RuntimeError" in traceback
    assert "ghp_" + "x" * 36 not in traceback + line  # redacted in the line and in the file


def test_a_crashed_repeat_is_not_a_failed_verdict(tmp_path):
    (tmp_path / "crash.py").write_text("import sys\nsys.exit(3)\n")
    done = repro500("run", "--no-tracking", "--run-id", "c", "-n", "1", "--command", "--metric",
                    "acc=regex:acc ([0-9.]+)", "--accept", "acc>=0.5", "--", sys.executable, "crash.py", cwd=tmp_path)
    assert done.returncode == 5, done.stderr
    assert "repeat 0 failed" in done.stderr and "Traceback" not in done.stderr
