"""Someone else's experiment, run as it is, comes back out of a publication intact.

Three shapes real repositories have, each reading a small data file outside its directory and
each run exactly as its author runs it: a script importing a module beside it, a ``src/`` package
run with ``python -m`` and ``PYTHONPATH=src``, and a shell script that calls Python.  Each goes
run -> publish -> reproduce --run-code in a fresh directory; then its data changes, and the
reproduction refuses (one sentence naming the input) until --allow-data-differences, whose verdict
names the difference.  Also here: two runs of an unchanged directory have one source digest
while MLflow's store grows beside them, and a script keeps its MLflow habits under repro500.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.runs import repro500

PY = sys.executable
VENV = {"PATH": f"{Path(PY).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
METRIC = ["--metric", "accuracy=regex:Acc ([0-9.]+)", "--accept", "accuracy>=0.5±0.1"]
MEAN = "def mean(path):\n    xs = [float(x) for x in open(path) if x.strip()]\n    return sum(xs) / len(xs)\n"
TRAIN = textwrap.dedent("""
    import os, random, sys
    {imports}
    random.seed(int(os.environ["REPRO500_SEED"]))
    print(f"Acc {{mean(sys.argv[1]) / 10 + random.random() / 100:.4f}}")
""")


def sibling_module(proj: Path, data: Path) -> list[str]:
    (proj / "helpers.py").write_text(MEAN)
    (proj / "train.py").write_text(TRAIN.format(imports="from helpers import mean"))
    return [PY, "train.py", str(data)]


def src_package(proj: Path, data: Path) -> list[str]:
    pkg = proj / "src" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "stats.py").write_text(MEAN)
    (pkg / "train.py").write_text(TRAIN.format(imports="from pkg.stats import mean"))
    return [PY, "-m", "pkg.train", str(data)]


def shell_script(proj: Path, data: Path) -> list[str]:
    (proj / "helpers.py").write_text(MEAN)
    (proj / "train.py").write_text(TRAIN.format(imports="from helpers import mean"))
    (proj / "run.sh").write_text(f'#!/bin/sh\nset -e\nexec "{PY}" train.py "$1"\n')
    (proj / "run.sh").chmod(0o755)
    return ["./run.sh", str(data)]


@pytest.mark.slow
@pytest.mark.parametrize("shape", [sibling_module, src_package, shell_script], ids=lambda f: f.__name__)
def test_an_experiment_as_it_is_runs_publishes_and_reproduces_in_a_fresh_directory(tmp_path, shape):
    proj, data = tmp_path / "author" / "exp", tmp_path / "shared-data" / "values.csv"
    proj.mkdir(parents=True)
    data.parent.mkdir()
    data.write_text("6\n7\n8\n")
    argv = shape(proj, data)
    env = {**VENV, "PYTHONPATH": "src"} if shape is src_package else VENV
    ran = repro500("run", "--command", *METRIC, "-n", "3", "--no-tracking", "--run-id", "orig", "--", *argv,
                   cwd=proj, env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run = proj / "runs" / "orig"
    observed = json.loads((run / "inputs.json").read_text())
    assert [e["path"] for e in observed["observed"]] == [str(data)] and observed["observed"][0]["repeats"] == [0, 1, 2]
    published = repro500("publish", str(run), "--out", str(tmp_path / "pub"), cwd=tmp_path)
    assert published.returncode == 0, published.stderr

    fresh = tmp_path / "reproducer"
    fresh.mkdir()
    # the reproducer's shell has no PYTHONPATH=src: the recorded entry is re-rooted into OUT/source
    done = repro500("reproduce", str(tmp_path / "pub"), "--run-code", "--out", "again", cwd=fresh, env=VENV)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 input(s) the command will read match the published digests" in done.stdout
    assert f"{data}: read at {data} (at its recorded path, md5" in " ".join(done.stdout.split())
    verdict = json.loads((fresh / "again" / "verdict.json").read_text())
    assert verdict["status"] == "REPRODUCED" and verdict["provenance"]["result_relevant"] == 0, verdict["provenance"]

    data.write_text("6\n7\n9\n")
    refused = repro500("reproduce", str(tmp_path / "pub"), "--run-code", "--out", "changed", cwd=fresh, env=VENV)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    error = " ".join(refused.stderr.split())
    assert f"the command will open {data} at {data}, which holds other bytes than the recorded data" in error
    assert "--allow-data-differences" in error
    assert "Traceback" not in refused.stderr and not (fresh / "changed" / "runs").exists()
    allowed = repro500("reproduce", str(tmp_path / "pub"), "--run-code", "--allow-data-differences", "--out", "changed",
                       cwd=fresh, env=VENV)
    assert allowed.returncode in (0, 1, 3), allowed.stdout + allowed.stderr
    rows = json.loads((fresh / "changed" / "verdict.json").read_text())["provenance"]["top"]
    assert any(r["facet"] == "data" and r["key"] == f"observed.{data}.md5" and r["impact"] >= 90 for r in rows), rows


@pytest.mark.slow
def test_two_runs_of_an_unchanged_directory_share_a_source_digest_beside_their_mlflow_store(tmp_path):
    proj, data = tmp_path / "exp", tmp_path / "values.csv"
    proj.mkdir()
    data.write_text("6\n7\n8\n")
    argv = sibling_module(proj, data)

    def tree(run_id: str) -> tuple[str, list[str]]:
        done = repro500("run", "--command", *METRIC, "-n", "2", "--run-id", run_id, "--", *argv, cwd=proj,
                        env={**VENV, "MLFLOW_TRACKING_URI": "sqlite:///mlflow.db"})  # a relative store, in the experiment
        assert done.returncode in (0, 3), done.stdout + done.stderr
        kept = json.loads((proj / "runs" / run_id / "source.json").read_text())
        return kept["tree_sha256"], sorted(f["path"] for f in kept["files"])

    first, files = tree("one")
    assert (proj / "mlflow.db").is_file() and files == ["helpers.py", "train.py"]
    second, _ = tree("two")
    assert second == first  # the store changed in between; the experiment did not
    (proj / "helpers.py").write_text(MEAN + "\n")
    assert tree("three")[0] != first


HABITS = textwrap.dedent("""
    import os, sys
    import mlflow
    from sklearn.linear_model import LogisticRegression

    rows = [[float(v) for v in line.split(",")] for line in open(sys.argv[1]) if line.strip()]
    X, y = [r[:2] for r in rows], [int(r[2]) for r in rows]
    seed = int(os.environ["REPRO500_SEED"])
    mlflow.autolog(silent=True, log_models=False, log_datasets=False)

    def at_start(run):  # the tags the run had as it started: before repro500 could add any after it
        tags = mlflow.get_run(run.info.run_id).data.tags
        mlflow.log_params({"parent_at_start": tags.get("mlflow.parentRunId", "-"),
                           "repeat_run_at_start": tags.get("repro500.repeat_run_id", "-")})

    with mlflow.start_run(run_name="prepare") as run:  # in repro500's own experiment: nested under the repeat
        at_start(run)
        mlflow.log_metric("rows", len(rows))
    mlflow.set_experiment("lab-notebook")
    with mlflow.start_run(run_name="fit") as run:
        at_start(run)
        mlflow.log_metric("loss", 0.5, step=0)
        mlflow.log_metric("loss", 0.2, step=1)
    LogisticRegression(random_state=seed, max_iter=200).fit(X, y)  # autologging starts a run of its own
    with mlflow.start_run(run_name="eval") as run:
        at_start(run)
        mlflow.log_metric("accuracy", 0.9 + seed % 7 / 1000)
""")


@pytest.mark.slow
def test_a_script_keeps_its_mlflow_habits_under_repro500_run(tmp_path):
    from mlflow.tracking import MlflowClient

    proj, data = tmp_path / "exp", tmp_path / "data" / "points.csv"
    proj.mkdir()
    data.parent.mkdir()
    data.write_text("".join(f"{i % 7},{i % 5},{int(i % 7 > 3)}\n" for i in range(60)))
    (proj / "train.py").write_text(HABITS)
    store = f"sqlite:///{tmp_path / 'store.db'}"
    done = repro500("run", "--command", "--metric", "accuracy=mlflow", "--metric", "loss=mlflow",
                    "--metric", "rows=mlflow", "--metric", "train_acc=mlflow:training_accuracy_score",
                    "--accept", "accuracy>=0.85", "-n", "2", "--run-id", "habits", "--", PY, "train.py", str(data),
                    cwd=proj, env={**VENV, "MLFLOW_TRACKING_URI": store})
    assert done.returncode == 0, done.stdout + done.stderr
    client = MlflowClient(store)
    meta = json.loads((proj / "runs/habits/run.json").read_text())["mlflow"]
    repeat_runs = meta["repeat_run_ids"]
    lab = client.get_experiment_by_name("lab-notebook")
    runs = client.search_runs([lab.experiment_id])
    autologged = [r for r in runs if r.data.tags.get("estimator_name") == "LogisticRegression"]
    assert len(runs) == 6 and len(autologged) == 2
    assert sorted((r.info.run_name, r.data.tags["repro500.repeat"]) for r in runs if r not in autologged) == [
        ("eval", "0"), ("eval", "1"), ("fit", "0"), ("fit", "1")]
    for r in runs:  # found from the repeat, the way back from the script's own experiment, no parent there
        k = r.data.tags["repro500.repeat"]
        assert r.data.tags["repro500.run_id"] == "habits" and r.data.tags["repro500.script"] == "true"
        assert r.data.tags["repro500.repeat_run_id"] == repeat_runs[k] and "mlflow.parentRunId" not in r.data.tags
        if r not in autologged:  # tagged as it started, by the run-context provider
            assert r.data.params == {"parent_at_start": "-", "repeat_run_at_start": repeat_runs[k]}
    for k in ("0", "1"):  # autologging's own metric of the fit, read from its run
        summary = json.loads((proj / f"runs/habits/repeats/{k}/summary.json").read_text())
        fit = next(r for r in autologged if r.data.tags["repro500.repeat"] == k)
        assert summary["metrics"]["train_acc"] == fit.data.metrics["training_accuracy_score"]
        assert summary["metrics"]["loss"] == 0.2 and summary["metrics"]["rows"] == 60
        assert set(summary["metric_sources"].values()) == {"mlflow"}
    # in repro500's own experiment: nested under the repeat's run from the start
    ours = client.search_runs([meta["experiment_id"]], "tags.`repro500.script` = 'true'")
    assert sorted(r.data.tags["repro500.repeat"] for r in ours) == ["0", "1"]
    for r in ours:
        parent = repeat_runs[r.data.tags["repro500.repeat"]]
        assert r.data.tags["mlflow.parentRunId"] == parent and r.data.params["parent_at_start"] == parent
    assert client.get_run(meta["parent_run_id"]).data.tags["repro500.verdict"] == "PASS"
    # what it read: its data; never repro500's provider, sklearn's or MLflow's code (an editable install too)
    observed = json.loads((proj / "runs/habits/inputs.json").read_text())
    assert [e["path"] for e in observed["observed"]] == [str(data)] and observed["skipped"] == [], observed


@pytest.mark.slow
@pytest.mark.parametrize("where, module, said", [
    ("beside the script", "raise ImportError('an old copy of repro500')\n", "an old copy of repro500"),
    ("on fixed.env's PYTHONPATH", "RepeatRunContext = None\ndel RepeatRunContext\n",
     "module 'repro500.tracking.context' has no attribute 'RepeatRunContext'"),
], ids=["beside-the-script", "pythonpath"])
def test_a_run_context_provider_mlflow_does_not_load_is_refused_before_anything_is_written(tmp_path, where, module,
                                                                                           said):
    import subprocess

    proj = tmp_path / "exp"
    proj.mkdir()
    (proj / "train.py").write_text("import mlflow\nwith mlflow.start_run():\n    mlflow.log_metric('loss', 0.1)\n")
    shadow = proj if where == "beside the script" else tmp_path / "vendor"
    (shadow / "repro500" / "tracking").mkdir(parents=True)  # a package of the user's own that shadows repro500
    (shadow / "repro500" / "__init__.py").write_text("")
    (shadow / "repro500" / "tracking" / "__init__.py").write_text("")
    (shadow / "repro500" / "tracking" / "context.py").write_text(module)
    fixed = {"command": [PY, "train.py"], **({"env": {"PYTHONPATH": str(shadow)}} if shadow != proj else {})}
    (tmp_path / "exp.yaml").write_text(json.dumps({
        "schema": "repro500/recipe/v1", "name": "shadowed", "repeats": 2, "seed": 1, "fixed": fixed,
        "metrics": {"loss": "mlflow"}, "acceptance": {"loss": {"target": 1, "direction": "lower", "tolerance": 0}}}))
    store = tmp_path / "store.db"
    # the console script, as a user runs it (python -m repro500.cli here would import the shadow itself)
    done = subprocess.run([str(Path(PY).parent / "repro500"), "run", str(tmp_path / "exp.yaml")], cwd=proj,
                          env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store}"}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 4, done.stdout + done.stderr
    line = " ".join(done.stderr.split())
    assert done.stderr.startswith("repro500: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "need repro500's MLflow run-context provider, but MLflow in the command's Python" in line
    assert said in line and f"there, repro500 is {shadow / 'repro500' / '__init__.py'}" in line
    assert not (proj / "runs").exists() and not store.exists()  # nothing written, not even the store


@pytest.mark.slow
def test_data_kept_inside_a_repository_is_asked_for_and_taken_from_data_root(tmp_path):
    import shutil
    import subprocess

    proj = tmp_path / "author" / "exp"
    (proj / "data").mkdir(parents=True)
    (proj / "data" / "values.csv").write_text("6\n7\n8\n")
    argv = sibling_module(proj, Path("data/values.csv"))
    (proj / ".gitignore").write_text("data/\nruns/\n")  # as `dvc add data` leaves it
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=proj, check=True, capture_output=True)
    ran = repro500("run", "--command", *METRIC, "-n", "3", "--no-tracking", "--run-id", "orig", "--", *argv,
                   cwd=proj, env=VENV)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert repro500("publish", str(proj / "runs" / "orig"), "--out", str(tmp_path / "pub"), cwd=tmp_path).returncode == 0
    fresh = tmp_path / "reproducer"
    fresh.mkdir()
    copy = tmp_path / "my-copy"  # and nothing at the publisher's path, where it would be found
    shutil.move(proj / "data", copy / "data")
    missing = repro500("reproduce", str(tmp_path / "pub"), "--run-code", "--out", "again", cwd=fresh, env=VENV)
    assert missing.returncode == 4, missing.stdout + missing.stderr
    assert ("the command will open data/values.csv at again/source/data/values.csv, which lacks the recorded data"
            in " ".join(missing.stderr.split())) and not (fresh / "again" / "runs").exists()
    done = repro500("reproduce", str(tmp_path / "pub"), "--run-code", "--out", "again", "--data-root", str(copy),
                    cwd=fresh, env=VENV)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (f"data/values.csv: read at again/source/data/values.csv (linked from {copy / 'data' / 'values.csv'}"
            in " ".join(done.stdout.split()))
    assert json.loads((fresh / "again" / "verdict.json").read_text())["status"] == "REPRODUCED"
