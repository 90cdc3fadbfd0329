"""Energy and utilization per epoch: RAPL read from a powercap tree, NVML faked at its API (no GPU
here), /proc/stat, and the per-epoch records and summary figures a trained repeat gets."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from repro500.workloads.trainer import epochs
from repro500.workloads.trainer.energy import EnergyMeter, rapl_zones
from repro500.workloads.workload import Progress


def powercap(root, package_uj=1_000, dram_uj=500, max_uj=10_000):
    """A powercap tree as Linux lays it out: a package zone, its core and dram sub-zones, psys."""
    zones = {"intel-rapl:0": ("package-0", package_uj), "intel-rapl:0:0": ("core", 7),
             "intel-rapl:0:1": ("dram", dram_uj), "intel-rapl:1": ("psys", 99)}
    for name, (kind, value) in zones.items():
        zone = root / name
        zone.mkdir(parents=True)
        (zone / "name").write_text(kind + "\n")
        (zone / "energy_uj").write_text(f"{value}\n")
        (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return root


def set_energy(root, zone, value):
    (root / zone / "energy_uj").write_text(f"{value}\n")


def proc_stat(path, busy, idle):
    # user nice system idle iowait irq softirq steal guest guest_nice
    path.write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\n")
    return path


class FakeNvml:
    """pynvml's API as documented (nvmlInit, nvmlDeviceGetCount, ...), counters advancing per call."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus=2, energy_supported=True, fail_init=False):
        self.gpus, self.supported, self.fail_init = gpus, energy_supported, fail_init
        self.energy_mj = [10_000, 20_000][:gpus]
        self.shutdowns = 0

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if not self.supported:
            raise self.NVMLError("Not Supported")
        self.energy_mj[handle] += 1_500  # 1.5 J per reading
        return self.energy_mj[handle]

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=40 + 20 * handle, memory=10)


def test_rapl_package_and_dram_add_up_and_a_wrap_is_unwound(tmp_path):
    root = powercap(tmp_path / "powercap", package_uj=9_000, dram_uj=500)
    stat = proc_stat(tmp_path / "stat", busy=100, idle=100)
    meter = EnergyMeter(powercap=root, proc_stat=stat, nvml=FakeNvml(gpus=0), interval_s=3600).start()
    set_energy(root, "intel-rapl:0", 1_000)  # wrapped at 10 000: 9 000 -> 10 000 -> 1 000 is 2 000 uJ
    set_energy(root, "intel-rapl:0:1", 2_500)
    proc_stat(stat, busy=175, idle=125)
    out = meter.stop()
    assert out["cpu_package_j"] == pytest.approx(0.002)
    assert out["dram_j"] == pytest.approx(0.002)
    assert out["total_j"] == pytest.approx(0.004)  # core (inside the package) and psys (the platform) not added
    assert out["cpu_utilization_pct"] == pytest.approx(75.0)
    assert out["gpu_j"] is None and out["not_measured"] == {"gpu": "not measured: no GPU"}


def test_absent_or_unreadable_counters_are_reasons_never_zeros(tmp_path):
    out = EnergyMeter(powercap=tmp_path / "none", proc_stat=tmp_path / "nostat",
                      nvml=FakeNvml(fail_init=True), interval_s=3600).start().stop()
    assert out["cpu_package_j"] is None and out["dram_j"] is None and out["total_j"] is None
    assert out["cpu_utilization_pct"] is None
    assert "no RAPL" in out["not_measured"]["cpu_package"] and "does not exist" in out["not_measured"]["dram"]
    assert out["not_measured"]["gpu"] == "not measured: no GPU (NVML: Driver Not Loaded)"
    assert "could not be read" in out["not_measured"]["cpu_utilization"]
    root = powercap(tmp_path / "pc")
    (root / "intel-rapl:0:1" / "energy_uj").unlink()
    (root / "intel-rapl:0:1" / "energy_uj").mkdir()  # a counter that exists but cannot be read
    zones, missing = rapl_zones(root)
    assert [z.kind for z in zones] == ["cpu_package"]
    assert "intel-rapl:0:1/energy_uj cannot be read" in missing["dram"]


def test_nvml_energy_and_utilization_per_gpu(tmp_path):
    nvml = FakeNvml(gpus=2)
    meter = EnergyMeter(powercap=tmp_path / "none", nvml=nvml, interval_s=3600).start()
    out = meter.stop()
    assert out["gpu_j"] == [pytest.approx(1.5), pytest.approx(1.5)]  # one reading at start, one at stop
    assert out["gpu_utilization_pct"] == [40.0, 60.0]
    assert out["total_j"] == pytest.approx(3.0) and "gpu" not in out["not_measured"]
    assert nvml.shutdowns == 1
    old = EnergyMeter(powercap=tmp_path / "none", nvml=FakeNvml(energy_supported=False), interval_s=3600).start().stop()
    assert old["gpu_j"] is None and "not supported" in old["not_measured"]["gpu"]
    assert old["gpu_utilization_pct"] == [40.0, 60.0]  # utilization is still read


def test_the_sampling_thread_accumulates_between_epoch_ends(tmp_path):
    root = powercap(tmp_path / "powercap", package_uj=0)
    meter = EnergyMeter(powercap=root, nvml=FakeNvml(gpus=0), interval_s=0.01).start()
    import time

    for value in (3_000, 6_000, 9_000, 2_000):  # wraps once more after 9 000
        set_energy(root, "intel-rapl:0", value)
        # not a fixed sleep (a loaded machine may not run the thread in time): wait for two more
        # samples, so that one began after the write; the deadline only keeps a dead thread from hanging
        seen, deadline = meter._samples, time.monotonic() + 10
        while meter._samples < seen + 2 and time.monotonic() < deadline:
            time.sleep(0.005)
    out = meter.stop()
    assert out["cpu_package_j"] == pytest.approx(0.012)
    assert out["samples"] >= 4


def steps(n, data_s, step_s, samples=8):
    return [{"kind": "step", "time_data_s": data_s, "step_time_s": step_s, "samples": samples} for _ in range(n)]


def test_epoch_meter_writes_each_epoch_and_completes_the_summary(tmp_path):
    root = powercap(tmp_path / "powercap", package_uj=0, dram_uj=0, max_uj=10**12)
    seen = []
    meter = epochs.EpochMeter(tmp_path, meter=EnergyMeter(powercap=root, nvml=FakeNvml(gpus=0), interval_s=3600))
    hooks = meter.wrap(Progress(on_epoch_end=lambda record, s: seen.append(record)))
    for epoch, (data_s, joules) in enumerate([(0.3, 2.0), (0.1, 4.0)], start=1):
        hooks.on_epoch_start(epoch, 4)
        set_energy(root, "intel-rapl:0", int(joules * 1e6))
        hooks.on_epoch_end({"kind": "epoch", "epoch": epoch}, steps(4, data_s, 0.5))
    lines = [json.loads(x) for x in (tmp_path / "system.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in lines] == [1, 2]
    assert lines[0]["data_wait_fraction"] == pytest.approx(0.6) and lines[0]["io_bound"] is True
    assert seen[0]["system"]["epoch_cpu_package_j"] == pytest.approx(2.0)  # what MLflow logs per epoch
    assert seen[1]["system"]["epoch_data_wait_fraction"] == pytest.approx(0.2)
    summary = meter.finish({"metrics": {"train_flops": 8e9, "train_time_s": 4.0}, "samples_seen": 64},
                           {"arithmetic_intensity_flop_per_byte": 12.5})
    m = summary["metrics"]
    assert m["energy_j"] == pytest.approx(4.0)  # 2 J then 2 J more
    assert m["energy_j_per_sample"] == pytest.approx(4.0 / 64)
    assert m["flops_per_j"] == pytest.approx(2e9)
    assert m["data_wait_fraction"] == pytest.approx(0.4)
    assert m["achieved_flops_per_s"] == pytest.approx(2e9) and m["arithmetic_intensity_flop_per_byte"] == 12.5
    assert m["gpu_utilization_pct"] is None
    assert summary["system"]["energy"]["not_measured"]["gpu"] == "not measured: no GPU"
    assert summary["system"]["data_wait"]["io_bound"] is False


def test_without_counters_the_summary_says_not_measured(tmp_path):
    meter = epochs.EpochMeter(tmp_path, meter=EnergyMeter(powercap=tmp_path / "none", nvml=FakeNvml(fail_init=True)))
    hooks = meter.wrap(Progress())
    hooks.on_epoch_start(1, 2)
    hooks.on_epoch_end({"epoch": 1}, steps(2, 0.0, 0.1))
    m = meter.finish({"metrics": {"train_flops": 1e9, "train_time_s": 1.0}}, None)["metrics"]
    assert m["energy_j"] is None and m["energy_j_per_sample"] is None and m["flops_per_j"] is None
    assert m["arithmetic_intensity_flop_per_byte"] is None


def test_arithmetic_intensity_of_a_linear_layer_is_counted_exactly():
    import torch

    from repro500.workloads.trainer.intensity import estimate

    model = torch.nn.Linear(8, 4, bias=False)
    x, y = torch.randn(2, 8), torch.randn(2, 4)
    out = estimate(model, lambda m: torch.nn.functional.mse_loss(m(x), y), 2)
    assert out["flops_per_step"] == 2 * (2 * 2 * 8 * 4)  # forward, and the weight's gradient (x needs none)
    assert out["bytes_per_step"] > 4 * (2 * 8 + 8 * 4)  # at least the first GEMM's inputs
    assert out["arithmetic_intensity_flop_per_byte"] == out["flops_per_step"] / out["bytes_per_step"]
    assert model.weight.grad is None  # counted on a copy


@pytest.mark.measures
@pytest.mark.slow
def test_a_training_run_records_energy_utilization_data_wait_and_intensity(tmp_path):
    from helpers.runs import repro500, write_recipe

    write_recipe(tmp_path / "tiny.yaml", repeats=1)
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    done = repro500("run", "tiny.yaml", "--run-id", "t", cwd=tmp_path, env=env)
    assert done.returncode in (0, 3), done.stdout + done.stderr
    repeat = tmp_path / "runs" / "t" / "repeats" / "0"
    lines = [json.loads(x) for x in (repeat / "system.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in lines] == [1, 2]
    summary = json.loads((repeat / "summary.json").read_text())
    m = summary["metrics"]
    assert 0 <= m["data_wait_fraction"] < 1 and m["arithmetic_intensity_flop_per_byte"] > 1
    assert m["achieved_flops_per_s"] == pytest.approx(m["train_flops"] / m["train_time_s"])
    reasons = summary["system"]["energy"]["not_measured"]
    if m["energy_j"] is None:  # this VM: no RAPL, no GPU; the record says why
        assert reasons and all(reasons.values())
    import mlflow

    client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs(client.get_experiment_by_name("repro500/tiny").experiment_id,
                              "tags.mlflow.parentRunId != ''")
    history = client.get_metric_history(runs[0].info.run_id, "epoch_data_wait_fraction")
    epochs = client.get_metric_history(runs[0].info.run_id, "epoch")  # at the step that ended each epoch
    assert [h.step for h in history] == [e.step for e in epochs] and [e.value for e in epochs] == [1, 2]
    assert "data_wait_fraction" in runs[0].data.metrics
    verified = repro500("verify", "runs/t", cwd=tmp_path)
    assert verified.returncode in (0, 3), verified.stdout  # the rewritten summary is the sealed one
    report = repro500("report", "runs/t", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "runs" / "t" / "report.html").read_text()
    assert "waited for data" in page and "No ceilings to place it under" in page
