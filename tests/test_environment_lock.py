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
from helpers.stores import mlflow_store
from helpers.venvs import path_with, venv_with

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
    build_wheel(root)
    venv_with(venv, root, f"{PROBE}=={PROBE_VERSION}")
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


# ----- reproduce --env venv ----------------------------------------------------------------------
OLD_NUMPY = "2.2.6"  # older than repro500's own: the publisher's environment differs in a numerical library
NUMPY_SCRIPT = "import numpy as np\nprint('acc', float(np.float64(0.5) + np.float64(0.4)))\n"


@pytest.fixture(scope="module")
def numpy_publication(tmp_path_factory) -> Path:
    """A publication of a numpy-only command run by `python` from a venv with an older numpy on PATH."""
    root = tmp_path_factory.mktemp("publisher")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--disable-pip-version-check", f"numpy=={OLD_NUMPY}"], check=True, timeout=600, capture_output=True)
    proj = root / "proj"
    proj.mkdir()
    (proj / "s.py").write_text(NUMPY_SCRIPT)
    return run_and_publish(proj, venv / "bin", root / "pub")


def run_and_publish(proj: Path, bin_dir: Path, out: Path) -> Path:
    """``python s.py`` in *proj* run by the ``python`` of *bin_dir* (first on PATH, as an activated venv
    puts it), three repeats as run ``orig``, published to *out*."""
    ran = repro500("run", "--command", "--metric", "acc=regex:acc ([0-9.]+)", "--accept", "acc>=0.5±0.05", "-n", "3",
                   "--no-tracking", "--run-id", "orig", "--", "python", "s.py",
                   cwd=proj, env=path_with(bin_dir), timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    published = repro500("publish", "runs/orig", "--out", str(out), cwd=proj, timeout=300)
    assert published.returncode == 0, published.stdout + published.stderr
    return out


def _env_differences(publication: Path, reproduction: Path) -> list[str]:
    """The result-relevant environment differences of the rerun against the publisher's run."""
    from repro500.verify.diff import diff_manifests, is_result_relevant

    theirs = json.loads((publication.parent / "proj" / "runs" / "orig" / "manifest.json").read_text())
    rerun = next((reproduction / "runs").iterdir())
    mine = json.loads((rerun / "manifest.json").read_text())
    return [f"{d.facet}.{d.key}" for d in diff_manifests(theirs, mine) if d.facet == "environment" and is_result_relevant(d)]


@pytest.mark.slow
def test_reproduce_env_venv_rebuilds_the_publishers_numpy(tmp_path, numpy_publication):
    done = repro500("reproduce", str(numpy_publication), "--run-code", "--env", "venv", "--out", str(tmp_path / "rep"),
                    cwd=tmp_path, env=path_with(Path(sys.executable).parent), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "environment: rebuilding in" in done.stdout and "with pip" in done.stdout or "with uv" in done.stdout
    # publish asked PyPI for numpy's files: the rebuild installs only bytes the index served then
    assert (numpy_publication / "environment.hashes.json").is_file()
    assert "every file checked against the hashes recorded at publication" in done.stdout, done.stdout
    verdict = json.loads((tmp_path / "rep" / "verdict.json").read_text())
    assert verdict["environment"]["mode"] == "venv"
    assert verdict["provenance"]["available"] is True
    assert _env_differences(numpy_publication, tmp_path / "rep") == []
    rerun = next((tmp_path / "rep" / "runs").iterdir())
    env = json.loads((rerun / "manifest.json").read_text())["facets"]["environment"]
    assert {d["name"]: d["version"] for d in env["distributions"]}["numpy"] == OLD_NUMPY
    assert env["python"]["prefix"] == str((tmp_path / "rep" / "env").resolve())

    again = repro500("reproduce", str(numpy_publication), "--run-code", "--env", "venv", "--out", str(tmp_path / "rep"),
                     cwd=tmp_path, env=path_with(Path(sys.executable).parent), timeout=900)
    assert again.returncode == 0 and "reusing it" in again.stdout, again.stdout + again.stderr
    # a rebuild stopped before its end (no completion marker) is redone, never taken as finished
    (tmp_path / "rep" / "env" / ".repro500-built").unlink()
    third = repro500("reproduce", str(numpy_publication), "--run-code", "--env", "venv", "--out", str(tmp_path / "rep"),
                     cwd=tmp_path, env=path_with(Path(sys.executable).parent), timeout=900)
    assert third.returncode == 0 and "rebuilding in" in third.stdout, third.stdout + third.stderr


def test_reproduce_env_current_names_numpy(tmp_path, numpy_publication):
    done = repro500("reproduce", str(numpy_publication), "--run-code", "--out", str(tmp_path / "rep"),
                    cwd=tmp_path, env=path_with(Path(sys.executable).parent), timeout=600)
    assert done.returncode in (0, 1, 3), done.stdout + done.stderr
    verdict = json.loads((tmp_path / "rep" / "verdict.json").read_text())
    assert verdict["environment"]["mode"] == "current"
    assert "environment.distributions.numpy.version" in _env_differences(numpy_publication, tmp_path / "rep")


@pytest.mark.slow
def test_a_pin_no_index_serves_is_one_sentence_before_anything_is_installed(tmp_path, other_venv):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "s.py").write_text("import repro500_probe_pkg as p\nprint('acc', 0.9 if p.VALUE else 0)\n")
    ran = repro500("run", "--command", "--metric", "acc=regex:acc ([0-9.]+)", "--accept", "acc>=0.5±0.05", "-n", "3",
                   "--no-tracking", "--run-id", "orig", "--", "python", "s.py", cwd=proj,
                   env=path_with(other_venv / "bin"), timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert repro500("publish", "runs/orig", "--out", "pub", cwd=proj).returncode == 0
    out = tmp_path / "rep"
    refused = repro500("reproduce", "pub", "--run-code", "--env", "venv", "--out", str(out), cwd=proj, timeout=600)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    # the steps the rebuild took, a line each as they happened, then the refusal in one sentence
    *steps, message = refused.stderr.strip().splitlines()
    assert steps[-1].startswith("environment: checking that the indexes serve every pin: "), refused.stderr
    assert all(line.startswith(("environment: ", "  ")) for line in steps), refused.stderr
    assert PROBE in message and "--env current" in message and "--find-links DIR" in message
    assert "Traceback" not in refused.stderr
    assert not (out / "env").exists()  # nothing half-built left behind
    # the way on: the wheel from a directory
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels)
    done = repro500("reproduce", "pub", "--run-code", "--env", "venv", "--find-links", str(wheels), "--out", str(out),
                    cwd=proj, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_recorded_python_minor_version_must_be_here():
    from repro500.errors import InvalidInput
    from repro500.publish import rebuild

    with pytest.raises(InvalidInput) as err:
        rebuild.find_python("3.99.1")
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert "needs Python 3.99 (3.99.1)" in str(err.value) and f"has Python {here}" in str(err.value)
    assert err.value.exit_code == 4


def test_env_usage_errors(tmp_path):
    done = repro500("reproduce", "nowhere", "--find-links", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2 and "--find-links" in done.stderr and "--env venv" in done.stderr


@pytest.mark.slow
def test_reproduce_a_run_by_its_mlflow_id(tmp_path):
    """A teammate's run seen in the MLflow UI, rerun by its id from a SQLite store (and by a repeat's runs:/ id)."""
    import mlflow

    store = tmp_path / "store"
    store.mkdir()
    uri = mlflow_store(store / "mlflow.db")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "s.py").write_text(NUMPY_SCRIPT)
    ran = repro500("run", "--command", "--metric", "acc=regex:acc ([0-9.]+)", "--accept", "acc>=0.5±0.05", "-n", "3",
                   "--tracking", "--run-id", "orig", "--", sys.executable, "s.py", cwd=proj,
                   env={"MLFLOW_TRACKING_URI": uri}, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    parent = next(r for r in runs if "repro500.repeat" not in r.data.tags)
    repeat = next(r for r in runs if "repro500.repeat" in r.data.tags)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for n, ref in enumerate((f"mlflow:{parent.info.run_id}", f"runs:/{repeat.info.run_id}")):
        done = repro500("reproduce", ref, "--run-code", "--out", str(tmp_path / f"rep{n}"), cwd=elsewhere,
                        env={"MLFLOW_TRACKING_URI": uri}, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "fetching the sealed run of" in done.stdout
        verdict = json.loads((tmp_path / f"rep{n}" / "verdict.json").read_text())
        assert verdict["status"] == "REPRODUCED"


def test_a_repeats_distributions_are_read_again_only_where_they_changed(tmp_path, monkeypatch):
    from repro500.capture import env as env_facet
    from repro500.capture import interpreters

    site, hooks = tmp_path / "site-packages", tmp_path / "hooks"
    hooks.mkdir()
    info = site / "probe-1.0.dist-info"
    info.mkdir(parents=True)

    def metadata(version: str) -> None:
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: probe\nVersion: {version}\n\nA description.\n")

    def recorded() -> list[dict]:
        (hooks / "python-1.txt").write_text(f"executable\t{sys.executable}\npath\t{site}\ndist\t{info}\nend\t\n")
        return interpreters.read_hook_records(hooks)[0]["distributions"]

    reads = []
    real = env_facet.name_version
    monkeypatch.setattr(env_facet, "name_version", lambda dist: reads.append(dist) or real(dist))
    metadata("1.0")
    assert recorded() == [{"name": "probe", "version": "1.0"}] and len(reads) == 1
    assert recorded() == [{"name": "probe", "version": "1.0"}] and len(reads) == 1  # nothing changed: not read
    metadata("2.0.1")  # rewritten in place
    assert recorded() == [{"name": "probe", "version": "2.0.1"}] and len(reads) == 2
    (info / "direct_url.json").write_text(json.dumps({"url": "file:///src/probe", "dir_info": {"editable": True}}))
    assert recorded()[0]["source"] == {"kind": "local", "url": "file:///src/probe", "editable": True}


def test_the_runs_own_environment_and_a_commands_interpreter_share_one_reader(tmp_path, monkeypatch):
    # the run reads its own environment beside the first repeat; a command run by the same Python
    # then costs the repeat a few stats, not its distributions' metadata again
    from repro500.capture import env as env_facet
    from repro500.capture import interpreters

    own = env_facet.distributions()
    reads = []
    real = env_facet.name_version
    monkeypatch.setattr(env_facet, "name_version", lambda dist: reads.append(dist) or real(dist))
    dists = env_facet.distribution_paths(sys.path)
    (tmp_path / "python-1.txt").write_text(
        f"executable\t{sys.executable}\n" + "".join(f"dist\t{d}\n" for d in dists) + "end\t\n")
    assert interpreters.read_hook_records(tmp_path)[0]["distributions"] == own
    assert reads == []
