"""``repro500 data check``: is a data file what it claims to be, and the file a manifest recorded?

For every HDF5 file under a path: the layout is recognised (layout.detect_kind), its
structure checked (shapes, dtypes, channel names: layout.SAMPLE_COUNTERS), then every sample
is read (or, with ``quick``, up to ``QUICK_SAMPLES`` evenly spaced ones) and checked for
NaN/Inf, box rows in range with classes 0-3 and -1 padding, labels in range, parameter
targets in range.  A CIFAR-10 batch directory is checked batch by batch.  With a manifest,
the path's digest is recomputed and compared with the manifest's data facet.

Any problem raises InvalidInput with one sentence naming the file and the problem
(exit code 4 on the command line); corrupt or truncated files included.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from repro500.capture.data import digest_path
from repro500.capture.manifest import load_manifest
from repro500.data import cifar, h5files
from repro500.data.layout import (
    EWA_CLASSES,
    SAMPLE_COUNTERS,
    attr_str,
    detect_kind,
    text,
)
from repro500.data.progress import progress_bar
from repro500.errors import InvalidInput

QUICK_SAMPLES = 16
_CLASS_ABBREV = ("TD", "TC", "ETC", "AR")


@dataclass
class FileCheck:
    """What was found in one file."""

    path: Path
    kind: str
    samples: int
    summary: str
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckReport:
    """All files checked under one path, and the manifest comparison if any."""

    path: Path
    files: list[FileCheck]
    manifest: str | None = None  # one sentence on the digest comparison
    problems: list[str] = field(default_factory=list)  # one sentence per file that is not in order

    def lines(self) -> list[str]:
        out = [f"OK {f.path}: {f.summary}" for f in self.files]
        if self.manifest:
            out.append(f"OK {self.manifest}")
        return out

    def raise_problems(self) -> None:
        """InvalidInput naming every file that is not in order (each on its own line)."""
        if len(self.problems) == 1:
            raise InvalidInput(self.problems[0])
        if self.problems:
            checked = len(self.problems) + len(self.files)
            raise InvalidInput(f"{len(self.problems)} of {checked} files under {self.path} are not in order:\n  "
                               + "\n  ".join(self.problems))


def check_path(
    path: str | os.PathLike[str],
    *,
    manifest: str | os.PathLike[str] | None = None,
    quick: bool = False,
    progress: bool = False,
) -> CheckReport:
    """Check every data file under ``path`` (and its digest against ``manifest``)."""
    root = Path(path)
    if not root.exists():
        raise InvalidInput(f"{root} does not exist")
    if root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in h5files.H5_SUFFIXES)
        if not files:
            from repro500.data import cifar

            try:
                batches = cifar.batch_dir(root)
            except InvalidInput:
                raise InvalidInput(f"{root} holds no HDF5 files or CIFAR-10 batches to check") from None
            checks = [_check_cifar(batches)]
        else:
            checks, problems = [], []
            for f in files:  # every file, so that one command names every bad one
                try:
                    checks.append(check_file(f, quick=quick, progress=progress))
                except InvalidInput as err:
                    problems.append(str(err))
            report = CheckReport(path=root, files=checks, problems=problems)
            report.raise_problems()
            if manifest is not None:
                report.manifest = compare_with_manifest(root, Path(manifest))
            return report
    else:
        checks = [check_file(root, quick=quick, progress=progress)]
    report = CheckReport(path=root, files=checks)
    if manifest is not None:
        report.manifest = compare_with_manifest(root, Path(manifest))
    return report


def check_file(path: str | os.PathLike[str], *, quick: bool = False, progress: bool = False) -> FileCheck:
    """Check one HDF5 data file; InvalidInput names the first problem found."""
    path = Path(path)
    # Damaged metadata fails anywhere h5py looks (a name, a shape, an attribute, a read):
    # every h5py error in here is one InvalidInput sentence naming the file.
    with h5files.reading(path), h5files.open_h5(path) as h5:
        kind = detect_kind(h5)
        if kind is None:
            names = sorted(text(k) for k in h5)
            raise InvalidInput(
                f"{path}: unknown layout (datasets {names}); expected EWA (images, boxes), "
                "CosmoFlow (full, unitPar) or classification (images, labels)"
            )
        n = SAMPLE_COUNTERS[kind](path, h5)
        indices = _indices(n, quick)
        with progress_bar(progress, f"check {path.name}", len(indices)) as advance:
            facts = {"ewa": _scan_ewa, "cosmo": _scan_cosmo, "classification": _scan_classification}[kind](
                path, h5, indices, advance
            )
        origin = _origin(h5)
    summary = f"{kind}, {n} samples, {facts.pop('_summary')}"
    if quick and len(indices) < n:
        summary += f" ({len(indices)} samples scanned)"
    if origin:
        summary += f"; {origin}"
    return FileCheck(path=path, kind=kind, samples=n, summary=summary, facts=facts)


def _indices(n: int, quick: bool) -> np.ndarray:
    if quick and n > QUICK_SAMPLES:
        return np.unique(np.linspace(0, n - 1, QUICK_SAMPLES).round().astype(int))
    return np.arange(n)


def _origin(h5: Any) -> str:
    gen = attr_str(h5, "generator")
    if not gen:
        return "no generator attributes (real data)"
    return (
        f"generated by {gen} v{attr_str(h5, 'generator_version')}, seed {attr_str(h5, 'seed')}, "
        f"split {attr_str(h5, 'split')}, shard {attr_str(h5, 'shard')}"
    )


def _finite(path: Path, what: str, i: int, arr: np.ndarray) -> None:
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise InvalidInput(f"{path}: {what} of sample {i} holds {bad} NaN/Inf values")


def _scan_ewa(path: Path, h5: Any, indices: np.ndarray, advance: Any) -> dict[str, Any]:
    images, boxes = h5["images"], h5["boxes"][()]
    _, _, height, width = images.shape
    per_class: Counter[int] = Counter()
    # Before the padding test: a NaN class compares false with 0, so it would look like padding.
    nonfinite = ~np.isfinite(boxes).all(axis=2)
    if nonfinite.any():
        i, r = (int(k) for k in np.argwhere(nonfinite)[0])
        values = ", ".join(f"{v:g}" for v in boxes[i, r])
        raise InvalidInput(f"{path}: sample {i} has a box row with NaN/Inf values (row {r}: {values})")
    for i, rows in enumerate(boxes):
        valid = rows[:, 4] >= 0
        pad = rows[~valid]
        if pad.size and not np.all(pad == -1):
            raise InvalidInput(f"{path}: sample {i} has a box row with a negative class that is not all -1 padding")
        for ymin, xmin, ymax, xmax, cls in rows[valid]:
            if int(cls) != cls or not 0 <= cls < len(EWA_CLASSES):
                raise InvalidInput(f"{path}: sample {i} has a box of class {cls}; classes are 0-3")
            if not (0 <= ymin <= ymax <= height and 0 <= xmin <= xmax <= width):
                raise InvalidInput(
                    f"{path}: sample {i} has box (ymin {ymin}, xmin {xmin}, ymax {ymax}, xmax {xmax}) "
                    f"outside the {height}x{width} image"
                )
            per_class[int(cls)] += 1
    for i in indices:
        _finite(path, "images", int(i), images[int(i)])
        advance()
    counts = ", ".join(f"{_CLASS_ABBREV[c]} {per_class[c]}" for c in range(4))
    total = sum(per_class.values())
    return {
        "_summary": f"images 16x{height}x{width} {images.dtype}, {total} boxes ({counts})",
        "boxes_per_class": {EWA_CLASSES[c]: per_class[c] for c in range(4)},
    }


def _scan_cosmo(path: Path, h5: Any, indices: np.ndarray, advance: Any) -> dict[str, Any]:
    full, par = h5["full"], h5["unitPar"][()]
    if not np.isfinite(par).all():
        raise InvalidInput(f"{path}: 'unitPar' holds NaN/Inf values")
    if "param_low" in h5.attrs and (np.abs(par) > 1.0 + 1e-6).any():
        raise InvalidInput(f"{path}: 'unitPar' holds values outside [-1, 1], the generator's normalised range")
    for i in indices:
        vol = full[()] if full.ndim == 4 else full[int(i)]
        _finite(path, "'full'", int(i), vol)
        if vol.min() < 0:
            raise InvalidInput(f"{path}: 'full' of universe {int(i)} holds negative counts")
        advance()
    d, c = full.shape[-2], full.shape[-1]
    return {"_summary": f"volumes {d}^3 x {c} channels {full.dtype}, targets {list(h5['unitPar'].shape)}"}


def _scan_classification(path: Path, h5: Any, indices: np.ndarray, advance: Any) -> dict[str, Any]:
    images, labels = h5["images"], h5["labels"][()]
    names = h5.attrs.get("class_names")
    num_classes = len(names) if names is not None else None
    if labels.size and labels.min() < 0:
        raise InvalidInput(f"{path}: 'labels' holds negative values")
    if num_classes is not None and labels.size and labels.max() >= num_classes:
        raise InvalidInput(f"{path}: 'labels' holds {int(labels.max())} but the file names {num_classes} classes")
    for i in indices:
        _finite(path, "images", int(i), images[int(i)])
        advance()
    counts = np.bincount(labels, minlength=num_classes or 0)
    shape = "x".join(str(s) for s in images.shape[1:])
    return {
        "_summary": f"images {shape} {images.dtype}, {len(counts)} classes ({int(counts.min())}-{int(counts.max())} per class)",
        "per_class": counts.tolist(),
    }


def _check_cifar(batches: Path) -> FileCheck:
    total, counts = 0, np.zeros(10, dtype=np.int64)
    for name in cifar.FILES["train"] + cifar.FILES["eval"]:
        _, labels = cifar.read_batch(batches / name)
        total += len(labels)
        counts += np.bincount(labels, minlength=10)
    return FileCheck(
        path=batches, kind="cifar10", samples=total,
        summary=f"cifar10, {total} images 3x32x32 uint8 in 6 batches, {int(counts.min())}-{int(counts.max())} per class",
    )


# -- manifests ----------------------------------------------------------------------------
def data_entries(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries of a manifest's data facet (``facets.data.entries``)."""
    facets = manifest.get("facets")
    facet = facets.get("data") if isinstance(facets, dict) else None
    if not isinstance(facet, dict) or not isinstance(facet.get("entries"), list):
        return []
    return [e for e in facet["entries"] if isinstance(e, dict) and "path" in e]


def _find_entry(target: Path, entries: list[dict[str, Any]], manifest_path: Path) -> dict[str, Any] | None:
    want = target.resolve()
    base = manifest_path if manifest_path.is_dir() else manifest_path.parent
    for e in entries:
        p = Path(e["path"])
        candidates = [p] if p.is_absolute() else [Path.cwd() / p, base / p, base.parent / p]
        if any(c.resolve() == want for c in candidates):
            return e
    same_name = [e for e in entries if Path(e["path"]).name == target.name]
    return same_name[0] if len(same_name) == 1 else None


def compare_with_manifest(path: Path, manifest_path: Path) -> str:
    """Recompute ``path``'s digest and compare it with the manifest's record of it."""
    manifest = load_manifest(manifest_path)
    entries = data_entries(manifest)
    entry = _find_entry(path, entries, manifest_path)
    if entry is None:
        recorded = ", ".join(str(e["path"]) for e in entries[:5]) or "nothing"
        raise InvalidInput(f"{path} is not recorded in {manifest_path}'s data facet (it records {recorded})")
    now = digest_path(path)
    if now.get("md5") != entry.get("md5"):
        raise InvalidInput(
            f"{path} differs from {manifest_path}: md5 {now.get('md5')} now, {entry.get('md5')} recorded "
            f"(size {now.get('size')} vs {entry.get('size')} bytes)"
        )
    return f"{path} matches {manifest_path} (md5 {now['md5']}, {now.get('size')} bytes)"
