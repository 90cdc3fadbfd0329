"""MLPerf-format logs: MLPerf's own compliance checker, run as a subprocess, judges them."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from helpers.runs import write_recipe

from repro500.data.generate import generate
from repro500.errors import InvalidInput, UsageError
from repro500.mlperf.check import check_compliance, logged_benchmark
from repro500.mlperf.logger import MLPerfLogger, OptimizerInfo, optimizer_records
from repro500.runner import RunOptions, run
from repro500.workloads.models import build_model
from repro500.workloads.trainer.evaluation import make_evaluator

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"
SGD = OptimizerInfo("sgd", base_lr=0.1, momentum=0.9, weight_decay=1e-4)
# Values MLPerf's closed ResNet rules accept (training_3.1.0/closed_resnet_sgd.yaml).
CLOSED_SGD = OptimizerInfo(
    "sgd",
    base_lr=2.0,
    momentum=0.9,
    weight_decay=5e-5 * 2,
    end_lr=1e-4,
    decay_poly_power=2.0,
    decay_steps=1000,
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # The test machine's cores are shared: one intra-op thread avoids oversubscription stalls.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _small_logger(path, **options) -> MLPerfLogger:
    settings = {"benchmark": "resnet", "seed": 1, "global_batch_size": 8, "optimizer": SGD}
    return MLPerfLogger(path, **{"train_samples": 8, "eval_samples": 8, **settings, **options})


def _records(path) -> list[dict]:
    lines = path.read_text().splitlines()
    assert all(line.startswith(":::MLLOG ") for line in lines)
    return [json.loads(line[len(":::MLLOG ") :]) for line in lines]


def _simulate(path, benchmark, evals, status, *, optimizer=SGD, staging=False, **options):
    """A short training run as the trainer drives it: init, run, epochs with an eval each."""
    with MLPerfLogger(
        path,
        benchmark=benchmark,
        seed=1234,
        global_batch_size=64,
        train_samples=1024,
        eval_samples=256,
        optimizer=optimizer,
        **options,
    ) as mll:
        mll.init_start()
        if staging:  # HPC 3.0: data staging may happen before the timed run
            mll.staging_start()
            mll.staging_stop()
        mll.init_stop()
        mll.run_start()
        for epoch, value in enumerate(evals, start=1):
            mll.epoch_start(epoch)
            mll.epoch_stop(epoch)
            mll.eval_start(epoch)
            mll.eval_stop(epoch)
            mll.eval_accuracy(value, epoch)
        mll.run_stop(status)
    return path


@pytest.mark.parametrize(
    ("evals", "status"), [([0.42, 0.61], "aborted"), ([0.55, 0.93], "success")]
)
def test_resnet_log_passes_training_4_0_0_open(tmp_path, evals, status):
    log = _simulate(tmp_path / "mllog.txt", "resnet", evals, status)
    result = check_compliance(log)
    assert result.passed, result.output
    assert (result.usage, result.ruleset, result.benchmark) == ("training", "4.0.0", "resnet")
    assert "open_resnet.yaml" in result.output and "SUCCESS" in result.output


def test_resnet_log_with_mlperf_hyperparameters_passes_closed_rules_too(tmp_path):
    log = _simulate(
        tmp_path / "mllog.txt",
        "resnet",
        [0.70, 0.7601],
        "success",
        optimizer=CLOSED_SGD,
        division="closed",
    )
    result = check_compliance(log)
    assert result.passed, result.output
    assert "closed_resnet_sgd.yaml" in result.output


def test_resnet_open_rule_rejects_perfect_accuracy(tmp_path):
    # MLPerf's open ResNet rule wants at least one eval_accuracy < 1.0 (a fraction, not 100%).
    result = check_compliance(_simulate(tmp_path / "mllog.txt", "resnet", [1.0], "success"))
    assert not result.passed
    assert "Failed checks for eval_accuracy : v['value'] < 1.0" in result.output


def test_cosmoflow_log_reaching_target_passes_hpc_3_0_0_open(tmp_path):
    log = _simulate(tmp_path / "mllog.txt", "cosmoflow", [0.31, 0.118], "success", staging=True)
    records = _records(log)
    assert [r["value"] for r in records if r["key"] == "eval_error"] == [0.31, 0.118]
    assert not any(r["key"] == "eval_accuracy" for r in records)
    result = check_compliance(log)
    assert result.passed, result.output
    assert (result.usage, result.ruleset) == ("hpc", "3.0.0")
    assert "open_cosmoflow.yaml" in result.output


def test_cosmoflow_short_run_short_of_target_fails_only_the_target_rule(tmp_path):
    log = _simulate(tmp_path / "mllog.txt", "cosmoflow", [0.31, 0.2], "aborted")
    result = check_compliance(log)
    assert not result.passed
    # The one rule a run that stops short of MLPerf's target cannot meet, and nothing else.
    assert "Failed checks for eval_error : v['value'] <= 0.124 and v['value'] > 0." in result.output
    assert "CHECK for" not in result.output and "Required" not in result.output


def test_real_short_training_writes_a_compliant_log(tmp_path):
    """ResNet-20 trains two 1-step epochs, evaluated by the classification evaluator."""
    torch.manual_seed(0)
    model = build_model("resnet20")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_x, train_y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    eval_x, eval_y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    log = tmp_path / "repeats" / "0" / "mllog.txt"
    with MLPerfLogger(
        log,
        benchmark="resnet",
        seed=7,
        global_batch_size=16,
        train_samples=16,
        eval_samples=16,
        optimizer=OptimizerInfo("sgd", base_lr=0.1, momentum=0.9),
    ) as mll:
        mll.init_start()
        mll.init_stop()
        mll.run_start()
        for epoch in (1, 2):
            mll.epoch_start(epoch)
            model.train()
            loss = F.cross_entropy(model(train_x), train_y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mll.epoch_stop(epoch)
            mll.eval_start(epoch)
            model.eval()
            evaluator = make_evaluator("classification", num_classes=10)
            with torch.no_grad():
                evaluator.update(model(eval_x), eval_y)
            mll.eval_stop(epoch)
            assert mll.log_eval(evaluator.compute(), epoch)
        mll.run_stop("aborted")
    result = check_compliance(log)
    assert result.passed, result.output


def test_real_cosmoflow_run_writes_a_log_that_passes_hpc_3_0_0_but_for_the_target(in_tmp):
    """experiments/cosmoflow_cpu.yaml shrunk to seconds: 8 tiny universes, one epoch, the real trainer."""
    generate("cosmo", in_tmp / "cosmo.h5", samples=8, size="8", seed=2)
    generate("cosmo", in_tmp / "cosmo-eval.h5", samples=4, size="8", seed=2, split="eval")
    recipe = yaml.safe_load((EXPERIMENTS / "cosmoflow_cpu.yaml").read_text())
    recipe["fixed"].update(
        model_options={"crop_size": 8, "base_channels": 2, "depth": 1, "fc1_size": 8, "fc2_size": 4},
        dataset={"name": "cosmo", "path": "cosmo.h5", "eval_path": "cosmo-eval.h5", "params": {"crop": 8}},
        epochs=1,
    )
    recipe["mutable"].update(batch_size=4, eval_batch_size=4, threads=1)
    recipe["repeats"] = 1
    outcome = run(RunOptions(recipe=str(write_recipe(in_tmp / "cosmo.yaml", recipe)), tracking=False))
    log = outcome.run_dir / "repeats/0/mllog.txt"
    keys = [r["key"] for r in _records(log)]
    assert {"submission_benchmark", "run_start", "eval_error", "run_stop"} <= set(keys)
    result = check_compliance(log)
    assert (result.benchmark, result.usage, result.ruleset) == ("cosmoflow", "hpc", "3.0.0")
    assert "open_cosmoflow.yaml" in result.output
    # One epoch of a tiny model cannot reach MLPerf's MAE 0.124: that rule, and only that, may fail.
    failed = [line for line in result.output.splitlines() if "Failed checks" in line]
    target_rule = "Failed checks for eval_error : v['value'] <= 0.124 and v['value'] > 0."
    assert result.passed or [target_rule in line for line in failed] == [True], result.output
    assert "CHECK for" not in result.output and "Required" not in result.output, result.output


def test_cosmoflow_hpc_cpu_log_says_how_its_model_and_data_differ_from_mlperfs(in_tmp):
    """experiments/cosmoflow_hpc_cpu.yaml shrunk to seconds: its log names the model, the data
    set's options and the universes (generator parameters, size) next to MLPerf's reference."""
    for split, n in (("train", 8), ("eval", 4)):
        generate("cosmo", in_tmp / "cosmo" / f"{split}.h5", samples=n, size="8", seed=2, split=split,
                 options={"fixed_amplitude": True, "mean_count": 512.0})
    recipe = yaml.safe_load((EXPERIMENTS / "cosmoflow_hpc_cpu.yaml").read_text())
    recipe["fixed"]["model_options"].update(crop_size=8, fc1_size=8, fc2_size=4)
    recipe["fixed"]["dataset"].update(path="cosmo", params={**recipe["fixed"]["dataset"]["params"], "crop": 8})
    recipe["fixed"]["epochs"] = 1
    recipe["mutable"].update(batch_size=4, eval_batch_size=4, threads=1)
    recipe["repeats"] = 1
    outcome = run(RunOptions(recipe=str(write_recipe(in_tmp / "cosmo.yaml", recipe)), tracking=False))
    log = outcome.run_dir / "repeats/0/mllog.txt"
    records = {r["key"]: r["value"] for r in _records(log)}
    assert records["repro500_model"] == {"name": "cosmoflow", "options": recipe["fixed"]["model_options"]}
    assert records["repro500_dataset"] == {"name": "cosmo", "params": recipe["fixed"]["dataset"]["params"]}
    data = records["repro500_data"]
    assert data["train"]["universes"] == 8 and data["eval"]["universes"] == 4
    assert data["train"]["volume"] == [8, 8, 8, 4] and "512^3" in data["train"]["reference"]
    assert (data["train"]["augment"], data["eval"]["augment"]) == ("symmetries", "none")
    (source,) = data["train"]["sources"]
    assert source["params"]["fixed_amplitude"] is True and source["params"]["mean_count"] == 512.0
    assert (source["seed"], source["split"], source["samples"]) == (2, "train", 8)
    result = check_compliance(log)  # the extra keys are nothing MLPerf's checker objects to
    failed = [line for line in result.output.splitlines() if "Failed checks" in line]
    target_rule = "Failed checks for eval_error : v['value'] <= 0.124 and v['value'] > 0."
    assert result.passed or [target_rule in line for line in failed] == [True], result.output
    assert "CHECK for" not in result.output and "Required" not in result.output, result.output


def test_logs_carry_seed_batch_size_and_optimizer(tmp_path):
    records = {
        r["key"]: r for r in _records(_simulate(tmp_path / "m.txt", "resnet", [0.5], "aborted"))
    }
    assert records["seed"]["value"] == 1234
    assert records["global_batch_size"]["value"] == 64
    assert records["opt_name"]["value"] == "sgd"
    assert records["sgd_opt_base_learning_rate"]["value"] == 0.1
    assert records["sgd_opt_momentum"]["value"] == 0.9
    assert records["run_stop"]["metadata"]["status"] == "aborted"
    assert records["eval_accuracy"]["metadata"]["epoch_num"] == 1


def test_optimizer_names_map_to_mlperf():
    cosmo = optimizer_records(
        "cosmoflow", OptimizerInfo("momentum", base_lr=0.001, warmup_epochs=4)
    )
    assert cosmo["opt_name"] == "sgd" and cosmo["opt_base_learning_rate"] == 0.001
    assert cosmo["opt_learning_rate_warmup_epochs"] == 4
    lars = optimizer_records("resnet", OptimizerInfo("LARS", base_lr=9.0, warmup_epochs=2))
    assert lars["opt_name"] == "lars" and lars["lars_opt_learning_rate_warmup_epochs"] == 2
    assert "opt_base_learning_rate" not in lars and lars["lars_opt_base_learning_rate"] == 9.0
    assert optimizer_records("resnet", OptimizerInfo("adamw", base_lr=1e-3))["opt_name"] == "adamw"


def test_repeats_in_one_process_write_separate_files_and_nothing_to_stdout(tmp_path, capfd):
    first = _small_logger(tmp_path / "0.txt", seed=1)
    second = _small_logger(tmp_path / "1.txt", benchmark="cosmoflow", seed=2)
    first.init_start()
    second.init_start()
    first.close()
    second.close()
    assert [r["value"] for r in _records(tmp_path / "0.txt") if r["key"] == "seed"] == [1]
    assert [r["value"] for r in _records(tmp_path / "1.txt") if r["key"] == "seed"] == [2]
    captured = capfd.readouterr()
    assert ":::MLLOG" not in captured.out + captured.err
    # The logging module's registry is untouched: no handlers left on any named logger.
    assert not any(name.startswith("repro500.mllog") for name in logging.Logger.manager.loggerDict)


def test_crash_inside_a_run_ends_the_log_as_aborted(tmp_path):
    log = tmp_path / "mllog.txt"
    with pytest.raises(KeyboardInterrupt):  # noqa: SIM117 - the crash must happen inside the with
        with MLPerfLogger(
            log,
            benchmark="resnet",
            seed=1,
            global_batch_size=8,
            train_samples=8,
            eval_samples=8,
            optimizer=SGD,
        ) as mll:
            mll.init_start()
            mll.init_stop()
            mll.run_start()
            mll.epoch_start(1)
            raise KeyboardInterrupt
    last = _records(log)[-1]
    assert last["key"] == "run_stop" and last["metadata"]["status"] == "aborted"


def test_undefined_eval_value_is_not_logged_as_quality(tmp_path):
    log = tmp_path / "mllog.txt"
    with MLPerfLogger(
        log,
        benchmark="cosmoflow",
        seed=1,
        global_batch_size=8,
        train_samples=8,
        eval_samples=8,
        optimizer=SGD,
    ) as mll:
        mll.init_start()
        mll.init_stop()
        mll.run_start()
        assert mll.log_eval({"mae": None}, 1) is False
        assert mll.eval_accuracy(float("nan"), 2) is False
        mll.run_stop("aborted")
    keys = [r["key"] for r in _records(log)]
    assert keys.count("eval_undefined") == 2 and "eval_error" not in keys


def test_calls_out_of_order_are_refused(tmp_path):
    mll = _small_logger(tmp_path / "m.txt")
    with pytest.raises(RuntimeError, match="run_start"):
        mll.epoch_start(1)
    with pytest.raises(RuntimeError, match="init_stop"):
        mll.init_stop()
    with pytest.raises(UsageError, match="run status 'done'"):
        mll.run_stop("done")
    mll.init_start()
    with pytest.raises(RuntimeError, match="staging_start"):
        mll.staging_stop()
    mll.close()


def test_bad_settings_and_inputs(tmp_path):
    with pytest.raises(UsageError, match="division 'public'"):
        _small_logger(tmp_path / "m.txt", division="public")
    with pytest.raises(InvalidInput, match="does not exist"):
        check_compliance(tmp_path / "missing.txt")
    other = _simulate(tmp_path / "ewa.txt", "extreme_weather", [0.2], "aborted")
    assert logged_benchmark(other) == "extreme_weather"
    with pytest.raises(UsageError, match="no compliance rules for benchmark 'extreme_weather'"):
        check_compliance(other)
    not_a_log = tmp_path / "notes.txt"
    not_a_log.write_text("hello\n")
    with pytest.raises(InvalidInput, match="no submission_benchmark line"):
        check_compliance(not_a_log)


def test_trainer_style_use_recipe_optimizer_late_sample_counts_boolean_status(tmp_path):
    """The trainer builds the logger before the data: sizes come later, status is a bool."""
    log = tmp_path / "mllog.txt"
    with MLPerfLogger(
        log,
        benchmark="cosmoflow",
        seed=99,
        global_batch_size=16,
        optimizer={"name": "sgd", "lr": 0.004, "momentum": 0.9, "weight_decay": 0.0},
        lr_schedule={"name": "step", "step_epochs": 2, "gamma": 0.5, "warmup_epochs": 1},
        epochs=6,
        target={"metric": "mae", "value": 0.2, "direction": "lower"},
    ) as mll:
        mll.init_start()
        mll.log_samples(512, 128)
        mll.init_stop()
        mll.run_start()
        mll.epoch_start(1)
        mll.epoch_stop(1)
        mll.eval_start(1)
        mll.eval_stop(1)
        mll.log_eval({"mae": 0.1, "mse": 0.02}, 1)
        mll.run_stop(True)
    records = {r["key"]: r for r in _records(log)}
    assert records["train_samples"]["value"] == 512 and records["eval_samples"]["value"] == 128
    assert records["opt_learning_rate_decay_boundary_epochs"]["value"] == [2, 4]
    assert records["opt_learning_rate_decay_factor"]["value"] == 0.5
    assert records["opt_learning_rate_warmup_epochs"]["value"] == 1.0
    assert records["eval_error"]["value"] == 0.1
    assert records["repro500_quality_target"]["value"] == {
        "metric": "mae",
        "value": 0.2,
        "direction": "lower",
    }
    assert records["run_stop"]["metadata"]["status"] == "success"
    assert check_compliance(log).passed


def test_missing_sample_counts_warn_and_fail_the_checker(tmp_path):
    log = tmp_path / "mllog.txt"
    with MLPerfLogger(log, benchmark="resnet", seed=1, global_batch_size=8, optimizer=SGD) as mll:
        mll.init_start()
        mll.init_stop()
        with pytest.warns(RuntimeWarning, match="log_samples"):
            mll.run_start()
        mll.epoch_start(1)
        mll.epoch_stop(1)
        mll.eval_start(1)
        mll.eval_stop(1)
        mll.eval_accuracy(0.5, 1)
        mll.run_stop(False)
    result = check_compliance(log)
    assert not result.passed
    assert "Required EXACTLY_ONE occurrence of 'train_samples' but found 0" in result.output


def test_run_stop_before_the_run_started_writes_nothing(tmp_path):
    log = tmp_path / "mllog.txt"
    with (
        pytest.raises(ValueError, match="bad data"),
        MLPerfLogger(log, benchmark="resnet", seed=1, global_batch_size=8, optimizer=SGD) as mll,
    ):
        mll.init_start()
        mll.run_stop(False)  # what an error handler does: harmless here
        raise ValueError("bad data")
    assert "run_stop" not in [r["key"] for r in _records(log)]


class _Run:
    """What verify/mlperf.py reads of a run: its completed repeats and their files."""

    def __init__(self, root: Path, completed: list[int]):
        self.path, self.completed = root, completed

    def repeat_file(self, k: int, name: str) -> Path:
        return self.path / "repeats" / str(k) / name


def test_verify_names_the_ruleset_and_quotes_the_checker_for_a_failing_repeat(tmp_path):
    from repro500.mlperf.compliance import check_mlperf

    for k, evals in enumerate([[0.31, 0.118], [0.31, 0.2], [0.3, 0.11]]):
        (tmp_path / f"repeats/{k}").mkdir(parents=True)
        _simulate(tmp_path / f"repeats/{k}/mllog.txt", "cosmoflow", evals, "success", staging=True)
    verdict = check_mlperf(_Run(tmp_path, [0, 1, 2]))
    assert (verdict.status, verdict.usage, verdict.ruleset, verdict.benchmark) == ("WARN", "hpc", "3.0.0", "cosmoflow")
    assert verdict.reason.startswith("1 of 3 repeat log(s) fail MLPerf hpc 3.0.0 (cosmoflow)'s compliance checker; "
                                     "repeat 1: ")
    assert "v['value'] <= 0.124" in verdict.reason and "Traceback" not in verdict.reason
    assert [verdict.repeats[k]["passed"] for k in "012"] == [True, False, True]
    # a repeat that did not finish is not judged; a run with no MLPerf logs has no section
    assert check_mlperf(_Run(tmp_path, [0, 2])).status == "OK"
    assert "all 2 repeat log(s) pass MLPerf hpc 3.0.0" in check_mlperf(_Run(tmp_path, [0, 2])).reason
    assert check_mlperf(_Run(tmp_path / "none", [0])) is None


def test_verify_says_why_a_log_without_mlperf_rules_is_not_judged(tmp_path):
    from repro500.mlperf.compliance import check_mlperf

    (tmp_path / "repeats/0").mkdir(parents=True)
    (tmp_path / "repeats/0/mllog.txt").write_text(
        ':::MLLOG {"key": "submission_benchmark", "value": "deepcam_like", "namespace": "", "time_ms": 1}\n')
    verdict = check_mlperf(_Run(tmp_path, [0]))
    assert verdict.status == "SKIPPED" and "MLPerf has no compliance rules for benchmark 'deepcam_like'" in verdict.reason


def test_the_tree_is_rejected_by_the_package_checker_or_the_summarizer_never_by_the_rcp_checker():
    from repro500.mlperf.checkers import CheckOutcome, rejected_by

    def outcomes(package, summary, rcp):
        return [CheckOutcome("package_checker", package, ""), CheckOutcome("result_summarizer", summary, ""),
                CheckOutcome("rcp_checker", rcp, "")]

    assert rejected_by(outcomes(True, True, False)) == []  # slow convergence is said, not a rejection
    assert rejected_by(outcomes(True, None, None)) == []  # a tool that did not run rejects nothing
    assert rejected_by(outcomes(False, False, True)) == ["package_checker", "result_summarizer"]
