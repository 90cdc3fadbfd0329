"""``repro500 roofline``: the machine's ceilings, each next to an independent tool's figure.

HPC AI500 V2.0 places a workload against the machine's measured compute and memory ceilings.
Measured here, per device (the CPU always; the GPU too when the run's device is one):

* **peak FLOP/s per dtype**: a square GEMM (``torch.matmul``, n x n x n, 2 n^3 FLOPs), the median
  of timed calls (``timing.py``);
* **memory bandwidth**, STREAM-style on arrays far larger than the caches: copy (a = b, 2 arrays
  moved), triad (a = b + s c, 3 arrays), read (sum of b, 1 array) and write (fill a, 1 array);
  the roofline's memory ceiling is the triad's (McCalpin's convention);
* **the interconnect's alpha/beta** with more than one rank: ``repro500 model``'s Gloo
  measurement and fit (repro500.scaling), latency L and seconds per byte gamma of the all-reduce.

Cross-checks on the CPU, each in the same run and recorded side by side: numpy's matmul
(through numpy's own BLAS) on the same fp32 shape, with numpy's BLAS threads set to torch's,
and Debian's ``sysbench memory`` reading and writing the same number of bytes per thread with
the same threads.  A ceiling that disagrees with its tool by more than the stated tolerance is
suspect: the recipe's acceptance is ``|repro500 / tool - 1|`` within 0.25 for the GEMM (two
BLAS libraries may differ that much: torch ships MKL, numpy OpenBLAS) and 0.15 for bandwidth.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any

from repro500.capture.hardware import cpu_info
from repro500.errors import InvalidInput, UsageError
from repro500.scaling.fit import fit_collective
from repro500.scaling.measure import Settings, measure
from repro500.system import DTYPES, timing
from repro500.system.ops import available_bytes

MiB = 1 << 20
PRESETS = {  # GEMM n and STREAM array bytes, per device
    "tiny": {"cpu": (128, 4 * MiB), "cuda": (256, 16 * MiB)},
    "default": {"cpu": (2048, 256 * MiB), "cuda": (8192, 1024 * MiB)},
    "large": {"cpu": (4096, 1024 * MiB), "cuda": (16384, 4096 * MiB)},
}
GEMM_TOLERANCE = 0.25
BANDWIDTH_TOLERANCE = 0.15
KERNELS = {"copy": 2, "triad": 3, "read": 1, "write": 1}  # arrays each kernel moves


@dataclass
class RooflineConfig:
    dtypes: list[str]
    sizes: str = "default"
    device: str = "cpu"
    nproc: int = 1
    threads: int | None = None
    budget: timing.Budget = field(default_factory=lambda: timing.Budget(min_reps=10, budget_s=2.0))

    @classmethod
    def from_recipe(cls, system: dict[str, Any], mutable: dict[str, Any], device: str) -> RooflineConfig:
        budget = timing.Budget(**{k: system[k] for k in ("warmup", "min_reps", "max_reps", "budget_s") if k in system})
        return cls(dtypes=list(system.get("dtypes") or DTYPES), sizes=str(system.get("sizes", "default")),
                   device=device, nproc=int(mutable.get("nproc") or 1), threads=mutable.get("threads"), budget=budget)

    @property
    def devices(self) -> list[str]:
        return ["cpu", "cuda"] if self.device == "cuda" else ["cpu"]


def sysbench() -> str | None:
    return shutil.which("sysbench")


def check_names(dtypes: list[str], sizes: str) -> None:
    """Names a user typed (usage errors, exit 2), checked before torch loads."""
    for dt in dtypes:
        if dt not in DTYPES:
            raise UsageError(f"unknown dtype {dt!r}; known: {', '.join(DTYPES)}")
    if sizes not in PRESETS:
        raise UsageError(f"unknown size preset {sizes!r}; known: {', '.join(PRESETS)}")


def check(config: RooflineConfig) -> list[str]:
    """Refuse bad names and sizes before anything is written; the metric names a repeat reports."""
    check_names(config.dtypes, config.sizes)

    for device in config.devices:
        n, array = PRESETS[config.sizes][device]
        need = max(3 * array, 3 * n * n * 8)
        available = available_bytes(device)
        if available is not None and need > available:
            raise InvalidInput(f"the {config.sizes} roofline needs about {need / 2**30:.1f} GiB of {device} memory but "
                               f"{available / 2**30:.1f} GiB are available: use --sizes tiny or default")
    return metric_names(config)


def metric_names(config: RooflineConfig) -> list[str]:
    names = []
    for device in config.devices:
        names += [f"peak_flops_per_s.{device}.{dt}" for dt in config.dtypes]
        names += [f"bandwidth_bytes_per_s.{device}.{kernel}" for kernel in KERNELS]
    names += ["cross_check.numpy_gemm_fp32_flops_per_s", "cross_check.gemm_fp32_disagreement"]
    names += [f"cross_check.sysbench_{op}_bytes_per_s" for op in ("read", "write")]
    names += [f"cross_check.{op}_disagreement" for op in ("read", "write")]
    if config.nproc > 1:
        names += ["interconnect.allreduce_latency_s", "interconnect.allreduce_bandwidth_bytes_per_s"]
    return names


def acceptance(config: RooflineConfig) -> dict[str, dict[str, Any]]:
    out = {"cross_check.gemm_fp32_disagreement": {"target": 0.0, "direction": "lower", "tolerance": GEMM_TOLERANCE}}
    if sysbench():  # without the tool there is nothing to compare with: the record says so
        for op in ("read", "write"):
            out[f"cross_check.{op}_disagreement"] = {"target": 0.0, "direction": "lower",
                                                     "tolerance": BANDWIDTH_TOLERANCE}
    return out


def gemm_flops(n: int, dtype: str, device: str, budget: timing.Budget) -> tuple[float, dict[str, Any]]:
    """FLOP/s of an n x n x n GEMM; a dtype so slow here (fp16 emulated on a CPU) that one call
    would take more than the whole budget is measured at the largest n that fits (recorded)."""
    import time

    import torch

    from repro500.system.operators import DTYPES as TORCH_DTYPES

    def square(size: int) -> tuple[Any, Any]:
        gen = torch.Generator().manual_seed(0)
        return tuple(torch.randn(size, size, generator=gen).to(TORCH_DTYPES[dtype]).to(device) for _ in range(2))

    sync = timing.synchronizer(device)
    probe = min(n, 256)
    a, b = square(probe)
    probe_s = []
    for _ in range(4):  # the fastest of a few: a call slowed by another process must not shrink n
        t0 = time.perf_counter()
        torch.matmul(a, b)
        sync()
        probe_s.append(time.perf_counter() - t0)
    projected_s = min(probe_s[1:]) * (n / probe) ** 3
    if projected_s > budget.budget_s:
        n = max(probe, int(n * (budget.budget_s / projected_s) ** (1 / 3)) // 64 * 64)
    a, b = square(n)
    t = timing.time_calls(lambda: torch.matmul(a, b), sync, budget)
    return 2.0 * n**3 / t.median_s, {**t.as_dict(), "n": n}


def numpy_gemm_flops(n: int, threads: int, budget: timing.Budget) -> tuple[float, dict[str, Any]]:
    """numpy's matmul through numpy's own BLAS, its threads set to torch's (threadpoolctl)."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    with threadpool_limits(limits=threads, user_api="blas"):
        t = timing.time_calls(lambda: a @ b, lambda: None, budget)
    return 2.0 * n**3 / t.median_s, t.as_dict()


def bandwidth(array_bytes: int, device: str, budget: timing.Budget) -> dict[str, Any]:
    """bytes/s of each STREAM-style kernel on float32 arrays of ``array_bytes``."""
    import torch

    n = array_bytes // 4
    a, b, c = (torch.ones(n, device=device) for _ in range(3))
    calls = {"copy": lambda: a.copy_(b), "triad": lambda: torch.add(b, c, alpha=3.0, out=a),
             "read": lambda: b.sum(), "write": lambda: a.fill_(1.5)}
    sync = timing.synchronizer(device)
    out = {}
    for kernel, call in calls.items():
        t = timing.time_calls(call, sync, budget)
        out[kernel] = {"bytes_per_s": KERNELS[kernel] * n * 4 / t.median_s, "time": t.as_dict()}
    return out


def sysbench_memory(op: str, bytes_per_thread: int, threads: int, passes: int = 10) -> tuple[float | None, str]:
    """(bytes/s, how it was run) from ``sysbench memory``, None with the reason when it cannot run."""
    tool = sysbench()
    if tool is None:
        return None, "not measured: sysbench is not installed (Debian: apt-get install sysbench)"
    block_k = max(1, bytes_per_thread // 1024)
    passes = max(passes, (1 << 20) // (block_k * threads))  # at least 1 GiB: the tool's start-up is not timed
    argv = [tool, "memory", f"--memory-block-size={block_k}K", f"--memory-total-size={block_k * threads * passes}K",
            f"--memory-oper={op}", "--memory-access-mode=seq", f"--threads={threads}", "--time=0", "run"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"not measured: {' '.join(argv)} failed ({err})"
    match = re.search(r"\(([0-9.]+) MiB/sec\)", done.stdout)
    if done.returncode != 0 or not match:
        return None, f"not measured: {' '.join(argv)} exited {done.returncode} without a MiB/sec figure"
    return float(match.group(1)) * MiB, " ".join(argv[1:])


def _disagreement(ours: float | None, theirs: float | None) -> float | None:
    return abs(ours / theirs - 1.0) if ours and theirs else None


def run(config: RooflineConfig, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One repeat: every ceiling, the tools' figures, and (several ranks) the interconnect."""
    import torch

    metrics: dict[str, Any] = {}
    doc: dict[str, Any] = {"measure": "roofline", "sizes": config.sizes, "threads": torch.get_num_threads(),
                           "budget": asdict(config.budget), "devices": {}, "cross_check": {}, "notes": []}
    for device in config.devices:
        n, array = PRESETS[config.sizes][device]
        entry: dict[str, Any] = {"gemm_n": n, "array_bytes": array, "peak_flops_per_s": {}, "gemm": {}}
        for dt in config.dtypes:
            from repro500.system.ops import unsupported

            why = unsupported("matmul", dt, device)
            if why:
                doc["notes"].append(f"not measured: peak {dt} FLOP/s on {device}: {why}")
                continue
            with timing.math_mode(dt):  # an fp32 peak is fp32's, not TF32's
                flops, t = gemm_flops(n, dt, device, config.budget)
            entry["peak_flops_per_s"][dt], entry["gemm"][dt] = flops, t
            metrics[f"peak_flops_per_s.{device}.{dt}"] = flops
        entry["bandwidth"] = bandwidth(array, device, config.budget)
        for kernel, rec in entry["bandwidth"].items():
            metrics[f"bandwidth_bytes_per_s.{device}.{kernel}"] = rec["bytes_per_s"]
        entry["bandwidth_level"], why = bandwidth_level(device, array)
        if entry["bandwidth_level"] == "memory":
            entry["memory_ceiling_bytes_per_s"] = entry["bandwidth"]["triad"]["bytes_per_s"]
        else:  # a figure measured in cache is no memory ceiling: say so rather than pass it off as one
            doc["notes"].append(f"{device} bandwidth measured in cache, not memory: {why}; use --sizes default or large "
                                "for the memory ceiling")
        doc["devices"][device] = entry
    _cross_check(config, doc, metrics)
    if config.nproc > 1:
        _interconnect(config, doc, metrics)
    return metrics, doc


def _cross_check(config: RooflineConfig, doc: dict[str, Any], metrics: dict[str, Any]) -> None:
    import torch

    threads = torch.get_num_threads()
    n, array = PRESETS[config.sizes]["cpu"]
    cpu = doc["devices"]["cpu"]
    ours, gemm = cpu["peak_flops_per_s"].get("fp32"), cpu["gemm"].get("fp32")
    if ours is None:  # fp32 left out of --dtype: the cross-check needs the fp32 GEMM all the same
        ours, gemm = gemm_flops(n, "fp32", "cpu", config.budget)
    numpy_flops, t = numpy_gemm_flops(gemm["n"], threads, config.budget)
    check = {"numpy_gemm_fp32_flops_per_s": numpy_flops, "numpy_gemm": t, "torch_gemm_fp32_flops_per_s": ours,
             "gemm_fp32_disagreement": _disagreement(ours, numpy_flops), "threads": threads}
    for op in ("read", "write"):
        figure, how = sysbench_memory(op, array // threads, threads)
        check[f"sysbench_{op}_bytes_per_s"], check[f"sysbench_{op}"] = figure, how
        check[f"{op}_disagreement"] = _disagreement(cpu["bandwidth"][op]["bytes_per_s"], figure)
        if figure is None:
            doc["notes"].append(f"{op} bandwidth {how}")
    doc["cross_check"] = check
    for key in ("numpy_gemm_fp32_flops_per_s", "gemm_fp32_disagreement", "sysbench_read_bytes_per_s",
                "sysbench_write_bytes_per_s", "read_disagreement", "write_disagreement"):
        metrics[f"cross_check.{key}"] = check[key]


def _interconnect(config: RooflineConfig, doc: dict[str, Any], metrics: dict[str, Any]) -> None:
    settings = Settings(p_values=(config.nproc,), max_bytes=4 * MiB if config.sizes == "tiny" else 64 * MiB)
    measured = measure(settings)
    fit = fit_collective("allreduce", measured.points)
    doc["interconnect"] = {"backend": "gloo", "ranks": config.nproc, "fit": fit.as_dict(),
                           "points": [p.as_dict() for p in measured.points]}
    metrics["interconnect.allreduce_latency_s"] = fit.latency_s
    metrics["interconnect.allreduce_bandwidth_bytes_per_s"] = fit.bandwidth_bytes_per_s


def last_level_cache_bytes(device: str) -> int | None:
    """The largest cache of the device: the CPU's last level (sysfs), a GPU's L2 (torch)."""
    if device == "cuda":
        import torch

        return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)) or None

    sizes = [c.get("size_bytes") or 0 for c in cpu_info().get("caches") or []]
    return max(sizes) or None if sizes else None


def bandwidth_level(device: str, array_bytes: int) -> tuple[str, str]:
    """("memory" | "cache", why): STREAM's rule, each array at least 4x the last-level cache,
    read as the triad's three arrays together against 4x the cache."""
    cache = last_level_cache_bytes(device)
    if cache is None:
        return "memory", "the cache size is unknown"
    total = 3 * array_bytes
    why = f"three arrays of {array_bytes / MiB:g} MiB against a {cache / MiB:g} MiB last-level cache"
    return ("memory" if total >= 4 * cache else "cache"), why
