"""The on-disk layouts repro500 reads and writes, and how to recognise them.

Each layout is the real dataset's (DESIGN.md, "Reference facts"), so real files and
synthetic ones go through the same loaders and checks:

* ``ewa`` (Extreme Weather, one file per year ``climo_YYYY.h5``): ``images`` (N, 16, H, W)
  float, ``boxes`` (N, 15, 5) rows ``ymin, xmin, ymax, xmax, class`` padded with -1.
* ``cosmo`` (CosmoFlow, one file per universe): ``full`` (D, D, D, C) counts and ``unitPar`` (4,).
  Synthetic files batch universes: ``full`` (N, D, D, D, C) and ``unitPar`` (N, 4).
* ``classification``: ``images`` (N, C, H, W) uint8 (or float) and ``labels`` (N,) integer.

No heavy imports here: the command line reads these constants.
"""

from __future__ import annotations

from typing import Any

from repro500.errors import InvalidInput

# The generator's name as generated files have always recorded it, the package it lived in until
# the data moved to repro500.data: a new name would change every generated file's bytes, and with
# them the digests that runs and publications already sealed.
GENERATOR_PREFIX = "repro500.workloads.data."

EWA_CHANNELS: tuple[str, ...] = (
    "PRECT", "PS", "PSL", "QREFHT", "T200", "T500", "TMQ", "TREFHT",
    "TS", "U850", "UBOT", "V850", "VBOT", "Z1000", "Z200", "ZBOT",
)
EWA_CLASSES: tuple[str, ...] = (
    "tropical_depression", "tropical_cyclone", "extratropical_cyclone", "atmospheric_river",
)
EWA_MAX_BOXES = 15
EWA_FULL_SIZE = (768, 1152)

COSMO_PARAMS: tuple[str, ...] = ("Omega_m", "sigma_8", "n_s", "H_0")
COSMO_CHANNELS = 4

KINDS: tuple[str, ...] = ("ewa", "cosmo", "classification")
SPLITS: tuple[str, ...] = ("train", "eval")


def detect_kind(h5: Any) -> str | None:
    """The layout of an open ``h5py.File``: "ewa", "cosmo", "classification" or None.

    The generator's ``kind`` attribute wins; otherwise the dataset names decide, which is
    how real files (which carry no repro500 attributes) are recognised.
    """
    kind = attr_str(h5, "kind")
    if kind in KINDS:
        return kind
    names = set(h5.keys())
    if {"images", "boxes"} <= names:
        return "ewa"
    if {"full", "unitPar"} <= names:
        return "cosmo"
    if {"images", "labels"} <= names:
        return "classification"
    return None


def text(value: Any) -> str:
    """An HDF5 string as printable text: bytes decoded, undecodable bytes shown as U+FFFD.

    h5py hands back invalid UTF-8 (a damaged file) as lone surrogates, which cannot be
    printed; replacing them keeps every message one readable line.
    """
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in str(value))


def attr_str(h5: Any, name: str, default: str | None = None) -> str | None:
    """A string attribute, whether h5py hands it back as str or bytes."""
    value = h5.attrs.get(name, default)
    return None if value is None else text(value)


# -- structural checks: shapes, dtypes and names, without reading the data ----------------
def _fail(path: Any, problem: str) -> None:
    raise InvalidInput(f"{path}: {problem}")


def _need(path: Any, h5: Any, names: tuple[str, ...], kind: str) -> None:
    missing = [n for n in names if n not in h5]
    if missing:
        _fail(path, f"not {kind} file: it has no {', '.join(repr(m) for m in missing)} dataset")


def ewa_samples(path: Any, h5: Any) -> int:
    """Number of samples of an EWA file; a wrong layout raises InvalidInput."""
    _need(path, h5, ("images", "boxes"), "an EWA")
    images, boxes = h5["images"], h5["boxes"]
    if images.ndim != 4 or images.shape[1] != len(EWA_CHANNELS):
        _fail(path, f"'images' has shape {images.shape}, expected (N, 16, H, W)")
    if images.dtype.kind != "f":
        _fail(path, f"'images' has dtype {images.dtype}, expected floating point")
    if boxes.shape != (images.shape[0], EWA_MAX_BOXES, 5):
        _fail(path, f"'boxes' has shape {boxes.shape}, expected ({images.shape[0]}, {EWA_MAX_BOXES}, 5)")
    if boxes.dtype.kind not in "fiu":
        _fail(path, f"'boxes' has dtype {boxes.dtype}, expected numbers")
    names = h5.attrs.get("channel_names")
    if names is not None:
        names = [text(n) for n in names]
        if tuple(names) != EWA_CHANNELS:
            _fail(path, f"channel names {names} differ from the EWA order {list(EWA_CHANNELS)}")
    return int(images.shape[0])


def cosmo_samples(path: Any, h5: Any) -> int:
    """Number of universes of a cosmo file (1 for a real per-universe file)."""
    _need(path, h5, ("full", "unitPar"), "a CosmoFlow")
    full, par = h5["full"], h5["unitPar"]
    if full.ndim == 4 and par.shape == (len(COSMO_PARAMS),):
        n = 1
    elif full.ndim == 5 and par.ndim == 2 and par.shape == (full.shape[0], len(COSMO_PARAMS)):
        n = int(full.shape[0])
    else:
        _fail(path, f"'full' {full.shape} and 'unitPar' {par.shape} are neither (D, D, D, C) + (4,) "
                    "nor (N, D, D, D, C) + (N, 4)")
    d = full.shape[-4:-1]
    if len(set(d)) != 1:
        _fail(path, f"'full' holds {d} volumes; expected cubes (D, D, D)")
    if full.dtype.kind not in "fiu":
        _fail(path, f"'full' has dtype {full.dtype}, expected counts or densities")
    return n


def classification_samples(path: Any, h5: Any) -> int:
    """Number of images of a classification file."""
    _need(path, h5, ("images", "labels"), "a classification")
    images, labels = h5["images"], h5["labels"]
    if images.ndim != 4:
        _fail(path, f"'images' has shape {images.shape}, expected (N, C, H, W)")
    if labels.shape != (images.shape[0],):
        _fail(path, f"'labels' has shape {labels.shape}, expected ({images.shape[0]},)")
    if labels.dtype.kind not in "iu":
        _fail(path, f"'labels' has dtype {labels.dtype}, expected integers")
    if images.dtype.kind not in "fiu":
        _fail(path, f"'images' has dtype {images.dtype}, expected numbers")
    return int(images.shape[0])


SAMPLE_COUNTERS = {"ewa": ewa_samples, "cosmo": cosmo_samples, "classification": classification_samples}
