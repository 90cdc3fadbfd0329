"""`repro500 model` on crafted run directories, with a seeded timing cache (no Gloo here)."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from helpers.rundirs import GAMMA, LATENCY_S, craft_run

from repro500.cli import cli
from repro500.report import write_report
from repro500.scaling import measure

DATA_URI = re.compile(r'<img class="plot" src="data:image/png;base64,')


def invoke(*args):
    return CliRunner().invoke(cli, ["model", *map(str, args)])


def test_model_checks_p2_writes_scaling_json_and_the_report_plots_it(tmp_path, timings):
    run = craft_run(tmp_path)
    result = invoke(run, "--write", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "repro500/scaling/v1"
    assert doc == json.loads((run / "derived" / "scaling.json").read_text())
    # the fit of exact timings, as in tests/test_scaling.py: ~1e-14 of double least squares, 1e-9 headroom
    assert doc["model"]["allreduce_latency_s"] == pytest.approx(LATENCY_S, rel=1e-9)
    assert doc["model"]["allreduce_gamma_s_per_byte"] == pytest.approx(GAMMA, rel=1e-9)
    assert doc["model"]["allreduce_r2"] == pytest.approx(1.0)
    assert [p["p"] for p in doc["predictions"]] == [2, 8, 16, 32, 64, 128, 256, 512, 1024]
    work = doc["workload"]
    assert work["params"] == 269_722  # from the recorded dense bytes
    assert work["compute_time_s"] == pytest.approx(0.02 + 0.05 + 0.006 - 0.012 - 0.001 - 0.0005)
    # by hand: two buckets (1 MiB and 30312 B), one allreduce each, at P = 2
    comm = 2 * (2 * LATENCY_S) + GAMMA * (1_048_576 + 30_312)
    predicted = 0.004 + 0.0625 + 0.0015 + comm
    measured = doc["measured"]
    assert measured["p"] == 2 and measured["steps"] == 10  # 2 repeats x 5 steps after warm-up
    assert measured["step_time_s"] == pytest.approx(0.082)
    assert measured["predicted_step_time_s"] == pytest.approx(predicted)
    assert measured["relative_error"] == pytest.approx((predicted - 0.082) / 0.082)
    assert measured["bytes_relative_error"] == 0
    # no time_comm_wait_s (an older run): the compute is biased low, the step spent 14 ms beyond
    # data + compute + compression, the model prices 1.3 ms of collectives: the check fails
    assert measured["comm_cost_s"] == pytest.approx(0.082 - (0.004 + 0.0625 + 0.0015))
    assert measured["predicted_comm_cost_s"] == pytest.approx(comm)
    assert measured["tolerance"] == 0.5 and measured["within_tolerance"] is False
    assert any("upper bounds" in a for a in doc["assumptions"])
    # the integrity of the run is untouched, and the report draws the model
    report = write_report(run)
    assert report.exit_code == 0 and "scaling" in report.sections
    page = report.path.read_text()
    scaling = page[page.index('id="scaling"'):page.index('id="provenance"')]
    assert DATA_URI.search(scaling)
    assert "allreduce_latency_s" in scaling and "no scaling model" not in scaling


def test_table_output_names_the_relative_error(tmp_path, timings):
    result = invoke(craft_run(tmp_path))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "relative error" in out and "check at P = 2" in out
    for p in ("8", "64", "1024"):
        assert re.search(rf"│\s+{p} │", out)
    assert not (tmp_path / "run-2" / "derived").exists()  # nothing written without --write


# With time_comm_wait_s recorded, compute = forward + backward + optimizer - wait - compression, so
# the measured communication cost of a step is 0.082 - (0.004 + (0.076 - wait - 0.001) + 0.0015).
@pytest.mark.parametrize(("wait_s", "within"), [(0.0001, True), (0.0005, True), (0.0015, False), (0.004, False)])
def test_the_check_at_p2_compares_communication_costs_against_a_stated_tolerance(tmp_path, timings, wait_s, within):
    run = craft_run(tmp_path, step={"time_comm_wait_s": wait_s})
    doc = json.loads(invoke(run, "--json").stdout)
    assert doc["workload"]["compute_time_s"] == pytest.approx(0.076 - wait_s - 0.001)
    assert not any("biased low" in a for a in doc["assumptions"])
    measured = doc["measured"]
    comm = 2 * (2 * LATENCY_S) + GAMMA * (1_048_576 + 30_312)
    cost = 0.082 - (0.004 + (0.076 - wait_s - 0.001) + 0.0015)
    assert measured["comm_wait_s"] == pytest.approx(wait_s)
    assert measured["comm_cost_s"] == pytest.approx(cost)
    assert measured["predicted_comm_cost_s"] == pytest.approx(comm)
    # double arithmetic; cost (>= 1.6 ms) is a difference of ~80 ms figures: ~50 u, far inside approx's 1e-6
    assert measured["comm_relative_error"] == pytest.approx((comm - cost) / cost)
    assert measured["within_tolerance"] is within
    table = " ".join(invoke(run).stdout.split())  # rich wraps lines at the terminal width
    assert ("within tolerance" if within else "OUTSIDE tolerance") in table
    assert "tolerance ±50.0%" in table
    assert invoke(run).exit_code == 0  # a prediction, whatever the check says
    checked = invoke(run, "--check")  # unless asked to fail on a missed check
    assert checked.exit_code == (0 if within else 1)
    assert ("OUTSIDE its tolerance" in checked.stderr) is not within


def test_a_step_no_slower_than_its_computation_fails_the_check(tmp_path, timings):
    run = craft_run(tmp_path, step={"time_comm_wait_s": 0.0, "step_time_s": 0.075})
    doc = json.loads(invoke(run, "--json").stdout)
    assert doc["measured"]["comm_relative_error"] is None and doc["measured"]["within_tolerance"] is False
    assert any("no communication cost to compare" in a for a in doc["assumptions"])


def test_explicit_model_and_compressor_without_a_run(timings):
    result = invoke("--model", "resnet50", "--compute-s", "0.25", "--compressor", "{name: topk, ratio: 0.01}",
                    "--p", "8,1024", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [p["p"] for p in doc["predictions"]] == [8, 1024]
    assert doc["workload"]["collective"] == "allgather" and doc["workload"]["params"] == 25_557_032
    assert "measured" not in doc
    assert any("compression time of topk not measured" in a for a in doc["assumptions"])
    eff = [p["efficiency"] for p in doc["predictions"]]
    assert 0 < eff[1] < eff[0] < 1


def test_single_rank_run_gives_compute_time_but_no_check(tmp_path, timings):
    result = invoke(craft_run(tmp_path, "run-1", world_size=1), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["workload"]["compute_time_s"] == pytest.approx(0.076)
    assert doc["workload"]["params"] == 269_722  # resnet20 from the recipe, by the table
    assert "measured" not in doc
    unchecked = invoke(tmp_path / "run-1", "--check")
    assert unchecked.exit_code == 2 and "nothing to check the prediction against" in unchecked.output
    assert invoke("--model", "resnet50", "--compute-s", "0.1", "--check").exit_code == 2


def test_compute_from_a_single_rank_run_is_an_independent_check(tmp_path, timings):
    two, one = craft_run(tmp_path), craft_run(tmp_path, "run-1", world_size=1)
    result = invoke(two, "--compute-from", one, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["workload"]["compute_time_s"] == pytest.approx(0.076)  # nothing subtracted on one rank
    assert doc["workload"]["compute_run_dir"] == str(one)
    comm = 2 * (2 * LATENCY_S) + GAMMA * (1_048_576 + 30_312)
    predicted = 0.004 + 0.076 + 0.0015 + comm  # compression as recorded by the 2-rank run
    assert doc["measured"]["relative_error"] == pytest.approx((predicted - 0.082) / 0.082)
    assert not any("biased low" in a for a in doc["assumptions"])
    alone = json.loads(invoke(two, "--json").stdout)
    assert any("biased low" in a for a in alone["assumptions"])


def test_another_compressor_than_the_run_is_not_checked(tmp_path, timings):
    result = invoke(craft_run(tmp_path), "--compressor", "fp16", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert "measured" not in doc
    assert any("no check against the run" in a for a in doc["assumptions"])


@pytest.mark.parametrize(("args", "code", "message"), [
    (["{tmp}/nope"], 4, "does not exist: give a run directory"),
    (["{untimed}"], 4, "has no step records with timings"),
    (["{run}", "--compressor", "zip"], 2, "unknown compressor 'zip'"),
    (["{run}", "--compressor", "{name: topk, ratio: 2}"], 2, "ratio=2 is invalid"),
    (["--params", "1000"], 2, "compute time per step is unknown"),
    (["--compute-s", "0.1"], 2, "model size is unknown"),
    (["--params", "10", "--model", "resnet20", "--compute-s", "1"], 2, "either --params or --model"),
    (["--model", "gpt5", "--compute-s", "1"], 2, "no parameter count is known for model 'gpt5'"),
    (["--params", "10", "--compute-s", "1", "--write"], 2, "--write stores RUN_DIR"),
    (["{run}", "--compute-s", "1", "--compute-from", "{run}"], 2, "either --compute-s or --compute-from"),
    (["{run}", "--compute-from", "{tmp}/nope"], 4, "does not exist"),
    (["--params", "10", "--compute-s", "1", "--p", "8,x"], 2, "not a positive integer"),
    (["--params", "10", "--compute-s", "1", "--compressor", "powersgd"], 2, "powersgd's wire size"),
])
def test_bad_input_is_one_line_and_the_documented_exit_code(tmp_path, timings, args, code, message):
    run = craft_run(tmp_path)
    untimed = craft_run(tmp_path, "untimed", with_timings=False)
    for key, value in {"{tmp}": tmp_path, "{run}": run, "{untimed}": untimed}.items():
        args = [a.replace(key, str(value)) for a in args]
    result = invoke(*args)
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert not (run / "derived").exists()


def test_corrupt_cache_is_measured_again(tmp_path, monkeypatch, timings):
    measure.cache_path().write_text("{not json")
    calls = []

    def fake_measure(settings=None):
        calls.append(settings)
        return timings

    monkeypatch.setattr(measure, "measure", fake_measure)
    result = invoke("--params", "1000", "--compute-s", "0.1", "--json")
    assert result.exit_code == 0, result.output
    assert len(calls) == 1
    assert "ignoring the unreadable collective timings" in result.stderr
    assert json.loads(measure.cache_path().read_text())["schema"] == "repro500/collectives/v1"
    # now cached: no second measurement, also not with --remeasure off and default settings
    assert invoke("--params", "1000", "--compute-s", "0.1").exit_code == 0
    assert len(calls) == 1
    # other measurement settings than the cached ones, or --remeasure: measured again
    assert invoke("--params", "1000", "--compute-s", "0.1", "--measure-reps", "3").exit_code == 0
    assert invoke("--params", "1000", "--compute-s", "0.1", "--remeasure").exit_code == 0
    assert len(calls) == 3 and calls[1].reps == 3


def test_a_failing_measurement_is_one_line_exit_1(monkeypatch, tmp_path):
    import torch.multiprocessing

    monkeypatch.setenv("REPRO500_CACHE_DIR", str(tmp_path / "empty-cache"))

    def broken_spawn(*args, **kwargs):
        raise RuntimeError("\n-- Process 0 terminated with the following error:\nRuntimeError: Connection refused")

    monkeypatch.setattr(torch.multiprocessing, "spawn", broken_spawn)
    result = invoke("--params", "1000", "--compute-s", "0.1")
    assert result.exit_code == 5, result.output
    assert "timing Gloo collectives on 2 processes failed (RuntimeError: Connection refused)" in result.output
    assert "Traceback" not in result.output
    assert not measure.cache_path().exists()


def test_powersgd_bytes_come_only_from_a_run_that_compressed(tmp_path, timings):
    # a run shorter than start_iter recorded dense bytes, which were taken as powersgd's
    spec = {"name": "powersgd", "start_iter": 2}
    short = craft_run(tmp_path, "short", compressor=spec, step={"compressed": False})
    result = invoke(short, "--json")
    assert result.exit_code == 2, result.output
    assert "never compressed: its last step ran before powersgd's start_iter (2)" in result.output
    compressed = craft_run(tmp_path, "long", compressor=spec,
                           step={"compressed": True, "bytes_sent": 31_164, "bytes_received": 31_164})
    result = invoke(compressed, "--json")
    assert result.exit_code == 0, result.output
    assert "powersgd payload: 31164 bytes per step" in result.stdout
