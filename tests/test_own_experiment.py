"""A researcher's own experiment through the chain: plug-ins (import path and entry point) in
the built-in trainer, and commands (recipe and ad-hoc), run -> verify, resume, bad input."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from helpers.runs import PLUGIN, plugin_recipe, repro500, write_recipe


@pytest.mark.slow
def test_a_plugin_model_dataset_and_evaluator_train_and_verify(in_tmp):
    plugin_recipe(in_tmp)
    result = repro500("run", "mine.yaml", "--no-tracking", "--run-id", "p", cwd=in_tmp)
    assert result.returncode in (0, 3), result.stdout + result.stderr
    run = in_tmp / "runs" / "p"
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["repeats"].values()) == {"completed"}
    assert len(summary["metrics"]["balanced_hits"]["values"]) == 2
    manifest = json.loads((run / "manifest.json").read_text())
    experiment = manifest["facets"]["experiment"]
    assert experiment["workload"]["model"] == "mylab.nets:build"
    imported = [Path(e["path"]).name for e in experiment["imported_sources"]]
    assert "nets.py" in imported and all(e["sha256"] for e in experiment["imported_sources"])
    assert not [e for e in experiment["imported_sources"]  # the console script is never the experiment's
                if Path(e["path"]).name == "repro500" or Path(e["path"]).is_relative_to(sys.prefix)]
    assert (run / "source" / "mylab" / "nets.py").read_text() == PLUGIN
    again = repro500("verify", str(run), cwd=in_tmp)
    assert again.returncode == result.returncode, again.stdout


@pytest.mark.parametrize(("change", "message", "code"), [
    ({"fixed__model": "mylab.nope:build"}, "fixed.model: cannot import 'mylab.nope'", 4),
    ({"fixed__model": "mylab.nets:missing"}, "fixed.model: module 'mylab.nets' has no attribute 'missing'", 4),
    ({"fixed__model": "mylab.nets:not_a_model", "fixed__model_options": {}}, "returned a str, not a torch.nn.Module", 4),
    ({"fixed__model": "mylab.nets:broken", "fixed__model_options": {}}, "raised RuntimeError: width must be even", 4),
    ({"fixed__dataset": {"entry": "mylab.nets:nothing"}}, "fixed.dataset.entry: module 'mylab.nets' has no attribute", 4),
    ({"fixed__evaluate": "mylab.nets:build"}, "fixed.evaluate: 'mylab.nets:build' returned a Sequential", 4),
    ({"fixed__model": "resnet2O"}, "unknown model 'resnet2O'", 4),
    # an option the model does not take is a usage error (docs/workloads.md), as with a built-in model
    ({"fixed__model_options": {"depth": 3}}, "has no option 'depth'", 2),
])
def test_a_broken_plugin_is_one_line_before_anything_is_written(in_tmp, change, message, code):
    plugin_recipe(in_tmp, **change)
    result = repro500("run", "mine.yaml", "--no-tracking", cwd=in_tmp)
    assert result.returncode == code, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (in_tmp / "runs").exists()


@pytest.mark.slow
def test_a_model_registered_through_an_entry_point_is_found_by_name(in_tmp):
    site = in_tmp / "site"
    (site / "labnets").mkdir(parents=True)
    (site / "labnets" / "__init__.py").write_text(PLUGIN)
    info = site / "labnets-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: labnets\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[repro500.models]\nlab_mlp = labnets:build\n\n"
                                           "[repro500.datasets]\nlab_blobs = labnets:make\n")
    plugin_recipe(in_tmp, fixed__model="lab_mlp", fixed__dataset={"name": "lab_blobs", "params": {"samples": 64}},
                  fixed__evaluate=None, fixed__target={"metric": "accuracy", "value": 0.999},
                  acceptance={"accuracy": {"target": 0.5}}, repeats=1)
    result = repro500("run", "mine.yaml", "--no-tracking", "--run-id", "e", cwd=in_tmp, env={"PYTHONPATH": str(site)})
    assert result.returncode in (0, 3), result.stderr
    done = json.loads((in_tmp / "runs" / "e" / "repeats" / "0" / "summary.json").read_text())
    assert done["status"] == "completed" and done["metrics"]["accuracy"] is not None


SCRIPT = '''
import os, sys
seed = int(os.environ["REPRO500_SEED"])
lr = float(sys.argv[sys.argv.index("--lr") + 1])
fail_once = os.environ.get("FAIL_MARK")
if fail_once and os.environ["REPRO500_REPEAT"] == "1" and not os.path.exists(fail_once):
    open(fail_once, "w").close()
    sys.exit("boom: out of disk")
print(f"epoch 1 Acc@1 {80 + seed % 7 + lr:.2f}")
print(f"epoch 2 Acc@1 {90 + seed % 5 + lr:.2f}")
'''


def command_recipe(tmp: Path, **changes: object) -> Path:
    (tmp / "train.py").write_text(textwrap.dedent(SCRIPT))
    import sys

    recipe = {
        "schema": "repro500/recipe/v1", "name": "script",
        "fixed": {"command": [sys.executable, "train.py", "--lr", "{mutable.lr}", "--seed", "{seed}"]},
        "mutable": {"lr": 0.5},
        "metrics": {"accuracy": {"regex": "Acc@1 ([0-9.]+)", "take": "last", "scale": 0.01}},
        "acceptance": {"accuracy": {"target": 0.9, "tolerance": 0.01}},
        "repeats": 3, "seed": 2,
    }
    return write_recipe(tmp / "script.yaml", recipe, **changes)


@pytest.mark.slow
def test_a_command_recipe_runs_with_placeholders_set_values_and_verifies(in_tmp):
    command_recipe(in_tmp)
    result = repro500("run", "script.yaml", "--no-tracking", "--run-id", "c", "--set", "lr=0.25", cwd=in_tmp)
    assert result.returncode == 0, result.stdout + result.stderr
    run = in_tmp / "runs" / "c"
    first = json.loads((run / "repeats" / "0" / "summary.json").read_text())
    assert first["command"][2:4] == ["--lr", "0.25"] and first["metric_sources"]["accuracy"] == "regex:stdout"
    assert (run / "repeats" / "0" / "stdout.txt").read_text().count("Acc@1") == 2
    values = json.loads((run / "summary.json").read_text())["metrics"]["accuracy"]["values"]
    assert all(0.9 <= v <= 0.96 for v in values) and len(values) == 3
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    assert recipe["mutable"]["lr"] == 0.25 and recipe["metrics"]["accuracy"]["scale"] == 0.01
    # the experiment's source travels with the run, sealed (not the run directories beside it)
    kept = json.loads((run / "source.json").read_text())
    assert [f["path"] for f in kept["files"]] == ["script.yaml", "train.py"] and kept["complete"]
    assert (run / "source" / "train.py").read_text() == (in_tmp / "train.py").read_text()
    assert "source/train.py" in (run / "SHA256SUMS").read_text()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["facets"]["experiment"]["source"]["tree_sha256"] == kept["tree_sha256"]
    assert repro500("verify", str(run), cwd=in_tmp).returncode == 0
    # not a terminal: a plain line per repeat, and the command's own output shown live
    assert "repeat 2 (3 of 3): completed" in result.stdout and "epoch 2 Acc@1" in result.stdout
    report = repro500("report", str(run), "--out", str(in_tmp / "c.html"), cwd=in_tmp)
    assert report.returncode == 0 and "accuracy" in (in_tmp / "c.html").read_text(), report.stderr


def test_a_failed_command_keeps_finished_repeats_and_resume_completes_it(in_tmp):
    command_recipe(in_tmp)
    env = {"FAIL_MARK": str(in_tmp / "failed-once")}
    first = repro500("run", "script.yaml", "--no-tracking", "--run-id", "r", cwd=in_tmp, env=env)
    assert first.returncode == 5, first.stderr
    assert "repeat 1 failed: " in first.stderr and "boom: out of disk" in first.stderr
    assert "Traceback" not in first.stderr
    run = in_tmp / "runs" / "r"
    kept = (run / "repeats" / "0" / "summary.json").read_bytes()
    second = repro500("run", "--resume", str(run), cwd=in_tmp, env=env)  # an untracked run resumes untracked
    assert second.returncode == 0, second.stdout + second.stderr
    assert not (in_tmp / "mlflow.db").exists() and json.loads((run / "run.json").read_text())["mlflow"] is None
    assert (run / "repeats" / "0" / "summary.json").read_bytes() == kept
    statuses = json.loads((run / "summary.json").read_text())["repeats"]
    assert statuses == {"0": "completed", "1": "completed", "2": "completed"}
    sums = (run / "SHA256SUMS").read_bytes()
    third = repro500("run", "--resume", str(run), "--no-tracking", cwd=in_tmp)
    assert third.returncode == 2 and "already complete" in third.stderr
    assert (run / "SHA256SUMS").read_bytes() == sums


def test_adhoc_command_writes_its_recipe_and_a_missing_metric_is_a_failed_repeat(in_tmp):
    import sys

    (in_tmp / "train.py").write_text(textwrap.dedent(SCRIPT))
    ok = repro500("run", "--no-tracking", "--run-id", "a", "-n", "2", "--command",
                  "--metric", "accuracy=regex:Acc@1 ([0-9.]+)", "--accept", "accuracy>=85±1",
                  "--", sys.executable, "train.py", "--lr", "0.1", cwd=in_tmp)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    written = yaml.safe_load((in_tmp / "runs" / "a" / "recipe.yaml").read_text())
    assert written["fixed"]["command"][1:] == ["train.py", "--lr", "0.1"]
    assert written["metrics"] == {"accuracy": {"regex": "Acc@1 ([0-9.]+)"}}
    assert written["acceptance"]["accuracy"] == {"target": 85.0, "direction": "higher", "tolerance": 1.0}
    missing = repro500("run", "--no-tracking", "--run-id", "m", "-n", "2", "--command",
                       "--metric", "accuracy=regex:Top1 ([0-9.]+)", "--accept", "accuracy>=85",
                       "--", sys.executable, "train.py", "--lr", "0.1", cwd=in_tmp)
    assert missing.returncode == 5 and "Traceback" not in missing.stderr
    assert "no line of stdout matched" in missing.stderr, missing.stderr


# options that do not make sense are usage errors (2); a program that is not there is invalid input (4)
@pytest.mark.parametrize(("args", "message", "code"), [
    (["--command", "--metric", "acc=regex:x([0-9]+)", "--accept", "acc>=1", "--", "no-such-program-x"], "was not found", 4),
    (["--command", "--accept", "acc>=1", "--", "true"], "at least one --metric", 2),
    (["--command", "--metric", "acc=regex:x([0-9]+)", "--", "true"], "at least one --accept", 2),
    (["--command", "--metric", "acc=regex:x([0-9]+)", "--accept", "acc=>1", "--", "true"], "--accept 'acc=>1'", 2),
    (["--metric", "acc=mlflow", "script.yaml"], "--metric go", 2),
])
def test_adhoc_mistakes_are_one_line_before_anything_is_written(in_tmp, args, message, code):
    command_recipe(in_tmp)
    result = repro500("run", "--no-tracking", *args, cwd=in_tmp)
    assert result.returncode == code, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (in_tmp / "runs").exists()


def _h5_recipe(tmp: Path, eval_split: str) -> Path:
    for split, name in (("train", "train.h5"), (eval_split, "eval.h5")):
        made = repro500("data", "generate", "classification", "--out", name, "--samples", "64", "--seed", "1",
                        "--size", "16x16", "--split", split, "--force", cwd=tmp)
        assert made.returncode == 0, made.stderr
    return write_recipe(tmp / "h5.yaml", fixed__dataset={"name": "classification-h5", "path": "train.h5",
                                                         "eval_path": "eval.h5"})


@pytest.mark.slow
def test_mistakes_in_data_or_options_are_caught_before_the_run_directory_exists(in_tmp):
    import h5py

    _h5_recipe(in_tmp, "train")
    same = repro500("run", "h5.yaml", "--no-tracking", cwd=in_tmp)
    assert same.returncode == 4 and "eval.h5 holds training data" in same.stderr, same.stderr
    for out, split in (("cosmo.h5", "train"), ("cosmo-eval.h5", "eval")):
        made = repro500("data", "generate", "cosmo", "--out", out, "--samples", "4", "--size", "16", "--seed", "2",
                        "--split", split, cwd=in_tmp)
        assert made.returncode == 0, made.stderr
    with h5py.File(in_tmp / "cosmo.h5", "r+") as f:
        f["unitPar"][3, 1] = float("nan")
    from helpers.runs import COSMO

    write_recipe(in_tmp / "cosmo.yaml", COSMO)
    nan = repro500("run", "cosmo.yaml", "--no-tracking", cwd=in_tmp)
    assert nan.returncode == 4 and "NaN" in nan.stderr and "repro500 data check" in nan.stderr, nan.stderr
    option = repro500("run", "tiny.yaml", "--no-tracking", "--open-division", "--set", "fixed.model_options.note=X",
                      cwd=write_recipe(in_tmp / "tiny.yaml").parent)
    assert option.returncode == 2 and option.stderr.startswith("repro500: error: --set fixed.model_options.note=X"), option.stderr
    assert not (in_tmp / "runs").exists()


def test_a_signed_command_run_verifies_with_trust_and_its_chain_catches_a_dropped_repeat(in_tmp):
    import shutil

    from helpers.keys import make_key, trust_line, write_trust

    command_recipe(in_tmp)
    key = make_key(in_tmp, "lab")
    result = repro500("run", "script.yaml", "--no-tracking", "--run-id", "s", "--sign-key", str(key),
                      "--sign-principal", "lab@example.org", cwd=in_tmp)
    assert result.returncode == 0, result.stdout + result.stderr
    run = in_tmp / "runs" / "s"
    assert (run / "attestation.intoto.jsonl").is_file() and (run / "chain.jsonl").is_file()
    trust = write_trust(in_tmp, trust_line(key, "lab@example.org"))
    assert repro500("verify", str(run), "--trust", str(trust), cwd=in_tmp).returncode == 0
    shutil.rmtree(run / "repeats" / "2")
    summary = json.loads((run / "summary.json").read_text())
    summary["repeats"].pop("2")
    (run / "summary.json").write_text(json.dumps(summary))
    from repro500.rundir.sums import write_sums

    write_sums(run)
    dropped = repro500("verify", str(run), cwd=in_tmp)
    assert dropped.returncode == 4 and "repeat 2" in dropped.stdout + dropped.stderr


def test_a_command_given_as_one_string_is_split_like_a_shell_and_trained_keys_are_refused():
    from repro500.errors import InvalidInput
    from repro500.recipe import load as recipes

    base = {"fixed": {"command": "python train.py --name 'two words'"}, "metrics": {"acc": {"regex": "a ([0-9]+)"}},
            "acceptance": {"acc": {"target": 1}}}
    recipe = recipes.from_data(base, "r.yaml")
    assert recipe.is_command and recipe.fixed["command"] == ["python", "train.py", "--name", "two words"]
    with pytest.raises(InvalidInput, match="fixed.model belongs to a trained workload"):
        recipes.from_data({**base, "fixed": {**base["fixed"], "model": "resnet20"}}, "r.yaml")
    with pytest.raises(InvalidInput, match="must declare its metrics"):
        recipes.from_data({k: v for k, v in base.items() if k != "metrics"}, "r.yaml")
