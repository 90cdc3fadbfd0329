"""`repro500 run` end to end: bundle, MLflow structure, determinism, interruption and resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.runs import repro500, write_recipe
from helpers.stores import mlflow_store

import repro500 as repro500_pkg
from repro500.capture.source import package_digest
from repro500.errors import EXIT_INTERRUPTED, InvalidInput, UsageError
from repro500.rundir import sums as bundle
from repro500.runner import RunOptions, run


@pytest.fixture
def sqlite_store(in_tmp, monkeypatch):
    uri = mlflow_store(in_tmp / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def _git(*args: str, cwd) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.slow
def test_run_writes_a_complete_bundle_and_mlflow_structure(in_tmp, sqlite_store):
    from mlflow.tracking import MlflowClient

    # run from a git work tree with an uncommitted change, as users do
    _git("init", "-q", "-b", "main", cwd=in_tmp)
    (in_tmp / ".gitignore").write_text("runs/\nmlflow.db\n")
    (in_tmp / "augment.py").write_text("FLIP = True\n")
    _git("add", ".gitignore", "augment.py", cwd=in_tmp)
    _git("commit", "-q", "-m", "start", cwd=in_tmp)
    head = _git("rev-parse", "HEAD", cwd=in_tmp)
    (in_tmp / "augment.py").write_text("FLIP = False  # uncommitted\n")
    recipe = write_recipe(in_tmp / "tiny.yaml")
    outcome = run(RunOptions(recipe=str(recipe), argv=["repro500", "run", "tiny.yaml"]))
    run_dir = outcome.run_dir
    assert outcome.exit_code == 0, outcome.verdict.status
    for name in ("run.json", "manifest.json", "recipe.yaml", "summary.json", "SHA256SUMS", "verdict.json"):
        assert (run_dir / name).is_file(), name
    for k in (0, 1):
        for name in ("metrics.jsonl", "summary.json", "params.jsonl", "mllog.txt"):
            assert (run_dir / "repeats" / str(k) / name).is_file()
    assert bundle.check_sums(run_dir).ok
    # in-memory synthetic data: no data file to describe, but the record is there and digested
    assert json.loads((run_dir / "data-specs.json").read_text()) == {"schema": "repro500/data-specs/v1", "data": []}
    assert "data-specs.json" in bundle.read_sums(run_dir)
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "completed"
    summaries = [json.loads((run_dir / "repeats" / str(k) / "summary.json").read_text()) for k in (0, 1)]
    assert [s["status"] for s in summaries] == ["completed", "completed"]
    assert summaries[0]["seeds"]["torch"] != summaries[1]["seeds"]["torch"]
    assert summaries[0]["final_param_digest"] != summaries[1]["final_param_digest"]
    assert summaries[0]["metrics"]["train_flops"] > 0 and summaries[0]["metrics"]["valid_flops"] > 0
    steps = [json.loads(line) for line in (run_dir / "repeats/0/metrics.jsonl").read_text().splitlines()]
    step = next(r for r in steps if r["kind"] == "step")
    for key in ("time_data_s", "time_forward_s", "time_backward_s", "time_optimizer_s", "peak_memory_bytes"):
        assert step[key] is not None and step[key] >= 0
    assert sum(r["kind"] == "epoch" for r in steps) == summaries[0]["epochs_run"]

    client = MlflowClient(sqlite_store)
    parent = client.get_run(meta["mlflow"]["parent_run_id"])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["repro500.manifest_digest"] == manifest["digest"]["value"]
    own = Path(repro500_pkg.__file__).parent  # taken beside the first repeat, sealed with the rest
    assert manifest["facets"]["experiment"]["repro500"]["source_sha256"] == package_digest(own)
    assert parent.data.tags["repro500.run_id"] == run_dir.name
    assert parent.data.tags["repro500.gpu_model"] == "none"
    assert parent.data.tags["repro500.world_size"] == "1"
    assert parent.data.tags["repro500.verdict"] == "PASS"
    assert parent.data.tags["mlflow.source.git.commit"] == head
    assert parent.data.tags["mlflow.source.git.branch"] == "main"
    assert parent.data.tags["repro500.dirty"] == "true"
    assert parent.data.tags["repro500.compressor"] == "none"
    assert parent.data.tags["repro500.engine"] == "local"
    assert parent.data.params["fixed.model"] == "resnet20"
    assert parent.data.params["mutable.batch_size"] == "32"
    assert {"manifest.json", "recipe.yaml", "code.diff", "summary.json", "verdict.json"} <= {
        a.path for a in client.list_artifacts(parent.info.run_id)}
    # the verdict's figures are the parent's metrics, named as in DVC's view with "_" for "."
    verdict = json.loads((run_dir / "verdict.json").read_text())
    stats = verdict["statistics"]["accuracy"]
    for key in ("mean", "std", "ci_low", "ci_high", "n"):
        assert parent.data.metrics[f"accuracy_{key}"] == pytest.approx(stats[key]), key
    (band,) = verdict["bands"]
    assert parent.data.metrics["accuracy_band_bound"] == pytest.approx(band["lower_bound"])
    assert parent.data.tags["repro500.verdict.accuracy.band.status"] == band["status"]
    assert parent.data.metrics["throughput_samples_per_s_mean"] == pytest.approx(
        verdict["statistics"]["throughput_samples_per_s"]["mean"])
    assert parent.data.metrics["alpha"] == 0.05 and not [k for k in parent.data.metrics if k.startswith("mean_")]
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "run")] == [f"run/{run_dir.name}.tar.gz"]
    (in_tmp / "fetched").mkdir()
    diff = Path(client.download_artifacts(parent.info.run_id, "code.diff", str(in_tmp / "fetched")))
    assert "+FLIP = False  # uncommitted" in diff.read_text(encoding="utf-8")
    assert manifest["facets"]["distributed"]["backend"] is None  # one process: no collectives
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(c.data.tags["repro500.repeat"] for c in children) == ["0", "1"]
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.tags["repro500.status"] == "completed"
        history = client.get_metric_history(child.info.run_id, "train/loss")  # the training loss, by step
        assert len(history) == sum(r["kind"] == "step" for r in steps)
        # one name per quantity: the evaluation's accuracy, each epoch's and the repeat's, is `accuracy`,
        # stepped like everything else by the global step; `epoch` says which epoch ended there
        k = int(child.data.tags["repro500.repeat"])
        records = [json.loads(line) for line in (outcome.run_dir / "repeats" / str(k) / "metrics.jsonl").open()]
        ends = {r["epoch"]: max(s["step"] for s in records if s["kind"] == "step" and s["epoch"] == r["epoch"])
                for r in records if r["kind"] == "epoch"}
        assert [(m.step, m.value) for m in client.get_metric_history(child.info.run_id, "epoch")] == [
            (step, float(epoch)) for epoch, step in sorted(ends.items())]
        accuracy = sorted((m.step, m.value) for m in client.get_metric_history(child.info.run_id, "accuracy"))
        final = json.loads((outcome.run_dir / "repeats" / str(k) / "summary.json").read_text())["metrics"]
        assert [s for s, _ in accuracy] == sorted(ends.values()) and accuracy[-1][1] == final["accuracy"]
        assert child.data.metrics["accuracy"] == final["accuracy"]
        assert child.data.metrics["throughput_samples_per_s"] == pytest.approx(final["throughput_samples_per_s"])
        assert not [key for key in child.data.metrics if key.startswith(("eval_", "final_"))]
        assert child.info.run_name == f"{outcome.run_dir.name}-repeat-{k}"  # unique in the store, readable
        assert child.data.tags["mlflow.source.git.commit"] == parent.data.tags["mlflow.source.git.commit"]
        sampled = client.get_metric_history(child.info.run_id, "sampling_p_value")  # one per epoch
        assert sorted(m.step for m in sampled) == sorted(ends.values()) and all(0 <= m.value <= 1 for m in sampled)
        assert {"summary.json", "metrics.jsonl", "mllog.txt"} <= {a.path for a in client.list_artifacts(child.info.run_id)}


def test_same_seed_deterministic_repeats_have_identical_digests(in_tmp):
    recipe = write_recipe(in_tmp / "tiny.yaml", fixed__epochs=1)
    outcome = run(RunOptions(recipe=str(recipe), same_seed=True, deterministic=True, tracking=False))
    s = [json.loads((outcome.run_dir / "repeats" / str(k) / "summary.json").read_text()) for k in (0, 1)]
    assert s[0]["seeds"] == s[1]["seeds"]
    assert s[0]["final_param_digest"] == s[1]["final_param_digest"]
    assert s[0]["epoch_param_digests"] == s[1]["epoch_param_digests"]
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    assert manifest["facets"]["runtime"]["determinism"]["deterministic_algorithms"] is True
    verdict = json.loads((outcome.run_dir / "verdict.json").read_text())
    assert verdict["determinism"]["status"] == "PASS"


def test_mlperf_log_of_a_real_run_passes_the_compliance_checker(in_tmp):
    from repro500.mlperf.check import check_compliance

    recipe = write_recipe(in_tmp / "tiny.yaml", repeats=1)
    outcome = run(RunOptions(recipe=str(recipe), tracking=False))
    result = check_compliance(outcome.run_dir / "repeats/0/mllog.txt")
    assert result.passed, result.output


def test_diverged_repeat_is_recorded_not_a_crash(in_tmp):
    recipe = write_recipe(in_tmp / "tiny.yaml", repeats=1, mutable__optimizer={"name": "sgd", "lr": 1.0e12})
    outcome = run(RunOptions(recipe=str(recipe), tracking=False))
    summary = json.loads((outcome.run_dir / "repeats/0/summary.json").read_text())
    assert summary["status"] == "diverged"
    assert "loss became" in summary["error"]
    assert outcome.exit_code == 1  # the only repeat diverged: the result does not hold
    assert "did not complete" in " ".join(outcome.verdict.to_dict()["reasons"])
    assert bundle.check_sums(outcome.run_dir).ok


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"fixed__model": "resnet7"}, InvalidInput, "fixed.model: unknown model 'resnet7'"),
        ({"fixed__dataset": {"name": "classification-h5", "path": "nope.h5"}}, InvalidInput, "dataset nope.h5 does not exist"),
        ({"fixed__dataset": {"name": "mnist"}}, InvalidInput, "mnist"),
        ({"fixed__model": "cosmoflow"}, InvalidInput, "is a regression model but fixed.workload is classification"),
        ({"mutable__compressor": "zip"}, UsageError, "unknown compressor 'zip'"),
        ({"mutable__compressor": "topk"}, UsageError, "needs a distributed engine"),
        ({"acceptance": {"acuracy": {"target": 0.2}}}, InvalidInput,
         r"acceptance 'acuracy' is not a metric this workload reports; did you mean 'accuracy'\? allowed: accuracy, loss"),
        ({"fixed__target": {"metric": "map_50", "value": 0.3}}, InvalidInput,
         r"fixed.target.metric 'map_50' is not an evaluation metric of this workload; allowed: accuracy, loss, top5_accuracy$"),
        pytest.param({"mutable__device": "cuda"}, InvalidInput, "mutable.device is cuda but this machine has no usable CUDA device",
                     marks=pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is present")),
    ],
)
def test_bad_input_is_refused_before_any_work(in_tmp, change, error, message):
    recipe = write_recipe(in_tmp / "tiny.yaml", **change)
    with pytest.raises(error, match=message):
        run(RunOptions(recipe=str(recipe), tracking=False))
    assert not (in_tmp / "runs").exists()


def test_summary_metrics_are_accepted_in_acceptance(in_tmp):
    from repro500.recipe import load as recipes
    from repro500.runner import SUMMARY_METRICS, preflight

    acceptance = {"loss": {"target": 9.0, "direction": "lower"}, **{m: {"target": 0} for m in SUMMARY_METRICS}}
    plan = preflight(recipes.load(write_recipe(in_tmp / "tiny.yaml", acceptance=acceptance)))
    # every run-level metric a repeat's summary reports stays a criterion of the plan, none dropped
    assert set(plan.recipe.acceptance) == {"loss", *SUMMARY_METRICS}
    # the same check refuses a name that is neither an evaluation metric nor a summary one
    with pytest.raises(InvalidInput, match=r"acceptance 'throughput' is not a metric this workload reports"):
        preflight(recipes.load(write_recipe(in_tmp / "typo.yaml", acceptance={"throughput": {"target": 0}})))


@pytest.mark.slow
def test_cli_usage_and_output_mistakes_exit_2_and_4_in_one_line(in_tmp):
    write_recipe(in_tmp / "tiny.yaml")
    (in_tmp / "a-file").write_text("")
    for out in ("/proc/nope", "a-file/runs"):
        result = repro500("run", "tiny.yaml", "--out", out, "--no-tracking", cwd=in_tmp)
        assert result.returncode == 4, result.stderr
        assert result.stderr.startswith("repro500: error: cannot write the run directory")
        assert "choose a writable --out" in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    result = repro500("run", "tiny.yaml", "--set", "batch_size=abc", "--no-tracking", cwd=in_tmp)
    assert result.returncode == 2
    assert result.stderr.strip() == "repro500: error: --set batch_size=abc: mutable.batch_size must be an integer, got 'abc'"
    assert not (in_tmp / "runs").exists()
    help_text = " ".join(repro500("run", "--help", cwd=in_tmp).stdout.split())
    assert "2 for a usage error" in help_text and "4 for invalid input" in help_text
    # --resume reruns the run as recorded: options that would silently not apply are refused
    for extra, named in ((["--deterministic"], "--deterministic does not apply"),
                         (["--same-seed", "--out", "elsewhere"], "--same-seed, --out do not apply")):
        result = repro500("run", "--resume", "runs/r", *extra, cwd=in_tmp)
        assert result.returncode == 2, result.stderr
        assert named in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_cli_bad_input_one_line_and_exit_code(in_tmp):
    (in_tmp / "broken.yaml").write_text("fixed:\n  model: [\n")
    result = repro500("run", "broken.yaml", cwd=in_tmp)
    assert result.returncode == 4
    assert result.stderr.strip().startswith("repro500: error: broken.yaml:")
    assert "Traceback" not in result.stderr

    write_recipe(in_tmp / "tiny.yaml")
    start = time.monotonic()
    result = repro500("run", "tiny.yaml", cwd=in_tmp, env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"})
    assert result.returncode == 4, result.stderr
    assert "unreachable" in result.stderr and "Traceback" not in result.stderr
    assert time.monotonic() - start < 60
    assert not (in_tmp / "runs").exists()


@pytest.mark.slow
def test_sigint_keeps_finished_repeats_and_resume_completes(in_tmp):
    from mlflow.tracking import MlflowClient

    uri = mlflow_store(in_tmp / "mlflow.db")
    write_recipe(in_tmp / "tiny.yaml", repeats=3, fixed__epochs=3)
    proc = subprocess.Popen([sys.executable, "-m", "repro500.cli", "run", "tiny.yaml", "--run-id", "r1"],
                            cwd=in_tmp, env={**__import__("os").environ, "MLFLOW_TRACKING_URI": uri},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = in_tmp / "runs" / "r1"
    deadline = time.monotonic() + 240
    # interrupt in the middle of repeat 1, once repeat 0 is finished
    while time.monotonic() < deadline:
        if (run_dir / "repeats/0/summary.json").exists() and (run_dir / "repeats/1/metrics.jsonl").exists() \
                and (run_dir / "repeats/1/metrics.jsonl").stat().st_size > 0:
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert "--resume" in out + err
    first = (run_dir / "repeats/0/summary.json").read_bytes()
    assert json.loads(first)["status"] == "completed"
    assert json.loads((run_dir / "repeats/1/summary.json").read_text())["status"] == "killed"
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "interrupted"
    assert bundle.check_sums(run_dir).ok
    client = MlflowClient(uri)
    ids = meta["mlflow"]["repeat_run_ids"]
    assert client.get_run(ids["0"]).info.status == "FINISHED"
    assert client.get_run(ids["1"]).info.status == "KILLED"
    assert client.get_run(meta["mlflow"]["parent_run_id"]).info.status == "KILLED"

    result = repro500("run", "--resume", "runs/r1", cwd=in_tmp, env={"MLFLOW_TRACKING_URI": uri})
    assert result.returncode in (0, 1, 3), result.stderr
    assert (run_dir / "repeats/0/summary.json").read_bytes() == first  # finished work untouched
    summaries = [json.loads((run_dir / "repeats" / str(k) / "summary.json").read_text()) for k in range(3)]
    assert [s["status"] for s in summaries] == ["completed"] * 3
    plan = json.loads((run_dir / "manifest.json").read_text())["facets"]["seeds"]["plan"]
    assert [s["seeds"]["torch"] for s in summaries] == [p["ranks"][0]["torch"] for p in plan]
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "completed" and len(meta["resumes"]) == 1
    assert bundle.check_sums(run_dir).ok
    parent = client.get_run(meta["mlflow"]["parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert client.get_run(meta["mlflow"]["repeat_run_ids"]["1"]).info.status == "FINISHED"


def test_interrupt_while_logging_a_finished_repeat_keeps_it_finished(in_tmp, sqlite_store, monkeypatch):
    import _thread

    from mlflow.tracking import MlflowClient

    from repro500.tracking import client as tracking

    original = tracking.Tracker.end_repeat

    def interrupted(self, run_id, summary, files, status, end_ms=None):
        if summary["repeat"] == 0:  # Ctrl-C while the finished repeat's artifacts are uploading beside repeat 1
            _thread.interrupt_main()
            time.sleep(1.0)
        original(self, run_id, summary, files, status, end_ms=end_ms)

    monkeypatch.setattr(tracking.Tracker, "end_repeat", interrupted)
    monkeypatch.setenv("REPRO500_MLFLOW_PROCESS", "0")  # the patch is this process's: MLflow stays in it
    recipe = write_recipe(in_tmp / "tiny.yaml", repeats=2, fixed__epochs=1)
    outcome = run(RunOptions(recipe=str(recipe), run_id="r"))
    assert outcome.exit_code == EXIT_INTERRUPTED
    meta = json.loads((outcome.run_dir / "run.json").read_text())
    assert meta["status"] == "interrupted"
    client = MlflowClient(sqlite_store)
    assert client.get_run(meta["mlflow"]["repeat_run_ids"]["0"]).info.status == "FINISHED"
    assert client.get_run(meta["mlflow"]["parent_run_id"]).info.status == "KILLED"
    assert json.loads((outcome.run_dir / "repeats/0/summary.json").read_text())["status"] == "completed"
    assert bundle.check_sums(outcome.run_dir).ok


@pytest.mark.slow
def test_a_crash_outside_the_repeats_fails_the_mlflow_parent(in_tmp, sqlite_store, monkeypatch):
    from mlflow.tracking import MlflowClient

    import repro500.verify.judge

    def broken(*args, **kwargs):
        raise RuntimeError("verifier bug")

    # the verdict every run ends with is assembled in one place (verify.judge), which calls verify_run
    monkeypatch.setattr(repro500.verify.judge, "verify_run", broken)
    recipe = write_recipe(in_tmp / "tiny.yaml", repeats=1, fixed__epochs=1)
    with pytest.raises(RuntimeError, match="verifier bug"):
        run(RunOptions(recipe=str(recipe), run_id="r"))
    meta = json.loads((in_tmp / "runs/r/run.json").read_text())
    client = MlflowClient(sqlite_store)
    assert client.get_run(meta["mlflow"]["parent_run_id"]).info.status == "FAILED"
    assert client.get_run(meta["mlflow"]["repeat_run_ids"]["0"]).info.status == "FINISHED"


def test_interrupt_during_capture_leaves_a_resumable_run(in_tmp, monkeypatch):
    import repro500.runner.capture

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:  # where the run's capture builds its manifest
        patch.setattr(repro500.runner.capture, "build_manifest", interrupted)
        recipe = write_recipe(in_tmp / "tiny.yaml", repeats=1, fixed__epochs=1)
        outcome = run(RunOptions(recipe=str(recipe), run_id="r", tracking=False))
    assert outcome.exit_code == EXIT_INTERRUPTED
    run_dir = in_tmp / "runs/r"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    assert not (run_dir / "manifest.json").exists()
    with pytest.raises(InvalidInput, match="repro500 run --resume runs/r"):  # the --run-id is not a dead end
        run(RunOptions(recipe=str(recipe), run_id="r", tracking=False))

    resumed = run(RunOptions(resume=str(run_dir), tracking=False))
    assert resumed.exit_code in (0, 1, 3)
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "completed" and len(meta["resumes"]) == 1
    assert (run_dir / "manifest.json").is_file()
    assert json.loads((run_dir / "repeats/0/summary.json").read_text())["status"] == "completed"
    assert bundle.check_sums(run_dir).ok


def test_detection_workload_trains_and_evaluates_through_the_trainer(in_tmp):
    for split, n in (("train", "4"), ("eval", "2")):
        result = repro500("data", "generate", "ewa", "--out", f"ewa-{split}.h5", "--samples", n, "--size", "64x96",
                          "--seed", "1", "--split", split, cwd=in_tmp)
        assert result.returncode == 0, result.stderr
    recipe = {
        "name": "tinyewa",
        "fixed": {
            "workload": "detection", "model": "fasterrcnn_mobilenet_v3_fpn",
            "model_options": {"min_size": 64, "max_size": 96, "anchor_sizes": [8, 16, 32],
                              "rpn_pre_nms_top_n": 50, "rpn_post_nms_top_n": 20, "box_batch_size_per_image": 32},
            "dataset": {"name": "ewa", "path": "ewa-train.h5", "eval_path": "ewa-eval.h5"},
            "target": {"metric": "map_50", "value": 0.35}, "epochs": 1,
        },
        "mutable": {"batch_size": 2, "eval_batch_size": 2, "optimizer": {"name": "sgd", "lr": 0.001}, "threads": 1},
        "acceptance": {"map_50": {"target": 0.35, "tolerance": 0.35}},
        "repeats": 1, "seed": 2,
    }
    outcome = run(RunOptions(recipe=str(write_recipe(in_tmp / "d.yaml", recipe)), tracking=False))
    summary = json.loads((outcome.run_dir / "repeats/0/summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["samples_seen"] == 4  # two steps of two images
    assert summary["metrics"]["map_50"] is not None and 0.0 <= summary["metrics"]["map_50"] <= 1.0
    mllog = (outcome.run_dir / "repeats/0/mllog.txt").read_text()
    assert '"key": "run_stop"' in mllog


@pytest.mark.parametrize(("target", "epochs_run", "to_quality"), [(0.05, 1, 1), (1.01, 3, None)])
def test_training_stops_at_the_target_quality_or_spends_the_epoch_budget(in_tmp, target, epochs_run, to_quality):
    recipe = write_recipe(in_tmp / "tiny.yaml", repeats=1, fixed__epochs=3,
                          fixed__target={"metric": "accuracy", "value": target, "direction": "higher"})
    outcome = run(RunOptions(recipe=str(recipe), tracking=False))
    summary = json.loads((outcome.run_dir / "repeats/0/summary.json").read_text())
    epochs = [r for r in map(json.loads, (outcome.run_dir / "repeats/0/metrics.jsonl").read_text().splitlines())
              if r["kind"] == "epoch"]
    assert summary["status"] == "completed"
    assert summary["epochs_run"] == len(epochs) == epochs_run
    assert summary["epochs_to_quality"] == to_quality
    assert summary["reached_target"] is (to_quality is not None)
    if to_quality is None:
        assert summary["time_to_quality_s"] is None
    else:  # the wall time until the end of the evaluation that reached it
        assert summary["time_to_quality_s"] == pytest.approx(epochs[0]["wall_s"])
        assert summary["metrics"]["accuracy"] >= target
