"""repro500 ops: operator cases, their float64 references, errors, tolerances and refusals."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from helpers.runs import repro500

from repro500.errors import InvalidInput, UsageError
from repro500.system import ops
from repro500.system.operators import REGISTRY, Case, error, tolerance_eps

TINY = {"sizes": "tiny", "budget_s": 0.0, "min_reps": 3, "warmup": 1}


@pytest.fixture
def reference_kernels(monkeypatch):
    """repro500's kernels through their PyTorch references: no C++ compile in the fast suite
    (tests/test_ops.py checks the compiled kernels against the same references)."""
    monkeypatch.setenv("REPRO500_OPS", "reference")
    ops.unsupported.cache_clear()
    yield
    ops.unsupported.cache_clear()


def _all_within_tolerance(operators: list[str] | None) -> tuple[dict, dict]:
    config = ops.OpsConfig.from_recipe({**TINY, "operators": operators} if operators else TINY, {"nproc": 1}, "cpu")
    cases = ops.check(config)
    metrics, doc = ops.run(config, seed=3)
    assert len(doc["cases"]) == len(cases) and doc["skipped"] == []  # the references take every float dtype
    for rec in doc["cases"]:
        assert rec["within_tolerance"], rec
        assert 0 <= rec["error"]["err_eps"] <= rec["tolerance_eps"]
        assert rec["time"]["calls"] >= 3 and rec["time"]["warmup_calls"] >= 1
        assert metrics[f"{rec['id']}.time_s"] == rec["time"]["median_s"] > 0
    return metrics, doc


def test_operators_in_every_dtype_are_within_their_stated_tolerance(reference_kernels):
    _, doc = _all_within_tolerance(["matmul", "ef_update", "quantize"])
    assert {(c["op"], c["dtype"]) for c in doc["cases"]} == {
        (op, dt) for op in ("matmul", "ef_update", "quantize") for dt in ("fp32", "bf16", "fp16")}


@pytest.mark.slow
def test_every_operator_in_every_dtype_is_within_its_stated_tolerance(reference_kernels):
    _, doc = _all_within_tolerance(None)
    assert {c["op"] for c in doc["cases"]} == set(ops.OPERATORS) - {"allreduce"}


def test_flops_and_bytes_follow_the_documented_formulas(reference_kernels):
    config = ops.OpsConfig.from_recipe({**TINY, "operators": ["matmul", "conv2d"], "dtypes": ["fp32"],
                                        "custom": {"matmul": ["16x32x8"]}}, {}, "cpu")
    _, doc = ops.run(config, seed=0)
    by_op = {rec["op"]: rec for rec in doc["cases"]}
    assert by_op["matmul"]["flops"] == 2 * 16 * 32 * 8
    assert by_op["matmul"]["bytes"] == (16 * 8 + 8 * 32 + 16 * 32) * 4
    conv = by_op["conv2d"]["shape"]
    assert by_op["conv2d"]["flops"] == 2 * conv["n"] * conv["o"] * conv["h"] * conv["w"] * conv["c"] * conv["k"] ** 2
    assert by_op["matmul"]["flops_per_s"] == pytest.approx(by_op["matmul"]["flops"] / by_op["matmul"]["time"]["median_s"])


def test_the_error_is_normwise_in_epsilons_and_an_infinite_one_is_the_largest_float():
    ref = torch.tensor([1.0, -4.0, 2.0], dtype=torch.float64)
    got = ref + torch.tensor([0.0, 4.0 * torch.finfo(torch.float32).eps, 0.0], dtype=torch.float64)
    err = error([got], [ref], "fp32")
    assert err["max_abs_err"] == pytest.approx(4 * torch.finfo(torch.float32).eps)
    assert err["max_rel_err"] == pytest.approx(torch.finfo(torch.float32).eps)  # relative to max |r| = 4
    assert err["err_eps"] == pytest.approx(1.0)
    broken = error([torch.tensor([1.0, float("nan"), 2.0], dtype=torch.float64)], [ref], "fp32")
    assert broken["finite"] is False and broken["err_eps"] == sys.float_info.max


def test_tolerance_grows_with_the_reduction_length():
    assert tolerance_eps("matmul", {"m": 4, "n": 4, "k": 100}) == 2 * 10 + 4
    assert tolerance_eps("ef_update", {"n": 10**6}) == 6  # elementwise: one rounding, whatever the size
    assert Case("matmul", "bf16", "cpu", (("m", 2), ("n", 3), ("k", 4))).id == "matmul.bf16.cpu.2x3x4"
    assert REGISTRY["conv2d"].parse("8") == {key: 8 for key in REGISTRY["conv2d"].keys}


def test_acceptance_bounds_every_measured_case_by_its_tolerance(reference_kernels):
    config = ops.OpsConfig.from_recipe({**TINY, "operators": ["matmul", "sign_unpack"], "tolerances": {"matmul": 1.5}},
                                       {}, "cpu")
    accepted = ops.acceptance(ops.check(config), config)
    assert accepted["matmul.fp32.cpu.64x64x64.err_eps"] == {"target": 0.0, "direction": "lower", "tolerance": 1.5}
    assert accepted["sign_unpack.fp32.cpu.n4096.err_eps"]["tolerance"] == 6
    assert len(accepted) == 6  # 2 operators x 3 dtypes, each decided on its own error


@pytest.mark.parametrize("system, mutable, error_type, words", [
    ({"operators": ["matmull"]}, {}, UsageError, "did you mean 'matmul'"),
    ({"dtypes": ["fp64"]}, {}, UsageError, "unknown dtype 'fp64'"),
    ({"operators": ["allreduce"]}, {}, UsageError, "at least two ranks"),
    ({"operators": ["allreduce"]}, {"nproc": 2, "engine": "horovod"}, UsageError, "Horovod"),
    ({"operators": ["matmul"], "custom": {"matmul": ["300000"]}}, {}, InvalidInput, "GiB of cpu memory"),
    ({"custom": {"matmul": ["3x4x5x6"]}}, {}, UsageError, "expected 3 positive integers"),
])
def test_bad_requests_are_refused_before_anything_runs(system, mutable, error_type, words):
    with pytest.raises(error_type, match=words):
        ops.check(ops.OpsConfig.from_recipe(system, mutable, "cpu"))


def test_cli_names_a_typo_in_one_line_with_exit_2_before_torch_loads(tmp_path):
    done = repro500("ops", "--op", "matmull", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "repro500: error: unknown operator 'matmull'; did you mean 'matmul'? known: " + ", ".join(ops.OPERATORS)]
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_ops_is_a_run_directory_verified_against_another_machines_ops(tmp_path):
    """Two ops runs (two 'systems'), each verified on its own bands, then one against the other;
    MLflow holds the per-case metrics."""
    common = ["ops", "--op", "matmul", "--op", "topk", "--op", "dequantize", "--op", "batchnorm", "--sizes", "tiny", "--budget-s", "0.01",
              "--threads", "1", "-n", "3"]
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    first = repro500(*common, "--run-id", "a", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    second = repro500(*common, "--run-id", "b", "--no-tracking", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    run = tmp_path / "runs" / "a"
    assert {"manifest.json", "SHA256SUMS", "recipe.yaml", "verdict.json"} <= {p.name for p in run.iterdir()}
    record = json.loads((run / "repeats" / "0" / "system.json").read_text())
    assert record["schema"] == "repro500/system-record/v1" and record["measure"] == "ops"
    backends = {c["backend"] for c in record["cases"] if c["op"] == "topk"}
    assert backends <= {"native", "reference"}
    if backends == {"native"}:  # the compiled dequantize takes float32 scales only: bf16 is listed, not guessed
        skipped = {s["id"]: s["reason"] for s in record["skipped"]}
        assert "BFloat16" in skipped["dequantize.bf16.cpu.n4096"]
    verdict = json.loads((run / "verdict.json").read_text())
    assert verdict["status"] == "PASS"
    assert {b["metric"] for b in verdict["bands"]} >= {"matmul.fp32.cpu.64x64x64.err_eps", "topk.bf16.cpu.n4096.err_eps"}
    against = repro500("verify", "runs/a", "--against", "runs/b", "--json", cwd=tmp_path)
    assert against.returncode == 0, against.stdout + against.stderr
    compared = json.loads(against.stdout)
    assert compared["status"] == "REPRODUCED"
    assert {e["metric"] for e in compared["equivalence"]} >= {"batchnorm.fp16.cpu.n4c8h8w8.err_eps"}
    import mlflow

    client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    repeats = client.search_runs(client.get_experiment_by_name("repro500/ops").experiment_id,
                                 "tags.mlflow.parentRunId != ''")
    assert len(repeats) == 3
    assert "matmul.fp32.cpu.64x64x64.flops_per_s" in repeats[0].data.metrics


@pytest.mark.slow
def test_an_operator_beyond_its_tolerance_fails_the_verdict_by_name(tmp_path):
    done = repro500("ops", "--op", "matmul", "--dtype", "fp32", "--sizes", "tiny", "--tolerance", "matmul=0.001",
                    "--budget-s", "0.01", "--threads", "1", "--device", "cpu", "--no-tracking", "--run-id", "f",
                    cwd=tmp_path)  # --device cpu: auto would pick a GPU where there is one
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = json.loads((tmp_path / "runs" / "f" / "verdict.json").read_text())
    assert verdict["status"] == "FAIL"
    assert any(r.startswith("matmul.fp32.cpu.64x64x64.err_eps:") and "misses band <= 0.001" in r for r in verdict["reasons"])
    table = done.stdout[done.stdout.index("operators (repeat 0"):]
    row = next(line for line in table.splitlines() if line.strip().startswith("matmul.fp32.cpu.64x64x64"))
    assert row.split()[-1] == "FAIL" and row.split()[-2] == "0.001"  # named in the table with its error figures


@pytest.mark.measures
@pytest.mark.slow
def test_the_all_reduce_runs_on_two_gloo_ranks(tmp_path):
    done = repro500("ops", "--op", "allreduce", "--sizes", "tiny", "--nproc", "2", "--budget-s", "0.01", "-n", "2",
                    "--device", "cpu", "--no-tracking", "--run-id", "ar", cwd=tmp_path)
    assert done.returncode in (0, 3), done.stdout + done.stderr  # 2 repeats: zero-variance bands decide
    record = json.loads((tmp_path / "runs" / "ar" / "repeats" / "0" / "system.json").read_text())
    fp32 = [c for c in record["cases"] if c["id"].startswith("allreduce.fp32.cpu.")]
    assert [c["shape"]["bytes"] for c in fp32] == [4096, 16384]
    assert all(c["ranks"] == 2 and c["within_tolerance"] and c["bytes_per_s"] > 0 for c in fp32)
    run = json.loads((tmp_path / "runs" / "ar" / "run.json").read_text())
    assert run["engine"] == "ddp" and run["world_size"] == 2


@pytest.mark.slow
def test_a_dtype_an_operator_has_no_kernel_for_is_refused_when_asked_for_by_name(tmp_path):
    from repro500.ext import ops as ext

    if not ext.load_native():
        pytest.skip(f"the C++ operators do not build here ({ext.native_error()})")
    done = repro500("ops", "--op", "dequantize", "--dtype", "bf16", "--sizes", "tiny", "--device", "cpu",
                    "--no-tracking", cwd=tmp_path)
    assert done.returncode == 4
    assert done.stderr.strip().splitlines() == [
        "repro500: error: dequantize has no bf16 kernel on cpu (repro500::stochastic_dequantize needs float32 or "
        "float64 scales, got BFloat16): leave --dtype bf16 or --op dequantize out"]
    assert not (tmp_path / "runs").exists()


def test_fp32_cases_run_without_tf32_and_the_settings_are_restored(monkeypatch):
    """cuDNN's TF32 default would make an 'fp32' convolution a TF32 one on a GPU (an H200 measured
    2,560 fp32 epsilons); the flags are plain attributes on a CPU, so the switch is checked here."""
    seen = []
    spec = REGISTRY["conv2d"]
    real_call = spec.call

    def spy(x):
        inner = real_call(x)

        def call():
            seen.append((torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
            return inner()
        return call

    monkeypatch.setattr(spec, "call", spy)
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul  # matmul's flags are properties
    before = (cudnn.allow_tf32, matmul.allow_tf32)
    cudnn.allow_tf32, matmul.allow_tf32 = True, True
    try:
        budget = ops.timing.Budget(warmup=1, min_reps=3, budget_s=0.0)
        for dtype, expected in (("fp32", (False, False)), ("bf16", (True, True))):
            seen.clear()
            shape = (("n", 1), ("c", 2), ("h", 4), ("w", 4), ("o", 2), ("k", 3))
            ops.measure_case(Case("conv2d", dtype, "cpu", shape), 0, budget)
            assert seen and set(seen) == {expected}, dtype
        assert (cudnn.allow_tf32, matmul.allow_tf32) == (True, True)
    finally:
        cudnn.allow_tf32, matmul.allow_tf32 = before
