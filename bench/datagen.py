"""EWA generator throughput against writing noise, and its peak memory as N grows.

    python bench/datagen.py [--samples 8] [--runs 3] [--size 768x1152] [--rss-samples 8 64] [--dir .]

Throughput: ``repro500 data generate ewa`` (library call) writing ``--samples`` full
resolution samples, against writing ``numpy.random.standard_normal`` float32 noise of the
same shape with h5py (same chunking: one sample per chunk, no compression).  Both write to
a temporary directory under ``--dir`` (the working directory: a disk, not tmpfs; the N=64
run writes 3.6 GB, removed at the end); runs alternate (noise, ewa, noise, ...) and each
figure is the median MB/s.  Target: ewa >= 0.5 x noise.

Peak memory: the generator runs in a fresh process for each N of ``--rss-samples`` and
reports its peak resident set size (getrusage ru_maxrss).  Targets: peak at the largest N
< 2 GB, and no larger than at the smallest N (streaming: memory does not grow with N;
a 5% allowance covers allocator noise).  A missed target prints MISSED and exits 1.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from repro500.data.generate import generate

TARGET_RATIO = 0.5
TARGET_RSS_BYTES = 2 * 1024**3
RSS_ALLOWANCE = 1.05


def write_noise(path: Path, samples: int, height: int, width: int, seed: int = 0) -> float:
    """Seconds to write standard-normal float32 noise of the EWA image shape with h5py."""
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    with h5py.File(path, "w") as h5:
        dset = h5.create_dataset("images", shape=(samples, 16, height, width), dtype="float32",
                                 chunks=(1, 16, height, width))
        for i in range(samples):
            dset[i] = rng.standard_normal((16, height, width), dtype=np.float32)
    return time.perf_counter() - start


def write_ewa(path: Path, samples: int, size: str) -> float:
    start = time.perf_counter()
    generate("ewa", path, samples=samples, size=size, force=True)
    return time.perf_counter() - start


_RSS_CHILD = """
import resource, sys
from repro500.data.generate import generate
generate("ewa", sys.argv[1], samples=int(sys.argv[2]), size=sys.argv[3], force=True)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # KiB on Linux
"""


def peak_rss_bytes(directory: Path, samples: int, size: str) -> int:
    out = directory / f"rss-{samples}.h5"
    proc = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(out), str(samples), size],
                          capture_output=True, text=True, check=True)
    out.unlink()
    return int(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8, help="samples per throughput run")
    parser.add_argument("--runs", type=int, default=3, help="throughput runs of each writer")
    parser.add_argument("--size", default="768x1152", help="HxW of the EWA grid")
    parser.add_argument("--rss-samples", type=int, nargs="+", default=[8, 64],
                        help="sample counts whose peak memory is compared")
    parser.add_argument("--dir", default=".", help="where to write the temporary files (a real disk)")
    args = parser.parse_args()
    height, width = (int(v) for v in args.size.split("x"))
    nbytes = args.samples * 16 * height * width * 4

    with tempfile.TemporaryDirectory(prefix="repro500-datagen-", dir=args.dir) as tmp:
        directory = Path(tmp)
        write_ewa(directory / "warmup.h5", 1, args.size)  # imports, caches, first-touch
        noise_mb_s, ewa_mb_s = [], []
        for _ in range(args.runs):
            noise_mb_s.append(nbytes / 1e6 / write_noise(directory / "noise.h5", args.samples, height, width))
            (directory / "noise.h5").unlink()
            ewa_mb_s.append(nbytes / 1e6 / write_ewa(directory / "ewa.h5", args.samples, args.size))
            (directory / "ewa.h5").unlink()
        noise, ewa = statistics.median(noise_mb_s), statistics.median(ewa_mb_s)
        ratio = ewa / noise
        verdict = "PASS" if ratio >= TARGET_RATIO else "MISSED"
        print(f"throughput at {args.size}, {args.samples} samples, median of {args.runs}: "
              f"ewa {ewa:.0f} MB/s, noise {noise:.0f} MB/s (runs: ewa {[round(v) for v in ewa_mb_s]}, "
              f"noise {[round(v) for v in noise_mb_s]})")
        print(f"ewa / noise = {ratio:.2f} (target >= {TARGET_RATIO}): {verdict}")

        rss = {n: peak_rss_bytes(directory, n, args.size) for n in args.rss_samples}
        small, large = min(rss), max(rss)
        for n, value in rss.items():
            print(f"peak RSS generating {n} samples at {args.size}: {value / 1024**2:.0f} MiB")
        grow = rss[large] / rss[small]
        ok = rss[large] < TARGET_RSS_BYTES and grow <= RSS_ALLOWANCE
        print(f"peak RSS N={large} / N={small} = {grow:.3f} (target <= 1 within {RSS_ALLOWANCE - 1:.0%}, "
              f"and < {TARGET_RSS_BYTES / 1024**3:.0f} GiB): {'PASS' if ok else 'MISSED'}")
    return 0 if ratio >= TARGET_RATIO and ok else 1


if __name__ == "__main__":
    sys.exit(main())
