"""Someone's own experiment published and reproduced on a machine that has only the publication:
the experiment's source travels in the run, reproduce runs it only with --run-code, and the
provenance diff compares code by content (a reproduction is not a git work tree)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.runs import repro500, write_recipe

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
VENV_PATH = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}

SCRIPT = '''
import os
import random

random.seed(int(os.environ["REPRO500_SEED"]))
print(f"Acc@1 {90 + random.random() / 20:.4f}")
'''


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=cwd, check=True,
                   capture_output=True)


@pytest.mark.slow
def test_a_command_experiment_from_a_git_repository_publishes_and_reproduces_elsewhere(in_tmp):
    lab = in_tmp / "lab"
    lab.mkdir()
    (lab / "train.py").write_text(textwrap.dedent(SCRIPT))
    (lab / ".gitignore").write_text("runs/\n")
    write_recipe(lab / "exp.yaml", {
        "schema": "repro500/recipe/v1", "name": "lab",
        "fixed": {"command": [sys.executable, "train.py"]},
        "metrics": {"accuracy": {"regex": "Acc@1 ([0-9.]+)", "scale": 0.01}},
        "acceptance": {"accuracy": {"target": 0.9, "tolerance": 0.005}}, "repeats": 3, "seed": 4})
    _git(lab, "init", "-q")
    _git(lab, "add", ".")
    _git(lab, "commit", "-qm", "experiment")
    ran = repro500("run", "exp.yaml", "--no-tracking", "--run-id", "orig", cwd=lab)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    kept = json.loads((lab / "runs" / "orig" / "source.json").read_text())
    assert sorted(f["path"] for f in kept["files"]) == ["exp.yaml", "train.py"]  # hidden files never
    published = repro500("publish", str(lab / "runs" / "orig"), "--out", str(in_tmp / "pub"), cwd=in_tmp)
    assert published.returncode == 0, published.stderr
    shutil.rmtree(lab)  # the other machine has only the publication

    refused = repro500("reproduce", "pub", "--out", "again", cwd=in_tmp)
    assert refused.returncode == 2, refused.stderr
    assert "runs its own code (command: exp.yaml, train.py)" in refused.stderr
    assert "--run-code" in refused.stderr and not (in_tmp / "again" / "runs").exists()

    done = repro500("reproduce", "pub", "--out", "again", "--run-code", cwd=in_tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    verdict = json.loads((in_tmp / "again" / "verdict.json").read_text())
    assert verdict["status"] == "REPRODUCED"
    provenance = verdict["provenance"]
    assert provenance["result_relevant"] == 0, provenance["top"]
    assert not any(d["facet"] == "code" and d["impact"] >= 50 for d in provenance["top"])
    assert (in_tmp / "again" / "source" / "train.py").read_text() == textwrap.dedent(SCRIPT)


def test_the_same_code_by_content_is_not_different_code_but_an_edit_is():
    from repro500.verify.diff import diff_manifests, is_result_relevant

    def manifest(commit: str | None, tree: str) -> dict:
        code = {"in_repo": commit is not None, "commit": commit, "dirty": False}
        return {"facets": {"code": code, "experiment": {"source": {"tree_sha256": tree},
                                                        "repro500": {"version": "x", "source_sha256": "r"}}}}

    same = [d for d in diff_manifests(manifest("abc", "t1"), manifest(None, "t1")) if is_result_relevant(d)]
    assert same == []
    edited = [d for d in diff_manifests(manifest("abc", "t1"), manifest("abc", "t2")) if is_result_relevant(d)]
    assert [(d.facet, d.key) for d in edited] == [("experiment", "source.tree_sha256")]


@pytest.mark.slow
# mlflow_script: three minutes of CI's 2 cores (torch and mlflow imported in every repeat); the same
# path, a script logging its metrics to MLflow run, published and reproduced, is in CI through
# tests/test_reproduce_mlflow_metrics.py, so this one runs in make test-heavy
@pytest.mark.parametrize("example", ["print_metrics", pytest.param("mlflow_script", marks=pytest.mark.heavy)])
def test_an_example_runs_verifies_publishes_and_reproduces(in_tmp, example):
    work = in_tmp / example
    shutil.copytree(EXAMPLES / example, work)
    env = {**VENV_PATH, "MLFLOW_TRACKING_URI": f"sqlite:///{in_tmp / 'mlflow.db'}"}
    ran = repro500("run", "repro500.yaml", "-n", "2", "--run-id", "ex", "--set", "epochs=2", cwd=work, env=env,
                   timeout=900)
    assert ran.returncode in (0, 3), ran.stdout + ran.stderr
    assert repro500("verify", "runs/ex", cwd=work).returncode == ran.returncode
    assert repro500("publish", "runs/ex", "--out", str(in_tmp / "pub"), cwd=work).returncode == 0
    again = repro500("reproduce", "pub", "--out", "again", "--run-code", "--tracking", cwd=in_tmp, env=env, timeout=900)
    assert again.returncode in (0, 3), again.stdout + again.stderr
    provenance = json.loads((in_tmp / "again" / "verdict.json").read_text())["provenance"]
    assert provenance["result_relevant"] == 0, provenance["top"]


@pytest.mark.slow
def test_the_word_language_model_reproduces_sandboxed_to_the_verdict_it_reaches_unconfined(in_tmp):
    work = in_tmp / "wlm"
    shutil.copytree(EXAMPLES / "word_language_model", work)
    made = subprocess.run([sys.executable, "make_corpus.py", "--out", "data/corpus", "--tokens", "20000"], cwd=work,
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    # one epoch, two repeats: the example's whole path (its band is for four epochs: this run may FAIL it)
    ran = repro500("run", "repro500.yaml", "-n", "2", "--run-id", "w", "--no-tracking", "--set", "mutable.epochs=1",
                   cwd=work, env=VENV_PATH, timeout=900)
    assert ran.returncode in (0, 1, 3), ran.stdout + ran.stderr
    manifest = json.loads((work / "runs" / "w" / "manifest.json").read_text())
    assert "data/corpus" in json.dumps(manifest)  # the declared corpus, by digest
    assert repro500("publish", "runs/w", "--out", str(in_tmp / "pub"), cwd=work).returncode == 0
    verdicts = {}
    for out, flags in (("boxed", ()), ("open", ("--no-sandbox",))):
        done = repro500("reproduce", "pub", "--run-code", "--no-tracking", "--out", out, *flags, cwd=in_tmp,
                        env=VENV_PATH, timeout=900)
        assert done.returncode in (0, 3), done.stdout + done.stderr
        verdicts[out] = json.loads((in_tmp / out / "verdict.json").read_text())
        assert ("sandbox: bubblewrap" in done.stdout) == (out == "boxed"), done.stdout
    assert verdicts["boxed"]["status"] == verdicts["open"]["status"] == "REPRODUCED"
    boxed, unboxed = ({k: json.loads(next((in_tmp / out / "runs").glob(f"*/repeats/{k}/summary.json")).read_text())
                       ["metrics"]["test_ppl"] for k in (0, 1)} for out in ("boxed", "open"))
    assert boxed == unboxed  # the same seeds, threads and corpus: the same perplexities, confined or not


@pytest.mark.slow
def test_the_plugin_package_example_installs_and_trains_through_its_entry_point(in_tmp):
    site = in_tmp / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                                "--target", str(site), str(EXAMPLES / "plugin_pkg")], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr
    shutil.copy(EXAMPLES / "plugin_pkg" / "repro500.yaml", in_tmp / "plugin.yaml")
    for split, n in (("train", "512"), ("eval", "128")):
        made = repro500("data", "generate", "classification", "--out", f"data/plugin-{split}.h5", "--samples", n,
                        "--seed", "500", "--noise", "0.04", "--split", split, cwd=in_tmp)
        assert made.returncode == 0, made.stderr
    ran = repro500("run", "plugin.yaml", "--no-tracking", "-n", "2", "--run-id", "pl", cwd=in_tmp,
                   env={"PYTHONPATH": str(site)}, timeout=900)
    assert ran.returncode in (0, 1, 3), ran.stdout + ran.stderr
    manifest = json.loads((in_tmp / "runs" / "pl" / "manifest.json").read_text())
    assert manifest["facets"]["experiment"]["workload"]["plugins"] == {"repro500-example-plugin": "0.1.0"}
