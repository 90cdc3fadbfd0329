"""repro500 init: a user's repository becomes a DVC pipeline that runs their experiment through
repro500, checked by DVC itself (dvc repro, dvc exp run -S, dvc metrics show) and by MLflow
itself (the runs DVC started are in the store)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.runs import repro500, tool_env

from repro500.workloads.command.init import MLFLOW_IGNORES, input_dep

BIN = Path(sys.executable).parent
# the script logs its accuracy to the repeat's MLflow run, as README's example reads it (accuracy=mlflow)
MLFLOW_SCRIPT = """import os, sys
import mlflow
lr = float(sys.argv[sys.argv.index("--lr") + 1])
seed = int(os.environ["REPRO500_SEED"])
with mlflow.start_run():
    mlflow.log_metric("accuracy", 90 + lr + seed % 3 / 100)
"""
SCRIPT = """import os, sys
lr = float(sys.argv[sys.argv.index("--lr") + 1])
seed = int(os.environ["REPRO500_SEED"])
print(f"Acc@1 {90 + lr + seed % 3 / 100:.3f}")
"""
ENV = {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "DVC_NO_ANALYTICS": "1",
       "MLFLOW_DISABLE_TELEMETRY": "true"}
REGEX = ["--metric", "accuracy=regex:Acc@1 ([0-9.]+)", "--accept", "accuracy>=90"]


def _sh(cwd: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, cwd=cwd, env=tool_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _repo(path: Path) -> None:
    _sh(path, "git", "init", "-q")
    _sh(path, str(BIN / "dvc"), "init", "-q")


def _commit(path: Path, message: str) -> None:
    _sh(path, "git", "add", "-A")
    _sh(path, "git", "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", message)


def _parent_runs(store: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{store}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    return [r for r in runs if "mlflow.parentRunId" not in r.data.tags and "repro500.verdict" in r.data.tags]


def _through_dvc(path: Path, script: str, metric: list[str], *, name: str | None = None) -> list:
    """init, dvc repro, git commit -a, dvc exp run -S run.mutable.lr=0.5 (named *name* if given);
    the parent runs MLflow holds."""
    (path / "train.py").write_text(script)
    (path / ".gitignore").write_text("/mlflow.db\n*.log")  # the user's own lines, one already covering the store
    _repo(path)
    made = repro500("init", *metric, "--accept", "accuracy>=90", "--set", "lr=0.1", "-n", "2",
                    "--", "python", "train.py", "--lr", "{mutable.lr}", cwd=path, env=ENV)
    assert made.returncode == 0, made.stderr
    assert "runs log to MLflow" in made.stdout
    added = [line for line in MLFLOW_IGNORES if line != "mlflow.db"]
    assert f"appended {', '.join(added)} to" in made.stdout
    gitignore = (path / ".gitignore").read_text()
    assert gitignore.startswith("/mlflow.db\n*.log\n#") and gitignore.endswith("\n".join(added) + "\n")
    stage = yaml.safe_load((path / "dvc.yaml").read_text())["stages"]["run"]
    assert "--no-tracking" not in stage["cmd"] and "--tracking" not in stage["cmd"]
    assert yaml.safe_load((path / "params.yaml").read_text())["run"]["tracking"] is True

    dvc = str(BIN / "dvc")
    _commit(path, "the experiment")  # a user's code committed first: what DVC writes next must not make it dirty
    _sh(path, dvc, "repro")
    first = json.loads((path / "metrics" / "verdict.json").read_text())
    assert first["status"] == "PASS" and 90.1 <= first["accuracy"]["mean"] < 90.2
    assert (path / "mlflow.db").is_file()
    _commit(path, "its first results")  # what a user does: the store must not go into git
    committed = _sh(path, "git", "ls-files").stdout.split()
    assert "train.py" in committed and not [f for f in committed if f.startswith(("mlflow.db", "mlruns"))]
    _sh(path, dvc, "exp", "run", "-S", "run.mutable.lr=0.5", *(("-n", name) if name else ()))
    varied = json.loads((path / "metrics" / "verdict.json").read_text())
    assert varied["status"] == "PASS" and 90.5 <= varied["accuracy"]["mean"] < 90.6
    untracked = [line for line in _sh(path, "git", "status", "--porcelain", "--untracked-files=all").stdout.splitlines()
                 if line.startswith("??")]
    assert untracked == []  # the store, its lock and MLflow's artifacts are all ignored
    # what DVC wrote (params.yaml's new lr, dvc.lock, the last verdict) is not the experiment's code:
    # not in its source, not what makes it dirty; the change is the parameter's
    dvc_names = _sh(path, dvc, "exp", "list", "--name-only").stdout.split()
    assert len(dvc_names) == 1 and (name is None or dvc_names == [name])
    index = json.loads((path / "runs/dvc" / _normal(dvc_names[0]) / "source.json").read_text())
    assert "train.py" in [f["path"] for f in index["files"]]
    assert not {"params.yaml", "dvc.lock", "metrics/verdict.json", "plots/repeats.json"} & {f["path"] for f in index["files"]}

    # MLflow itself: one parent run per DVC run, each with its verdict and the metric's mean
    parents = sorted(_parent_runs(path / "mlflow.db"), key=lambda r: r.info.start_time)
    assert [r.data.tags["repro500.verdict"] for r in parents] == ["PASS", "PASS"]
    assert parents[1].data.tags["repro500.dirty"] == "false"  # committed code, only a parameter varied
    # which DVC experiment each parent is: dvc repro's none, dvc exp run's its name and baseline
    head = _sh(path, "git", "rev-parse", "HEAD").stdout.strip()
    assert "repro500.dvc.experiment" not in parents[0].data.tags
    assert parents[1].data.tags["repro500.dvc.experiment"] == dvc_names[0]  # as DVC gave it
    assert parents[1].data.tags["repro500.dvc.baseline_rev"] == head
    # each DVC run is a run of its own, side by side, where the MLflow parent says it is
    run_dirs = [Path(r.data.tags["repro500.run_dir"]) for r in parents]
    assert run_dirs[1] == (path / "runs/dvc" / _normal(dvc_names[0])).resolve() and run_dirs[0] != run_dirs[1]
    assert all((d / "SHA256SUMS").is_file() for d in run_dirs)
    means = [r.data.metrics["accuracy_mean"] for r in parents]  # DVC's accuracy.mean
    assert 90.1 <= means[0] < 90.2 and 90.5 <= means[1] < 90.6
    return parents


def _normal(name: str) -> str:
    """The run id repro500 gives DVC experiment *name* (runner/dvcexp.py)."""
    from repro500.runner.dvcexp import Experiment, run_id

    return run_id(Experiment(name, None))


def _history(path: Path, source: str) -> dict:
    done = repro500("history", source, "accuracy", "--json", cwd=path, env=ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.slow  # about 100 s on 2 cores: dvc repro, three dvc exp run, history, diffs (make test has DVC's
# no-tracking stage below)
def test_every_dvc_experiment_is_a_run_of_its_own_that_history_and_diff_read(in_tmp):
    # dvc repro and a named dvc exp run (a name a run id cannot hold as given), then one more
    parents = _through_dvc(in_tmp, SCRIPT, ["--metric", "accuracy=regex:Acc@1 ([0-9.]+)"], name="lr@0.5")
    dvc = str(BIN / "dvc")
    _sh(in_tmp, dvc, "exp", "run", "-S", "run.mutable.lr=0.7")
    # dvc plots show draws this run's value of each repeat (DVC's own reading of the files); a command
    # records no epochs, so there is no per-epoch file
    points = _plotted(in_tmp)
    assert sorted(p["repeat"] for p in points) == [0, 1] and all(90.7 <= p["accuracy"] < 90.8 for p in points)
    assert sorted(p.name for p in (in_tmp / "plots").iterdir()) == ["repeats.json"]
    # a third experiment whose name normalises to the first one's run id is refused, and that run kept
    kept = (in_tmp / "runs/dvc/lr-0.5/SHA256SUMS").read_bytes()
    clash = subprocess.run([dvc, "exp", "run", "-S", "run.mutable.lr=0.9", "-n", "lr-0.5"], cwd=in_tmp, env=tool_env(),
                           capture_output=True, text=True, timeout=300)
    assert clash.returncode != 0 and "Traceback" not in clash.stdout + clash.stderr
    assert ("DVC experiment 'lr-0.5' would be run lr-0.5, but runs/dvc/lr-0.5 already holds the run of DVC "
            "experiment 'lr@0.5'") in clash.stdout + clash.stderr
    assert (in_tmp / "runs/dvc/lr-0.5/SHA256SUMS").read_bytes() == kept

    # history lists all three, from the runs directory and from MLflow, oldest first, the
    # parameter named where the metric moved
    from_dir, from_store = _history(in_tmp, "runs/dvc"), _history(in_tmp, "repro500/train")
    assert [r["run_id"] for r in from_dir["runs"]] == [r["run_id"] for r in from_store["runs"]]
    ids = [r["run_id"] for r in from_dir["runs"]]
    assert len(ids) == 3 and ids[1] == "lr-0.5", ids
    assert [c["key"] for c in from_dir["runs"][2]["changes"]][:1] == ["recipe.mutable.lr"]
    # diff of two runs names the parameter first (not params.yaml, dvc.lock or the verdict as code)
    done = repro500("diff", f"runs/dvc/{ids[1]}", f"runs/dvc/{ids[2]}", "--json", cwd=in_tmp, env=ENV)
    assert done.returncode == 1, done.stderr[-2000:]
    first = json.loads(done.stdout)["differences"][0]
    assert (first["key"], first["a"], first["b"]) == ("mutable.lr", 0.5, 0.7), first
    # MLflow: three parents, none dirty, each pointing at its own run directory; diff from the store alone
    parents = sorted(_parent_runs(in_tmp / "mlflow.db"), key=lambda r: r.info.start_time)
    assert [r.data.tags["repro500.run_id"] for r in parents] == ids
    assert [r.data.tags["repro500.dirty"] for r in parents] == ["false"] * 3
    assert [r.data.tags.get("repro500.dvc.experiment") for r in parents][:2] == [None, "lr@0.5"]
    assert len({r.data.tags["repro500.run_dir"] for r in parents}) == 3
    done = repro500("diff", f"mlflow:{parents[1].info.run_id}", f"mlflow:{parents[2].info.run_id}", "--json",
                    cwd=in_tmp, env=ENV)
    assert done.returncode == 1, done.stderr[-2000:]
    first = json.loads(done.stdout)["differences"][0]
    assert (first["key"], first["a"], first["b"]) == ("mutable.lr", 0.5, 0.7), first
    # DVC itself kept the two experiments that ran, not the refused one
    listed = _sh(in_tmp, dvc, "exp", "list", "--name-only").stdout.split()
    assert len(listed) == 2 and "lr@0.5" in listed and "lr-0.5" not in listed, listed
    # a parent whose run directory is gone is read from the sealed run it holds in the store
    gone = Path(parents[1].data.tags["repro500.run_dir"])
    gone.rename(in_tmp / "elsewhere")
    found = _history(in_tmp, "repro500/train")
    assert [r["run_id"] for r in found["runs"]] == ids and found["skipped"] == [] and not gone.exists()

    # that run published into a results repository and cloned: its own dvc.yaml reproduces it
    results = in_tmp / "results"
    results.mkdir()
    _repo(results)
    published = repro500("publish", f"runs/dvc/{ids[2]}", "--out", str(results / "lr-0.7"), "--margin", "accuracy=0.05",
                         cwd=in_tmp, env=ENV)
    assert published.returncode == 0, published.stderr[-2000:]
    _commit(results, "the published run")
    _sh(in_tmp, "git", "clone", "-q", str(results), "clone")
    _sh(in_tmp / "clone" / "lr-0.7", dvc, "repro")
    verdict = json.loads((in_tmp / "clone/lr-0.7/metrics/verdict.json").read_text())
    assert verdict["status"] == "REPRODUCED" and verdict["accuracy"]["reproduced"]["status"] == "REPRODUCED", verdict
    assert sorted(p["repeat"] for p in _plotted(in_tmp / "clone" / "lr-0.7")) == [0, 1]


def _plotted(path: Path) -> list[dict]:
    """The points ``dvc plots show`` draws from plots/repeats.json in *path*."""
    shown = json.loads(_sh(path, str(BIN / "dvc"), "plots", "show", "--json").stdout)
    return shown["data"]["plots/repeats.json"][0]["content"]["data"]["values"]


def test_a_dvc_experiment_name_is_normalised_recorded_as_given_and_never_overwritten(in_tmp):
    (in_tmp / "train.py").write_text(SCRIPT)
    made = repro500("init", "--no-tracking", *REGEX, "-n", "1", "--", "python", "train.py", "--lr", "0.1",
                    cwd=in_tmp, env=ENV)
    assert made.returncode == 0, made.stderr
    cmd = yaml.safe_load((in_tmp / "dvc.yaml").read_text())["stages"]["run"]["cmd"]
    as_dvc = {"DVC_EXP_NAME": "lr@0.7-ü", "DVC_EXP_BASELINE_REV": "0" * 40}  # what dvc exp run gives the stage
    subprocess.run(["sh", "-c", cmd], cwd=in_tmp, env=tool_env(**as_dvc), capture_output=True, text=True, timeout=120,
                   check=True)
    run = in_tmp / "runs/dvc/lr-0.7-u"
    meta = json.loads((run / "run.json").read_text())
    assert meta["run_id"] == "lr-0.7-u" and meta["dvc"] == {"experiment": "lr@0.7-ü", "baseline_rev": "0" * 40}
    kept = (run / "SHA256SUMS").read_bytes()
    # another experiment whose name normalises alike: one sentence, exit 4, the first run as it was
    again = ["run", "repro500.yaml", "--params", "params.yaml", "--out", "runs/dvc", "--run-id-from-dvc"]
    refused = repro500(*again, cwd=in_tmp, env={**ENV, "DVC_EXP_NAME": "lr-0.7-u"})
    assert refused.returncode == 4 and "Traceback" not in refused.stderr
    assert ("DVC experiment 'lr-0.7-u' would be run lr-0.7-u, but runs/dvc/lr-0.7-u already holds the run of DVC "
            "experiment 'lr@0.7-ü', which is kept as it is; name this experiment otherwise (dvc exp run -n NAME)"
            ) in " ".join(refused.stderr.split())
    assert (run / "SHA256SUMS").read_bytes() == kept and len(list((in_tmp / "runs/dvc").iterdir())) == 1
    # a name with nothing a run id can hold, and two ways of naming one run
    empty = repro500(*again, cwd=in_tmp, env={**ENV, "DVC_EXP_NAME": "@@"})
    assert empty.returncode == 4 and "has no letter or digit a run id can hold" in empty.stderr
    both = repro500(*again, "--run-id", "x", cwd=in_tmp, env=ENV)
    assert both.returncode == 2 and "give --run-id or --run-id-from-dvc, not both" in both.stderr


@pytest.mark.parametrize(("name", "normal"), [
    ("raspy-magi", "raspy-magi"), ("lr@0.5", "lr-0.5"), ("ü-x", "u-x"), (".hidden", "hidden"), ("-x-", "x"),
    ("a" * 150, "a" * 100), ("a/b c", "a-b-c"),
])
def test_a_dvc_experiment_name_becomes_a_run_id(name, normal):
    assert _normal(name) == normal


# about 40 s idle, 110 s in CI's suite on 2 cores (the script imports mlflow in every repeat): make
# test-heavy; in CI, dvc exp run of an init'd command is test_every_dvc_experiment_is_a_run_of_its_own,
# metrics read from the script's MLflow calls tests/test_reproduce_mlflow_metrics.py
@pytest.mark.slow
@pytest.mark.heavy
def test_readme_example_with_mlflow_metrics_runs_under_dvc_repro_and_dvc_exp_run(in_tmp):
    _through_dvc(in_tmp, MLFLOW_SCRIPT, ["--metric", "accuracy=mlflow"])


def test_init_no_tracking_refuses_mlflow_metrics_and_writes_tracking_false(in_tmp):
    (in_tmp / "train.py").write_text(SCRIPT)
    refused = repro500("init", "--no-tracking", "--metric", "accuracy=mlflow", "--accept", "accuracy>=90",
                       "--", "python", "train.py", "--lr", "0.1", cwd=in_tmp, env=ENV)
    assert refused.returncode == 4 and "Traceback" not in refused.stderr
    assert "metrics.accuracy is read from MLflow, but this run is not tracked" in refused.stderr
    assert sorted(p.name for p in in_tmp.iterdir()) == ["train.py"]
    made = repro500("init", "--no-tracking", *REGEX, "-n", "1", "--", "python", "train.py", "--lr", "0.1",
                    cwd=in_tmp, env=ENV)
    assert made.returncode == 0, made.stderr
    assert "runs do not log to MLflow" in made.stdout and "appended" not in made.stdout
    assert yaml.safe_load((in_tmp / "params.yaml").read_text())["run"]["tracking"] is False
    assert not (in_tmp / ".gitignore").exists()


def test_the_run_stage_of_a_no_tracking_init_does_not_log_to_mlflow(in_tmp):
    (in_tmp / "train.py").write_text(SCRIPT)
    # no --set: params.yaml's run.mutable is empty, which must apply as nothing
    made = repro500("init", "--no-tracking", *REGEX, "-n", "1", "--", "python", "train.py", "--lr", "0.1",
                    cwd=in_tmp, env=ENV)
    assert made.returncode == 0, made.stderr
    stage = yaml.safe_load((in_tmp / "dvc.yaml").read_text())["stages"]["run"]
    # the stage's own command, as DVC runs it (sh -c in the stage's directory)
    subprocess.run(["sh", "-c", stage["cmd"]], cwd=in_tmp, env=tool_env(), capture_output=True, text=True, timeout=120,
                   check=True)
    # outside `dvc exp run` the run gets the default dated id, and a second one does not overwrite it
    subprocess.run(["sh", "-c", stage["cmd"]], cwd=in_tmp, env=tool_env(), capture_output=True, text=True, timeout=120,
                   check=True)
    assert len(list((in_tmp / "runs" / "dvc").glob("*/summary.json"))) == 2
    # the same stage writes DVC's metrics: one repeat cannot decide a band, a result all the same
    assert json.loads((in_tmp / "metrics" / "verdict.json").read_text())["status"] == "INCONCLUSIVE"
    # the runner reads params.yaml's run.tracking (Recipe.tracking) when the command line does not say
    assert not (in_tmp / "mlflow.db").exists()


def test_gitignore_lines_are_appended_only_when_missing_and_never_rewritten(in_tmp):
    (in_tmp / "train.py").write_text(SCRIPT)
    mine = "# mine\nmlruns/\r\n/mlflow.db.lock\nbuild/"  # CRLF, no final newline: kept byte for byte
    (in_tmp / ".gitignore").write_bytes(mine.encode())
    args = ["init", "--metric", "accuracy=mlflow", "--accept", "accuracy>=90", "--", "python", "train.py", "--lr", "0.1"]
    assert repro500(*args, cwd=in_tmp, env=ENV).returncode == 0
    text = (in_tmp / ".gitignore").read_bytes().decode()
    assert text.startswith(mine + "\n")
    appended = text[len(mine) + 1:].splitlines()
    assert appended[1:] == ["mlflow.db", "mlflow.db-journal", "mlflow.db-wal", "mlflow.db-shm", "mlartifacts/"]
    again = repro500("init", "--force", *args[1:], cwd=in_tmp, env=ENV)
    assert again.returncode == 0 and "appended" not in again.stdout
    assert (in_tmp / ".gitignore").read_bytes().decode() == text
    # git itself agrees that the store, its side files and the artifact root are ignored
    subprocess.run(["git", "init", "-q"], cwd=in_tmp, check=True)
    for name in ("mlflow.db", "mlflow.db-wal", "mlflow.db.lock", "mlruns/0/meta.yaml", "mlartifacts/1/a/artifacts/x"):
        assert subprocess.run(["git", "check-ignore", "-q", name], cwd=in_tmp).returncode == 0, name


def test_init_refuses_to_overwrite_and_checks_the_recipe_before_writing(in_tmp):
    (in_tmp / "train.py").write_text(SCRIPT)
    (in_tmp / "params.yaml").write_text("mine: 1\n")
    args = [*REGEX, "--", "python", "train.py"]
    kept = repro500("init", *args, cwd=in_tmp, env=ENV)
    assert kept.returncode == 4 and "params.yaml already exists" in kept.stderr
    assert (in_tmp / "params.yaml").read_text() == "mine: 1\n" and not (in_tmp / "repro500.yaml").exists()
    assert not (in_tmp / ".gitignore").exists()
    bad = repro500("init", "--metric", "accuracy=regex:no group", "--accept", "accuracy>=90", "--force",
                   "--", "python", "train.py", cwd=in_tmp, env=ENV)
    # the regex is checked as the recipe init writes would hold it: invalid input, as in a recipe file
    assert bad.returncode == 4 and "Traceback" not in bad.stderr and not (in_tmp / "dvc.yaml").exists()
    assert not (in_tmp / ".gitignore").exists()


# --------------------------------------------------------------------------- declared inputs


@pytest.mark.parametrize(("raw", "mutable", "dep"), [
    ("data/train.csv", {}, "data/train.csv"),
    ("/srv/data/shards", {}, "/srv/data/shards"),
    ("data/{mutable.split}.csv", {"split": "val"}, "data/${run.mutable.split}.csv"),
    ("data/{mutable.fold}/{mutable.split}", {"fold": 3, "split": "a"}, "data/${run.mutable.fold}/${run.mutable.split}"),
    ("data/{{raw}}.csv", {}, "data/{raw}.csv"),
    ("data/{mutable.lr:.2f}.csv", {"lr": 0.1}, None),  # a format spec DVC cannot apply
    ("data/{mutable.flag}", {"flag": True}, None),  # Python writes True, DVC true
    ("data/{mutable.scale}", {"scale": 0.5}, None),
    ("data/{seed}.csv", {}, None),
    ("data/$HOME/x", {}, None),
])
def test_an_input_becomes_a_dvc_dependency_where_dvc_can_name_it(raw, mutable, dep):
    assert input_dep(raw, mutable)[0] == dep
    if dep is None:
        assert input_dep(raw, mutable)[1]  # the reason init prints


def test_init_inputs_are_recipe_inputs_and_dvc_dependencies_that_follow_params(in_tmp):
    (in_tmp / "train.py").write_text(SCRIPT)
    (in_tmp / "data").mkdir()
    for name in ("train.csv", "a.csv", "b.csv", "0.10.csv"):
        (in_tmp / "data" / name).write_text(name)
    (in_tmp / ".gitignore").write_text("data/\n")  # data, not source: only the declared inputs are dependencies
    _repo(in_tmp)
    made = repro500("init", *REGEX, "--set", "split=a", "--set", "lr=0.1", "--input", "data/train.csv",
                    "--input", "data/{mutable.split}.csv", "--input", "data/{mutable.lr:.2f}.csv",
                    "--", "python", "train.py", "--lr", "{mutable.lr}", cwd=in_tmp, env=ENV)
    assert made.returncode == 0, made.stderr
    recipe = yaml.safe_load((in_tmp / "repro500.yaml").read_text())
    assert recipe["fixed"]["inputs"] == ["data/train.csv", "data/{mutable.split}.csv", "data/{mutable.lr:.2f}.csv"]
    deps = yaml.safe_load((in_tmp / "dvc.yaml").read_text())["stages"]["run"]["deps"]
    assert "data/train.csv" in deps and "data/${run.mutable.split}.csv" in deps
    assert not [d for d in deps if d.startswith("data/") and d not in ("data/train.csv", "data/${run.mutable.split}.csv")]
    assert "input data/{mutable.lr:.2f}.csv is not a dependency of the run stage" in made.stdout
    # DVC itself resolves the dependency from params.yaml, and follows a changed value
    dvc = str(BIN / "dvc")
    status = json.loads(_sh(in_tmp, dvc, "status", "--json").stdout)["run"][0]["changed deps"]
    assert "data/a.csv" in status and "data/train.csv" in status and "data/b.csv" not in status
    params = yaml.safe_load((in_tmp / "params.yaml").read_text())
    params["run"]["mutable"]["split"] = "b"
    (in_tmp / "params.yaml").write_text(yaml.safe_dump(params))
    status = json.loads(_sh(in_tmp, dvc, "status", "--json").stdout)["run"][0]["changed deps"]
    assert "data/b.csv" in status and "data/a.csv" not in status


def test_an_input_that_does_not_exist_is_refused_before_writing(in_tmp):
    (in_tmp / "train.py").write_text(SCRIPT)
    bad = repro500("init", *REGEX, "--input", "data/missing.csv", "--", "python", "train.py", "--lr", "0.1",
                   cwd=in_tmp, env=ENV)
    assert bad.returncode == 4 and "Traceback" not in bad.stderr and "missing.csv" in bad.stderr
    assert sorted(p.name for p in in_tmp.iterdir()) == ["train.py"]
