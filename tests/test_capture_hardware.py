"""The hardware facet on a fake /proc + /sys tree and a fake NVML with three GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from repro500.capture import hardware


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def fake_root(tmp_path):
    """Two sockets x 2 cores x 2 threads, 2 NUMA nodes, cgroup v2 limits, a NIC and an HCA."""
    root = tmp_path / "root"
    blocks = []
    for cpu in range(8):
        sock, core = cpu // 4, (cpu % 4) // 2
        blocks.append(f"processor\t: {cpu}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n"
                      f"model\t\t: 1\nmodel name\t: AMD EPYC 7763 64-Core Processor\n"
                      f"stepping\t: 1\nphysical id\t: {sock}\ncore id\t\t: {core}\n"
                      f"cpu MHz\t\t: 2445.{cpu}\nflags\t\t: fpu sse2 avx2 avx\n")
    write(root, "proc/cpuinfo", "\n".join(blocks))
    write(root, "proc/meminfo", "MemTotal:       16384 kB\nSwapTotal:  0 kB\nHugepagesize:  2048 kB\n")
    write(root, "proc/self/cgroup", "0::/job/42\n")
    cpu = "sys/devices/system/cpu/"
    write(root, cpu + "online", "0-7\n")
    write(root, cpu + "cpu0/cpufreq/cpuinfo_max_freq", "3500000\n")
    write(root, cpu + "cpu0/cpufreq/scaling_governor", "performance\n")
    for i, (level, kind, size) in enumerate([(1, "Data", "32K"), (2, "Unified", "512K"),
                                             (3, "Unified", "32768K")]):
        write(root, f"{cpu}cpu0/cache/index{i}/level", f"{level}\n")
        write(root, f"{cpu}cpu0/cache/index{i}/type", f"{kind}\n")
        write(root, f"{cpu}cpu0/cache/index{i}/size", f"{size}\n")
    for node, cpus in ((0, "0-3"), (1, "4-7")):
        base = f"sys/devices/system/node/node{node}/"
        write(root, base + "cpulist", cpus + "\n")
        write(root, base + "meminfo", f"Node {node} MemTotal:       8192 kB\n")
        write(root, base + "distance", "10 32\n" if node == 0 else "32 10\n")
    write(root, "sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n")
    write(root, "sys/fs/cgroup/cgroup.controllers", "cpu memory\n")
    write(root, "sys/fs/cgroup/job/42/cpu.max", "400000 100000\n")
    write(root, "sys/fs/cgroup/job/42/memory.max", "8589934592\n")
    write(root, "sys/fs/cgroup/job/42/cpuset.cpus.effective", "0-3\n")
    write(root, "sys/class/net/lo/mtu", "65536\n")
    write(root, "sys/class/net/ib0/mtu", "4092\n")
    write(root, "sys/class/net/ib0/speed", "200000\n")
    write(root, "sys/class/net/ib0/operstate", "up\n")
    (root / "sys/class/net/ib0/device").mkdir()
    write(root, "sys/class/net/veth1/mtu", "1500\n")
    write(root, "sys/class/net/veth1/speed", "-1\n")
    ib = "sys/class/infiniband/mlx5_0/"
    write(root, ib + "hca_type", "MT4123\n")
    write(root, ib + "fw_ver", "20.31.1014\n")
    write(root, ib + "device/numa_node", "1\n")
    write(root, ib + "ports/1/rate", "200 Gb/sec (4X HDR)\n")
    write(root, ib + "ports/1/state", "4: ACTIVE\n")
    write(root, ib + "ports/1/link_layer", "InfiniBand\n")
    return root


def test_cpu_numa_memory_cgroup_and_network_from_sys(fake_root):
    cpu = hardware.cpu_info(fake_root)
    assert cpu["model"] == "AMD EPYC 7763 64-Core Processor"
    assert (cpu["sockets"], cpu["cores"], cpu["threads"]) == (2, 4, 8)
    assert cpu["flags"] == ["avx", "avx2", "fpu", "sse2"]
    assert cpu["max_frequency_mhz"] == 3500 and cpu["governor"] == "performance"
    assert [c["size_bytes"] for c in cpu["caches"]] == [32 << 10, 512 << 10, 32 << 20]
    numa = hardware.numa_nodes(fake_root)
    assert [(n["node"], n["cpus"], n["memory_bytes"], n["distances"]) for n in numa] == [
        (0, "0-3", 8192 * 1024, [10, 32]), (1, "4-7", 8192 * 1024, [32, 10])]
    assert hardware.memory_info(fake_root) == {"total_bytes": 16384 * 1024, "swap_bytes": 0,
                                               "hugepage_size_bytes": 2048 * 1024,
                                               "transparent_hugepages": "madvise"}
    assert hardware.cgroup_limits(fake_root) == {"version": 2, "cpu_limit_cores": 4.0,
                                                 "memory_limit_bytes": 8 << 30, "cpuset": "0-3"}
    nets = {n["name"]: n for n in hardware.network_interfaces(fake_root)}
    assert set(nets) == {"ib0", "veth1"}  # loopback left out
    assert nets["ib0"]["speed_mbps"] == 200000 and not nets["ib0"]["virtual"]
    assert nets["veth1"]["speed_mbps"] is None and nets["veth1"]["virtual"]
    (ib,) = hardware.infiniband_devices(fake_root)
    assert ib["name"] == "mlx5_0" and ib["numa_node"] == 1
    assert ib["ports"][0]["rate"].startswith("200 Gb/sec") and ib["ports"][0]["state"] == "4: ACTIVE"


def test_cgroup_v1_unlimited_memory_reads_as_none(tmp_path):
    write(tmp_path, "proc/self/cgroup", "4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n")
    write(tmp_path, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")
    write(tmp_path, "sys/fs/cgroup/cpu/docker/abc/cpu.cfs_quota_us", "150000\n")
    write(tmp_path, "sys/fs/cgroup/cpu/docker/abc/cpu.cfs_period_us", "100000\n")
    limits = hardware.cgroup_limits(tmp_path)
    assert limits["version"] == 1 and limits["memory_limit_bytes"] is None
    assert limits["cpu_limit_cores"] == 1.5


class NVMLError(Exception):
    pass


def fake_pynvml() -> types.ModuleType:
    """GPUs 0 and 1 joined by 4 NVLinks; GPU 2 on PCIe (NODE), lacking some queries."""
    bus = ["00000000:07:00.0", "00000000:0A:00.0", "00000000:C1:00.0"]
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_NVLINK_MAX_LINKS = 1, 2, 6
    nv.calls = {"shutdown": 0}

    def unsupported(*_):
        raise NVMLError("Not Supported")

    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: nv.calls.__setitem__("shutdown", nv.calls["shutdown"] + 1)
    nv.nvmlDeviceGetCount = lambda: 3
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3" if h < 2 else "NVIDIA A100-PCIE-40GB"
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h:08d}-aaaa"
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=bus[h].encode())
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=(80 if h < 2 else 40) << 30)
    nv.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0) if h < 2 else (8, 0)
    nv.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980 if kind == 1 else 2619
    nv.nvmlDeviceGetApplicationsClock = unsupported
    nv.nvmlDeviceGetPowerManagementLimit = lambda h: 700000
    nv.nvmlDeviceGetEccMode = lambda h: (1, 1)
    nv.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5
    nv.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16
    nv.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 5
    nv.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16
    nv.nvmlDeviceGetMigMode = lambda h: (1, 1) if h == 2 else (0, 0)
    nv.nvmlDeviceGetMaxMigDeviceCount = lambda h: 2
    nv.nvmlDeviceGetMigDeviceHandleByIndex = lambda h, i: 100 + i if i == 0 else unsupported()
    nv.nvmlDeviceGetPersistenceMode = lambda h: 1
    nv.nvmlDeviceGetComputeMode = lambda h: 0
    nv.nvmlDeviceGetVbiosVersion = lambda h: "96.00.74.00.01"
    nv.nvmlDeviceGetNumaNodeId = lambda h: 0 if h < 2 else unsupported()
    nv.nvmlDeviceGetCpuAffinity = lambda h, n: [0x0F, 0] if h < 2 else [0xF0 | (1 << 9), 0]
    nv.nvmlSystemGetDriverVersion = lambda: "560.35.03"
    nv.nvmlSystemGetCudaDriverVersion = lambda: 12060
    nv.nvmlSystemGetNVMLVersion = unsupported

    def link_state(h, link):
        if h == 2:
            raise NVMLError("Not Supported")
        return 1 if link < 4 else 0

    nv.nvmlDeviceGetNvLinkState = link_state
    nv.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(
        busId=bus[1 - h].lower())
    nv.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 40
    return nv


def test_gpus_links_and_affinity_through_nvml(monkeypatch, fake_root):
    nv = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    facet = hardware.hardware(fake_root)
    assert facet["gpu_count"] == 3 and facet["gpu_reason"] is None
    assert facet["gpu_driver"] == {"driver_version": "560.35.03", "cuda_driver_version": "12.6",
                                   "nvml_version": None}
    g0, g1, g2 = facet["gpus"]
    assert g0["name"] == "NVIDIA H100 80GB HBM3"  # bytes from old bindings decoded
    assert g0["compute_capability"] == "9.0" and g0["memory_total_bytes"] == 80 << 30
    assert g0["power_limit_w"] == 700.0 and g0["ecc_enabled"] is True
    assert g0["application_sm_clock_mhz"] is None  # unsupported query: this field only
    assert g0["cpu_affinity"] == "0-3" and g0["numa_node"] == 0
    assert g2["cpu_affinity"] == "4-7,9" and g2["numa_node"] is None
    assert g2["mig_enabled"] is True and g2["mig_devices"] == [
        {"index": 0, "name": "NVIDIA A100-PCIE-40GB", "uuid": "GPU-00000100-aaaa",
         "memory_total_bytes": 40 << 30}]
    assert facet["gpu_links"] == [["X", "NV4", "NODE"], ["NV4", "X", "NODE"],
                                  ["NODE", "NODE", "X"]]
    assert nv.calls["shutdown"] == 1
    json.dumps(facet)
    manifest = {"facets": {"hardware": facet}}
    assert hardware.gpu_model(manifest) == "NVIDIA H100 80GB HBM3, NVIDIA A100-PCIE-40GB"
    facet["gpus"] = facet["gpus"][:2]
    assert hardware.gpu_model(manifest) == "NVIDIA H100 80GB HBM3"


def test_no_driver_means_no_gpus_not_an_error(monkeypatch):
    nv = types.ModuleType("pynvml")

    def fail():
        raise NVMLError("NVML Shared Library Not Found")

    nv.nvmlInit = fail
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    info = hardware.gpu_info()
    assert info["count"] == 0 and info["gpus"] == []
    assert "NVML Shared Library Not Found" in info["reason"]
    assert hardware.gpu_model({"facets": {"hardware": {"gpus": []}}}) == "none"
    assert hardware.gpu_model({"facets": {}}) == "unknown"


def test_real_machine_hardware_is_json_and_stable():
    first, second = hardware.hardware(), hardware.hardware()
    assert first == second  # nothing volatile (current clocks, free memory) is recorded
    assert first["cpu"]["threads"] >= 1 and first["memory"]["total_bytes"] > 0
    json.dumps(first)


needs_two_cpus = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                                    reason="needs Linux CPU affinity and at least two CPUs to narrow it")


@needs_two_cpus
def test_a_narrowed_allocation_is_what_capture_records_and_ranks_are_sized_by(tmp_path):
    # what SLURM's cpuset or `taskset -c 0` does to a job: the process may run on one CPU of several
    one_cpu = sorted(os.sched_getaffinity(0))[:1]
    probe = ("import json, os; from repro500.capture.hardware import usable_cpus; "
             "from repro500.workloads.engines.launch import launcher_env; "
             "print(json.dumps([os.cpu_count(), usable_cpus(), launcher_env(2)['OMP_NUM_THREADS']]))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env,
                         preexec_fn=lambda: os.sched_setaffinity(0, one_cpu))
    machine, usable, threads = json.loads(out.stdout)
    assert machine >= 2 and usable == 1
    assert threads == "1"  # two ranks on one CPU: one thread each, not cpu_count() // 2
    manifest = tmp_path / "m.json"
    subprocess.run([sys.executable, "-m", "repro500.cli", "capture", "-o", str(manifest)], capture_output=True,
                   check=True, cwd=tmp_path, preexec_fn=lambda: os.sched_setaffinity(0, one_cpu))
    assert json.loads(manifest.read_text())["facets"]["hardware"]["cpu"]["usable_cpus"] == 1


def test_a_thread_count_set_by_the_user_is_kept(monkeypatch):
    from repro500.workloads.engines.launch import launcher_env

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert launcher_env(2)["OMP_NUM_THREADS"] == "3"
