"""repro500 roofline, repro500 ops --inference and repro500 io: their pieces, and each end to end."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
from helpers.runs import repro500, write_recipe

from repro500.errors import InvalidInput, UsageError
from repro500.recipe import load as recipes
from repro500.scaling import ceilings
from repro500.system import dataio, inference, roofline

needs_sysbench = pytest.mark.skipif(shutil.which("sysbench") is None,
                                    reason="sysbench is not installed (.ci/run installs Debian's package)")


# ----- roofline ---------------------------------------------------------------------------------
@needs_sysbench
def test_sysbench_memory_is_run_and_read_in_bytes_per_second():
    figure, how = roofline.sysbench_memory("read", 1 << 20, 1, passes=4)
    assert figure is not None and figure > 1e8, how  # any machine reads RAM faster than 100 MB/s
    assert "--memory-oper=read" in how and "--threads=1" in how


def test_without_sysbench_the_bandwidth_cross_check_is_not_measured_and_not_accepted(monkeypatch):
    monkeypatch.setattr(roofline.shutil, "which", lambda name: None)
    figure, how = roofline.sysbench_memory("write", 1 << 20, 1)
    assert figure is None and how.startswith("not measured: sysbench is not installed")
    config = roofline.RooflineConfig.from_recipe({"sizes": "tiny"}, {}, "cpu")
    assert list(roofline.acceptance(config)) == ["cross_check.gemm_fp32_disagreement"]


@pytest.mark.measures
@pytest.mark.slow
def test_the_roofline_measures_gemm_and_stream_kernels_and_checks_them_with_numpy(monkeypatch):
    monkeypatch.setattr(roofline.shutil, "which", lambda name: None)  # the sysbench part is tested above
    config = roofline.RooflineConfig.from_recipe({"sizes": "tiny", "dtypes": ["fp32"], "budget_s": 0.01,
                                                  "min_reps": 3}, {}, "cpu")
    metrics, doc = roofline.run(config, seed=0)
    assert metrics["peak_flops_per_s.cpu.fp32"] > 0
    assert set(doc["devices"]["cpu"]["bandwidth"]) == {"copy", "triad", "read", "write"}
    check = doc["cross_check"]
    assert check["gemm_fp32_disagreement"] == pytest.approx(
        abs(metrics["peak_flops_per_s.cpu.fp32"] / check["numpy_gemm_fp32_flops_per_s"] - 1))
    assert metrics["cross_check.read_disagreement"] is None  # no tool, no figure: never a made-up one
    assert any("sysbench is not installed" in n for n in doc["notes"])


def test_a_bandwidth_measured_in_cache_is_not_called_memory(monkeypatch):
    monkeypatch.setattr(roofline.shutil, "which", lambda name: None)
    monkeypatch.setattr(roofline, "last_level_cache_bytes", lambda device: 32 * roofline.MiB)
    config = roofline.RooflineConfig.from_recipe({"sizes": "tiny", "dtypes": ["fp32"], "budget_s": 0.01,
                                                  "min_reps": 3}, {}, "cpu")
    _, doc = roofline.run(config, seed=0)
    entry = doc["devices"]["cpu"]
    assert entry["bandwidth_level"] == "cache" and "memory_ceiling_bytes_per_s" not in entry
    assert any("measured in cache, not memory" in n for n in doc["notes"])
    assert {r["name"] for r in ceilings.rows(doc)} >= {"triad cache bandwidth (cpu)"}
    # STREAM's rule: the arrays together at least four times the last-level cache
    assert roofline.bandwidth_level("cpu", 256 * roofline.MiB)[0] == "memory"
    assert roofline.bandwidth_level("cpu", 4 * roofline.MiB)[0] == "cache"


def test_roofline_refuses_names_and_sizes_before_anything_runs():
    with pytest.raises(UsageError, match="unknown dtype 'fp64'"):
        roofline.check_names(["fp64"], "tiny")
    with pytest.raises(UsageError, match="unknown size preset 'huge'"):
        roofline.check_names(["fp32"], "huge")


# ----- inference ----------------------------------------------------------------------------------
def test_latency_quantiles_come_with_order_statistic_intervals():
    row = inference.latency([0.001 * (i + 1) for i in range(100)], batch=4)
    assert row["p50_s"] == pytest.approx(0.050) and row["p90_s"] == pytest.approx(0.090)
    assert row["p50_ci_s"][0] <= 0.050 <= row["p50_ci_s"][1]
    assert row["p99_ci_s"][1] is None and "368 values would" in row["notes"][0]
    assert row["throughput_samples_per_s"] == pytest.approx(4 / 0.050)


def test_inference_needs_a_recipe_that_trains_a_model(tmp_path):
    recipe = tmp_path / "cmd.yaml"
    recipe.write_text("fixed: {command: [python, t.py]}\nmetrics: {a: {regex: 'a ([0-9]+)'}}\n"
                      "acceptance: {a: {target: 1}}\n")
    with pytest.raises(InvalidInput, match="command recipe; --inference needs a recipe that trains"):
        inference.options_from_recipe(recipe)
    options = inference.options_from_recipe(write_recipe(tmp_path / "tiny.yaml"), batch_sizes=[2], calls=5)
    assert options["model"] == "resnet20" and options["task"] == "classification" and options["batch_sizes"] == [2]


def test_inference_checks_and_times_ieee_fp32_with_tf32_off_and_restores_it(tmp_path, monkeypatch):
    import torch

    system = inference.options_from_recipe(write_recipe(tmp_path / "tiny.yaml"), batch_sizes=[2], calls=20)
    config = inference.InferenceConfig.from_recipe(system, {}, "cpu")
    seen: list[tuple[bool, bool]] = []
    built = inference.build

    def build_watched(cfg):
        model, dataset = built(cfg)
        model.register_forward_pre_hook(lambda *_: seen.append(
            (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)))
        return model, dataset

    monkeypatch.setattr(inference, "build", build_watched)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)  # torch's default for cuDNN
    metrics, doc = inference.run(config, seed=1)
    assert len(seen) >= 20 and set(seen) == {(False, False)}  # the checked call and every timed call
    assert torch.backends.cudnn.allow_tf32 is True and doc["math"] == "fp32 (TF32 off)"
    assert metrics["output_max_rel_err"] < inference.OUTPUT_TOLERANCE


# ----- io -----------------------------------------------------------------------------------------
def test_reads_are_checked_sample_by_sample_and_a_corrupted_sample_is_counted(tmp_path):
    config = dataio.IoConfig(samples=24, size="8x8", formats=["chunked", "contiguous"], files=[1, 2],
                             access=["shuffled"], workers=[0], caches=["cold"], batch_size=5, scratch=str(tmp_path))
    dataio.check(config)
    root = dataio.prepare(config, seed=1)
    sums = np.load(root / "sums.npy")
    paths = sorted((root / "contiguous-2").glob("*.h5"))
    got = dataio.read_epoch(paths, "shuffled", 0, 5, 0, sums)
    assert got["samples"] == 24 and got["mismatches"] == 0 and got["bytes"] == 24 * 3 * 8 * 8
    with h5py.File(paths[1], "r+") as h5:
        h5["images"][0] = 255 - h5["images"][0]
    assert dataio.read_epoch(paths, "sequential", 0, 5, 0, sums)["mismatches"] == 1


def test_cold_reads_start_with_the_files_pages_dropped(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * (1 << 20))
    dataio.raw_read([path])
    assert dataio.resident_fraction(path) == pytest.approx(1.0)
    state = dataio.evict([path])
    assert state["method"] == "posix_fadvise(POSIX_FADV_DONTNEED)" and state["resident_after"] == pytest.approx(0.0)


@pytest.mark.parametrize("options, words", [
    ({"formats": ["zip"]}, "unknown format 'zip'"),
    ({"access": []}, "unknown access"),
    ({"files": [0]}, "at least 1"),
    ({"samples": 2, "files": [4]}, "more files than samples"),
])
def test_io_refuses_bad_options(options, words):
    with pytest.raises(UsageError, match=words):
        dataio.check(dataio.IoConfig(**options))


# ----- the recipe schema ----------------------------------------------------------------------------
def test_a_system_recipe_is_a_recipe_and_its_keys_are_checked(tmp_path):
    good = tmp_path / "ops.yaml"
    good.write_text("fixed: {workload: system, measure: ops, system: {sizes: tiny}}\nmutable: {device: cpu}\n"
                    "acceptance: {}\n")
    recipe = recipes.load(good)
    assert recipe.kind == "system" and recipe.mutable["nproc"] == 1 and "optimizer" not in recipe.mutable
    for text, words in [
        ("fixed: {workload: system, measure: ops, model: resnet20}\nacceptance: {}\n", "fixed.model is not part of a system"),
        ("fixed: {workload: system}\nacceptance: {}\n", "fixed.measure is required"),
        ("fixed: {workload: system, measure: ops}\nmutable: {batch_size: 4}\nacceptance: {}\n", "not tunable in a system"),
    ]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(InvalidInput, match=words):
            recipes.load(bad)
    trained = write_recipe(tmp_path / "t.yaml", fixed__measure="ops")
    with pytest.raises(InvalidInput, match="fixed.measure is for system workloads"):
        recipes.load(trained)


# ----- end to end ---------------------------------------------------------------------------------------
@pytest.mark.measures
@pytest.mark.slow
def test_roofline_run_and_a_training_run_placed_on_it_in_the_report(tmp_path):
    done = repro500("roofline", "--sizes", "tiny", "--dtype", "fp32", "--dtype", "bf16", "--budget-s", "0.05",
                    "--threads", "1", "-n", "3", "--no-tracking", "--run-id", "roof", cwd=tmp_path)
    assert done.returncode in (0, 1, 3), done.stdout + done.stderr  # tiny arrays sit in the caches: any verdict
    summary = json.loads((tmp_path / "runs" / "roof" / "summary.json").read_text())
    assert len(summary["metrics"]["peak_flops_per_s.cpu.bf16"]["values"]) == 3
    assert "cross_check.gemm_fp32_disagreement" in summary["acceptance"]
    assert "peak fp32 GEMM" in done.stdout and "numpy matmul" in done.stdout
    write_recipe(tmp_path / "tiny.yaml", repeats=1)
    trained = repro500("run", "tiny.yaml", "--run-id", "t", "--no-tracking", cwd=tmp_path)
    assert trained.returncode in (0, 3), trained.stderr
    report = repro500("report", "runs/t", "--roofline", "runs/roof", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "runs" / "t" / "report.html").read_text()
    assert "Ceilings from runs/roof (given with --roofline)" in page and "the run on the roofline" in page
    found = repro500("report", "runs/t", "--out", str(tmp_path / "auto.html"), cwd=tmp_path)
    assert found.returncode == 0 and "found beside this run" in (tmp_path / "auto.html").read_text()
    wrong = repro500("report", "runs/t", "--roofline", "runs/t", "--out", str(tmp_path / "x.html"), cwd=tmp_path)
    assert wrong.returncode == 4 and "is not a repro500 roofline run" in wrong.stderr


@pytest.mark.measures
@pytest.mark.slow
def test_inference_latency_of_a_recipes_model(tmp_path):
    write_recipe(tmp_path / "tiny.yaml")
    done = repro500("ops", "--inference", "tiny.yaml", "--batch-size", "1", "--batch-size", "4", "--calls", "30",
                    "--threads", "1", "-n", "2", "--no-tracking", "--run-id", "inf", cwd=tmp_path)
    assert done.returncode in (0, 3), done.stdout + done.stderr  # 2 repeats bound the error band
    repeat = json.loads((tmp_path / "runs" / "inf" / "repeats" / "0" / "summary.json").read_text())["metrics"]
    assert 0 < repeat["b1.batch_latency.p50_s"] <= repeat["b1.batch_latency.p90_s"] <= repeat["b1.batch_latency.p99_s"]
    assert repeat["b4.sample_latency.p50_s"] == pytest.approx(repeat["b4.batch_latency.p50_s"] / 4)
    assert repeat["output_max_rel_err"] < inference.OUTPUT_TOLERANCE
    record = json.loads((tmp_path / "runs" / "inf" / "repeats" / "0" / "system.json").read_text())
    assert [b["calls"] for b in record["batches"]] == [30, 30]
    assert any("368 values would" in note for note in record["notes"])


@pytest.mark.measures
@pytest.mark.slow
def test_io_run_compares_layouts_with_the_raw_read(tmp_path):
    done = repro500("io", "--samples", "64", "--image-size", "16x16", "--formats", "chunked,gzip", "--files", "1,2",
                    "--access", "sequential,shuffled", "--workers", "0,1", "--cache", "cold,warm", "-n", "2",
                    "--scratch", str(tmp_path), "--no-tracking", "--run-id", "io", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr  # every sample read back as written: zero variance
    record = json.loads((tmp_path / "runs" / "io" / "repeats" / "1" / "system.json").read_text())
    assert len(record["configs"]) == 2 * 2 * 2 * 2 * 2 and len(record["raw"]) == 2 * 2 * 2
    assert all(c["mismatches"] == 0 and c["of_raw"] > 0 for c in record["configs"])
    assert {c["cache_state"].get("resident_after") for c in record["configs"] if c["cache"] == "cold"} <= {0.0, None}
    assert not list(tmp_path.glob("repro500-io-*"))  # the scratch files are gone
