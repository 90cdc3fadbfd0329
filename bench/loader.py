"""EWA loader (2 DataLoader workers) against a raw sequential h5py read of the same samples.

    python bench/loader.py [--samples 8] [--size 768x1152] [--workers 2] [--runs 3] [--laps 4] [--dir .]

A generated EWA file of ``--samples`` full-resolution samples (8 x 56.6 MB = 453 MB) is
read, warm in the page cache, two ways:

* raw: one process, ``h5py.File(path)["images"][i]`` for every i in order, plus the boxes;
* loader: ``open_dataset("ewa", "train", path=...)`` through a DataLoader with
  ``--workers`` persistent workers and ``collate_detection`` (batch size 1): each sample's
  boxes are read and turned into a torchvision target in a worker, and its image is handed
  to the main process as a mapping of the file's pages (repro500/data/handoff.py),
  which the main process then reads once, whole (``image.sum()``).

The loader hands over pages that nobody has read yet; the cost of reading them falls on the
first consumer (in training, the detection model's normalisation).  So the loader side is
charged that read: each sample the main process gets is summed before the next is taken.  The
raw side is not (its array is in hand, read once by the copy); for reference the script also
prints the raw read followed by the same sum.

A timed pass goes ``--laps`` times over the samples in order, both ways, so that it
measures the steady flow a training epoch sees (a year of EWA is 1,460 samples) rather than
mostly the DataLoader's start of an epoch: the first sample of an epoch reaches the main
process only after one worker's whole read.  The loader's first pass (worker start-up) is
not timed; the figures are samples/s, median of ``--runs`` interleaved passes.  Target:
loader >= 0.8 x raw.  A missed target prints MISSED and exits 1.

It also prints the CPU time each way costs per sample (the loader's: main process plus
workers).  The ratio needs both workers on a core of their own; on a machine shared with
other jobs the CPU figures say what the wall-clock ratio cannot.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import h5py
import psutil
import torch
from torch.utils.data import DataLoader

from repro500.data import collate_detection, open_dataset
from repro500.data.generate import generate

TARGET_RATIO = 0.8


def raw_pass(path: Path, laps: int, *, read: bool = False) -> float:
    """Seconds for ``laps`` sequential reads of every sample's image and boxes (each image then
    summed if ``read``)."""
    start = time.perf_counter()
    with h5py.File(path, "r") as h5:
        images, boxes = h5["images"], h5["boxes"]
        for _ in range(laps):
            for i in range(images.shape[0]):
                image = images[i]
                boxes[i]
                if read:
                    torch.from_numpy(image).sum()
    return time.perf_counter() - start


def loader_pass(loader: DataLoader) -> float:
    """Seconds to take every batch from the loader and read its image once, whole."""
    start = time.perf_counter()
    for images, _targets in loader:
        for image in images:
            image.sum()
    return time.perf_counter() - start


def evict(path: Path) -> None:
    """Drop the file's pages from the page cache (clean pages go at once; no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cpu_s(pids: list[int]) -> float:
    """User plus system CPU seconds used so far by these processes."""
    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--size", default="768x1152")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--laps", type=int, default=4, help="passes over the samples per timed run")
    parser.add_argument("--dir", default=".", help="where to write the temporary file")
    parser.add_argument("--cold", action="store_true",
                        help="drop the file from the page cache before every pass (reads come from the disk)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="repro500-loader-", dir=args.dir) as tmp:
        path = Path(tmp) / "ewa.h5"
        result = generate("ewa", path, samples=args.samples, size=args.size)
        dataset = open_dataset("ewa", "train", path=path)
        loader = DataLoader(dataset, batch_size=1, num_workers=args.workers, persistent_workers=True,
                            collate_fn=collate_detection, sampler=list(range(args.samples)) * args.laps)
        raw_pass(path, 1)  # page cache warm
        children = {p.pid for p in multiprocessing.active_children()}
        loader_pass(loader)  # workers started, handles opened
        me = [os.getpid()]
        workers = [p.pid for p in multiprocessing.active_children() if p.pid not in children]
        raw_s, raw_read_s, loader_s = [], [], []
        raw_cpu = main_cpu = workers_cpu = 0.0
        drop = (lambda: evict(path)) if args.cold else (lambda: None)
        for _ in range(args.runs):
            drop()
            before = cpu_s(me)
            raw_s.append(raw_pass(path, args.laps))
            raw_cpu += cpu_s(me) - before
            drop()
            raw_read_s.append(raw_pass(path, args.laps, read=True))
            drop()
            before, before_workers = cpu_s(me), cpu_s(workers)
            loader_s.append(loader_pass(loader))
            main_cpu += cpu_s(me) - before
            workers_cpu += cpu_s(workers) - before_workers
        n = args.samples * args.laps
        raw = n / statistics.median(raw_s)
        raw_read = n / statistics.median(raw_read_s)
        fed = n / statistics.median(loader_s)
        ratio = fed / raw
        per_sample_ms = 1e3 / (n * args.runs)
        print(f"file: {result.file_bytes / 1e6:.0f} MB, {args.samples} samples of 16x{args.size} float32, "
              f"read {args.laps} times a pass{', from the disk (page cache dropped before each pass)' if args.cold else ''}")
        print(f"raw sequential h5py read: {raw:.1f} samples/s ({raw * result.file_bytes / args.samples / 1e6:.0f} MB/s), "
              f"CPU {raw_cpu * per_sample_ms:.1f} ms/sample; followed by image.sum(): {raw_read:.1f} samples/s")
        print(f"EWA loader, {args.workers} workers, image.sum() in the main process: {fed:.1f} samples/s "
              f"({fed * result.file_bytes / args.samples / 1e6:.0f} MB/s), median of {args.runs}; CPU "
              f"{(main_cpu + workers_cpu) * per_sample_ms:.1f} ms/sample (main {main_cpu * per_sample_ms:.1f}, "
              f"workers {workers_cpu * per_sample_ms:.1f})")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print(f"loader / raw = {ratio:.2f} (target >= {TARGET_RATIO}): {'PASS' if ratio >= TARGET_RATIO else 'MISSED'}")
    return 0 if ratio >= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
