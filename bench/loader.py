"""EWA loader (2 DataLoader workers) against a raw sequential h5py read of the same samples.

    python bench/loader.py [--samples 8] [--size 768x1152] [--workers 2] [--runs 3] [--dir .]

A generated EWA file of ``--samples`` full-resolution samples (8 x 56.6 MB = 453 MB) is
read, warm in the page cache, two ways:

* raw: one process, ``h5py.File(path)["images"][i]`` for every i in order, plus the boxes;
* loader: ``open_dataset("ewa", "train", path=...)`` through a DataLoader with
  ``--workers`` persistent workers and ``collate_detection`` (batch size 1): each sample is
  read, normalised per channel and turned into a torchvision target in a worker and
  handed to the main process.

The loader's first pass (worker start-up) is not timed; the figures are samples/s, median
of ``--runs`` interleaved passes.  Target: loader >= 0.8 x raw.  Always exits 0; a missed
target prints MISSED.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import h5py
from torch.utils.data import DataLoader

from repro500.workloads.data import collate_detection, open_dataset
from repro500.workloads.data.generate import generate

TARGET_RATIO = 0.8


def raw_pass(path: Path) -> float:
    """Seconds for one sequential read of every sample's image and boxes."""
    start = time.perf_counter()
    with h5py.File(path, "r") as h5:
        images, boxes = h5["images"], h5["boxes"]
        for i in range(images.shape[0]):
            images[i]
            boxes[i]
    return time.perf_counter() - start


def loader_pass(loader: DataLoader) -> float:
    start = time.perf_counter()
    for _images, _targets in loader:
        pass
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--size", default="768x1152")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=".", help="where to write the temporary file")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="repro500-loader-", dir=args.dir) as tmp:
        path = Path(tmp) / "ewa.h5"
        result = generate("ewa", path, samples=args.samples, size=args.size)
        dataset = open_dataset("ewa", "train", path=path)
        loader = DataLoader(dataset, batch_size=1, num_workers=args.workers, persistent_workers=True,
                            collate_fn=collate_detection)
        raw_pass(path)  # page cache warm
        loader_pass(loader)  # workers started, handles opened
        raw_s, loader_s = [], []
        for _ in range(args.runs):
            raw_s.append(raw_pass(path))
            loader_s.append(loader_pass(loader))
        n = args.samples
        raw = n / statistics.median(raw_s)
        fed = n / statistics.median(loader_s)
        ratio = fed / raw
        print(f"file: {result.file_bytes / 1e6:.0f} MB, {n} samples of 16x{args.size} float32")
        print(f"raw sequential h5py read: {raw:.1f} samples/s ({raw * result.file_bytes / n / 1e6:.0f} MB/s)")
        print(f"EWA loader, {args.workers} workers: {fed:.1f} samples/s "
              f"({fed * result.file_bytes / n / 1e6:.0f} MB/s), median of {args.runs}")
        print(f"loader / raw = {ratio:.2f} (target >= {TARGET_RATIO}): {'PASS' if ratio >= TARGET_RATIO else 'MISSED'}")


if __name__ == "__main__":
    main()
