"""A run directory's recipe.yaml reads back as exactly the recipe that ran, for every metric
source and every kind of recipe, while secrets stay out of it by value and by chosen name."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from helpers.runs import repro500

from repro500.recipe import load as recipes
from repro500.recipe.fields import recipe_yaml
from repro500.redact import REDACTED
from repro500.rundir import layout
from repro500.system.recipes import io_recipe
from repro500.workloads.command.adhoc import recipe_data
from repro500.workloads.command.metric_sources import SOURCES, MetricDecl

EXPERIMENTS = sorted((Path(__file__).resolve().parents[1] / "experiments").glob("*.yaml"))

# Every metric source with every field it takes; the JSON and MLPerf keys, and a metric name,
# look like secrets' names on purpose: they are the recipe's fields, not credentials.
DECLARATIONS = {
    "regex": {"regex": "api_key=([0-9.]+)", "stream": "stderr", "take": "max", "scale": 0.01},
    "json": {"source": "json", "key": "scores.f1", "take": "mean", "scale": 2.0},
    "json_secretish": {"source": "json", "key": "secret_token.value"},
    "mllog": {"source": "mllog", "key": "eval_accuracy", "file": "mlperf.log", "take": "last", "scale": 1.0},
    "mlflow": {"source": "mlflow", "key": "password_strength", "take": "min"},
    "auto": {"key": "access_key"},
    "shorthand": "mlflow",
    "token_f1": {},
}


def _written(recipe: recipes.Recipe, tmp_path: Path) -> recipes.Recipe:
    run = tmp_path / "run"
    run.mkdir()
    (run / layout.RECIPE).write_text(recipe_yaml(recipe.to_dict()))
    return recipes.from_run_dir(run)


def test_the_declarations_cover_every_metric_source():
    covered = {MetricDecl.parse(name, raw, where=name).source for name, raw in DECLARATIONS.items()}
    assert covered == set(SOURCES)


def test_every_metric_declaration_reads_back_from_the_run_directory(tmp_path):
    data = {"schema": "repro500/recipe/v1", "name": "mine",
            "fixed": {"workload": "command", "command": ["python", "s.py"], "timeout_s": 60},
            "mutable": {"lr": 0.1}, "metrics": DECLARATIONS,
            "acceptance": {name: {"target": 0.5, "direction": "higher", "tolerance": 0.1} for name in DECLARATIONS},
            "repeats": 2, "seed": 7}
    ran = recipes.from_data(data, "mine.yaml")
    back = _written(ran, tmp_path)
    assert back.to_dict() == ran.to_dict()
    assert back.metrics["json"]["key"] == "scores.f1" and back.metrics["auto"]["key"] == "access_key"


@pytest.mark.parametrize("metric", [
    "f1=json:scores.f1", "f1=json:api_key", "f1=mllog:eval_accuracy", "f1=mlflow:token_loss",
    "f1=regex:Acc@1 ([0-9.]+)", "f1", "f1=auto:secret",
])
def test_an_adhoc_recipe_reads_back_whatever_its_metric_source(tmp_path, metric):
    ran = recipes.from_data(recipe_data(["python", "s.py"], metrics=[metric], accept=["f1>=0.8±0.01"],
                                        scales={"f1": 0.01}), "--command")
    assert _written(ran, tmp_path).to_dict() == ran.to_dict()


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_every_trained_recipe_reads_back(tmp_path, path):
    ran = recipes.load(path)
    assert _written(ran, tmp_path).to_dict() == ran.to_dict()


def test_a_system_recipe_reads_back(tmp_path):
    ran = recipes.from_data(io_recipe({}, {}), "io")
    assert ran.kind == "system"
    assert _written(ran, tmp_path).to_dict() == ran.to_dict()


def test_secrets_stay_out_by_value_and_by_the_names_a_user_chose(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "s3cr3t-value-4242")
    data = {"schema": "repro500/recipe/v1", "name": "mine",
            "fixed": {"workload": "command", "command": ["python", "s.py", "{mutable.note}"],
                      "env": {"WANDB_API_KEY": "hunter2-is-it", "OMP_NUM_THREADS": "1"}},
            "mutable": {"note": "x", "api_key": "plain-literal-secret"},
            "metrics": {"f1": {"source": "json", "key": "scores.f1"}},
            "acceptance": {"f1": {"target": 0.8, "direction": "higher", "tolerance": 0.01}}}
    ran = recipes.from_data(data, "mine.yaml", overrides=["note=s3cr3t-value-4242"])
    text = recipe_yaml(ran.to_dict())
    assert "s3cr3t-value-4242" not in text and "hunter2-is-it" not in text and "plain-literal-secret" not in text
    written = yaml.safe_load(text)
    assert written["mutable"]["note"] == REDACTED  # a --set holding a secret's value, by value
    assert written["overrides"] == {"mutable.note": REDACTED}
    assert written["mutable"]["api_key"] == REDACTED  # a command's own key: a chosen name
    assert written["fixed"]["env"] == {"WANDB_API_KEY": REDACTED, "OMP_NUM_THREADS": "1"}
    assert written["metrics"] == {"f1": {"source": "json", "key": "scores.f1"}}  # a schema field: kept


def test_a_url_with_credentials_in_a_recipe_keeps_its_host_only():
    data = {"schema": "repro500/recipe/v1", "name": "mine",
            "fixed": {"workload": "command", "command": ["python", "s.py", "https://bob:pa55word@example.org/d"]},
            "metrics": {"f1": {"source": "json", "key": "f1"}},
            "acceptance": {"f1": {"target": 0.8}}}
    text = recipe_yaml(recipes.from_data(data, "mine.yaml").to_dict())
    assert "pa55word" not in text and "example.org/d" in text


SCRIPT = """
import json, os, pathlib, sys
repeat = int(os.environ["REPRO500_REPEAT"])
mark = pathlib.Path(os.environ["FAIL_MARK"])
if repeat == 1 and not mark.exists():
    mark.write_text("failed once")
    sys.exit("boom: repeat 1 fails the first time")
with open(os.environ["REPRO500_METRICS"], "w") as fh:
    json.dump({"scores": {"f1": 0.85}}, fh)
print(':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": "eval_accuracy", '
      '"value": 0.91, "metadata": {"file": "s.py", "lineno": 1}}')
print("Acc@1 93.3")
"""


def test_a_json_metric_command_runs_and_resumes_from_its_own_recipe(in_tmp):
    (in_tmp / "s.py").write_text(textwrap.dedent(SCRIPT))
    env = {"FAIL_MARK": str(in_tmp / "failed-once")}
    first = repro500("run", "--no-tracking", "--run-id", "j", "-n", "2", "--command",
                     "--metric", "f1=json:scores.f1", "--metric", "acc=mllog:eval_accuracy",
                     "--metric", "top1=regex:Acc@1 ([0-9.]+)", "--scale", "top1=0.01",
                     "--accept", "f1>=0.8±0.01", "--", sys.executable, "s.py", cwd=in_tmp, env=env)
    assert first.returncode == 5 and "boom" in first.stderr, first.stdout + first.stderr
    run = in_tmp / "runs" / "j"
    written = yaml.safe_load((run / "recipe.yaml").read_text())
    assert written["metrics"] == {"f1": {"source": "json", "key": "scores.f1"},
                                  "acc": {"source": "mllog", "key": "eval_accuracy"},
                                  "top1": {"regex": "Acc@1 ([0-9.]+)", "scale": 0.01}}
    second = repro500("run", "--resume", str(run), cwd=in_tmp, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["repeats"] == {"0": "completed", "1": "completed"}
    for k in ("0", "1"):
        metrics = json.loads((run / "repeats" / k / "summary.json").read_text())["metrics"]
        assert metrics["f1"] == 0.85 and metrics["acc"] == 0.91 and metrics["top1"] == pytest.approx(0.933)
