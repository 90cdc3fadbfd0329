"""The compressor a run records is its resolved spec, checked before anything is written.

The plan resolves ``mutable.compressor`` (every default filled in; a seed the trainer derives per
repeat is None) and that is what the manifest, run.json and MLflow's parent run carry; runs that
recorded a bare name still compare equal; a missing Horovod and a PowerSGD run too short to
compress are said before training.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.runs import repro500, write_recipe

from repro500.capture import seeds as seeding
from repro500.errors import UsageError
from repro500.ext import compressors, specs
from repro500.runner import RunOptions, preflight
from repro500.verify.diff import diff_manifests


@pytest.mark.parametrize("name", compressors.names())
def test_resolve_fills_every_default_and_is_what_get_builds(name):
    resolved = specs.resolve(name)
    assert list(resolved) == ["name", *specs.PARAMETERS[name], "memory"]
    assert resolved == compressors.get(name).spec() == compressors.get(resolved).spec()
    assert specs.resolve(resolved) == resolved


def test_resolve_keeps_given_values_and_checks_them():
    assert specs.resolve({"name": "TopK", "ratio": 0.001, "memory": "none"}) == {
        "name": "topk", "ratio": 0.001, "memory": "none"}
    assert specs.resolve({"name": "qsgd", "seed": 7}, seed_per_repeat=True)["seed"] == 7
    assert specs.resolve("qsgd", seed_per_repeat=True)["seed"] is None  # drawn per repeat
    with pytest.raises(UsageError, match="compressor 'topk': ratio=1.5 is invalid"):
        specs.resolve({"name": "topk", "ratio": 1.5})
    with pytest.raises(UsageError, match="unknown compressor 'zip'; valid compressors: none, fp16"):
        specs.resolve("zip")


def test_a_recorded_spec_given_back_as_a_recipe_compressor_runs_the_same():
    from repro500.workloads.trainer.records import compressor_spec

    seeds = seeding.derive(500, 1, 0)
    recorded = specs.resolve("qsgd", seed_per_repeat=True)
    assert compressor_spec(recorded, seeds)["seed"] == compressor_spec("qsgd", seeds)["seed"] is not None
    compressors.get(compressor_spec(recorded, seeds))  # a valid spec for the trainer


def _plan(tmp_path: Path, compressor, overrides: tuple[str, ...] = ()):
    """The plan `repro500 run tiny.yaml --nproc 2 [--set ...]` makes."""
    from repro500.runner.plan import load_recipe

    path = write_recipe(tmp_path / "tiny.yaml", mutable__compressor=compressor)
    options = RunOptions(recipe=str(path), nproc=2, overrides=list(overrides))
    return preflight(load_recipe(options), options)


def test_the_plan_records_the_resolved_spec(tmp_path):
    assert _plan(tmp_path, "topk").compressor == {"name": "topk", "ratio": 0.01, "memory": "residual"}
    assert _plan(tmp_path, {"name": "qsgd", "levels": 15}).compressor == {
        "name": "qsgd", "levels": 15, "bucket_size": 512, "seed": None, "memory": "none"}
    plan = _plan(tmp_path, "none", overrides=("compressor.name=powersgd", "compressor.start_iter=3"))
    assert plan.compressor == {"name": "powersgd", "rank": 1, "start_iter": 3, "min_compression_rate": 2.0,
                               "warm_start": True, "error_feedback": True, "seed": None, "memory": "none"}
    with pytest.raises(UsageError, match="compressor 'powersgd': start_iter=1 is invalid"):
        _plan(tmp_path, {"name": "powersgd", "start_iter": 1})


def test_the_mlflow_parent_gets_the_spec_as_params_and_the_name_as_tag(tmp_path):
    from repro500.runner import track

    plan = _plan(tmp_path, {"name": "terngrad", "clip_sigmas": None})
    started = {}

    class Tracker:
        def start_parent(self, run_id, params, tags, start_ms=None):
            started.update(params=params, tags=tags, start_ms=start_ms)
            return "parent-1"

    fake = type("T", (), {"tracker": Tracker(), "_inherited": {}, "_contexts": {}})()
    track.Tracking._open(fake, plan, {}, "run-1", "tiny.yaml", str(tmp_path / "runs" / "run-1"), 1_700_000_000_000)
    params = started["params"]
    assert {k: v for k, v in params.items() if k.startswith("compressor.")} == {
        "compressor.name": "terngrad", "compressor.clip_sigmas": "null", "compressor.bucket_size": "4096",
        "compressor.seed": "null", "compressor.memory": "none"}
    assert params["fixed.model"] == "resnet20"  # the recipe's params are still there
    assert started["tags"]["repro500.compressor"] == "terngrad"
    assert started["tags"]["repro500.run_dir"] == str(tmp_path / "runs" / "run-1")
    assert started["start_ms"] == 1_700_000_000_000  # the run's start, not when the record lands


def test_powersgd_too_short_to_compress_is_said_before_training(tmp_path, capsys):
    # 256 samples / (32 per rank x 2 ranks) = 4 steps an epoch, 2 epochs: 8 steps
    _plan(tmp_path, {"name": "powersgd", "start_iter": 8})
    err = capsys.readouterr().err
    assert "powersgd compresses only after start_iter=8 steps, but a repeat runs at most 8" in err
    assert "no step will be compressed" in err and "--set compressor.start_iter=N" in err
    _plan(tmp_path, {"name": "powersgd", "start_iter": 7})
    assert "start_iter" not in capsys.readouterr().err


def test_a_horovod_engine_without_horovod_stops_before_the_run_directory(in_tmp):
    import sys

    write_recipe(in_tmp / "tiny.yaml")
    bare = in_tmp / "bin"  # a PATH with python and no horovodrun, as on a machine without Horovod
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    result = repro500("run", "tiny.yaml", "--set", "engine=horovod", "--nproc", "2", "--no-tracking",
                      "--run-id", "hvd", cwd=in_tmp, env={"PATH": str(bare)})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == ("repro500: error: engine horovod needs Horovod: build it with "
                                     "scripts/build_horovod.sh (see docs/distributed.md)")
    assert not (in_tmp / "runs").exists()


@pytest.mark.parametrize(("name", "message"), [
    ("powersgd", "the powersgd compressor works only with the ddp engine; choose another compressor for horovod."),
    ("bf16", "Horovod 0.28.1 cannot reduce bfloat16 tensors; use fp16 with horovod, or bf16 with the ddp engine."),
])
def test_a_compressor_the_engine_cannot_run_stops_before_the_run_directory(in_tmp, name, message):
    write_recipe(in_tmp / "tiny.yaml")
    result = repro500("run", "tiny.yaml", "--set", "engine=horovod", "--set", f"compressor={name}", "--nproc", "2",
                      "--no-tracking", cwd=in_tmp)
    assert (result.returncode, result.stderr.strip()) == (2, f"repro500: error: {message}")
    assert not (in_tmp / "runs").exists()


def _distributed(compressor) -> dict:
    return {"facets": {"distributed": {"engine": "ddp", "world_size": 2, "backend": "gloo",
                                       "compressor": compressor}}}


def test_diff_compares_a_bare_name_with_its_resolved_spec():
    old, new = _distributed("topk"), _distributed({"name": "topk", "ratio": 0.01, "memory": "residual"})
    assert diff_manifests(new, old) == []
    changed = diff_manifests(_distributed({"name": "topk", "ratio": 0.001, "memory": "residual"}), old)
    assert [(d.key, d.a, d.b) for d in changed] == [("compressor.ratio", 0.001, 0.01)]
    assert changed[0].impact >= 90
    seeded = diff_manifests(_distributed(specs.resolve("qsgd", seed_per_repeat=True)), _distributed("qsgd"))
    assert seeded == []  # both drew their seed per repeat
    # a name this version does not know is compared as it was recorded
    assert [(d.key, d.a, d.b) for d in diff_manifests(_distributed("zip"), _distributed("zap"))] == [
        ("compressor", "zip", "zap")]


@pytest.mark.slow
def test_a_run_records_the_spec_and_verifies_against_an_older_run(in_tmp):
    """Two real gloo ranks; an "older" copy of the run recording the bare name is no difference."""
    from mlflow.tracking import MlflowClient

    from repro500.capture.manifest import seal
    from repro500.rundir import sums as bundle

    write_recipe(in_tmp / "tiny.yaml", repeats=1, fixed__epochs=1)
    uri = f"sqlite:///{in_tmp / 'mlflow.db'}"
    result = repro500("run", "tiny.yaml", "--nproc", "2", "--set", "compressor=fp16", "--run-id", "new",
                      cwd=in_tmp, env={"MLFLOW_TRACKING_URI": uri}, timeout=600)
    assert result.returncode in (0, 1, 3), result.stderr  # 1, 3: the verdict (one repeat), not a failure
    new = in_tmp / "runs" / "new"
    spec = {"name": "fp16", "memory": "none"}
    manifest = json.loads((new / "manifest.json").read_text())
    assert manifest["facets"]["distributed"]["compressor"] == spec
    meta = json.loads((new / "run.json").read_text())
    assert meta["compressor"] == spec
    parent = MlflowClient(uri).get_run(meta["mlflow"]["parent_run_id"])
    assert (parent.data.params["compressor.name"], parent.data.params["compressor.memory"]) == ("fp16", "none")

    old = in_tmp / "runs" / "old"
    shutil.copytree(new, old)
    manifest["facets"]["distributed"]["compressor"] = "fp16"  # as older runs recorded it
    (old / "manifest.json").write_text(json.dumps(seal(manifest), indent=2))
    bundle.write_sums(old)
    diff = repro500("diff", "runs/new", "runs/old", "--json", cwd=in_tmp)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    assert not [d for d in json.loads(diff.stdout)["differences"] if d["facet"] == "distributed"]
    verify = repro500("verify", "runs/new", "--against", "runs/old", "--json", "--no-write", cwd=in_tmp)
    assert verify.returncode in (0, 1, 3), verify.stderr
    provenance = json.loads(verify.stdout)["provenance"]
    assert provenance["available"] and provenance["result_relevant"] == 0, provenance
    assert not [r for r in provenance["top"] if r["facet"] == "distributed"], provenance
