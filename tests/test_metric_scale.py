"""``--scale NAME=FACTOR`` on the command line, for every metric source, and the warning when a
measured value is off the scale of its acceptance band (a percentage against fractions)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from helpers.runs import repro500

from repro500.errors import UsageError
from repro500.workloads.command.adhoc import recipe_data
from repro500.workloads.command.metric_sources import (
    MetricDecl,
    implausible,
    read_json,
    read_mllog,
    read_regex,
)

ACCEPT = ["accuracy>=0.9±0.02"]


@pytest.mark.parametrize(("metric", "source"), [
    ("accuracy=regex:Acc@1 ([0-9.]+)", "regex"), ("accuracy=json:scores.acc", "json"),
    ("accuracy=mllog:eval_accuracy", "mllog"), ("accuracy=mlflow:val_acc", "mlflow"), ("accuracy", "auto"),
])
def test_a_scale_from_the_command_line_goes_into_the_declaration_of_every_source(metric, source):
    data = recipe_data(["python", "s.py"], metrics=[metric], accept=ACCEPT, scales={"accuracy": 0.01})
    decl = MetricDecl.parse("accuracy", data["metrics"]["accuracy"], where="--metric")
    assert decl.source == source and decl.scale == 0.01


def test_a_scale_for_a_metric_no_metric_option_declares_is_a_usage_error():
    with pytest.raises(UsageError, match=r"--scale acc=0.01: no --metric declares 'acc'"):
        recipe_data(["python", "s.py"], metrics=["accuracy=json"], accept=ACCEPT, scales={"acc": 0.01})


def test_the_scale_multiplies_what_each_source_read(tmp_path):
    lines = ["Acc@1 93.3"]
    assert read_regex(MetricDecl("a", source="regex", regex=r"Acc@1 ([0-9.]+)", scale=0.01), lines) == pytest.approx(0.933)
    assert read_json(MetricDecl("a", source="json", key="s.a", scale=0.01), {"s": {"a": 93.3}},
                     tmp_path / "m.json") == pytest.approx(0.933)
    mllog = [':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": "eval_accuracy", '
             '"value": 93.3, "metadata": {"file": "s.py", "lineno": 1}}']
    assert read_mllog(MetricDecl("a", source="mllog", key="eval_accuracy", scale=0.01), mllog,
                      "stdout") == pytest.approx(0.933)


@pytest.mark.parametrize(("value", "band", "warned"), [
    (93.3, {"target": 0.9, "direction": "higher", "tolerance": 0.02}, True),
    (24.5, {"target": 0.25, "direction": "lower", "tolerance": 0.0}, True),
    (1.2, {"target": 0.9, "direction": "higher", "tolerance": 0.02}, False),  # above 1, not a percentage
    (0.93, {"target": 0.9, "direction": "higher", "tolerance": 0.02}, False),
    (93.3, {"target": 90.0, "direction": "higher", "tolerance": 2.0}, False),  # a band of percentages
    (2500.0, {"target": 1000.0, "direction": "higher", "tolerance": 0.0}, False),
])
def test_a_value_off_its_bands_scale_is_named(value, band, warned):
    sentence = implausible("accuracy", value, band)
    assert bool(sentence) is warned
    if warned:
        assert "--scale accuracy=0.01" in sentence and f"{value:g}" in sentence


@pytest.mark.parametrize(("args", "message"), [
    (["--scale", "accuracy=abc"], "'abc' is not a number"),
    (["--scale", "accuracy=0"], "other than 0"),
    (["--scale", "accuracy"], "is not METRIC=FACTOR"),
    (["--scale", "top5=0.01"], "no --metric declares 'top5'"),
])
def test_a_bad_scale_is_one_line_exit_2_before_anything_is_written(in_tmp, args, message):
    result = repro500("run", "--no-tracking", "--command", "--metric", "accuracy=regex:Acc@1 ([0-9.]+)",
                      "--accept", ACCEPT[0], *args, "--", sys.executable, "s.py", cwd=in_tmp)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (in_tmp / "runs").exists()


def test_scale_goes_with_command(in_tmp):
    result = repro500("run", "x.yaml", "--scale", "accuracy=0.01", cwd=in_tmp)
    assert result.returncode == 2 and "--scale goes with --command" in result.stderr, result.stderr


def _run(cwd: Path, run_id: str, *extra: str):
    (cwd / "s.py").write_text("print('Acc@1 93.3')\n")  # as torchvision's reference prints it
    return repro500("run", "--no-tracking", "--run-id", run_id, "-n", "2", "--command",
                    "--metric", "accuracy=regex:Acc@1 ([0-9.]+)", *extra, "--accept", ACCEPT[0],
                    "--", sys.executable, "s.py", cwd=cwd)


def test_the_readme_example_scales_a_printed_percentage_and_warns_without_it(in_tmp):
    scaled = _run(in_tmp, "scaled", "--scale", "accuracy=0.01")
    assert scaled.returncode == 0, scaled.stdout + scaled.stderr
    assert "warning" not in scaled.stderr
    run = in_tmp / "runs" / "scaled"
    assert yaml.safe_load((run / "recipe.yaml").read_text())["metrics"] == {
        "accuracy": {"regex": "Acc@1 ([0-9.]+)", "scale": 0.01}}
    values = json.loads((run / "summary.json").read_text())["metrics"]["accuracy"]["values"]
    assert values == pytest.approx([0.933, 0.933])

    unscaled = _run(in_tmp, "unscaled")
    warnings = [line for line in unscaled.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, unscaled.stderr  # once a run, not once a repeat
    assert "metric accuracy measured 93.3" in warnings[0] and "--scale accuracy=0.01" in warnings[0]
