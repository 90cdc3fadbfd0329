"""The environment recorded is the one that ran the experiment, and every run writes a lock of it."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers.runs import repro500

from repro500.capture import lock

PROBE = "repro500-probe-pkg"  # a distribution repro500's own environment does not have
PROBE_VERSION = "0.3.1"
METRIC = ("--metric", "acc=regex:acc ([0-9.]+)", "--accept", "acc>=0.5")


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(out: Path, name: str = PROBE, version: str = PROBE_VERSION) -> Path:
    """A real, installable pure-Python wheel (PEP 427), built without network or build tools."""
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"VALUE = {version!r}\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "\n".join([*(_record_line(n, d) for n, d in files.items()), f"{info}/RECORD,,"]) + "\n"
    path = out / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for n, d in {**files, f"{info}/RECORD": record.encode()}.items():
            archive.writestr(n, d)
    return path


@pytest.fixture(scope="module")
def other_venv(tmp_path_factory) -> Path:
    """A venv that is not repro500's, holding the probe package (installed by pip, for real)."""
    root = tmp_path_factory.mktemp("other")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    build_wheel(root)
    # by name from a wheel directory, as from an index (a wheel file given by path is an archive install)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-index", "--find-links", str(root), f"{PROBE}=={PROBE_VERSION}"],
                   check=True, timeout=300, capture_output=True)
    return venv


def test_a_command_run_by_another_venv_records_that_venv_and_locks_it(tmp_path, other_venv):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "s.py").write_text("import repro500_probe_pkg as p\nprint('acc', 0.9 if p.VALUE else 0)\n")
    python = str(other_venv / "bin" / "python")
    ran = repro500("run", "--command", *METRIC, "-n", "1", "--no-tracking", "--run-id", "r", "--", python, "s.py",
                   cwd=proj, timeout=240)
    assert ran.returncode in (0, 3), ran.stdout + ran.stderr  # 3: one repeat bounds nothing
    run = proj / "runs" / "r"
    env = json.loads((run / "manifest.json").read_text())["facets"]["environment"]
    names = {d["name"]: d["version"] for d in env["distributions"]}
    assert env["python"]["executable"] == python
    assert env["python"]["prefix"] == str(other_venv)
    assert names.get(PROBE) == PROBE_VERSION
    assert "mlflow" not in names and "repro500" not in names  # repro500's own environment is not the experiment's
    assert env["tool"]["python"]["executable"] == sys.executable
    assert env["recorded_from"] == "the command's Python processes"
    interpreters = json.loads((run / "repeats" / "0" / "interpreters.json").read_text())["interpreters"]
    assert [i["executable"] for i in interpreters] == [python]

    locked = json.loads((run / "environment.lock.json").read_text())
    assert locked["applies"] is True
    assert locked["python"]["version"] == env["python"]["version"]
    assert {"name": PROBE, "version": PROBE_VERSION, "kind": "index",
            "requirement": f"{PROBE}=={PROBE_VERSION}"} in locked["distributions"]
    assert f"{PROBE}=={PROBE_VERSION}\n" in (run / "requirements.lock.txt").read_text()
    sealed = (run / "SHA256SUMS").read_text()
    assert "environment.lock.json" in sealed and "requirements.lock.txt" in sealed


def test_a_command_that_is_not_python_records_its_program_and_no_lock(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    script = proj / "s.sh"
    script.write_text("#!/bin/sh\necho acc 0.9\n")
    script.chmod(0o755)
    ran = repro500("run", "--command", *METRIC, "-n", "1", "--no-tracking", "--run-id", "r", "--", "./s.sh",
                   cwd=proj, timeout=240)
    assert ran.returncode in (0, 3), ran.stdout + ran.stderr  # 3: one repeat bounds nothing
    run = proj / "runs" / "r"
    env = json.loads((run / "manifest.json").read_text())["facets"]["environment"]
    assert env["python"] is None and env["distributions"] == []
    assert env["program"]["path"] == str(script) and env["program"]["shebang"] == "/bin/sh"
    assert env["program"]["sha256"] == hashlib.sha256(script.read_bytes()).hexdigest()
    locked = json.loads((run / "environment.lock.json").read_text())
    assert locked["applies"] is False and "no lock applies" in locked["why"]


def test_pins_say_where_each_distribution_came_from(tmp_path):
    root = tmp_path / "exp"
    (root / "pkg").mkdir(parents=True)
    dists = [
        {"name": "numpy", "version": "2.1.0"},
        {"name": "torch", "version": "2.14.1+cpu"},
        {"name": "torchvision", "version": "0.29.1+cu130"},
        {"name": "weird", "version": "1.0+local7"},
        {"name": "vcsdep", "version": "0.1", "source": {"kind": "vcs", "vcs": "git", "url": "https://github.com/o/r",
                                                      "commit": "a" * 40}},
        {"name": "mine", "version": "0.1", "source": {"kind": "local", "editable": True,
                                                    "url": (root / "pkg").as_uri()}},
        {"name": "elsewhere", "version": "0.2", "source": {"kind": "local", "editable": False,
                                                         "url": "file:///opt/elsewhere"}},
        {"name": "secret", "version": "1", "source": {"kind": "archive", "url": "https://[REDACTED]@h/s.whl"}},
        {"name": "repro500", "version": "0.9"},
    ]
    manifest = {"digest": {"value": "d"}, "facets": {"environment": {
        "python": {"version": "3.11.7", "implementation": "CPython"},
        "os": {"system": "Linux", "machine": "x86_64", "libc": "glibc 2.36"}, "distributions": dists}}}
    doc = lock.build(manifest, source_root=str(root), environ={"PIP_INDEX_URL": "https://u:pw@mirror/simple"})
    by = {p["name"]: p for p in doc["distributions"]}
    assert by["numpy"]["requirement"] == "numpy==2.1.0"
    assert by["torch"]["index"] == "https://download.pytorch.org/whl/cpu"
    assert by["torchvision"]["index"] == "https://download.pytorch.org/whl/cu130"
    assert by["weird"]["requirement"] is None and "+local7" in by["weird"]["why"]
    assert by["vcsdep"]["requirement"] == f"vcsdep @ git+https://github.com/o/r@{'a' * 40}"
    assert by["mine"]["experiment"] is True and by["mine"]["source_path"] == "pkg"
    assert "not part of the run" in by["elsewhere"]["why"]
    assert "credentials" in by["secret"]["why"]
    assert by["repro500"]["kind"] == "tool"
    assert {u["name"] for u in doc["unpinnable"]} == {"weird", "elsewhere", "secret"}
    assert "pw" not in json.dumps(doc)
    text = lock.requirements(doc)
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in text
    assert "--index-url" not in text  # a redacted index is no index: the installer's default applies
    assert "\nnumpy==2.1.0\n" in text and "# not pinned: elsewhere" in text
