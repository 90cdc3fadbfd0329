"""The ``hardware`` facet: CPU, NUMA, memory, container limits, GPUs, links and NICs.

Everything is read from ``/proc`` and ``/sys`` (fast, no subprocess) and from NVML through
``pynvml`` (the ``nvidia-ml-py`` package) when an NVIDIA driver is present.  No GPU is a
normal answer (``gpus: []`` with the reason), not an error; an NVML query a GPU does not
support is recorded as ``null`` and never loses the rest of the device.

Only stable facts are recorded (maximum clocks, not current ones; installed memory, not
free memory), so two captures of the same machine compare equal.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path
from typing import Any

from repro500.capture.gpus import gpu_info
from repro500.capture.registry import CaptureContext, facet


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:  # absent on this kernel, or not readable in this container
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _size_bytes(text: str | None) -> int | None:
    """``"48K"`` / ``"2048K"`` / ``"32M"`` (sysfs cache sizes) -> bytes."""
    if not text:
        return None
    m = re.fullmatch(r"(\d+)\s*([KMG]?)B?", text.strip(), re.IGNORECASE)
    if not m:
        return None
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]


def _proc_cpuinfo(root: Path) -> list[dict[str, str]]:
    text = _read(root / "proc/cpuinfo") or ""
    blocks = []
    for block in text.split("\n\n"):
        fields = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if fields:
            blocks.append(fields)
    return blocks


def _cpuinfo_fallback() -> dict[str, Any]:
    """py-cpuinfo, only when /proc/cpuinfo lacks a model name (e.g. some ARM kernels).

    Not the default: here it takes ~1.2 s (it runs CPUID probes in a subprocess), which
    alone would spend the capture's time budget; /proc/cpuinfo has the same facts on x86.
    """
    try:
        import cpuinfo

        info = cpuinfo.get_cpu_info()
    except Exception:
        return {}
    return {"model": info.get("brand_raw"), "vendor": info.get("vendor_id_raw"),
            "flags": sorted(info.get("flags", []))}


def _mhz(text: str | None) -> int | None:
    try:
        return round(float(text)) if text else None
    except ValueError:
        return None


def _caches(cpu_dir: Path) -> list[dict[str, Any]]:
    out = []
    for index in sorted(cpu_dir.glob("cache/index*")):
        out.append({
            "level": _read_int(index / "level"),
            "type": _read(index / "type"),
            "size_bytes": _size_bytes(_read(index / "size")),
            "shared_cpu_list": _read(index / "shared_cpu_list"),
        })
    return out


def cpu_info(root: Path = Path("/")) -> dict[str, Any]:
    """CPU model, vendor, flags, sockets/cores/threads, frequency and caches."""
    blocks = _proc_cpuinfo(root)
    first = blocks[0] if blocks else {}
    sockets = {b.get("physical id") for b in blocks if "physical id" in b}
    cores = {(b.get("physical id"), b.get("core id")) for b in blocks if "core id" in b}
    sys_cpu = root / "sys/devices/system/cpu"
    info: dict[str, Any] = {
        "architecture": platform.machine(),
        "model": first.get("model name") or first.get("Model") or first.get("cpu model"),
        "vendor": first.get("vendor_id") or first.get("CPU implementer"),
        "family": first.get("cpu family"),
        "model_number": first.get("model") or first.get("CPU part"),
        "stepping": first.get("stepping") or first.get("CPU revision"),
        "microcode": first.get("microcode"),
        "flags": sorted((first.get("flags") or first.get("Features") or "").split()),
        "sockets": len(sockets) or None,
        "cores": len(cores) or None,
        "threads": len(blocks) or os.cpu_count(),
        "online": _read(sys_cpu / "online"),
        "smt_active": _read_int(sys_cpu / "smt/active"),
        "max_frequency_mhz": None,
        # varies with load and power state on bare metal; recorded for context, ranked low
        "current_frequency_mhz": _mhz(first.get("cpu MHz")),
        "governor": _read(sys_cpu / "cpu0/cpufreq/scaling_governor"),
        "caches": _caches(sys_cpu / "cpu0"),
    }
    max_khz = _read_int(sys_cpu / "cpu0/cpufreq/cpuinfo_max_freq")
    if max_khz:
        info["max_frequency_mhz"] = max_khz / 1000
    if not info["model"]:
        info.update({k: v for k, v in _cpuinfo_fallback().items() if v})
    info["usable_cpus"] = usable_cpus()
    return info


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity, which a SLURM allocation, a container's
    cpuset or ``taskset`` narrows, not the machine's count (threads or ranks sized by
    ``os.cpu_count()`` in a 4-core allocation of a 64-core node oversubscribe it 16 times)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _meminfo_kb(text: str | None, key: str) -> int | None:
    m = re.search(rf"^(?:Node \d+ )?{key}:\s+(\d+)\s*kB", text or "", re.MULTILINE)
    return int(m.group(1)) if m else None


def numa_nodes(root: Path = Path("/")) -> list[dict[str, Any]]:
    """NUMA nodes with their CPUs, memory and distance row (from /sys)."""
    nodes = []
    node_dir = root / "sys/devices/system/node"
    for path in sorted(node_dir.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        kb = _meminfo_kb(_read(path / "meminfo"), "MemTotal")
        nodes.append({
            "node": int(path.name[4:]),
            "cpus": _read(path / "cpulist"),
            "memory_bytes": kb * 1024 if kb is not None else None,
            "distances": [int(d) for d in (_read(path / "distance") or "").split()],
        })
    return nodes


def memory_info(root: Path = Path("/")) -> dict[str, Any]:
    text = _read(root / "proc/meminfo")
    total_kb, swap_kb = _meminfo_kb(text, "MemTotal"), _meminfo_kb(text, "SwapTotal")
    huge_kb = _meminfo_kb(text, "Hugepagesize")
    thp = _read(root / "sys/kernel/mm/transparent_hugepage/enabled")
    m = re.search(r"\[(\w+)\]", thp or "")
    return {
        "total_bytes": total_kb * 1024 if total_kb is not None else None,
        "swap_bytes": swap_kb * 1024 if swap_kb is not None else None,
        "hugepage_size_bytes": huge_kb * 1024 if huge_kb is not None else None,
        "transparent_hugepages": m.group(1) if m else thp,
    }


def _cgroup_paths(root: Path) -> dict[str, str]:
    """controller -> cgroup path of this process (``""`` is the v2 unified hierarchy)."""
    paths = {}
    for line in (_read(root / "proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                paths[controller] = parts[2]
    return paths


def _first_existing(base: Path, rel: str, name: str) -> Path | None:
    # Inside a container the process's cgroup path is often not visible; the mount root
    # then holds the container's own limits.
    for candidate in (base / rel.lstrip("/") / name, base / name):
        if candidate.exists():
            return candidate
    return None


_UNLIMITED = 1 << 60  # cgroup v1 spells "no limit" as a huge number


def cgroup_limits(root: Path = Path("/")) -> dict[str, Any]:
    """The container's CPU and memory limits (cgroup v2 or v1); ``None`` = unlimited."""
    fs = root / "sys/fs/cgroup"
    paths = _cgroup_paths(root)
    out: dict[str, Any] = {"version": None, "cpu_limit_cores": None,
                           "memory_limit_bytes": None, "cpuset": None}
    if (fs / "cgroup.controllers").exists():
        out["version"] = 2
        rel = paths.get("", "/")
        cpu_max = _first_existing(fs, rel, "cpu.max")
        if cpu_max:
            quota, _, period = (_read(cpu_max) or "max").partition(" ")
            if quota != "max" and period:
                out["cpu_limit_cores"] = int(quota) / int(period)
        mem_max = _first_existing(fs, rel, "memory.max")
        if mem_max and (_read(mem_max) or "max") != "max":
            out["memory_limit_bytes"] = _read_int(mem_max)
        cpuset = _first_existing(fs, rel, "cpuset.cpus.effective")
        out["cpuset"] = _read(cpuset) if cpuset else None
        return out
    if (fs / "memory").is_dir() or (fs / "cpu").is_dir():
        out["version"] = 1
        mem = _first_existing(fs / "memory", paths.get("memory", "/"), "memory.limit_in_bytes")
        limit = _read_int(mem) if mem else None
        out["memory_limit_bytes"] = limit if limit is not None and limit < _UNLIMITED else None
        cpu_rel = paths.get("cpu", paths.get("cpuacct", "/"))
        quota_path = _first_existing(fs / "cpu", cpu_rel, "cpu.cfs_quota_us")
        period_path = _first_existing(fs / "cpu", cpu_rel, "cpu.cfs_period_us")
        quota = _read_int(quota_path) if quota_path else None
        period = _read_int(period_path) if period_path else None
        if quota and quota > 0 and period:
            out["cpu_limit_cores"] = quota / period
        cpuset = _first_existing(fs / "cpuset", paths.get("cpuset", "/"), "cpuset.cpus")
        out["cpuset"] = _read(cpuset) if cpuset else None
    return out


def network_interfaces(root: Path = Path("/")) -> list[dict[str, Any]]:
    """Network interfaces other than loopback: speed, MTU, state, driver."""
    out = []
    for path in sorted((root / "sys/class/net").glob("*")):
        if path.name == "lo":
            continue
        speed = _read_int(path / "speed")  # EINVAL while the link is down -> None
        driver = path / "device/driver"
        out.append({
            "name": path.name,
            "speed_mbps": speed if speed is not None and speed > 0 else None,
            "mtu_bytes": _read_int(path / "mtu"),
            "state": _read(path / "operstate"),
            "driver": os.path.basename(os.readlink(driver)) if driver.is_symlink() else None,
            "virtual": not (path / "device").exists(),
        })
    return out


def infiniband_devices(root: Path = Path("/")) -> list[dict[str, Any]]:
    """InfiniBand / RoCE adapters and their ports (rate, state, link layer)."""
    out = []
    for dev in sorted((root / "sys/class/infiniband").glob("*")):
        ports = []
        for port in sorted((dev / "ports").glob("*"), key=lambda p: p.name):
            ports.append({
                "port": port.name,
                "rate": _read(port / "rate"),
                "state": _read(port / "state"),
                "phys_state": _read(port / "phys_state"),
                "link_layer": _read(port / "link_layer"),
            })
        out.append({
            "name": dev.name,
            "hca_type": _read(dev / "hca_type"),
            "board_id": _read(dev / "board_id"),
            "fw_version": _read(dev / "fw_ver"),
            "numa_node": _read_int(dev / "device/numa_node"),
            "ports": ports,
        })
    return out


# GPUs are read through NVML in gpus.py.


def hardware(root: Path = Path("/")) -> dict[str, Any]:
    """The hardware facet's data (see module docstring)."""
    gpus = gpu_info()
    return {
        "cpu": cpu_info(root),
        "numa": numa_nodes(root),
        "memory": memory_info(root),
        "cgroup": cgroup_limits(root),
        "gpu_count": gpus.pop("count"),
        "gpu_driver": {k: gpus.pop(k, None)
                       for k in ("driver_version", "cuda_driver_version", "nvml_version")},
        "gpus": gpus.pop("gpus"),
        "gpu_links": gpus.pop("links", []),
        "gpu_reason": gpus.pop("reason", None),
        "network": network_interfaces(root),
        "infiniband": infiniband_devices(root),
    }


@facet("hardware")
def hardware_facet(ctx: CaptureContext) -> dict[str, Any]:
    return hardware()


def gpu_model(manifest: dict[str, Any]) -> str:
    """The GPU model for tags and summaries: a name, ``"none"``, or several names joined.

    ``"unknown"`` when the manifest has no hardware facet (it could not be gathered).
    """
    facets = manifest.get("facets", {})
    gpus = (facets.get("hardware") or {}).get("gpus")
    if gpus is None:
        devices = ((facets.get("runtime") or {}).get("torch") or {}).get("cuda_devices")
        if not devices:
            return "unknown" if "hardware" not in facets else "none"
        gpus = devices
    names = [str(g.get("name") or "unknown GPU") for g in gpus]
    if not names:
        return "none"
    unique = list(dict.fromkeys(names))
    return unique[0] if len(unique) == 1 else ", ".join(unique)
