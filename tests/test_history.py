"""References from history: `verify --against history:SOURCE` and `repro500 history`.

The fabricated runs are written by the run-directory contract (helpers/rundirs.py) with
their own creation times, manifests and recipes; one test records two real command runs in MLflow
and finds them again by the experiment's name.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from helpers.rundirs import THIS_CPU, history_run
from helpers.runs import repro500


def earlier_runs(runs: Path) -> None:
    history_run(runs, "h1", "2026-11-01T10:00:00Z", [0.930, 0.935, 0.940])
    history_run(runs, "h2", "2026-11-02T10:00:00Z", [0.932, 0.938, 0.934])
    history_run(runs, "h3", "2026-11-03T10:00:00Z", [0.936, 0.931, 0.937])


def verify(tmp_path: Path, run: str, *extra: str):
    done = repro500("verify", f"runs/{run}", "--against", "history:runs", "--json", "--no-write", *extra,
                    cwd=tmp_path)
    return done, (json.loads(done.stdout) if done.stdout.strip() else None)


def test_a_run_like_its_history_is_equivalent_and_names_the_runs_it_was_compared_with(tmp_path):
    runs = tmp_path / "runs"
    earlier_runs(runs)
    history_run(runs, "new", "2026-11-04T10:00:00Z", [0.934, 0.936, 0.933])
    history_run(runs, "later", "2026-11-05T10:00:00Z", [0.5, 0.5, 0.5])  # after the run: not its history
    # the timestamps have one-second resolution: a run made in the second "new" was made counts as
    # earlier only if it had finished by then
    history_run(runs, "h4", "2026-11-04T10:00:00Z", [0.935, 0.934, 0.936], finished="2026-11-04T10:00:00Z")
    history_run(runs, "same", "2026-11-04T10:00:00Z", [0.5, 0.5, 0.5], finished="2026-11-04T10:00:03Z")
    done, doc = verify(tmp_path, "new")
    assert done.returncode == 0, done.stdout + done.stderr
    assert doc["status"] == "PASS"
    hist = doc["against"]["history"]
    assert doc["against"]["kind"] == "history" and hist["runs"] == ["h1", "h2", "h3", "h4"] and hist["latest"] == "h4"
    why = {s["run"]: s["why"] for s in hist["skipped"]}
    assert why["later"] == "created after the run being verified (2026-11-05T10:00:00Z, not before 2026-11-04T10:00:00Z)"
    assert why["same"].startswith("created after the run being verified"), why
    changes = {e["metric"]: e["change"] for e in doc["equivalence"]}
    assert changes == {"accuracy": "equivalent", "throughput_samples_per_s": "equivalent",
                       "time_to_quality_s": "equivalent"}
    acc = next(e for e in doc["equivalence"] if e["metric"] == "accuracy")
    assert acc["tost"]["n_b"] == 12 and "pooled" in hist["pooling"]["accuracy"]
    text = repro500("verify", "runs/new", "--against", "history:runs", "--no-write", cwd=tmp_path).stdout
    assert "Against the history" in text and "EQUIVALENT" in text


def test_a_drop_beyond_the_margin_is_a_regression_and_a_faster_run_an_improvement(tmp_path):
    runs = tmp_path / "runs"
    earlier_runs(runs)
    history_run(runs, "worse", "2026-11-04T10:00:00Z", [0.880, 0.885, 0.882])
    done, doc = verify(tmp_path, "worse")
    assert done.returncode == 1 and doc["status"] == "FAIL"
    acc = next(e for e in doc["equivalence"] if e["metric"] == "accuracy")
    assert acc["change"] == "regression" and doc["reasons"][0].startswith("accuracy: regression:")
    shutil.rmtree(runs / "worse")
    history_run(runs, "faster", "2026-11-04T11:00:00Z", [0.934, 0.936, 0.933], throughput=240.0)
    done, doc = verify(tmp_path, "faster")
    assert done.returncode == 0 and doc["status"] == "PASS", doc["reasons"]
    tput = next(e for e in doc["equivalence"] if e["metric"] == "throughput_samples_per_s")
    assert tput["change"] == "improvement" and tput["margin_source"] == "5% of the history's mean"
    assert tput["margin"] > 9.0  # 5% of ~181
    assert next(e for e in doc["equivalence"] if e["metric"] == "accuracy")["change"] == "equivalent"


def test_only_the_same_recipe_on_the_same_system_counts_and_none_is_exit_3(tmp_path):
    runs = tmp_path / "runs"
    other_cpu = {**THIS_CPU, "cpu": {**THIS_CPU["cpu"], "model": "other cpu"}}
    history_run(runs, "elsewhere", "2026-11-01T10:00:00Z", [0.93, 0.94, 0.935], hardware=other_cpu)
    history_run(runs, "other-torch", "2026-11-01T11:00:00Z", [0.93, 0.94, 0.935], torch="2.13.0")
    history_run(runs, "bigger-batch", "2026-11-01T12:00:00Z", [0.93, 0.94, 0.935], batch_size=128)
    history_run(runs, "new", "2026-11-04T10:00:00Z", [0.934, 0.936, 0.933])
    done, doc = verify(tmp_path, "new")
    assert done.returncode == 3 and doc is None
    message = done.stderr.strip()
    assert message.count("\n") == 0 and "Traceback" not in message
    assert "history:runs has no earlier run of recipe 'quickstart' on this system" in message
    assert "run it here first" in message
    assert "hardware.cpu.model is 'other cpu', not 'test cpu'" in message
    history_run(runs, "same", "2026-11-02T10:00:00Z", [0.93, 0.94, 0.935])
    done, doc = verify(tmp_path, "new")
    assert done.returncode == 0, done.stderr
    skipped = {s["run"]: s["why"] for s in doc["against"]["history"]["skipped"]}
    assert doc["against"]["history"]["runs"] == ["same"]
    assert skipped["other-torch"] == "another system: environment.torch is '2.13.0', not '2.14.1'"
    assert skipped["bigger-batch"] == "recipe mutable.batch_size is 128, not 64"


def test_a_tampered_history_run_is_left_out_and_runs_that_differ_among_themselves_count_by_their_means(tmp_path):
    runs = tmp_path / "runs"
    earlier_runs(runs)
    history_run(runs, "shifted", "2026-11-03T12:00:00Z", [0.960, 0.961, 0.962])
    tampered = history_run(runs, "tampered", "2026-11-03T13:00:00Z", [0.93, 0.94, 0.935])
    (tampered / "repeats" / "0" / "summary.json").write_text(
        (tampered / "repeats" / "0" / "summary.json").read_text().replace("0.93", "0.99"))
    history_run(runs, "new", "2026-11-04T10:00:00Z", [0.934, 0.936, 0.933])
    done, doc = verify(tmp_path, "new")
    hist = doc["against"]["history"]
    assert "tampered" not in hist["runs"] and any(s["run"] == "tampered" for s in hist["skipped"])
    assert hist["runs"] == ["h1", "h2", "h3", "shifted"]
    assert hist["pooling"]["accuracy"].startswith("means of 4 runs")
    acc = next(e for e in doc["equivalence"] if e["metric"] == "accuracy")
    assert acc["tost"]["n_b"] == 4


def test_bad_history_sources_are_one_sentence(tmp_path):
    history_run(tmp_path / "runs", "new", "2026-11-04T10:00:00Z", [0.934, 0.936, 0.933])
    one = repro500("verify", "runs/new", "--against", "history:runs/new", cwd=tmp_path)
    assert one.returncode == 4 and "is one run directory: give the directory that holds the runs" in one.stderr
    nowhere = repro500("verify", "runs/new", "--against", "history:nowhere", cwd=tmp_path)
    assert nowhere.returncode == 4 and "no MLflow experiment of that name" in nowhere.stderr
    assert not (tmp_path / "mlflow.db").exists()  # reading history creates no store
    unknown = repro500("history", "runs", "loss", cwd=tmp_path)
    assert unknown.returncode == 2 and "no run in runs reports 'loss' (metrics there: accuracy" in unknown.stderr
    for done in (one, nowhere, unknown):
        assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1


@pytest.mark.slow
def test_history_shows_the_metric_moving_where_torch_changed_and_plots_it(tmp_path):
    runs = tmp_path / "runs"
    earlier_runs(runs)
    history_run(runs, "h4", "2026-11-04T10:00:00Z", [0.900, 0.902, 0.901], torch="2.15.0")
    history_run(runs, "gpu", "2026-11-04T11:00:00Z", [0.95, 0.951, 0.952],
                hardware={**THIS_CPU, "gpus": [{"name": "NVIDIA H100 80GB HBM3"}]})
    done = repro500("history", "runs", "accuracy", "--json", "--plot", "out/acc.png", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    rows = {r["run_id"]: r for r in doc["runs"]}
    assert [r["run_id"] for r in doc["runs"]] == ["h1", "h2", "h3", "h4", "gpu"]
    assert rows["h1"]["previous"] is None and rows["h2"]["moved"] is None
    assert rows["h4"]["moved"] == "worse" and rows["h4"]["p_value"] < 0.05
    assert any(c["before"] == "2.14.1" and c["after"] == "2.15.0" for c in rows["h4"]["changes"]), rows["h4"]["changes"]
    assert rows["gpu"]["system"] == "S2" and rows["gpu"]["previous"] is None  # its own series
    assert doc["systems"]["S2"]["hardware.gpus"] == "NVIDIA H100 80GB HBM3"
    png = tmp_path / "out" / "acc.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = repro500("history", "runs", "accuracy", cwd=tmp_path).stdout
    assert "worse" in text and "2.15.0" in text


@pytest.mark.slow
def test_a_history_found_by_its_mlflow_experiment_or_a_search_filter_and_from_run_against(tmp_path):
    """Real runs tracked into one experiment: the third is verified against them at the end of its
    own run (run --against history:runs), by the experiment's name, and by MLflow search filters."""
    script = tmp_path / "train.py"
    script.write_text("import os, random\nrandom.seed(int(os.environ['REPRO500_SEED']))\n"
                      "print(f'Acc {0.9 + random.random() / 1000:.5f}')\n")
    metric = ["--metric", "accuracy=regex:Acc ([0-9.]+)", "--accept", "accuracy>=0.9±0.01"]

    def run(run_id: str, *against: str):
        return repro500("run", "--command", *metric, "-n", "3", "--experiment", "nightly", "--run-id", run_id,
                        *against, "--", sys.executable, "train.py", cwd=tmp_path, timeout=600)

    nowhere = run("first", "--against", "history:runs")  # runs/ does not exist yet: refused before writing
    assert nowhere.returncode == 4 and "there is no directory 'runs'" in nowhere.stderr, nowhere.stderr
    assert not (tmp_path / "runs").exists()
    assert run("first").returncode == 0
    # a filter that matches no run: the run completes, and its verdict against the history cannot be made
    empty = run("second", "--against", "history:mlflow:tags.`repro500.run_id` = 'none'")
    assert empty.returncode == 3, empty.stderr[-2000:]
    assert "the run itself is complete (runs/second), but verifying it against history:mlflow:" in empty.stderr
    assert "has no earlier run of recipe 'train' on this system" in empty.stderr
    assert json.loads((tmp_path / "runs/second/run.json").read_text())["status"] == "completed"
    third = run("third", "--against", "history:runs")
    assert third.returncode == 0, third.stderr[-2000:]
    doc = json.loads((tmp_path / "runs/third/verdict.json").read_text())
    assert doc["against"]["kind"] == "history" and doc["against"]["history"]["runs"] == ["first", "second"], doc["against"]["history"].get("skipped")
    assert json.loads((tmp_path / "runs/third/run.json").read_text())["reference"]["against"] == \
        f"history:{(tmp_path / 'runs').resolve()}"

    done = repro500("verify", "runs/third", "--against", "history:nightly", "--json", "--no-write", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["against"]["history"]["runs"] == ["first", "second"]
    assert {e["metric"]: e["change"] for e in doc["equivalence"]}["accuracy"] == "equivalent"
    done = repro500("history", "nightly", "accuracy", "--json", cwd=tmp_path)
    assert [r["run_id"] for r in json.loads(done.stdout)["runs"]] == ["first", "second", "third"]

    # an MLflow search filter, over every experiment of the store: only the runs it matches
    chosen = "history:mlflow:tags.`repro500.run_id` = 'first' and tags.`repro500.recipe` = 'train'"
    done = repro500("verify", "runs/third", "--against", chosen, "--json", "--no-write", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["against"]["history"]["runs"] == ["first"]
    done = repro500("history", "mlflow:tags.`repro500.run_id` != 'first'", "accuracy", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [r["run_id"] for r in json.loads(done.stdout)["runs"]] == ["second", "third"]
    bad = repro500("verify", "runs/third", "--against", "history:mlflow:tags.x ===", cwd=tmp_path)
    assert bad.returncode == 2 and "MLflow cannot search with that filter" in bad.stderr
    assert "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1
