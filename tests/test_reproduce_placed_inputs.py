"""A reproduction puts the data where the rerun's command will look, or refuses before it runs.

The layout of many public examples: a script in a git repository reads ``../data/...`` beside
it (two files, and a directory it walks; one more file declared with ``--input``).  It is wrapped by ``run --command``, published, and
reproduced with ``--run-code`` from another directory, the publisher's data moved away and a copy
given as ``--data-root``: each input is placed at ``OUT/data/...`` (one plan line each), and the
rerun is REPRODUCED with no result-relevant difference.  Without the data the reproduction refuses
in one sentence naming the path the command will open, and no repeat runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.runs import repro500

PY = sys.executable
VENV = {"PATH": f"{Path(PY).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
SCRIPT = """
    import os
    values = [float(x) for x in open("../data/values.csv") if x.strip()]
    scale = float(open("../data/scale.txt").read())
    size = 0
    for folder, _, files in os.walk("../data/shards"):
        for name in sorted(files):
            size += len(open(os.path.join(folder, name), "rb").read())
    print(f"Acc {sum(values) / len(values) * scale + size / 1000:.4f}")
"""
INPUTS = ["../data/scale.txt", "../data/shards/0.bin", "../data/shards/1.bin", "../data/shards/2.bin",
          "../data/values.csv"]
DECLARED = "../data/notes.txt"  # declared with --input, never opened by Python (a C library's read, say)


def _published(root: Path) -> Path:
    """The author's repository and data beside it, run and published; the publication's path."""
    repo, data = root / "author" / "repo", root / "author" / "data"
    repo.mkdir(parents=True)
    (repo / "main.py").write_text(textwrap.dedent(SCRIPT))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "main.py"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=repo, check=True)
    (data / "shards").mkdir(parents=True)
    (data / "values.csv").write_text("5\n6\n7\n")
    (data / "scale.txt").write_text("0.1")
    (data / "notes.txt").write_text("how the shards were cut")
    for i in range(3):
        (data / "shards" / f"{i}.bin").write_bytes(bytes([i]) * (i + 1))
    ran = repro500("run", "--command", "--metric", "accuracy=regex:Acc ([0-9.]+)", "--accept", "accuracy>=0.5±0.1",
                   "-n", "2", "--no-tracking", "--run-id", "orig", "--input", DECLARED, "--", PY, "main.py",
                   cwd=repo, env=VENV)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    observed = json.loads((repo / "runs" / "orig" / "inputs.json").read_text())["observed"]
    assert sorted(e["opened"] for e in observed) == INPUTS
    published = repro500("publish", str(repo / "runs" / "orig"), "--out", str(root / "pub"), cwd=root)
    assert published.returncode == 0, published.stdout + published.stderr
    return root / "pub"


@pytest.mark.slow
def test_a_reproduction_elsewhere_places_the_data_where_the_command_looks_or_refuses_first(tmp_path):
    pub = _published(tmp_path)
    # the reproducer's copy, and nothing at the publisher's paths any more
    shutil.copytree(tmp_path / "author" / "data", tmp_path / "copy" / "data")
    shutil.move(tmp_path / "author" / "data", tmp_path / "author" / "gone")
    fresh = tmp_path / "reproducer"
    fresh.mkdir()

    refused = repro500("reproduce", str(pub), "--run-code", "--out", "nodata", cwd=fresh, env=VENV)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    error = " ".join(refused.stderr.split())
    assert "the command will open ../data/scale.txt at nodata/data/scale.txt, which lacks the recorded data" in error
    assert "and 5 more" in error and "--data-root" in error and "Traceback" not in refused.stderr
    assert not (fresh / "nodata" / "runs").exists() and not (fresh / "nodata" / "data").exists()

    done = repro500("reproduce", str(pub), "--run-code", "--data-root", str(tmp_path / "copy"), "--out", "again",
                    cwd=fresh, env=VENV)
    assert done.returncode == 0, done.stdout + done.stderr
    plan = " ".join(done.stdout.split())
    for opened in [*INPUTS, DECLARED]:
        place = opened.replace("..", "again", 1)
        assert f"{opened}: read at {place} (linked from {tmp_path / 'copy' / opened[3:]}," in plan, plan
    assert "6 input(s) the command will read match the published digests" in plan
    verdict = json.loads((fresh / "again" / "verdict.json").read_text())
    assert verdict["status"] == "REPRODUCED", verdict
    assert verdict["provenance"]["result_relevant"] == 0, verdict["provenance"]
    assert (fresh / "again" / "data" / "values.csv").read_text() == "5\n6\n7\n"


def _recipe(path: Path, workdir: str, data: str = "../data/scale.txt") -> None:
    path.write_text(textwrap.dedent(f"""\
        name: sub
        fixed:
          workload: command
          command: [{json.dumps(PY)}, train.py]
          workdir: {workdir}
          inputs: [{data}]
        acceptance:
          accuracy: {{target: 0.5, direction: higher, tolerance: 0.1}}
        metrics:
          accuracy: {{regex: "Acc ([0-9.]+)"}}
        repeats: 2
        """))


@pytest.mark.slow
def test_a_recipe_whose_command_runs_in_a_subdirectory_reproduces_from_there(tmp_path):
    """A recipe at the repository's root runs its command in ``sub`` (fixed.workdir), which reads
    ``../data``: the rerun runs in ``OUT/source/sub``, its data at ``OUT/source/data``."""
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    (repo / "data").mkdir()
    (repo / "data" / "scale.txt").write_text("0.75")
    (repo / "sub" / "train.py").write_text("print(f\"Acc {float(open('../data/scale.txt').read()):.4f}\")\n")
    _recipe(repo / "exp.yaml", "sub")
    ran = repro500("run", "exp.yaml", "--no-tracking", "--run-id", "orig", cwd=repo, env=VENV)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    published = repro500("publish", "runs/orig", "--out", str(tmp_path / "pub"), cwd=repo, env=VENV)
    assert published.returncode == 0, published.stdout + published.stderr

    done = repro500("reproduce", str(tmp_path / "pub"), "--run-code", "--data-root", str(repo), "--out", "out",
                    cwd=tmp_path, env=VENV)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "../data/scale.txt: read at out/source/data/scale.txt" in " ".join(done.stdout.split())
    assert (tmp_path / "out" / "source" / "sub" / "train.py").is_file()
    verdict = json.loads((tmp_path / "out" / "verdict.json").read_text())
    assert verdict["status"] == "REPRODUCED" and verdict["provenance"]["result_relevant"] == 0, verdict


def test_a_recipe_whose_command_runs_outside_its_experiment_is_refused_before_anything_runs(tmp_path):
    repo = tmp_path / "repo"
    (repo / "exp").mkdir(parents=True)
    (repo / "data").mkdir()
    (repo / "data" / "scale.txt").write_text("0.75")
    (repo / "train.py").write_text("print(f\"Acc {float(open('data/scale.txt').read()):.4f}\")\n")
    _recipe(repo / "exp" / "exp.yaml", "..", data="data/scale.txt")  # run from exp/: the command runs in repo/
    ran = repro500("run", "exp.yaml", "--no-tracking", "--run-id", "orig", cwd=repo / "exp", env=VENV)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert repro500("publish", "runs/orig", "--out", str(tmp_path / "pub"), cwd=repo / "exp", env=VENV).returncode == 0

    refused = repro500("reproduce", str(tmp_path / "pub"), "--run-code", "--out", "out", cwd=tmp_path, env=VENV)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())
    assert "runs its command in fixed.workdir .., outside the directory its source was kept from" in said, said
    assert "Traceback" not in refused.stderr and not (tmp_path / "out" / "runs").exists()
