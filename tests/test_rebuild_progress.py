"""``reproduce --env venv`` says on stderr what its rebuild is doing as it happens — a line a step,
the installer's own lines relayed short, "still installing" while it is quiet — and stdout stays
the answer.  The real install runs offline: a tiny wheel from a --find-links folder, no index."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from helpers.runs import repro500
from helpers.venvs import path_with, venv_with
from rich.console import Console
from test_environment_lock import PROBE, PROBE_VERSION, build_wheel, run_and_publish

from repro500.publish import rebuild
from repro500.publish.rebuild import watch

PROBE_WHEEL = f"{PROBE.replace('-', '_')}-{PROBE_VERSION}-py3-none-any.whl"


@pytest.fixture(scope="module")
def probe_publication(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a publication of a command run by a venv holding the probe wheel, the folder of that wheel)."""

    root = tmp_path_factory.mktemp("publisher")
    wheels = root / "wheels"
    wheels.mkdir()
    build_wheel(wheels)
    venv = root / "venv"
    venv_with(venv, wheels, f"{PROBE}=={PROBE_VERSION}")
    proj = root / "proj"
    proj.mkdir()
    (proj / "s.py").write_text("import repro500_probe_pkg as p\nprint('acc', 0.9 if p.VALUE else 0)\n")
    return run_and_publish(proj, venv / "bin", root / "pub"), wheels


def _in_order(lines: list[str], expected: list[str]) -> list[str]:
    """The lines of *expected* (prefixes) that do not come in that order in *lines*."""
    at, missing = 0, []
    for prefix in expected:
        found = next((i for i in range(at, len(lines)) if lines[i].startswith(prefix)), None)
        if found is None:
            missing.append(prefix)
        else:
            at = found + 1
    return missing


# the installer's own lines that say the probe was taken up and installed, as each prints them
RELAYED = {"pip": (f"  pip: Processing {PROBE_WHEEL}", f"  pip: Successfully installed {PROBE}-{PROBE_VERSION}"),
           "uv": ("  uv: Resolved 1 package", "  uv: Installed 1 package")}


@pytest.mark.parametrize("installer", ["pip", "uv"])
@pytest.mark.slow
def test_the_rebuild_says_each_step_on_stderr_as_it_happens(tmp_path, probe_publication, installer):
    if installer == "uv" and rebuild.uv_binary() is None:
        pytest.skip("no uv here (the test extra installs it)")
    publication, wheels = probe_publication
    out = tmp_path / "rep"
    env = {rebuild.INSTALLER_ENV: installer, "PIP_NO_INDEX": "1", "UV_NO_INDEX": "1", "PIP_FIND_LINKS": ""}
    done = repro500("reproduce", str(publication), "--run-code", "--env", "venv", "--find-links", str(wheels),
                    "--out", str(out), cwd=tmp_path, env={**env, **path_with(Path(sys.executable).parent)},
                    timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    taken_up, installed = RELAYED[installer]
    expected = ["environment: creating the venv with ", "environment: created the venv in ",
                f"environment: checking that the indexes serve all 1 pinned distributions ({installer} --dry-run)",
                "environment: every pin is served in ",
                f"environment: installing 1 distributions with {installer} from no index (1 from --find-links)",
                taken_up, installed, "environment: installed 1 distributions in ",
                f"environment: {out / 'env'} rebuilt in "]
    assert _in_order(lines, expected) == [], done.stderr
    # not a terminal: a line a step, none redrawn, nothing but plain text
    assert "\r" not in done.stderr and "\x1b" not in done.stderr
    assert "Looking in links" not in done.stderr  # the installer's chatter is not relayed
    # stdout stays the answer: the plan line and the verdict, none of the steps
    assert "environment: rebuilding in" in done.stdout and "REPRODUCED" in done.stdout, done.stdout
    assert not any(step.strip() in done.stdout for step in expected[:3] + [taken_up, installed]), done.stdout
    assert (out / "env" / rebuild.MARKER).is_file()


def test_the_installers_lines_are_shown_short_and_never_drive_the_terminal():
    assert watch.relayed("Looking in links: /opt/wheels") is None
    assert watch.relayed(" + six==1.16.0") is None  # uv's list of every package: its totals say it
    assert watch.relayed("Collecting six==1.16.0 (from -r /tmp/x/requirements.repro500.txt (line 1))") \
        == "Collecting six==1.16.0"
    assert watch.relayed("Processing /home/me/wheels/six-1.16.0-py2.py3-none-any.whl") \
        == "Processing six-1.16.0-py2.py3-none-any.whl"
    assert watch.relayed("  Downloading https://me:hunter22@mirror.example/six.whl (11 kB)") \
        == "Downloading https://[REDACTED]@mirror.example/six.whl (11 kB)"
    long = watch.relayed("Installing collected packages: " + ", ".join(f"pkg{i}" for i in range(100)))
    assert long is not None and len(long) == watch.RELAYED_WIDTH and long.endswith("...")
    # a package name chosen to retitle the window and hide the rest of the line
    hostile = "print('Successfully installed evil\\x1b]0;owned\\x07\\u202e-1')"
    stream = io.StringIO()
    ran = watch.Watch(console=Console(file=stream, width=200)).run(
        [sys.executable, "-c", hostile], doing="installing", done="installed", waiting="installing", tool="pip")
    shown = stream.getvalue()
    assert ran.returncode == 0 and "  pip: Successfully installed evil\\x1b]0;owned\\x07\\u202e-1\n" in shown, shown
    assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown


def test_a_quiet_installer_is_said_to_go_on_and_a_failed_one_is_named():
    stream = io.StringIO()
    quiet = "import sys, time; print('Collecting a==1', flush=True); time.sleep(1.5); sys.exit(3)"
    ran = watch.Watch(console=Console(file=stream, width=200), quiet_s=0.4).run(
        [sys.executable, "-c", quiet], doing="installing 2 distributions", done="installed 2 distributions",
        waiting="installing", tool="pip", total=2)
    lines = stream.getvalue().splitlines()
    assert ran.returncode == 3 and ran.stdout == "Collecting a==1\n"  # kept whole for the error sentence
    assert lines[:2] == ["environment: installing 2 distributions", "  pip: Collecting a==1"], lines
    assert any(line.startswith("  still installing: ") and line.endswith(", 1 of 2 distributions taken up")
               for line in lines[2:-1]), lines
    assert lines[-1].startswith("environment: installing: pip failed after "), lines
