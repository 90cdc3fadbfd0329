"""``reproduce --env venv`` rebuilding real publishers' environments: an experiment installed as its own
editable package, and the built-in quickstart with torch and its ~200 pinned distributions.

Both install from PyPI (setuptools for the editable build, torch's CUDA wheels: ~6 GB in uv's cache,
linked into OUT/env), hence slow.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.runs import repro500
from helpers.venvs import path_with
from test_environment_lock import _env_differences, run_and_publish

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
HERE = path_with(Path(sys.executable).parent)  # this environment's uv, as `make` has it

PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "labpkg"
version = "0.4.0"
dependencies = ["numpy"]

[tool.setuptools.packages.find]
where = ["src"]
"""
SCORE = "import numpy as np\n\n\ndef accuracy(hits, total):\n    return float(np.float64(hits) / np.float64(total))\n"


def _verdict(rep: Path) -> dict:
    return json.loads((rep / "verdict.json").read_text())


def test_an_experiments_own_editable_package_is_rebuilt_from_the_publications_source(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    proj = tmp_path / "proj"
    (proj / "src" / "labpkg").mkdir(parents=True)
    (proj / "pyproject.toml").write_text(PYPROJECT)
    (proj / "src" / "labpkg" / "__init__.py").write_text("from labpkg.score import accuracy\n")
    (proj / "src" / "labpkg" / "score.py").write_text(SCORE)
    (proj / "s.py").write_text("import labpkg\nprint('acc', labpkg.accuracy(9, 10))\n")
    # as the experimenter does, from the project's directory (setuptools comes from the index for the build)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--disable-pip-version-check", "-e", "."], cwd=proj, check=True, timeout=600, capture_output=True)
    run_and_publish(proj, venv / "bin", tmp_path / "pub")
    shutil.rmtree(venv)  # the rebuild can borrow neither the publisher's venv nor their checkout
    (tmp_path / "gone").mkdir()
    shutil.move(proj, tmp_path / "gone" / "proj")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rep = tmp_path / "rep"
    done = repro500("reproduce", str(tmp_path / "pub"), "--run-code", "--env", "venv", "--out", str(rep),
                    cwd=elsewhere, env=HERE, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the experiment's own labpkg from source/" in done.stdout, done.stdout
    assert _verdict(rep)["status"] == "REPRODUCED"
    where = subprocess.run([str(rep / "env" / "bin" / "python"), "-c", "import labpkg; print(labpkg.__file__)"],
                           cwd=elsewhere, capture_output=True, text=True, timeout=60)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).resolve().is_relative_to(rep.resolve()), where.stdout
    # `_env_differences` reads the publisher's run where it was made
    shutil.move(tmp_path / "gone" / "proj", proj)
    assert _env_differences(tmp_path / "pub", rep) == []
    rerun = next((rep / "runs").iterdir())
    rebuilt = json.loads((rerun / "manifest.json").read_text())["facets"]["environment"]
    labpkg = next(d for d in rebuilt["distributions"] if d["name"] == "labpkg")
    assert labpkg["version"] == "0.4.0" and labpkg["source"]["editable"] is True


# torch and its CUDA libraries from PyPI, about 2 GB: make test-online (the install path itself, in
# the sandbox, is the editable package's test above, which CI runs)
@pytest.mark.online
def test_the_quickstart_is_rebuilt_with_torch_and_reproduced(tmp_path):
    proj = tmp_path / "proj"
    (proj / "experiments").mkdir(parents=True)
    shutil.copy(ROOT / "experiments" / "quickstart.yaml", proj / "experiments")
    # the Makefile's demo data, made as `make demo` makes it
    for split, samples in (("train", "2048"), ("eval", "512")):
        made = repro500("data", "generate", "classification", "--out", f"data/quickstart-{split}.h5", "--samples",
                        samples, "--seed", "500", "--noise", "0.04", *(["--split", "eval"] if split == "eval" else []),
                        cwd=proj, timeout=300)
        assert made.returncode == 0, made.stdout + made.stderr
    # two repeats: an exact replay is judged repeat by repeat, and the third added only CI minutes
    ran = repro500("run", "experiments/quickstart.yaml", "-n", "2", "--no-tracking", "--run-id", "orig", cwd=proj,
                   timeout=900)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    published = repro500("publish", "runs/orig", "--out", str(tmp_path / "pub"), cwd=proj, timeout=300)
    assert published.returncode == 0, published.stdout + published.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # OUT relative, as the default reproductions/RUN_ID is: the rerun runs in another directory
    done = repro500("reproduce", str(tmp_path / "pub"), "--run-code", "--env", "venv", "--out", "rep", cwd=elsewhere, env=HERE,
                    timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "with uv" in done.stdout and "+ repro500 " in done.stdout, done.stdout  # a built-in recipe runs inside it
    rep = elsewhere / "rep"
    verdict = _verdict(rep)
    assert verdict["status"] == "REPRODUCED" and verdict["environment"]["mode"] == "venv"
    assert _env_differences(tmp_path / "pub", rep) == []
    rerun = next((rep / "runs").iterdir())
    rebuilt = json.loads((rerun / "manifest.json").read_text())["facets"]["environment"]
    assert rebuilt["python"]["prefix"] == str((rep / "env").resolve())
    published = json.loads((proj / "runs" / "orig" / "manifest.json").read_text())["facets"]["environment"]
    versions = {d["name"]: d["version"] for d in published["distributions"]}
    assert "torch" in versions and "numpy" in versions
    # every distribution at the publisher's version: the pins, and repro500 itself from this checkout
    assert {d["name"]: d["version"] for d in rebuilt["distributions"]} == versions
