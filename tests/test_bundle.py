"""Packing a run into one archive that verifies anywhere; unpacking refuses anything unsafe."""

from __future__ import annotations

import gzip
import os
import tarfile

import pytest
from helpers.rundirs import edit_json, make_run
from helpers.runs import make_tar

from repro500.errors import InvalidInput, UsageError
from repro500.rundir import archive as archives
from repro500.rundir import sums as bundle
from repro500.verify.verdict import verify_run


def _tar(path, members):
    return make_tar(path, members)


def _file(name, data=b"x"):
    return tarfile.TarInfo(name), data


def test_pack_unpack_elsewhere_verifies(tmp_path):
    run = make_run(tmp_path / "lab", "run-1")
    (run / "verdict.json").write_text("{}")  # a derived view travels too, uncovered
    (tmp_path / "out").mkdir()
    archive = archives.pack(run, tmp_path / "out")
    assert archive == tmp_path / "out" / "run-1.tar.gz"
    elsewhere = tmp_path / "elsewhere"
    unpacked = archives.unpack(archive, elsewhere)
    assert unpacked == elsewhere / "run-1"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["run-1"]  # no staging directory left
    assert bundle.check_sums(unpacked).ok
    assert (unpacked / "verdict.json").exists()
    assert verify_run(unpacked).status == "PASS"
    assert verify_run(archive).status == "PASS"  # an archive verifies directly too


def test_packing_twice_gives_identical_bytes(tmp_path):
    run = make_run(tmp_path, "run-1")
    first = archives.pack(run, tmp_path / "a.tar.gz")
    os.utime(run / "summary.json", (1, 1))  # timestamps must not leak into the archive
    second = archives.pack(run, tmp_path / "b.tar.gz")
    assert first.read_bytes() == second.read_bytes()


def test_pack_refuses_a_tampered_run_an_existing_archive_and_a_target_inside(tmp_path):
    run = make_run(tmp_path, "run-1")
    archives.pack(run)
    with pytest.raises(InvalidInput, match="already exists"):
        archives.pack(run)
    assert archives.pack(run, force=True).exists()
    with pytest.raises(UsageError, match="inside the run directory"):
        archives.pack(run, run / "self.tar.gz", force=True)
    edit_json(run / "repeats" / "0" / "summary.json", lambda d: d["metrics"].update(accuracy=0.5))
    with pytest.raises(InvalidInput, match="would not verify"):
        archives.pack(run, tmp_path / "x.tar.gz")


def test_verify_against_a_packed_reference(tmp_path):
    ref = make_run(tmp_path, "ref")
    archive = archives.pack(ref, tmp_path / "ref.tar.gz")
    run = make_run(tmp_path, "run", values={"accuracy": [0.932, 0.936, 0.938]})
    verdict = verify_run(run, against=archive)
    assert verdict.status == "REPRODUCED"
    assert verdict.against["kind"] == "bundle"


@pytest.mark.parametrize("members, reason", [
    ([_file("run/../../escaped.txt")], "escapes the target directory"),
    ([_file("/tmp/absolute.txt")], "absolute path"),
])
def test_unpack_refuses_escaping_paths_and_writes_nothing(tmp_path, members, reason):
    archive = _tar(tmp_path / "evil.tar.gz", [(tarfile.TarInfo("run"), None)] + members)
    dest = tmp_path / "dest"
    with pytest.raises(InvalidInput, match=reason):
        archives.unpack(archive, dest)
    assert not dest.exists()
    assert not (tmp_path / "escaped.txt").exists()


def test_unpack_refuses_links_pointing_outside_and_device_files(tmp_path):
    sym = tarfile.TarInfo("run/link")
    sym.type, sym.linkname = tarfile.SYMTYPE, "../../etc/passwd"
    hard = tarfile.TarInfo("run/hard")
    hard.type, hard.linkname = tarfile.LNKTYPE, "/etc/passwd"
    dev = tarfile.TarInfo("run/dev")
    dev.type, dev.devmajor, dev.devminor = tarfile.CHRTYPE, 1, 3
    for member, reason in ((sym, "points outside"), (hard, "points outside"), (dev, "device")):
        archive = _tar(tmp_path / f"{member.name.split('/')[1]}.tar.gz", [_file("run/a.txt"), (member, None)])
        with pytest.raises(InvalidInput, match=reason):
            archives.unpack(archive, tmp_path / "dest")
        assert not (tmp_path / "dest" / "run").exists()


def test_unpack_requires_one_top_level_directory(tmp_path):
    archive = _tar(tmp_path / "two.tar.gz", [_file("a/x"), _file("b/y")])
    with pytest.raises(InvalidInput, match="exactly one run directory"):
        archives.unpack(archive, tmp_path / "dest")


def test_truncated_or_garbage_archive_is_invalid_input(tmp_path):
    run = make_run(tmp_path, "run-1")
    archive = archives.pack(run, tmp_path / "run.tar.gz")
    data = archive.read_bytes()
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidInput, match="corrupt or truncated"):
        archives.unpack(truncated, tmp_path / "dest")
    assert not (tmp_path / "dest" / "run-1").exists()
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(gzip.compress(b"not a tar archive" * 10))
    with pytest.raises(InvalidInput, match="corrupt or truncated"):
        archives.unpack(garbage, tmp_path / "dest")
    with pytest.raises(InvalidInput, match="corrupt or truncated"):
        verify_run(truncated)


def test_unpack_refuses_to_overwrite(tmp_path):
    run = make_run(tmp_path / "lab", "run-1")
    archive = archives.pack(run, tmp_path / "run.tar.gz")
    with pytest.raises(InvalidInput, match="already exists"):
        archives.unpack(archive, tmp_path / "lab")
