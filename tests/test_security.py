"""Hostile inputs, each with its expected outcome (the "Security tests", signatures aside).

Every case: no traceback, nothing written outside the destination, the documented exit code
(4, invalid input) and one sentence naming what is wrong.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from helpers.rundirs import edit_json, make_run
from helpers.runs import make_tar, repro500

from repro500.errors import InvalidInput
from repro500.rundir import archive
from repro500.rundir import archive as archives
from repro500.rundir import sums as bundle
from repro500.verify.verdict import verify_run

DROP_DAC = ["setpriv", "--bounding-set=-dac_override", "--inh-caps=-dac_override"]


def _tar(path: Path, members, *, gz: bool = True) -> Path:
    return make_tar(path, members, gz=gz, format=tarfile.GNU_FORMAT)


def _dir(name):
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info, None


def _file(name, data=b"x"):
    return tarfile.TarInfo(name), data


def _link(name, target, kind=tarfile.SYMTYPE):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _refused(archive_path: Path, tmp_path: Path, match: str) -> None:
    """unpack refuses, and nothing appears anywhere under tmp_path (dest included)."""
    before = _snapshot(tmp_path)
    with pytest.raises(InvalidInput, match=match):
        archives.unpack(archive_path, tmp_path / "dest")
    assert _snapshot(tmp_path) == before


def _reseal_without(run: Path, prefix: str) -> None:
    """Remove a repeat's lines from SHA256SUMS, as a forger would."""
    sums = run / bundle.SUMS_NAME
    lines = [line for line in sums.read_text().splitlines(keepends=True) if f"  {prefix}" not in line]
    sums.write_text("".join(lines))


def _drop_repeat(run: Path, k: int) -> None:
    """Remove repeat k and rewrite the aggregate so that it is self-consistent without it."""
    shutil.rmtree(run / "repeats" / str(k))

    def forget(doc):
        doc["repeats"].pop(str(k))
        doc["final_param_digests"].pop(str(k), None)
        doc["seeds"].pop(str(k), None)
        for entry in doc["metrics"].values():
            if k in entry["repeats"]:
                i = entry["repeats"].index(k)
                entry["repeats"].pop(i)
                entry["values"].pop(i)

    edit_json(run / "summary.json", forget)


FIVE = {"accuracy": [0.93, 0.94, 0.935, 0.932, 0.80]}


# ------------------------------------------------------------------- run directories


def test_a_dropped_and_resealed_repeat_is_invalid_and_named(tmp_path):
    run = make_run(tmp_path, values=FIVE)
    _drop_repeat(run, 4)
    bundle.write_sums(run)  # a consistent forgery: every digest matches
    verdict = verify_run(run)
    assert (verdict.status, verdict.exit_code) == ("INVALID", 4)
    assert any("repeat(s) 4 of the 5 planned are missing" in r for r in verdict.reasons), verdict.reasons
    out = repro500("verify", str(run), "--no-write", cwd=tmp_path)
    assert out.returncode == 4 and "Traceback" not in out.stderr + out.stdout
    assert "repeat(s) 4 of the 5 planned are missing" in out.stdout


def test_planned_counts_that_disagree_are_invalid(tmp_path):
    run = make_run(tmp_path, values=FIVE)
    _drop_repeat(run, 4)
    edit_json(run / "summary.json", lambda d: d.update(repeats_planned=4))  # run.json still says 5
    bundle.write_sums(run)
    verdict = verify_run(run)
    assert verdict.status == "INVALID"
    assert any("planned number of repeats disagrees" in r and "run.json repeats 5" in r for r in verdict.reasons)


def test_a_repeat_moved_into_a_dropped_slot_is_invalid(tmp_path):
    run = make_run(tmp_path, values=FIVE)
    shutil.rmtree(run / "repeats" / "4")  # the unlucky one goes; repeat 3 is renumbered... into 4's place
    os.rename(run / "repeats" / "3", run / "repeats" / "4")
    bundle.write_sums(run)
    verdict = verify_run(run)
    assert verdict.status == "INVALID"
    assert any("says it is repeat 3" in r for r in verdict.reasons), verdict.reasons


def test_a_repeat_run_with_another_seed_than_planned_is_invalid(tmp_path):
    from helpers.rundirs import make_manifest

    from repro500.capture.manifest import seeds_facet

    run = make_run(tmp_path, values=FIVE, manifest=make_manifest(seeds=seeds_facet(500, 5)))
    assert verify_run(run).status != "INVALID"
    edit_json(run / "repeats" / "4" / "summary.json", lambda d: d["seeds"].update(torch=1234))
    bundle.write_sums(run)
    verdict = verify_run(run)
    assert verdict.status == "INVALID"
    assert any("repeat 4 ran with torch seed 1234" in r for r in verdict.reasons), verdict.reasons


def test_an_interrupted_run_is_incomplete_not_invalid_and_cannot_pass(tmp_path):
    run = make_run(tmp_path, values=FIVE, acceptance={"accuracy": {"target": 0.7, "direction": "higher", "tolerance": 0.0}})
    _drop_repeat(run, 4)
    edit_json(run / "run.json", lambda d: d.update(status="interrupted"))
    bundle.write_sums(run)
    verdict = verify_run(run)
    assert (verdict.status, verdict.exit_code) == ("INCONCLUSIVE", 3)
    assert any("incomplete" in r and "4" in r for r in verdict.reasons), verdict.reasons
    assert any("the run is incomplete" in n for n in verdict.integrity.notes)


def test_a_symlinked_repeat_outside_the_run_is_invalid(tmp_path):
    run = make_run(tmp_path / "lab", values=FIVE)
    outside = tmp_path / "elsewhere"
    shutil.move(run / "repeats" / "4", outside)
    (run / "repeats" / "4").symlink_to(outside)
    _reseal_without(run, "repeats/4/")
    verdict = verify_run(run)
    assert (verdict.status, verdict.exit_code) == ("INVALID", 4)
    assert any("repeats/4 -> " in r and "leaves the run directory" in r for r in verdict.reasons), verdict.reasons
    with pytest.raises(InvalidInput, match="leaves the run directory"):
        bundle.write_sums(run)  # nothing seals it either


def test_a_chain_of_links_that_ends_outside_is_invalid(tmp_path):
    run = make_run(tmp_path / "lab", values=FIVE)
    shutil.move(run / "repeats" / "4", tmp_path / "elsewhere")
    (run / "hop").symlink_to(tmp_path / "elsewhere")
    (run / "repeats" / "4").symlink_to("../hop")  # inside by its text, outside once followed
    _reseal_without(run, "repeats/4/")
    verdict = verify_run(run)
    assert verdict.status == "INVALID"
    assert any("repeats/4 -> ../hop" in r for r in verdict.reasons), verdict.reasons


def test_a_repeat_linked_to_another_repeat_is_invalid_even_when_sealed(tmp_path):
    run = make_run(tmp_path, values=FIVE)
    shutil.rmtree(run / "repeats" / "4")
    (run / "repeats" / "4").symlink_to("3")  # inside the run: sealed as a link, never a repeat
    bundle.write_sums(run)
    assert '# link {"path": "repeats/4", "target": "3"}' in (run / bundle.SUMS_NAME).read_text()
    verdict = verify_run(run)
    assert verdict.status == "INVALID"
    assert any("repeats/4 is a link" in r for r in verdict.reasons), verdict.reasons


def test_a_link_inside_is_recorded_checked_and_packed_as_content(tmp_path):
    run = make_run(tmp_path / "lab", "run-1")
    (run / "notes.txt").write_text("first\n")
    (run / "latest").symlink_to("notes.txt")
    bundle.write_sums(run)
    sums = (run / bundle.SUMS_NAME).read_text()
    assert '# link {"path": "latest", "target": "notes.txt"}\n' in sums
    # coreutils skips the '#' line and checks the link's content through it, strictly
    check = subprocess.run(["sha256sum", "--strict", "-c", bundle.SUMS_NAME], cwd=run, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert verify_run(run).status == "PASS"
    packed = archives.pack(run, tmp_path / "run.tar.gz")
    with tarfile.open(packed) as tar:
        member = tar.getmember("run-1/latest")
        assert member.isreg() and tar.extractfile(member).read() == b"first\n"  # content, never a link
    unpacked = archives.unpack(packed, tmp_path / "there")
    assert not (unpacked / "latest").is_symlink() and verify_run(unpacked).status == "PASS"
    (run / "latest").unlink()
    (run / "latest").symlink_to("summary.json")  # the link now names other content
    verdict = verify_run(run)
    assert verdict.status == "INVALID"
    assert any("latest (a link to 'notes.txt', now to 'summary.json')" in r for r in verdict.reasons)


def test_a_link_to_a_directory_is_refused_by_pack_with_one_sentence(tmp_path):
    run = make_run(tmp_path, "run-1")
    (run / "latest").symlink_to("repeats/0")
    bundle.write_sums(run)
    with pytest.raises(InvalidInput, match="is a link to a directory"):
        archives.pack(run, tmp_path / "run.tar.gz")
    assert not (tmp_path / "run.tar.gz").exists()


def test_a_derived_view_that_links_out_is_unsafe_and_never_packed(tmp_path):
    secret = tmp_path / "id_ed25519"
    secret.write_text("PRIVATE KEY")
    run = make_run(tmp_path / "lab", "run-1")
    (run / "derived").mkdir()
    (run / "derived" / "key").symlink_to(secret)
    assert verify_run(run).status == "INVALID"
    with pytest.raises(InvalidInput, match="leaves the run directory"):
        archives.pack(run, tmp_path / "run.tar.gz")


def test_a_fifo_in_a_run_is_invalid_and_never_read(tmp_path):
    run = make_run(tmp_path, "run-1")
    os.mkfifo(run / "repeats" / "0" / "pipe")
    started = time.monotonic()
    verdict = verify_run(run)  # reading the pipe would block forever
    assert verdict.status == "INVALID" and time.monotonic() - started < 10
    assert any("not a regular file" in r for r in verdict.reasons)


# ------------------------------------------------------------------------- archives


@pytest.mark.parametrize("members, match", [
    ([_dir("runA"), _file("runA/a"), _link("runA/link", "../outside.txt")], "points outside the run directory"),
    ([_dir("runA"), _link("runA/d", ".."), _file("runA/d/X")], "points outside the run directory|through the link"),
    ([_dir("runA"), _link("runA/abs", "/etc/passwd")], "points outside the run directory"),
    ([_dir("runA"), _dir("runA/sub"), _link("runA/sub/up", "../../runB/x")], "points outside the run directory"),
    ([_dir("runA"), _link("runA/a", "b"), _link("runA/b", "../x")], "points outside the run directory"),
    ([_dir("runA"), _link("runA/loop", "loop")], "points outside the run directory"),
    ([_dir("runA"), _link("runA/hard", "/etc/passwd", tarfile.LNKTYPE)], "points outside the run directory"),
    ([_dir("runA"), _link("runA/hard", "other/x", tarfile.LNKTYPE)], "does not name a file of the run"),
    ([_dir("runA"), _link("runA/hard", "runA/later", tarfile.LNKTYPE), _file("runA/later")], "does not name a file"),
    ([_dir("runA"), _dir("runA/sub"), _link("runA/d", "sub"), _file("runA/d/x")], "written through the link"),
    ([_dir("runA"), _file("runA/f"), _file("runA/f/x")], "which is not a directory"),
    ([_dir("runA"), _file("runA/x"), _link("runA/x", "y")], "appears twice"),
    ([_dir("runA"), _file("runA/../escaped.txt")], "escapes the target directory"),
    ([_dir("runA"), _file("/tmp/absolute.txt")], "absolute path"),
], ids=["relative-out", "dotdot-dir-then-file", "absolute", "into-a-sibling", "chain", "loop", "hard-abs",
        "hard-outside-run", "hard-to-later", "file-through-link", "file-under-file", "duplicate", "dotdot-name",
        "absolute-name"])
def test_unpack_refuses_hostile_links_and_names_and_writes_nothing(tmp_path, members, match):
    (tmp_path / "dest").mkdir()
    _refused(_tar(tmp_path / "evil.tar.gz", members), tmp_path, match)


def test_links_that_stay_in_the_run_unpack(tmp_path):
    members = [_dir("runA"), _dir("runA/sub"), _file("runA/sub/x", b"data"), _link("runA/ln", "sub/x"),
               _link("runA/hard", "runA/sub/x", tarfile.LNKTYPE)]
    target = archives.unpack(_tar(tmp_path / "ok.tar.gz", members), tmp_path / "dest")
    assert (target / "ln").read_bytes() == b"data" and (target / "hard").read_bytes() == b"data"


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE])
def test_unpack_refuses_devices_and_pipes(tmp_path, kind):
    info = tarfile.TarInfo("runA/dev")
    info.type, info.devmajor, info.devminor = kind, 1, 3
    _refused(_tar(tmp_path / "dev.tar.gz", [_dir("runA"), (info, None)]), tmp_path, "device or pipe")


def test_unpack_refuses_two_top_level_directories(tmp_path):
    _refused(_tar(tmp_path / "two.tar.gz", [_file("a/x"), _file("b/y")]), tmp_path, "exactly one run directory")


def _sparse_member(name: str, realsize: int, stored: int = 512) -> bytes:
    """A GNU sparse header declaring ``realsize`` bytes (a 10 GB file of holes), plus its data."""
    info = tarfile.TarInfo(name)
    info.size = stored
    buf = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    buf[156:157] = tarfile.GNUTYPE_SPARSE
    buf[386:398] = tarfile.itn(realsize - stored, 12, tarfile.GNU_FORMAT)
    buf[398:410] = tarfile.itn(stored, 12, tarfile.GNU_FORMAT)
    buf[482] = 0
    buf[483:495] = tarfile.itn(realsize, 12, tarfile.GNU_FORMAT)
    buf[148:156] = b" " * 8
    buf[148:155] = b"%06o\0" % sum(buf[:512])
    return bytes(buf) + b"x" * stored


def test_a_10_gb_sparse_member_is_refused_before_reading_it(tmp_path):
    head = tarfile.TarInfo("runA")
    head.type = tarfile.DIRTYPE
    raw = head.tobuf(format=tarfile.GNU_FORMAT) + _sparse_member("runA/huge", 10 * 2**30) + b"\0" * 1024
    path = tmp_path / "sparse.tar.gz"
    path.write_bytes(gzip.compress(raw))
    with tarfile.open(path) as tar:  # the crafted header is what tarfile reads: a 10 GB sparse file
        member = tar.getmember("runA/huge")
        assert member.issparse() and member.size == 10 * 2**30
    started = time.monotonic()
    _refused(path, tmp_path, r"declares at least 10\.7 GB of content, more than the 4\.3 GB")
    assert time.monotonic() - started < 5


def test_a_header_declaring_10_gb_is_refused_before_its_data_is_read(tmp_path):
    head = tarfile.TarInfo("runA/huge")
    head.size = 10 * 2**30
    raw = _dir("runA")[0].tobuf(format=tarfile.GNU_FORMAT) + head.tobuf(format=tarfile.GNU_FORMAT) + b"0" * 4096
    path = tmp_path / "declared.tar.gz"
    path.write_bytes(gzip.compress(raw))  # the data is not there: reading on would say "truncated"
    _refused(path, tmp_path, "more than the")


def test_a_zip_bomb_like_tar_is_refused_before_extraction(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO500_MAX_UNPACK_BYTES", str(16 * 2**20))
    zeros = b"\0" * 2**20
    path = _tar(tmp_path / "bomb.tar.gz", [_dir("runA")] + [_file(f"runA/z{i}", zeros) for i in range(64)])
    assert path.stat().st_size < 2**20  # 64 MiB of content in well under 1 MiB
    _refused(path, tmp_path, r"more than the 16777216 bytes a run directory may hold")


def test_content_beyond_the_free_space_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(archive.writable, "free_bytes", lambda dest: 1000)
    path = _tar(tmp_path / "big.tar.gz", [_dir("runA"), _file("runA/a", b"y" * 5000)])
    _refused(path, tmp_path, "free")


def test_the_extraction_counts_bytes_too(tmp_path):
    accept = archive._counting_filter(tmp_path / "x.tar.gz", budget=10)
    info = tarfile.TarInfo("runA/a")
    info.size = 8
    accept(info, str(tmp_path))
    with pytest.raises(InvalidInput, match="more than 10 bytes once extracted"):
        accept(info, str(tmp_path))


# --------------------------------------------------------------- outputs that cannot be written


def _one_error_line(out) -> str:
    assert "Traceback" not in out.stdout + out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("repro500: error:"), out.stderr
    return lines[0]


def test_pack_to_an_unwritable_place_is_one_sentence_and_leaves_nothing(tmp_path):
    run = make_run(tmp_path, "run-1")
    out = repro500("pack", str(run), "-o", "/dev/null/x.tar.gz", cwd=tmp_path)
    assert out.returncode == 4
    assert "cannot write the archive /dev/null/x.tar.gz" in _one_error_line(out)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    out = subprocess.run([*DROP_DAC, *_cli("pack", str(run), "-o", str(locked / "x.tar.gz"))],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 4 and "Permission denied" in _one_error_line(out)
    assert list(locked.iterdir()) == []


def _cli(*args: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "repro500.cli", *args]


@pytest.mark.parametrize("dest, match", [
    ("README.md", "is not a directory"),
    ("/dev/null", "is not a directory"),
    ("/dev/null/sub", "cannot create /dev/null/sub"),
])
def test_unpack_into_a_file_or_dev_null_is_one_sentence(tmp_path, dest, match):
    run = make_run(tmp_path, "run-1")
    packed = archives.pack(run, tmp_path / "run.tar.gz")
    (tmp_path / "README.md").write_text("readme\n")
    before = _snapshot(tmp_path)
    out = repro500("unpack", str(packed), "--dest", dest, cwd=tmp_path)
    assert out.returncode == 4 and match in _one_error_line(out)
    assert _snapshot(tmp_path) == before and (tmp_path / "README.md").read_text() == "readme\n"


def test_unpack_into_an_unwritable_directory_is_one_sentence(tmp_path):
    run = make_run(tmp_path, "run-1")
    packed = archives.pack(run, tmp_path / "run.tar.gz")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    for dest in (locked, locked / "new" / "deeper"):
        out = subprocess.run([*DROP_DAC, *_cli("unpack", str(packed), "--dest", str(dest))],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert out.returncode == 4 and "Permission denied" in _one_error_line(out)
        assert list(locked.iterdir()) == []


def test_verdict_json_records_the_unsafe_entries(tmp_path):
    run = make_run(tmp_path / "lab", "run-1")
    (run / "escape").symlink_to(tmp_path)
    doc = verify_run(run).to_dict()
    assert doc["integrity"]["sums"]["unsafe"] == [f"escape -> {tmp_path} is a link that leaves the run directory"]
    json.dumps(doc)
