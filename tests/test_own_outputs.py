"""repro500's own outputs never enter an experiment's source, wherever they lie and whatever they
are called (repro500.capture.outputs): a run written with ``--out results``, a
publication in ``pub/``, a reproduction in ``again/``, a packed run, an MLflow store called
``lab.sqlite`` and the artifact directory its experiment names are recognised by what they hold,
while a user's own SQLite database or a folder of theirs called ``results`` stays source."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.runs import repro500

from repro500.capture import source

PY = sys.executable
VENV = {"PATH": f"{Path(PY).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
METRIC = ["--metric", "accuracy=regex:Acc ([0-9.]+)", "--accept", "accuracy>=0.5±0.1"]
HELPERS = "def mean(path):\n    xs = [float(x) for x in open(path) if x.strip()]\n    return sum(xs) / len(xs)\n"
# The script logs an artifact with MLflow into an experiment whose artifact location it chooses
# (``blobs/`` beside it), the way a notebook habit would.
TRAIN = textwrap.dedent("""
    import os, random, sys
    from helpers import mean
    random.seed(int(os.environ["REPRO500_SEED"]))
    if os.environ.get("LOG_ARTIFACT"):
        import mlflow
        found = mlflow.get_experiment_by_name("blobs")
        eid = found.experiment_id if found else mlflow.create_experiment("blobs", artifact_location=os.path.abspath("blobs"))
        with mlflow.start_run(experiment_id=eid):
            mlflow.log_text("a note", "note.txt")
    print(f"Acc {mean(sys.argv[1]) / 10 + random.random() / 100:.4f}")
""")


def _files(run: Path) -> tuple[str, list[str]]:
    kept = json.loads((run / "source.json").read_text())
    return kept["tree_sha256"], sorted(f["path"] for f in kept["files"])


@pytest.mark.slow
def test_outputs_named_anything_stay_out_of_the_source_and_its_digest(tmp_path):
    proj, data = tmp_path / "exp", tmp_path / "values.csv"
    proj.mkdir()
    data.write_text("6\n7\n8\n")
    (proj / "helpers.py").write_text(HELPERS)
    (proj / "train.py").write_text(TRAIN)
    argv = ["--", PY, "train.py", str(data)]

    # a run into a results/ directory, logging to a store called lab.sqlite with artifacts in blobs/
    lab = {**VENV, "MLFLOW_TRACKING_URI": "sqlite:///lab.sqlite", "LOG_ARTIFACT": "1"}
    first = repro500("run", "--command", *METRIC, "-n", "2", "--out", "results", "--run-id", "r1", *argv,
                     cwd=proj, env=lab)
    assert first.returncode == 0, first.stdout + first.stderr
    tree, files = _files(proj / "results" / "r1")
    assert files == ["helpers.py", "train.py"]
    published = repro500("publish", "results/r1", "--out", "pub", cwd=proj)
    assert published.returncode == 0, published.stdout + published.stderr
    again = repro500("reproduce", "pub", "--run-code", "--out", "again", cwd=proj, env=VENV)
    assert again.returncode == 0, again.stdout + again.stderr
    packed = repro500("pack", "results/r1", "-o", "r1-copy.tar.gz", cwd=proj)
    assert packed.returncode == 0, packed.stderr
    present = {p.name for p in proj.iterdir()}
    assert {"results", "pub", "again", "lab.sqlite", "blobs", "r1-copy.tar.gz"} <= present, present
    assert list((proj / "blobs").glob("*/artifacts/note.txt"))  # MLflow wrote the artifact there

    # a later run into the default runs/ and another store: none of the above is its source
    other = {**VENV, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'elsewhere.db'}"}
    later = repro500("run", "--command", *METRIC, "-n", "2", "--run-id", "r2", *argv, cwd=proj, env=other)
    assert later.returncode == 0, later.stdout + later.stderr
    assert _files(proj / "runs" / "r2") == (tree, files)
    # and a run with no git, no tracking, its files found by walking: the same
    untracked = repro500("run", "--command", *METRIC, "-n", "2", "--no-tracking", "--run-id", "r3", *argv,
                         cwd=proj, env=VENV)
    assert untracked.returncode == 0, untracked.stdout + untracked.stderr
    assert _files(proj / "runs" / "r3") == (tree, files)

    (proj / "helpers.py").write_text(HELPERS + " ")  # one byte
    edited = repro500("run", "--command", *METRIC, "-n", "2", "--no-tracking", "--run-id", "r4", *argv,
                      cwd=proj, env=VENV)
    assert edited.returncode == 0, edited.stdout + edited.stderr
    changed, same_files = _files(proj / "runs" / "r4")
    assert changed != tree and same_files == files


def test_a_users_own_sqlite_database_and_folder_called_results_stay_source(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    db = tmp_path / "measurements.db"
    with sqlite3.connect(db) as conn:  # a user's data in SQLite: not MLflow's tables
        conn.execute("CREATE TABLE runs (id INTEGER, value REAL)")
        conn.executemany("INSERT INTO runs VALUES (?, ?)", [(i, i / 3) for i in range(2000)])
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "table.csv").write_text("a,b\n1,2\n")
    (tmp_path / "runs.json").write_text(json.dumps({"schema": "mine/v1"}))
    assert db.stat().st_size > 4096
    assert source.candidates(tmp_path) == ["measurements.db", "results/table.csv", "runs.json", "train.py"]


def test_a_run_directory_is_recognised_by_its_run_json_inside_a_git_work_tree(tmp_path):
    import subprocess

    (tmp_path / "train.py").write_text("print('hi')\n")
    done = repro500("run", "--command", *METRIC, "-n", "1", "--no-tracking", "--out", "outputs", "--run-id", "x",
                    "--", PY, "-c", "print('Acc 0.9')", cwd=tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)  # outputs/ is untracked, not ignored
    assert source.candidates(tmp_path) == ["train.py"]


@pytest.mark.slow
def test_mlflows_store_and_artifacts_in_the_work_tree_are_not_the_experiments_untracked_state(tmp_path):
    import json
    import subprocess

    from repro500.capture.code import describe_repo

    (tmp_path / "train.py").write_text("print('Acc 0.9')\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e.org"}
    subprocess.run(["git", "add", "train.py"], cwd=tmp_path, check=True)
    subprocess.run(["git", "commit", "-qm", "x"], cwd=tmp_path, check=True, env={**os.environ, **env})
    # the default store, mlflow.db, and its artifacts beside it in mlartifacts/, both untracked
    done = repro500("run", "--command", *METRIC, "-n", "1", "--run-id", "first", "--", PY, "train.py", cwd=tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    assert (tmp_path / "mlflow.db").is_file() and any((tmp_path / "mlartifacts").rglob("*"))
    facet, _ = describe_repo(tmp_path)
    assert facet["untracked"] == [], facet["untracked"]
    # and the next run records no untracked state either
    done = repro500("run", "--command", *METRIC, "-n", "1", "--run-id", "second", "--", PY, "train.py", cwd=tmp_path)
    manifest = json.loads((tmp_path / "runs" / "second" / "manifest.json").read_text())
    assert manifest["facets"]["code"]["untracked"] == []
