"""Reading a wrapped command's declared metrics: each source, take/scale, the auto order."""

from __future__ import annotations

import json
import math
import re

import pytest
from helpers.stores import mlflow_store

from repro500.errors import InvalidInput
from repro500.workloads.command import metric_sources as ms
from repro500.workloads.command.metric_sources import (
    MetricDecl,
    MetricMissing,
    Produced,
    read_metric,
)


def decl(name="accuracy", raw=None):
    return MetricDecl.parse(name, raw, where=f"r.yaml: metrics.{name}")


def mllog(key, value, time_ms, prefix=""):
    record = {"namespace": "", "time_ms": time_ms, "event_type": "POINT_IN_TIME", "key": key,
              "value": value, "metadata": {"epoch_num": 1}}
    return f"{prefix}:::MLLOG {json.dumps(record)}"


# ----- declarations ---------------------------------------------------------------------------
def test_declaration_defaults_and_source_inference():
    assert decl(raw=None).source == "auto"
    assert decl(raw="mlflow").source == "mlflow"
    d = decl(raw={"regex": r"Acc@1 ([0-9.]+)", "scale": 0.01})
    assert (d.source, d.take, d.scale, d.label()) == ("regex", "last", 0.01, "regex:stdout")
    assert decl(raw={"regex": "x=(?P<value>\\d+) y=(\\d+)", "stream": "stderr"}).label() == "regex:stderr"
    assert decl("f1", {"source": "json", "key": "scores.f1"}).lookup == "scores.f1"


@pytest.mark.parametrize(("raw", "needle"), [
    ({"take": "median"}, "take must be one of last, first, max, min, mean, not 'median'"),
    ({"scale": "x"}, "scale must be a finite number"),
    ({"scale": True}, "scale must be a finite number"),
    ({"regex": "Acc@1 [0-9.]+"}, "has 0 groups; it needs exactly one group"),
    ({"regex": "(a)(b)"}, "has 2 groups"),
    ({"regex": "(unclosed"}, "does not compile"),
    ({"source": "regex"}, "source regex needs a regex key"),
    ({"source": "mlflow", "regex": "(x)"}, "drop either regex or source: mlflow"),
    ({"source": "tensorboard"}, "source must be one of mlflow, mllog, regex, json"),
    ({"sauce": "json"}, "unknown key 'sauce'"),
    ({"source": "json", "stream": "stderr"}, "stream is stdout or stderr, and only goes with a regex"),
    ({"source": "json", "file": "x.log"}, "file names an MLPerf log file"),
    (["regex"], "expected a mapping"),
])
def test_bad_declarations_are_one_sentence_naming_the_key(raw, needle):
    with pytest.raises(InvalidInput) as err:
        decl(raw=raw)
    text = str(err.value)
    assert text.startswith("r.yaml: metrics.accuracy: ") and needle in text and "\n" not in text


# ----- regex ----------------------------------------------------------------------------------
def test_regex_take_and_scale():
    lines = ["epoch 1 Acc@1 90.0", "noise", "epoch 2 Acc@1 93.5 Acc@1 91.0", "Acc@1 92.0"]
    values = {take: ms.read_regex(decl(raw={"regex": r"Acc@1 ([0-9.]+)", "take": take}), lines)
              for take in ms.TAKES}
    assert values == {"last": 92.0, "first": 90.0, "max": 93.5, "min": 90.0, "mean": pytest.approx(91.625)}
    scaled = ms.read_regex(decl(raw={"regex": r"Acc@1 ([0-9.]+)", "scale": 0.01}), lines)
    assert scaled == pytest.approx(0.92)


def test_regex_named_group_and_exponents():
    d = decl(raw={"regex": r"step (\d+) loss=(?P<value>\S+)"})
    assert ms.read_regex(d, ["step 1 loss=1e-3", "step 2 loss=2.5E-4"]) == pytest.approx(2.5e-4)


def test_regex_without_match_names_the_stream_and_pattern():
    with pytest.raises(MetricMissing, match=re.escape("metric accuracy: no line of stdout matched regex 'Acc@1 ([0-9.]+)'")):
        ms.read_regex(decl(raw={"regex": r"Acc@1 ([0-9.]+)"}), ["Acc@5 99"])


def test_regex_capturing_a_non_number_says_so():
    with pytest.raises(MetricMissing, match="matched 'n/a' on stdout, which is not a number"):
        ms.read_regex(decl(raw={"regex": r"Acc@1 (\S+)"}), ["Acc@1 n/a"])


def test_regex_nan_is_read_as_nan_not_zero():
    assert math.isnan(ms.read_regex(decl(raw={"regex": r"Acc@1 (\S+)"}), ["Acc@1 nan"]))


# ----- MLLOG ----------------------------------------------------------------------------------
def test_mllog_values_in_time_order_with_launcher_prefixes_and_junk():
    lines = [
        mllog("eval_accuracy", 0.7, 300),
        "[1,0]<stdout>:" + mllog("eval_accuracy", 0.5, 100),
        ":::MLLOG {not json",
        ':::MLLOG {"time_ms": 5, "key": "eval_accuracy", "value": 0.1}',  # no metadata: skipped
        mllog("eval_accuracy", {"nested": 1}, 150),  # not a number: skipped
        mllog("train_loss", 2.0, 200),
        "plain text",
    ]
    assert ms.mllog_values(lines, "eval_accuracy") == [0.5, 0.7]
    assert ms.read_mllog(decl("eval_accuracy", {"source": "mllog", "take": "first"}), lines, "stdout") == 0.5


def test_mllog_missing_key_names_it():
    with pytest.raises(MetricMissing, match="no :::MLLOG line in stdout or stderr has key 'eval_error'"):
        ms.read_mllog(decl("eval_error", {"source": "mllog"}), [mllog("eval_accuracy", 1, 1)], "stdout or stderr")


# ----- JSON file ------------------------------------------------------------------------------
def test_json_dotted_keys_lists_and_missing(tmp_path):
    path = tmp_path / "metrics.json"
    data = {"scores": {"f1": 0.8}, "a.b": 3, "curve": [1, 4, 2], "name": "x"}
    assert ms.read_json(decl("f1", {"source": "json", "key": "scores.f1"}), data, path) == 0.8
    assert ms.read_json(decl("ab", {"source": "json", "key": "a.b"}), data, path) == 3
    assert ms.read_json(decl("curve", {"source": "json", "take": "max"}), data, path) == 4
    with pytest.raises(MetricMissing, match=r"has no key 'scores.f2'"):
        ms.read_json(decl("f2", {"source": "json", "key": "scores.f2"}), data, path)
    with pytest.raises(MetricMissing, match="is not a number"):
        ms.read_json(decl("name", {"source": "json"}), data, path)


def test_json_file_not_written_or_corrupt(tmp_path):
    path = tmp_path / "metrics.json"
    with pytest.raises(MetricMissing, match=re.escape(f"$REPRO500_METRICS ({path}) was not written")):
        ms.load_json_file(path)
    path.write_text('{"f1": 0.5,')
    with pytest.raises(MetricMissing, match="is not valid JSON"):
        ms.load_json_file(path)
    path.write_text("[1]")
    with pytest.raises(MetricMissing, match="holds a JSON list, not an object"):
        ms.load_json_file(path)
    path.write_text('{"param_digest": "ab12", "f1": NaN}')
    data = ms.load_json_file(path)
    assert ms.json_param_digest(data) == "ab12"
    assert math.isnan(ms.read_json(decl("f1", {"source": "json"}), data, path))


# ----- MLflow (no subprocess: the test logs as a script's runs are tagged) -------------------------
@pytest.fixture
def mlflow_run(tmp_path):
    """A store with two runs a script started in repeat 0 of run "r" (the later one logs loss) and
    one of repro500's own (untagged as a script's, so never read)."""
    from mlflow.tracking import MlflowClient

    uri = mlflow_store(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    experiment = client.create_experiment("t")
    tags = {"repro500.run_id": "r", "repro500.repeat": "0", "repro500.script": "true"}
    first = client.create_run(experiment, tags=tags, start_time=1000).info.run_id
    client.log_metric(first, "loss", 5.0, step=0)
    client.log_metric(first, "warmup", 1.0, step=0)
    run_id = client.create_run(experiment, tags=tags, start_time=2000).info.run_id
    for step, value in enumerate([0.9, 0.4, 0.6]):
        client.log_metric(run_id, "loss", value, step=step)
    own = client.create_run(experiment, tags={"repro500.run_id": "r", "repro500.repeat": "0"}).info.run_id
    client.log_metric(own, "loss", 99.0)
    return ms.ScriptRuns(uri, "r", 0)


def test_mlflow_reads_the_last_started_script_run_that_logged_the_metric(mlflow_run):
    runs = ms.script_run_metrics(mlflow_run)
    assert [latest for _, latest in runs] == [{"loss": 5.0, "warmup": 1.0}, {"loss": 0.6}]
    uri = mlflow_run.uri
    assert ms.read_mlflow(decl("loss", {"source": "mlflow"}), uri, runs) == 0.6
    assert ms.read_mlflow(decl("loss", {"source": "mlflow", "take": "min"}), uri, runs) == 0.4
    assert ms.read_mlflow(decl("best", {"source": "mlflow", "key": "loss", "take": "max"}), uri, runs) == 0.9
    assert ms.read_mlflow(decl("warmup", {"source": "mlflow"}), uri, runs) == 1.0  # only the first run has it
    with pytest.raises(MetricMissing, match="none of the 2 MLflow run.s. the script started in this repeat logged 'accuracy'"):
        ms.read_mlflow(decl("accuracy", {"source": "mlflow"}), uri, runs)
    other = ms.script_run_metrics(ms.ScriptRuns(uri, "r", 1))  # another repeat's runs are not this one's
    assert other == []


# ----- the auto order, through Produced ----------------------------------------------------------
def produced(tmp_path, *, stdout="", metrics=None, mlflow=None):
    (tmp_path / "stdout.txt").write_text(stdout)
    (tmp_path / "stderr.txt").write_text("")
    if metrics is not None:
        (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    return Produced(stdout=tmp_path / "stdout.txt", stderr=tmp_path / "stderr.txt",
                    metrics_file=tmp_path / "metrics.json", search=[tmp_path], mlflow=mlflow)


def test_auto_prefers_mlflow_then_mllog_then_json(tmp_path, mlflow_run):
    p = produced(tmp_path, stdout=mllog("loss", 0.3, 1) + "\n" + mllog("top5", 0.95, 2) + "\n",
                 metrics={"loss": 0.1, "top5": 0.5, "f1": 0.7}, mlflow=mlflow_run)
    assert read_metric(decl("loss"), p) == (0.6, "mlflow")
    assert read_metric(decl("top5"), p) == (0.95, "mllog")
    assert read_metric(decl("f1"), p) == (0.7, "json")


def test_auto_without_any_source_lists_what_was_read(tmp_path):
    p = produced(tmp_path, stdout="hello\n")
    with pytest.raises(MetricMissing) as err:
        read_metric(decl("top5"), p)
    text = str(err.value)
    assert text.startswith("metric top5 was found in no source: ")
    assert "not tracked in MLflow" in text and "no :::MLLOG line" in text and "was not written" in text
    assert "\n" not in text


def test_declared_mlflow_without_tracking_is_a_sentence(tmp_path):
    with pytest.raises(MetricMissing, match="metric loss: this run is not tracked in MLflow"):
        read_metric(decl("loss", {"source": "mlflow"}), produced(tmp_path))


def test_unreadable_mlflow_store_is_a_sentence(tmp_path):
    (tmp_path / "m.db").write_text("not a database")
    p = produced(tmp_path, mlflow=ms.ScriptRuns(f"sqlite:///{tmp_path / 'm.db'}", "r", 0))
    with pytest.raises(MetricMissing, match=r"metric loss: the MLflow store could not be read"):
        read_metric(decl("loss", {"source": "mlflow"}), p)


def test_mllog_from_a_declared_file_and_crlf_streams(tmp_path):
    p = produced(tmp_path, stdout="Acc@1 93.1\r\n" + mllog("eval_accuracy", 0.2, 5) + "\r\n")
    (tmp_path / "resnet.log").write_text(mllog("eval_accuracy", 0.8, 10) + "\n")
    assert read_metric(decl("eval_accuracy", {"source": "mllog", "file": "resnet.log"}), p) == (0.8, "mllog")
    assert read_metric(decl("acc", {"regex": r"Acc@1 ([0-9.]+)$"}), p) == (93.1, "regex:stdout")
    with pytest.raises(MetricMissing, match="MLPerf log other.log was not written"):
        read_metric(decl("eval_accuracy", {"source": "mllog", "file": "other.log"}), p)
