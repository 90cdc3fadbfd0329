"""GPUs through NVML (``pynvml``, the ``nvidia-ml-py`` package), for the ``hardware`` facet:
each device's stable facts, MIG partitions and the GPU-to-GPU link matrix.  No driver is a
normal answer (``gpus: []`` with the reason); a query a device does not support is ``null``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

# nvidia-smi topo -m's names for NVML's common-ancestor levels
TOPOLOGY_LEVELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}



def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _cpus_from_mask(words: Any, bits_per_word: int = 64) -> str | None:
    """NVML's CPU-affinity bitmask (array of unsigned longs) -> ``"0-15,32-47"``."""
    if words is None:
        return None
    cpus = [i * bits_per_word + b for i, w in enumerate(words) for b in range(bits_per_word)
            if (int(w) >> b) & 1]
    ranges, start = [], None
    for i, cpu in enumerate(cpus):
        if start is None:
            start = cpu
        if i + 1 == len(cpus) or cpus[i + 1] != cpu + 1:
            ranges.append(str(start) if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(ranges)


def _gpu(nvml: Any, index: int, handle: Any) -> dict[str, Any]:
    def q(name: str, *args: Any) -> Any:
        func = getattr(nvml, name, None)  # older bindings lack newer queries
        if func is None:
            return None
        try:
            return _text(func(handle, *args))
        except Exception:  # NVMLError_NotSupported / NoPermission / ...: this field only
            return None

    memory = q("nvmlDeviceGetMemoryInfo")
    capability = q("nvmlDeviceGetCudaComputeCapability")
    ecc = q("nvmlDeviceGetEccMode")
    mig = q("nvmlDeviceGetMigMode")
    pci = q("nvmlDeviceGetPciInfo")
    power_mw = q("nvmlDeviceGetPowerManagementLimit")
    ncpu_words = max(1, ((os.cpu_count() or 1) + 63) // 64)
    gpu = {
        "index": index,
        "name": q("nvmlDeviceGetName"),
        "uuid": q("nvmlDeviceGetUUID"),
        "pci_bus_id": _text(getattr(pci, "busId", None)),
        "memory_total_bytes": getattr(memory, "total", None),
        "compute_capability": ".".join(map(str, capability)) if capability else None,
        "max_sm_clock_mhz": q("nvmlDeviceGetMaxClockInfo", getattr(nvml, "NVML_CLOCK_SM", 1)),
        "max_memory_clock_mhz": q("nvmlDeviceGetMaxClockInfo", getattr(nvml, "NVML_CLOCK_MEM", 2)),
        "application_sm_clock_mhz": q("nvmlDeviceGetApplicationsClock",
                                      getattr(nvml, "NVML_CLOCK_SM", 1)),
        "power_limit_w": power_mw / 1000 if isinstance(power_mw, (int, float)) else None,
        "ecc_enabled": bool(ecc[0]) if isinstance(ecc, (tuple, list)) else None,
        "pcie_max_generation": q("nvmlDeviceGetMaxPcieLinkGeneration"),
        "pcie_max_width": q("nvmlDeviceGetMaxPcieLinkWidth"),
        "pcie_generation": q("nvmlDeviceGetCurrPcieLinkGeneration"),
        "pcie_width": q("nvmlDeviceGetCurrPcieLinkWidth"),
        "mig_enabled": bool(mig[0]) if isinstance(mig, (tuple, list)) else None,
        "persistence_mode": bool(p) if (p := q("nvmlDeviceGetPersistenceMode")) is not None else None,
        "compute_mode": q("nvmlDeviceGetComputeMode"),
        "vbios": q("nvmlDeviceGetVbiosVersion"),
        "numa_node": q("nvmlDeviceGetNumaNodeId"),
        "cpu_affinity": _cpus_from_mask(q("nvmlDeviceGetCpuAffinity", ncpu_words)),
    }
    if gpu["mig_enabled"]:
        gpu["mig_devices"] = _mig_devices(nvml, handle)
    return gpu


def _mig_devices(nvml: Any, handle: Any) -> list[dict[str, Any]]:
    out = []
    try:
        count = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    except Exception:
        return out
    for i in range(count):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except Exception:  # an unused slot
            continue
        entry: dict[str, Any] = {"index": i}
        for key, func in (("name", "nvmlDeviceGetName"), ("uuid", "nvmlDeviceGetUUID")):
            try:
                entry[key] = _text(getattr(nvml, func)(mig))
            except Exception:
                entry[key] = None
        try:
            entry["memory_total_bytes"] = nvml.nvmlDeviceGetMemoryInfo(mig).total
        except Exception:
            entry["memory_total_bytes"] = None
        out.append(entry)
    return out


def _link_matrix(nvml: Any, handles: list[Any], bus_ids: list[str | None]) -> list[list[str]]:
    """``nvidia-smi topo -m``'s GPU x GPU matrix: ``X``, ``NV<n>`` or a PCIe level."""
    n = len(handles)
    nvlinks = [[0] * n for _ in range(n)]
    max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
    index_of_bus = {str(b).lower(): i for i, b in enumerate(bus_ids) if b}
    for i, handle in enumerate(handles):
        for link in range(max_links):
            try:
                if not nvml.nvmlDeviceGetNvLinkState(handle, link):
                    continue
                remote = _text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except Exception:  # no NVLink on this GPU, or past its last link
                continue
            j = index_of_bus.get(str(remote).lower())
            if j is not None and j != i:
                nvlinks[i][j] += 1
    matrix = []
    for i in range(n):
        row = []
        for j in range(n):
            if i == j:
                row.append("X")
            elif nvlinks[i][j]:
                row.append(f"NV{nvlinks[i][j]}")
            else:
                try:
                    level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                    row.append(TOPOLOGY_LEVELS.get(int(level), str(level)))
                except Exception:
                    row.append("unknown")
        matrix.append(row)
    return matrix


def gpu_info() -> dict[str, Any]:
    """GPUs via NVML: ``{"count", "driver_version", "cuda_driver_version", "gpus", "links"}``."""
    try:
        import pynvml as nvml
    except ImportError:
        return {"count": 0, "gpus": [], "reason": "nvidia-ml-py (pynvml) is not installed"}
    try:
        nvml.nvmlInit()
    except Exception as err:  # no driver / no GPU: a normal answer
        return {"count": 0, "gpus": [], "reason": f"NVML unavailable: {err}"}
    try:
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        gpus = [_gpu(nvml, i, h) for i, h in enumerate(handles)]

        def system(name: str) -> Any:
            try:
                return _text(getattr(nvml, name)())
            except Exception:
                return None

        cuda_driver = system("nvmlSystemGetCudaDriverVersion")
        return {
            "count": count,
            "driver_version": system("nvmlSystemGetDriverVersion"),
            "cuda_driver_version": (f"{cuda_driver // 1000}.{cuda_driver % 1000 // 10}"
                                    if isinstance(cuda_driver, int) else cuda_driver),
            "nvml_version": system("nvmlSystemGetNVMLVersion"),
            "gpus": gpus,
            "links": _link_matrix(nvml, handles, [g["pci_bus_id"] for g in gpus]),
        }
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
