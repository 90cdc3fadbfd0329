"""Joules and utilization over an interval: ``EnergyMeter().start()`` ... ``.stop() -> dict``.

Counters read (docs/system.md, "Energy and utilization"):

* **CPU package and DRAM**: Linux's RAPL powercap zones, ``/sys/class/powercap/intel-rapl:N``
  (``name`` ``package-N``; its sub-zone named ``dram``; AMD's RAPL appears under the same names),
  ``energy_uj`` in microjoules, wrapping at ``max_energy_range_uj``.  Package energy covers the
  cores and the uncore, not DRAM, so the two add up; the platform zone (``psys``), which would
  count them again, is not read;
* **each GPU**: NVML's ``nvmlDeviceGetTotalEnergyConsumption`` (millijoules since the driver
  loaded; Volta and later) and ``nvmlDeviceGetUtilizationRates`` (percent of the last sample
  period with a kernel running), through ``pynvml`` (nvidia-ml-py);
* **CPU utilization**: ``/proc/stat``'s first line, busy = total - idle - iowait, over all cores
  of the machine (other processes' work counts too: a shared machine is busier than the run).

A background thread samples every ``interval_s`` seconds: RAPL's wrap is handled between two
samples (a counter wraps after minutes at full power, never within a second), and GPU
utilization is averaged over the samples.  Where a counter is absent or unreadable the result
says so, with the reason, in ``not_measured`` and the figure is ``None``: never a zero that was
not measured.  The thread reads a few small files a second; bench/energy_overhead.py measures
what it costs a training step.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

POWERCAP = Path("/sys/class/powercap")
PROC_STAT = Path("/proc/stat")
INTERVAL_S = 1.0


@dataclass
class Zone:
    """One RAPL zone: its kind (cpu_package or dram), its counter and where it wraps."""

    kind: str
    name: str
    path: Path
    max_uj: int
    last_uj: int = 0
    total_uj: int = 0

    def read(self) -> int:
        return int((self.path / "energy_uj").read_text(encoding="ascii").strip())

    def advance(self) -> None:
        now = self.read()
        self.total_uj += now - self.last_uj if now >= self.last_uj else now + self.max_uj - self.last_uj
        self.last_uj = now


def rapl_zones(root: Path = POWERCAP) -> tuple[list[Zone], dict[str, str]]:
    """The package and DRAM zones that can be read, and for each kind that cannot, why."""
    if not root.is_dir():
        why = f"no RAPL: {root} does not exist (a virtual machine, or a kernel without the powercap driver)"
        return [], {"cpu_package": why, "dram": why}
    zones, problems = [], []
    for path in sorted(root.glob("intel-rapl:*")):
        try:
            name = (path / "name").read_text(encoding="ascii").strip()
        except OSError:
            continue
        kind = "cpu_package" if name.startswith("package") else "dram" if name == "dram" else None
        if kind is None:
            continue  # core, uncore (inside the package's count) and psys (the whole platform)
        try:
            zone = Zone(kind, name, path, int((path / "max_energy_range_uj").read_text(encoding="ascii").strip()))
            zone.last_uj = zone.read()
        except PermissionError:
            problems.append(f"{path}/energy_uj is not readable (permission denied: since Linux 5.10 only root may "
                            "read RAPL counters)")
            continue
        except (OSError, ValueError) as err:
            problems.append(f"{path}/energy_uj cannot be read ({type(err).__name__})")
            continue
        zones.append(zone)
    missing = {}
    for kind in ("cpu_package", "dram"):
        if not any(z.kind == kind for z in zones):
            missing[kind] = "; ".join(problems) or f"no RAPL {kind.replace('cpu_', '')} zone under {root}"
    return zones, missing


class Gpus:
    """NVML's energy counters and utilization of every GPU (none: a reason instead)."""

    def __init__(self, nvml: Any = None) -> None:
        self.handles: list[Any] = []
        self.reason: str | None = None
        self.nvml = nvml
        try:
            if self.nvml is None:
                import pynvml

                self.nvml = pynvml
            self.nvml.nvmlInit()
            count = int(self.nvml.nvmlDeviceGetCount())
        except Exception as err:  # noqa: BLE001 - NVML absent, no driver: every failure means "no GPU here"
            self.reason = f"not measured: no GPU (NVML: {str(err) or type(err).__name__})"
            self.nvml = None
            return
        if count == 0:
            self.reason = "not measured: no GPU"
        self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def energy_mj(self) -> list[int | None]:
        out: list[int | None] = []
        for handle in self.handles:
            try:
                out.append(int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(handle)))
            except Exception:  # noqa: BLE001 - NVML_ERROR_NOT_SUPPORTED before Volta
                out.append(None)
        return out

    def utilization_pct(self) -> list[float | None]:
        out: list[float | None] = []
        for handle in self.handles:
            try:
                out.append(float(self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            except Exception:  # noqa: BLE001 - as above
                out.append(None)
        return out

    def close(self) -> None:
        if self.nvml is not None:
            with contextlib.suppress(Exception):  # shutting down what may never have worked
                self.nvml.nvmlShutdown()


def cpu_times(path: Path = PROC_STAT) -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, or None where /proc/stat cannot be read."""
    try:
        fields = [int(v) for v in path.read_text(encoding="ascii").splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return total - idle, total


@dataclass
class EnergyMeter:
    powercap: Path = POWERCAP
    proc_stat: Path = PROC_STAT
    nvml: Any = None
    interval_s: float = INTERVAL_S
    _zones: list[Zone] = field(default_factory=list)
    _missing: dict[str, str] = field(default_factory=dict)
    _gpus: Gpus | None = None
    _gpu_start: list[int | None] = field(default_factory=list)
    _gpu_util: list[list[float]] = field(default_factory=list)
    _cpu_start: tuple[int, int] | None = None
    _t0: float = 0.0
    _samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> EnergyMeter:
        self._zones, self._missing = rapl_zones(self.powercap)
        self._gpus = Gpus(self.nvml)
        self._gpu_start = self._gpus.energy_mj()
        self._gpu_util = [[] for _ in self._gpus.handles]
        self._cpu_start = cpu_times(self.proc_stat)
        self._samples, self._t0 = 0, time.perf_counter()
        self._stop.clear()
        if self._zones or self._gpus.handles:
            self._thread = threading.Thread(target=self._sample_loop, name="repro500-energy", daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        for zone in self._zones:
            with contextlib.suppress(OSError, ValueError):  # a missed sample: the next covers it (no wrap in seconds)
                zone.advance()
        for series, value in zip(self._gpu_util, self._gpus.utilization_pct() if self._gpus else [], strict=False):
            if value is not None:
                series.append(value)
        self._samples += 1

    def _sample_loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def stop(self) -> dict[str, Any]:
        """Joules and utilization since :meth:`start` (``None`` plus a reason where not measured)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._sample()
        wall_s = time.perf_counter() - self._t0
        out: dict[str, Any] = {"wall_s": wall_s, "samples": self._samples, "not_measured": dict(self._missing)}
        for kind in ("cpu_package", "dram"):
            zones = [z for z in self._zones if z.kind == kind]
            out[f"{kind}_j"] = sum(z.total_uj for z in zones) / 1e6 if zones else None
        gpus = self._gpus or Gpus(None)
        end = gpus.energy_mj()
        per_gpu = [None if a is None or b is None else (b - a) / 1e3 for a, b in zip(self._gpu_start, end, strict=False)]
        out["gpu_j"] = per_gpu if per_gpu and all(v is not None for v in per_gpu) else None
        out["gpu_utilization_pct"] = ([sum(s) / len(s) if s else None for s in self._gpu_util] if gpus.handles else None)
        if gpus.reason or not gpus.handles:
            out["not_measured"]["gpu"] = gpus.reason or "not measured: no GPU"
        elif out["gpu_j"] is None:
            out["not_measured"]["gpu"] = "NVML's total energy counter is not supported by this GPU (before Volta)"
        gpus.close()
        end_cpu = cpu_times(self.proc_stat)
        if self._cpu_start and end_cpu and end_cpu[1] > self._cpu_start[1]:
            out["cpu_utilization_pct"] = 100.0 * (end_cpu[0] - self._cpu_start[0]) / (end_cpu[1] - self._cpu_start[1])
        else:
            out["cpu_utilization_pct"] = None
            out["not_measured"]["cpu_utilization"] = f"{self.proc_stat} could not be read, or no time passed"
        parts = [out["cpu_package_j"], out["dram_j"], *(out["gpu_j"] or [])]
        measured = [p for p in parts if p is not None]
        out["total_j"] = sum(measured) if measured else None
        return out
