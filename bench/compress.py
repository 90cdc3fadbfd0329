"""Compression kernels against their anchors, on a ResNet-50-sized gradient (25.6M fp32).

    python bench/compress.py [--numel 25600000] [--runs 9]

Top-k 1%: the custom kernel (sampled threshold, repro500::topk_threshold) against one read
pass over the gradient (torch.sum: the memory floor no selection can beat), target <= 2.5x,
and against torch.topk(g.abs(), k), target <= 0.05x; then the coding of its positions for
the wire (repro500::positions_encode / _decode) and the bytes top-k 1% puts on the wire for
this gradient cut into DDP's buckets, by the wire model (target <= 1/100 of dense; the same
figure measured on TCP sockets is bench/wire_bytes.py's, which prints the selection figure
beside it).  QSGD (127 levels, buckets of 512) and the 1-bit sign kernels: effective GB/s
(bytes read + bytes written per second), with the pure-PyTorch references for comparison.
Variants are interleaved and each figure is the median of --runs.  Each kernel's effective
bandwidth is also set against the memory ceiling `repro500 roofline` measures (its STREAM triad
on arrays of its default size), measured in the same process: information on a CPU; on a GPU
the streaming kernels must reach at least half of it and top-k at most 2x a read pass (and the
datasheet's peak, from the device's memory clock and bus, is printed beside).  A missed target
prints MISSED; the run goes on to the end and then exits 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from repro500.ext import ops, reference

TARGET_TOPK_RATIO = 0.05  # custom top-k / torch.topk(|g|)
TARGET_FLOOR_RATIO = 2.5  # custom top-k / one read pass (torch.sum)
TARGET_FLOOR_RATIO_GPU = 2.0  # the same on a GPU, whose read pass is HBM's
TARGET_CEILING_SHARE_GPU = 0.5  # a streaming kernel's bytes moved per second / the roofline's memory ceiling
TARGET_WIRE_RATIO = 1 / 100  # top-k 1% bytes / dense allreduce bytes


def _timed(fn: Callable[[], object], sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def _medians(
    variants: dict[str, Callable[[], object]], runs: int, sync: Callable[[], None]
) -> dict[str, float]:
    for fn in variants.values():  # warm-up (allocator, first-touch, lazy init)
        fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(runs):
        for name, fn in variants.items():  # interleaved, so drift hits every variant alike
            samples[name].append(_timed(fn, sync))
    return {name: statistics.median(values) for name, values in samples.items()}


def _peak_bandwidth_bytes_per_s(device: torch.device) -> float | None:
    props = torch.cuda.get_device_properties(device)
    clock_khz = getattr(props, "memory_clock_rate", None)
    bus_bits = getattr(props, "memory_bus_width", None)
    if clock_khz and bus_bits:
        return 2.0 * clock_khz * 1e3 * bus_bits / 8  # double data rate
    return None


def selection_vs_floor(g: torch.Tensor, k: int, runs: int, sync: Callable[[], None],
                       with_torch_topk: bool = False) -> dict[str, float]:
    """Median seconds of the custom top-k and of one read pass over *g* (and torch.topk)."""
    topk = torch.ops.repro500.topk_threshold
    variants = {"custom top-k": lambda: topk(g, k), "read floor": lambda: torch.sum(g)}
    if with_torch_topk:
        variants["torch.topk(|g|)"] = lambda: torch.topk(g.abs(), k)
    return _medians(variants, runs, sync)


def floor_ratio(times: dict[str, float]) -> float:
    """The custom top-k's time over one read pass's (selection_vs_floor's medians)."""
    return times["custom top-k"] / times["read floor"]


def floor_verdict(times: dict[str, float], target: float = TARGET_FLOOR_RATIO) -> str:
    ratio = floor_ratio(times)
    verdict = "met" if ratio <= target else "MISSED"
    return f"{ratio:.2f}x (target <= {target}x: {verdict})"


def memory_ceiling(device: torch.device) -> dict[str, float]:
    """bytes/s of the STREAM kernels as `repro500 roofline` measures them (the same function, on
    its default array size for the device); its memory ceiling is the triad's."""
    from repro500.system import roofline, timing

    _, array_bytes = roofline.PRESETS["default"][device.type]
    measured = roofline.bandwidth(array_bytes, device.type, timing.Budget())
    return {kernel: rec["bytes_per_s"] for kernel, rec in measured.items()}


def ceiling_share(bytes_per_s: float, ceiling: float, on_gpu: bool) -> str:
    """A kernel's share of the memory ceiling: a target on a GPU, information on a CPU."""
    share = bytes_per_s / ceiling
    if not on_gpu:
        return f"{share:.0%} of the roofline's memory ceiling"
    verdict = "met" if share >= TARGET_CEILING_SHARE_GPU else "MISSED"
    return f"{share:.0%} of the roofline's HBM ceiling (target >= {TARGET_CEILING_SHARE_GPU:.0%}: {verdict})"


def wire_model_ratio(numel: int, ratio: float = 0.01) -> float:
    """Top-k's payload over a dense allreduce's for *numel* fp32 elements in DDP's buckets."""
    from repro500.scaling import wire

    spec = {"name": "topk", "ratio": ratio}
    sparse = wire.bytes_per_rank(wire.buckets(spec, numel), 2, summable=False)
    dense = wire.bytes_per_rank(wire.buckets("none", numel), 2, summable=True)
    return sparse / dense


def bench(device: torch.device, numel: int, runs: int) -> list[str]:
    """Print the device's figures; return the targets it missed."""
    on_gpu = device.type == "cuda"
    missed: list[str] = []
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    g = torch.randn(numel, generator=torch.Generator().manual_seed(0)).to(device)
    k = numel // 100
    times = selection_vs_floor(g, k, runs, sync, with_torch_topk=True)
    ratio = times["custom top-k"] / times["torch.topk(|g|)"]
    print(f"[{device.type}] top-k 1% of {numel:,} fp32 (k={k:,}), median of {runs}:")
    for name, seconds in times.items():
        print(f"  {name:<18} {seconds * 1e3:9.2f} ms")
    verdict = "met" if ratio <= TARGET_TOPK_RATIO else "MISSED"
    floor_target = TARGET_FLOOR_RATIO_GPU if on_gpu else TARGET_FLOOR_RATIO
    print(f"  custom / read floor = {floor_verdict(times, floor_target)}")
    if floor_ratio(times) > floor_target:
        missed.append(f"{device.type} top-k / read floor")
    if ratio > TARGET_TOPK_RATIO:
        missed.append(f"{device.type} top-k / torch.topk")
    print(
        f"  custom / torch.topk = {ratio:.4f}x (target <= {TARGET_TOPK_RATIO}x: {verdict}; "
        f"{ratio / TARGET_TOPK_RATIO:.2f} of target)"
    )
    _, indices = torch.ops.repro500.topk_threshold(g, k)
    if not on_gpu:  # the positions code has CPU kernels; on a GPU it is the torch reference
        code = torch.ops.repro500.positions_encode(indices, numel)
        coding = _medians(
            {
                "encode positions": lambda: torch.ops.repro500.positions_encode(indices, numel),
                "decode positions": lambda: torch.ops.repro500.positions_decode(code, numel, k),
            },
            runs,
            sync,
        )
        print(
            f"  positions code: {code.numel():,} B ({8 * code.numel() / k:.2f} bits per position); "
            + ", ".join(f"{name} {seconds * 1e3:.2f} ms" for name, seconds in coding.items())
        )
    wire_ratio = wire_model_ratio(numel)
    wire_verdict = "met" if wire_ratio <= TARGET_WIRE_RATIO else "MISSED"
    if wire_ratio > TARGET_WIRE_RATIO:
        missed.append("wire bytes")
    print(
        f"  wire bytes, top-k 1% / dense (model, DDP buckets, 2 ranks) = 1/{1 / wire_ratio:.1f} "
        f"(target <= 1/100: {wire_verdict}; on TCP: bench/wire_bytes.py)"
    )

    codes, scales = torch.ops.repro500.stochastic_quantize(g, 127, 512, False, 1)
    packed, scale = torch.ops.repro500.sign_pack(g)
    n_buckets = scales.numel()
    moved = {  # bytes read + written by each kernel
        "qsgd quantize": 4 * numel + numel + 4 * n_buckets,
        "qsgd dequantize": numel + 4 * n_buckets + 4 * numel,
        "sign pack": 4 * numel + packed.numel() + 4,
        "sign unpack": packed.numel() + 4 * numel,
    }
    kernels = {
        "qsgd quantize": lambda: torch.ops.repro500.stochastic_quantize(g, 127, 512, False, 1),
        "qsgd dequantize": lambda: torch.ops.repro500.stochastic_dequantize(
            codes, scales, 127, 512
        ),
        "sign pack": lambda: torch.ops.repro500.sign_pack(g),
        "sign unpack": lambda: torch.ops.repro500.sign_unpack(packed, scale, numel),
    }
    references = {
        "qsgd quantize": lambda: reference.stochastic_quantize(g, 127, 512, False, 1),
        "qsgd dequantize": lambda: reference.stochastic_dequantize(codes, scales, 127, 512),
        "sign pack": lambda: reference.sign_pack(g),
        "sign unpack": lambda: reference.sign_unpack(packed, scale, numel),
    }
    variants = {**kernels, **{f"{name} (reference)": fn for name, fn in references.items()}}
    times = _medians(variants, max(3, runs // 2), sync)
    peak = _peak_bandwidth_bytes_per_s(device) if on_gpu else None
    ceiling = memory_ceiling(device)  # three arrays of 256 MiB (CPU) or 1 GiB (GPU) beside the gradient
    print(
        f"[{device.type}] memory ceiling as repro500 roofline measures it, in this process: triad "
        f"{ceiling['triad'] / 1e9:.1f} GB/s, read {ceiling['read'] / 1e9:.1f} GB/s, copy {ceiling['copy'] / 1e9:.1f} GB/s"
        + (f"; datasheet peak {peak / 1e9:.0f} GB/s" if peak else "")
    )
    print(
        f"[{device.type}] QSGD (127 levels, buckets of 512) and 1-bit sign kernels, effective GB/s:"
    )
    for name in kernels:
        gbps = moved[name] / times[name] / 1e9
        ref_gbps = moved[name] / times[f"{name} (reference)"] / 1e9
        speedup = times[f"{name} (reference)"] / times[name]
        line = (
            f"  {name:<16} {gbps:7.2f} GB/s  ({times[name] * 1e3:8.2f} ms; "
            f"reference {ref_gbps:6.2f} GB/s, kernel {speedup:5.1f}x faster)"
        )
        line += f"  {ceiling_share(gbps * 1e9, ceiling['triad'], on_gpu)}"
        if peak:
            line += f"; {gbps * 1e9 / peak:.1%} of the datasheet peak"
        print(line)
        if on_gpu and gbps * 1e9 / ceiling["triad"] < TARGET_CEILING_SHARE_GPU:
            missed.append(f"{device.type} {name} / HBM ceiling")
    return missed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--numel", type=int, default=25_600_000, help="gradient size in elements (ResNet-50: 25.6M)"
    )
    parser.add_argument(
        "--runs", type=int, default=9, help="timed runs per variant (median reported)"
    )
    args = parser.parse_args()
    if not ops.load_native():
        print(f"MISSED: the C++ operators could not be built ({ops.native_error()})")
        return 1
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    missed = bench(torch.device("cpu"), args.numel, args.runs)
    if torch.cuda.is_available():
        if ops.load_native(cuda=True):
            missed += bench(torch.device("cuda"), args.numel, args.runs)
        else:
            print(f"MISSED: GPU present but the CUDA operators did not build: {ops.native_error()}")
            missed.append("the CUDA operators' build")
    else:
        print("no GPU: skipped the CUDA kernels and their share of the HBM ceiling")
    if missed:
        print("MISSED: " + "; ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
