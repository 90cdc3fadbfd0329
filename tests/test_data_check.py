"""``repro500 data check``: good files pass; corrupt, truncated, wrong or edited ones exit 4 in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from repro500.data.generate import generate

REPRO500 = [sys.executable, "-m", "repro500.cli"]


def _check(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*REPRO500, "data", "check", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def _one_error_line(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 4, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("repro500: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    generate("ewa", root / "ewa.h5", samples=4, size="48x72")
    generate("cosmo", root / "cosmo.h5", samples=2, size="8")
    generate("classification", root / "cls.h5", samples=30)
    return root


def test_good_files_pass_with_a_summary(data_dir):
    proc = _check(".", cwd=data_dir)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("OK ") for line in lines)
    ewa = next(line for line in lines if "ewa.h5" in line)
    assert "ewa, 4 samples" in ewa and "16x48x72 float32" in ewa and "seed 0" in ewa
    assert any("classification, 30 samples" in line and "10 classes" in line for line in lines)
    assert any("cosmo, 2 samples" in line for line in lines)
    quick = _check("cls.h5", "--quick", cwd=data_dir)
    assert quick.returncode == 0 and "(16 samples scanned)" in quick.stdout


def test_truncated_and_garbage_files_exit_4(tmp_path, data_dir):
    truncated = tmp_path / "truncated.h5"
    truncated.write_bytes((data_dir / "ewa.h5").read_bytes()[:5000])
    _one_error_line(_check(str(truncated), cwd=tmp_path), "truncated.h5", "truncated")
    garbage = tmp_path / "garbage.h5"
    garbage.write_bytes(b"this is not HDF5 at all" * 100)
    _one_error_line(_check(str(garbage), cwd=tmp_path), "garbage.h5", "not a readable HDF5 file")
    _one_error_line(_check(str(tmp_path / "absent.h5"), cwd=tmp_path), "absent.h5", "does not exist")


def test_a_directory_with_several_bad_files_names_every_one(tmp_path, data_dir):
    bad = tmp_path / "several"
    bad.mkdir()
    (bad / "good.h5").write_bytes((data_dir / "ewa.h5").read_bytes())
    (bad / "a-truncated.h5").write_bytes((data_dir / "ewa.h5").read_bytes()[:5000])
    (bad / "b-garbage.h5").write_bytes(b"this is not HDF5 at all" * 100)
    done = _check(str(bad), cwd=tmp_path)
    assert done.returncode == 4 and "Traceback" not in done.stderr, done.stderr
    assert "2 of 3 files" in done.stderr
    assert "a-truncated.h5" in done.stderr and "b-garbage.h5" in done.stderr and "good.h5:" not in done.stderr


def test_corrupt_compressed_chunk_exits_4(tmp_path):
    path = tmp_path / "ewa.h5"
    generate("ewa", path, samples=3, size="48x72", compression="gzip")
    with h5py.File(path, "r") as h5:
        offset, size = h5["images"].id.get_chunk_info(1).byte_offset, h5["images"].id.get_chunk_info(1).size
    raw = bytearray(path.read_bytes())
    raw[offset + size // 3: offset + size // 3 + 64] = b"\xff" * 64  # damage sample 1's chunk
    path.write_bytes(bytes(raw))
    _one_error_line(_check(str(path), cwd=tmp_path), "ewa.h5", "corrupt")


# Offsets into a generated 4-sample 64x96 EWA file where 8 overwritten bytes land in HDF5
# metadata (global heap, object headers, attribute messages): each made h5py raise OSError,
# KeyError or ValueError out of a name lookup, an attribute or a read.
METADATA_OFFSETS = [2048, 2304, 2432, 2688, 2816, 3200, 6272, 6400, 7040, 7168, 7552]
GARBAGE = bytes.fromhex("123456789abcdef0")


@pytest.fixture(scope="module")
def small_ewa(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ewa") / "x.h5"
    generate("ewa", path, samples=4, size="64x96")
    return path


@pytest.mark.parametrize("offset", METADATA_OFFSETS)
def test_corrupt_metadata_exits_4_in_one_line(tmp_path, small_ewa, offset):
    raw = bytearray(small_ewa.read_bytes())
    raw[offset:offset + 8] = GARBAGE
    bad = tmp_path / "bad.h5"
    bad.write_bytes(bytes(raw))
    proc = _check(str(bad), cwd=tmp_path)
    assert "Traceback" not in proc.stderr
    _one_error_line(proc, "bad.h5", "corrupt")


def test_undecodable_attribute_text_is_printed_readably(tmp_path, small_ewa):
    odd = tmp_path / "odd.h5"
    odd.write_bytes(small_ewa.read_bytes())
    with h5py.File(odd, "r+") as h5:
        h5.attrs["generator"] = np.bytes_(b"gen\xff\xfe")  # invalid UTF-8, as damage leaves it
    proc = _check(str(odd), cwd=tmp_path)  # text=True: undecodable output would raise here
    assert proc.returncode == 0, proc.stderr
    assert "generated by gen\ufffd\ufffd" in proc.stdout


def _copy_with(src: Path, dst: Path, edit) -> Path:
    dst.write_bytes(src.read_bytes())
    with h5py.File(dst, "r+") as h5:
        edit(h5)
    return dst


def test_bad_values_and_wrong_layouts_exit_4(tmp_path, data_dir):
    ewa = data_dir / "ewa.h5"

    def nan(h5):
        img = h5["images"][2]
        img[6, 10, 10] = np.nan
        h5["images"][2] = img

    def box_outside(h5):
        boxes = h5["boxes"][()]
        boxes[1, 0] = (10, 10, 60, 20, 1)  # ymax 60 > height 48
        h5["boxes"][...] = boxes

    def bad_class(h5):
        boxes = h5["boxes"][()]
        boxes[0, 0, 4] = 7
        h5["boxes"][...] = boxes

    def renamed_channels(h5):
        names = list(h5.attrs["channel_names"])
        names[0], names[1] = names[1], names[0]
        h5.attrs["channel_names"] = names

    cases = [
        (nan, "NaN/Inf", "sample 2"),
        (box_outside, "outside the 48x72 image", "sample 1"),
        (bad_class, "class 7", "sample 0"),
        (renamed_channels, "channel names", "EWA order"),
    ]
    for k, (edit, *needles) in enumerate(cases):
        bad = _copy_with(ewa, tmp_path / f"bad{k}.h5", edit)
        _one_error_line(_check(str(bad), cwd=tmp_path), f"bad{k}.h5", *needles)

    odd = tmp_path / "odd.h5"
    with h5py.File(odd, "w") as h5:
        h5["temperature"] = np.zeros((3, 4))
    _one_error_line(_check(str(odd), cwd=tmp_path), "odd.h5", "unknown layout")
    flat = tmp_path / "flat.h5"
    with h5py.File(flat, "w") as h5:
        h5["images"] = np.zeros((2, 3, 8, 8), dtype=np.float32)  # 3 channels, not 16
        h5["boxes"] = np.full((2, 15, 5), -1, dtype=np.float32)
    _one_error_line(_check(str(flat), cwd=tmp_path), "flat.h5", "(N, 16, H, W)")
    few_boxes = tmp_path / "few_boxes.h5"
    with h5py.File(few_boxes, "w") as h5:
        h5["images"] = np.zeros((2, 16, 8, 8), dtype=np.float32)
        h5["boxes"] = np.full((2, 10, 5), -1, dtype=np.float32)  # EWA pads to 15 rows
    _one_error_line(_check(str(few_boxes), cwd=tmp_path), "few_boxes.h5", "(2, 10, 5)", "expected (2, 15, 5)")


@pytest.mark.parametrize(
    ("sample", "row", "column", "value"),
    [(1, 0, 4, np.nan), (2, 0, 3, np.inf), (3, 14, 0, np.nan)],
    ids=["nan-class", "inf-xmax", "nan-in-padding"],
)
def test_nan_or_inf_in_boxes_is_reported_as_such(tmp_path, data_dir, sample, row, column, value):
    # A NaN class compares false with 0: it must not be mistaken for a bad padding row.
    def poison(h5):
        boxes = h5["boxes"][()]
        boxes[sample, row, column] = value
        h5["boxes"][...] = boxes

    bad = _copy_with(data_dir / "ewa.h5", tmp_path / "bad.h5", poison)
    line = _one_error_line(_check(str(bad), cwd=tmp_path), "bad.h5", f"sample {sample}", "NaN/Inf", f"row {row}")
    assert "padding" not in line


def test_digest_is_compared_with_the_manifest(tmp_path, data_dir):
    data = tmp_path / "ewa.h5"
    data.write_bytes((data_dir / "ewa.h5").read_bytes())
    capture = subprocess.run([*REPRO500, "capture", "-o", "run/manifest.json", "--data", "ewa.h5"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert capture.returncode == 0, capture.stderr
    proc = _check("ewa.h5", "--manifest", "run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "matches run" in proc.stdout.splitlines()[-1]

    other = tmp_path / "other.h5"
    other.write_bytes(data.read_bytes())
    _one_error_line(_check("other.h5", "--manifest", "run", cwd=tmp_path), "other.h5", "not recorded")

    with h5py.File(data, "r+") as h5:  # a legitimate-looking edit: still valid, different bytes
        h5["images"][0, 0, 0, 0] = 1e-9
    _one_error_line(_check("ewa.h5", "--manifest", "run/manifest.json", cwd=tmp_path), "ewa.h5", "differs", "recorded")


def test_cifar_batch_directory_is_checked(tmp_path):
    import pickle

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(folder / name, "wb") as fh:
            pickle.dump({b"data": np.zeros((2, 3072), np.uint8), b"labels": [1, 2]}, fh)
    proc = _check(str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0 and "cifar10, 12 images" in proc.stdout
    with open(folder / "test_batch", "wb") as fh:
        pickle.dump({b"data": np.zeros((2, 3000), np.uint8), b"labels": [1, 2]}, fh)
    _one_error_line(_check(str(tmp_path), cwd=tmp_path), "test_batch", "expected uint8 (n, 3072)")
