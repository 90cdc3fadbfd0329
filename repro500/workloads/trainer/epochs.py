"""What a training run records about the system, per epoch and per repeat, beside the trainer.

Hooked into a trained repeat through the trainer's own progress callbacks (no line of the
training loop changes), in the process that runs the repeat (for the ddp and horovod engines:
the launcher, whose callbacks follow rank 0's records as they are written):

* per epoch, between ``on_epoch_start`` and ``on_epoch_end``: joules of the CPU package, DRAM
  and each GPU, CPU and GPU utilization (``energy.py``), and the time the epoch's steps waited
  for data (the step records' ``time_data_s``, against their ``step_time_s``), one line each in
  the repeat's ``system.jsonl`` and, flattened, in the epoch record MLflow logs;
* per repeat, in its summary: ``energy_j``, ``energy_j_per_sample``, ``flops_per_j``,
  ``cpu_utilization_pct``, ``gpu_utilization_pct``, ``data_wait_fraction``, and the step's
  ``arithmetic_intensity_flop_per_byte`` (``intensity.py``) with ``achieved_flops_per_s``
  (counted training FLOPs / training time), which place the run on the roofline.

A figure that was not measured is ``None`` and the summary's ``system`` section says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500.rundir import layout
from repro500.workloads import parts
from repro500.workloads.trainer.energy import EnergyMeter
from repro500.workloads.trainer.intensity import estimate

IO_BOUND_FRACTION = 0.5  # an epoch that waited for data longer than it computed is I/O-bound


def data_wait(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """How much of the steps' time went to waiting for the next batch."""
    waited = sum(float(s.get("time_data_s") or 0.0) for s in steps)
    total = sum(float(s.get("step_time_s") or 0.0) for s in steps)
    fraction = waited / total if total > 0 else None
    return {"data_wait_s": waited, "step_time_s": total, "data_wait_fraction": fraction,
            "io_bound": None if fraction is None else fraction >= IO_BOUND_FRACTION}


def flat(epoch: dict[str, Any]) -> dict[str, float]:
    """The numbers of one epoch's system record, as MLflow metric names (per epoch)."""
    out: dict[str, float] = {}
    energy = epoch.get("energy") or {}
    for key in ("cpu_package_j", "dram_j", "total_j", "cpu_utilization_pct"):
        if energy.get(key) is not None:
            out[f"epoch_{key.replace('total_j', 'energy_j')}"] = float(energy[key])
    for i, value in enumerate(energy.get("gpu_j") or []):
        out[f"epoch_gpu{i}_j"] = float(value)
    for i, value in enumerate(energy.get("gpu_utilization_pct") or []):
        if value is not None:
            out[f"epoch_gpu{i}_utilization_pct"] = float(value)
    if epoch.get("data_wait_fraction") is not None:
        out["epoch_data_wait_fraction"] = float(epoch["data_wait_fraction"])
    return out


@dataclass
class EpochMeter:
    out_dir: Path
    meter: Any = None  # an EnergyMeter (tests give one reading fake counter files)
    epochs: list[dict[str, Any]] = field(default_factory=list)
    _running: bool = False

    def wrap(self, progress: Any) -> Any:
        """The same progress hooks with the metering around each epoch."""
        from dataclasses import replace

        inner_start, inner_end = progress.on_epoch_start, progress.on_epoch_end

        def on_epoch_start(epoch: int, steps: int | None) -> None:
            self.start()
            if inner_start:
                inner_start(epoch, steps)

        def on_epoch_end(record: dict[str, Any], steps: list[dict[str, Any]]) -> None:
            line = self.end(record, steps)
            if line is not None:
                record = {**record, "system": flat(line)}
            if inner_end:
                inner_end(record, steps)

        return replace(progress, on_epoch_start=on_epoch_start, on_epoch_end=on_epoch_end)

    def start(self) -> None:
        self.meter = self.meter or EnergyMeter()
        self.meter.start()
        self._running = True

    def end(self, record: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any] | None:
        if not self._running:  # no start was reported for this epoch: nothing was metered
            return None
        self._running = False
        line = {"epoch": record.get("epoch"), "energy": self.meter.stop(), **data_wait(steps),
                "samples": sum(int(s.get("samples") or 0) for s in steps)}
        self.epochs.append(line)
        with (self.out_dir / layout.SYSTEM_EPOCHS).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, allow_nan=False) + "\n")
        return line

    def stop(self) -> None:
        """A repeat that ended inside an epoch (an error, Ctrl-C) leaves no thread behind."""
        if self._running:
            self._running = False
            self.meter.stop()

    def finish(self, summary: dict[str, Any], intensity: dict[str, Any] | None) -> dict[str, Any]:
        """The repeat summary with the system's metrics and its ``system`` section added."""
        metrics = summary.setdefault("metrics", {})
        samples = sum(e["samples"] for e in self.epochs) or summary.get("samples_seen") or 0
        parts = {"cpu_package": "cpu_package_j", "dram": "dram_j", "total": "total_j"}
        totals: dict[str, Any] = {}
        for part, key in parts.items():
            values = [e["energy"].get(key) for e in self.epochs]
            totals[f"{part}_j"] = sum(values) if values and all(v is not None for v in values) else None
        energy_j = totals["total_j"]
        train_flops, train_time_s = metrics.get("train_flops"), metrics.get("train_time_s") or summary.get("train_time_s")
        wall = sum(e["energy"]["wall_s"] for e in self.epochs)
        cpu = [e["energy"].get("cpu_utilization_pct") for e in self.epochs]
        gpu = [v for e in self.epochs for v in (e["energy"].get("gpu_utilization_pct") or []) if v is not None]
        waited = data_wait([{"time_data_s": e["data_wait_s"], "step_time_s": e["step_time_s"]} for e in self.epochs])
        metrics.update({
            "energy_j": energy_j,
            "energy_j_per_sample": energy_j / samples if energy_j is not None and samples else None,
            "flops_per_j": train_flops / energy_j if energy_j and train_flops else None,
            "cpu_utilization_pct": (sum(c * e["energy"]["wall_s"] for c, e in zip(cpu, self.epochs, strict=True)) / wall
                                    if cpu and all(c is not None for c in cpu) and wall > 0 else None),
            "gpu_utilization_pct": sum(gpu) / len(gpu) if gpu else None,
            "data_wait_fraction": waited["data_wait_fraction"],
            "arithmetic_intensity_flop_per_byte": (intensity or {}).get("arithmetic_intensity_flop_per_byte"),
            "achieved_flops_per_s": train_flops / train_time_s if train_flops and train_time_s else None,
        })
        reasons: dict[str, str] = {}
        for e in self.epochs:
            reasons.update(e["energy"].get("not_measured") or {})
        summary["system"] = {
            "energy": {**totals, "gpu_j": _gpu_totals(self.epochs), "not_measured": reasons,
                       "epochs_metered": len(self.epochs)},
            "data_wait": {**waited, "rule": f"I/O-bound when the steps waited for data at least "
                                            f"{IO_BOUND_FRACTION:.0%} of their time",
                          "per_epoch": [{"epoch": e["epoch"], "data_wait_fraction": e["data_wait_fraction"]}
                                        for e in self.epochs]},
            "intensity": intensity or {"arithmetic_intensity_flop_per_byte": None, "not_measured": "no estimate"},
        }
        return summary


def _gpu_totals(epochs: list[dict[str, Any]]) -> list[float] | None:
    series = [e["energy"].get("gpu_j") for e in epochs]
    if not series or any(s is None for s in series):
        return None
    return [sum(values) for values in zip(*series, strict=True)]


def intensity_of(spec: Any) -> dict[str, Any]:
    """The training step's arithmetic intensity for a trainer spec: its model and one batch of
    ``batch_size`` samples of its training data, built through the trainer's door."""
    import torch

    from repro500.workloads.trainer import train

    try:
        dataset = parts.open_data(spec.dataset, "train", paths=spec.search_paths)
        model = train.build_model(spec, dict(getattr(dataset, "info", {}) or {}))
        n = min(int(spec.batch_size), len(dataset))
        items = [dataset[i] for i in range(n)]
        if spec.workload == "detection":
            from repro500.data import collate_detection

            inputs, targets = collate_detection(items)
        else:
            inputs, targets = torch.utils.data.default_collate(items)
        device = torch.device("cuda" if spec.device == "cuda" else "cpu")  # the counts are the same anywhere
        model = model.to(device)
        inputs, targets = _to(inputs, device), _to(targets, device)
        task = train.Task(spec.workload)
        return estimate(model, lambda m: task.loss(m, inputs, targets), n)
    except Exception as err:  # noqa: BLE001 - an operator the counters cannot trace: not measured, said why
        return {"arithmetic_intensity_flop_per_byte": None,
                "not_measured": f"the estimate failed ({type(err).__name__}: {str(err)[:200]})"}


def _to(value: Any, device: Any) -> Any:
    if hasattr(value, "to"):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value
