"""Hostile data parameters, git trees and packed runs exhaust nothing.

Each attack is built as a malicious publisher builds it: a publication of their own run whose
``params.yaml`` asks its generator for far more data than the run recorded, a ``file://``
repository with a blob bomb, 60,000 files or a tree 1,500 deep, a packed run nested 2,000
directories deep or holding a decompression bomb, a run directory whose listed file turns into a
FIFO.  Each is refused with one sentence (exit 4), before the disk, the memory or the recursion
limit is spent, and nothing of it is left behind.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml
from helpers.rundirs import make_manifest, make_run
from helpers.runs import repro500

from repro500.errors import InvalidInput
from repro500.rundir import archive as archives
from repro500.rundir import sums as bundle

EVAL = "data/eval.h5"


def _no_traceback(done: subprocess.CompletedProcess[str]) -> str:
    text = done.stdout + done.stderr
    assert "Traceback" not in text, text
    return text


def _publication(base: Path, *, size: int | None = -1, generate: bool = True) -> Path:
    """A publisher's publication of their own run (fabricated repeats, no torch) that read one
    generated data file; ``size`` overrides the size its manifest records (None: none recorded)."""
    from repro500.capture.data import digest_path
    from repro500.data.generate import generate as make_data
    from repro500.publish.datafiles import SPECS_NAME, SPECS_SCHEMA, file_spec
    from repro500.publish.publication import publish

    make_data("classification", base / EVAL, samples=64, seed=7, split="eval")
    entry = {**digest_path(base / EVAL), "path": EVAL}
    spec, _ = file_spec(base / EVAL, EVAL)
    if size is None:
        entry.pop("size")
    elif size >= 0:
        entry["size"] = size
    run = make_run(base / "runs", "ref", manifest=make_manifest(data={"entries": [entry]}))
    specs = {"path": EVAL, "md5": entry["md5"], "bytes": entry.get("size"), "nfiles": None,
             "generate": [spec] if generate else None, "note": None if generate else "real data"}
    (run / SPECS_NAME).write_text(json.dumps({"schema": SPECS_SCHEMA, "data": [specs]}))
    bundle.write_sums(run)
    return publish(run, base / "pub").path


def _edit_spec(pub: Path, **changes: object) -> None:
    """What the attacker edits: the generator parameters in params.yaml, the digest list resealed."""
    params = yaml.safe_load((pub / "params.yaml").read_text())
    params["data"][0]["generate"][0].update(changes)
    (pub / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    bundle.write_sums(pub)


def _reproduce(source: str, victim: Path, **env: str) -> subprocess.CompletedProcess[str]:
    victim.mkdir(exist_ok=True)
    return repro500("reproduce", source, "--out", "OUT", cwd=victim, env=env or None, timeout=120)


def _largest_file(root: Path) -> int:
    return max((p.stat().st_size for p in root.rglob("*") if p.is_file()), default=0)


# ------------------------------------------------------------------------- generator parameters


@pytest.mark.parametrize("changes", [{"samples": 50_000}, {"size": "1024x1024"}], ids=["samples", "size"])
def test_generator_parameters_for_more_data_than_recorded_are_refused_before_generating(
        tmp_path: Path, changes: dict) -> None:
    pub = _publication(tmp_path / "publisher")
    _edit_spec(pub, **changes)
    done = _reproduce(str(pub), tmp_path / "victim")
    text = _no_traceback(done)
    assert done.returncode == 4 and "more than the 210,200 bytes the run recorded" in text, text
    assert not (tmp_path / "victim" / "OUT" / "data").exists()


@pytest.mark.parametrize("changes", [{"samples": 10**9}, {"size": "30000x30000"},
                                     {"samples": 10**9, "compression": "gzip"}],
                         ids=["a-billion-samples", "30000x30000", "gzip-cannot-shrink-that-much"])
def test_a_publications_data_specs_are_checked_against_the_recorded_size(tmp_path: Path, changes: dict) -> None:
    # the values of the issue itself, which the reproduction above would spend a disk (or the
    # memory, for one 30000x30000 sample) on: refused from the numbers alone
    from repro500.publish.datafiles import check_entries

    pub = _publication(tmp_path)
    _edit_spec(pub, **changes)
    params = yaml.safe_load((pub / "params.yaml").read_text())
    manifest = json.loads((pub / "manifest.json").read_text())
    started = time.monotonic()
    with pytest.raises(InvalidInput, match=r"would write at least [\d,]+ bytes, more than the 210,200 bytes"):
        check_entries(params["data"], manifest, pub / "params.yaml")
    assert time.monotonic() - started < 5


def test_compressed_data_stops_as_soon_as_it_outgrows_the_recorded_size(tmp_path: Path) -> None:
    pub = _publication(tmp_path / "publisher")
    _edit_spec(pub, samples=100_000, compression="gzip")  # could compress below the cap: only writing tells
    done = _reproduce(str(pub), tmp_path / "victim")
    text = _no_traceback(done)
    assert done.returncode == 4 and "grew past" in text and "stopped and removed" in text, text
    data = tmp_path / "victim" / "OUT" / "data"
    assert not data.exists() or not any(data.iterdir())  # neither the file nor a partial one stays


def test_a_recorded_size_beyond_the_free_space_is_refused_before_generating(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from repro500.publish.reproduce import reproduce

    pub = _publication(tmp_path / "publisher", size=10**15)  # the publisher's run "recorded" a petabyte
    _edit_spec(pub, samples=50_000)
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=10**6))
    victim = tmp_path / "victim"
    with pytest.raises(InvalidInput, match=r"may need [\d,]+ bytes but its file system has 1,000,000 free"):
        reproduce(str(pub), out=victim)
    assert not (victim / "data").exists() or not any((victim / "data").iterdir())


@pytest.mark.parametrize("size", [-1, None], ids=["recorded", "old-publication-without-a-size"])
def test_a_genuine_publications_data_still_regenerates(tmp_path: Path, size: int | None) -> None:
    pub = _publication(tmp_path / "publisher", size=size)
    if size is None:  # as publications written before sizes were recorded
        params = yaml.safe_load((pub / "params.yaml").read_text())
        params["data"][0].pop("bytes")
        (pub / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        bundle.write_sums(pub)
    done = _reproduce(str(pub), tmp_path / "victim")
    assert f"{EVAL}: regenerated from its generator parameters (md5" in _no_traceback(done), done.stdout + done.stderr


def test_publish_records_the_size_when_the_manifest_lacks_it(tmp_path: Path) -> None:
    from repro500.capture.data import digest_path
    from repro500.publish.datafiles import describe

    pub = _publication(tmp_path, size=None)
    manifest = json.loads((pub / "manifest.json").read_text())
    plan = describe(manifest, tmp_path)
    assert plan.entries[0].size_bytes == digest_path(tmp_path / EVAL)["size"]


# ------------------------------------------------------------------------------- git sources


def _git_repo(path: Path, files: dict[str, bytes | int]) -> Path:
    """A repository committed with git fast-import as an attacker scripts it: a file's content is
    bytes, or an int for that many zero bytes (streamed, never held here); one blob per content."""
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    # zlib's fastest level (the level is the writer's choice, nothing a reader can rely on), and the
    # objects stay in fast-import's pack: below 100 objects git explodes it into loose objects
    # (inflating and deflating a 600 MiB blob again), and a clone then deflates them once more to
    # send them; from a pack they go out as they are (the blob-bomb test's CPU, the repository and
    # the clone: 22 s -> 8 s)
    proc = subprocess.Popen(["git", "-c", "core.compression=1", "-c", "fastimport.unpackLimit=0", "fast-import",
                             "--quiet"], cwd=path, stdin=subprocess.PIPE)
    assert proc.stdin is not None
    marks: dict[object, int] = {}
    for content in files.values():
        key = content if isinstance(content, int) else hashlib.sha256(content).digest()
        if key in marks:
            continue
        marks[key] = len(marks) + 1
        size = content if isinstance(content, int) else len(content)
        proc.stdin.write(b"blob\nmark :%d\ndata %d\n" % (marks[key], size))
        if isinstance(content, int):
            zeros = bytes(2**20)
            for start in range(0, size, len(zeros)):
                proc.stdin.write(zeros[: min(len(zeros), size - start)])
        else:
            proc.stdin.write(content)
        proc.stdin.write(b"\n")
    proc.stdin.write(b"commit refs/heads/main\ncommitter t <t@e.org> 0 +0000\ndata 11\npublication\n")
    for name, content in files.items():
        key = content if isinstance(content, int) else hashlib.sha256(content).digest()
        proc.stdin.write(b"M 100644 :%d %s\n" % (marks[key], name.encode()))
    proc.stdin.write(b"\n")
    proc.stdin.close()
    assert proc.wait(timeout=300) == 0
    subprocess.run(["git", "symbolic-ref", "HEAD", "refs/heads/main"], cwd=path, check=True)
    return path


def _files(pub: Path) -> dict[str, bytes | int]:
    return {p.name: p.read_bytes() for p in pub.iterdir() if p.is_file()}


def _zeros_sha256(n: int) -> str:
    digest, zeros = hashlib.sha256(), bytes(2**20)
    for start in range(0, n, len(zeros)):
        digest.update(zeros[: min(len(zeros), n - start)])
    return digest.hexdigest()


@pytest.mark.slow
def test_a_git_blob_bomb_is_refused_by_its_size_without_being_read(tmp_path: Path) -> None:
    pub = _publication(tmp_path / "publisher")
    bomb = 600 * 2**20  # over git's own streaming threshold: only a reader that holds it whole grows
    files = _files(pub)
    files["README.md"] = bomb
    sums = [line for line in files["SHA256SUMS"].decode().splitlines() if not line.endswith("  README.md")]
    files["SHA256SUMS"] = "\n".join([*sums, f"{_zeros_sha256(bomb)}  README.md", ""]).encode()
    repo = _git_repo(tmp_path / "bomb", files)
    victim = tmp_path / "victim"
    victim.mkdir()
    # Measured from a small Python of its own: a child forked from this test process (pytest, with
    # torch loaded by earlier tests) would carry the parent's resident size as its own peak.
    probe = ("import resource, subprocess, sys\n"
             "done = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)\n"
             "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "sys.stdout.write(done.stdout)\n")
    done = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "repro500.cli", "reproduce",
                           f"file://{repo}", "--out", "OUT"], cwd=victim, capture_output=True, text=True, timeout=300)
    first, _, out = done.stdout.partition("\n")
    returncode, peak_kib = (int(x) for x in first.split())
    assert "Traceback" not in out, out
    assert returncode == 4 and "README.md is 629,145,600 bytes, over the" in out, out
    # the peak of reproduce and of every git process it waited for
    assert peak_kib * 1024 < bomb / 2, f"{peak_kib} KiB"
    assert _largest_file(victim) < 2**20


def test_only_the_publications_own_files_are_taken_from_a_git_tree(tmp_path: Path) -> None:
    from repro500.publish import source

    pub = _publication(tmp_path / "publisher")
    files = {**_files(pub), "big.bin": 8 * 2**20, "notes/todo.txt": b"not listed\n"}
    repo = _git_repo(tmp_path / "repo", files)
    found = source.resolve(f"file://{repo}", tmp_path / "tmp")
    taken = sorted(p.relative_to(found.path).as_posix() for p in found.path.rglob("*") if p.is_file())
    assert taken == sorted(name for name in _files(pub))


def test_a_60000_file_git_tree_is_not_extracted_for_dvc_pull(tmp_path: Path) -> None:
    pub = _publication(tmp_path / "publisher", generate=False)  # its data can only be pulled
    files: dict[str, bytes | int] = {f"pub/{name}": data for name, data in _files(pub).items()}
    files[".dvc/config"] = b"[core]\n    remote = store\n['remote \"store\"']\n    url = /nonexistent\n"
    files.update({f"junk/{i // 1000}/{i}.txt": b"x\n" for i in range(60_000)})
    repo = _git_repo(tmp_path / "repo", files)
    started = time.monotonic()
    done = _reproduce(f"file://{repo}", tmp_path / "victim")
    text = _no_traceback(done)
    assert done.returncode == 4 and "holds more than 20,000 files" in text, text
    assert time.monotonic() - started < 60


def test_a_git_tree_1500_deep_is_one_sentence(tmp_path: Path) -> None:
    pub = _publication(tmp_path / "publisher")
    files: dict[str, bytes | int] = {**_files(pub), "d/" * 1500 + "f": b"deep\n"}
    repo = _git_repo(tmp_path / "repo", files)
    done = _reproduce(f"file://{repo}", tmp_path / "victim")
    text = _no_traceback(done)
    assert done.returncode == 4 and "more than 64 directories deep" in text, text


# ------------------------------------------------------------------------------ packed runs


def _nested(path: Path, depth: int) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        name = "runA"
        for _ in range(depth):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
            name += "/d"
    return path


def test_a_packed_run_nested_2000_deep_is_refused_before_extracting(tmp_path: Path) -> None:
    archive = _nested(tmp_path / "deep.tar.gz", 2000)
    started = time.monotonic()
    done = repro500("unpack", str(archive), "--dest", "dest", cwd=tmp_path, timeout=60)
    text = _no_traceback(done)
    assert done.returncode == 4 and "more than 64 directories deep" in text, text
    assert time.monotonic() - started < 30 and not (tmp_path / "dest").exists()


@pytest.mark.parametrize("command", [["verify"], ["reproduce", "--out", "OUT"]], ids=["verify", "reproduce"])
def test_a_packed_run_nested_3000_deep_leaves_no_temporary_directory(tmp_path: Path, command: list[str]) -> None:
    archive = _nested(tmp_path / "deep.tar.gz", 3000)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    done = repro500(command[0], str(archive), *command[1:], cwd=tmp_path, env={"TMPDIR": str(scratch)}, timeout=60)
    text = _no_traceback(done)
    assert done.returncode == 4 and "more than 64 directories deep" in text, text
    assert list(scratch.iterdir()) == []


def test_a_decompression_bomb_under_the_size_cap_is_refused_before_extracting(tmp_path: Path) -> None:
    archive = tmp_path / "bomb.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in ("runA", "runA/repeats"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for i in range(4):
            info = tarfile.TarInfo(f"runA/repeats/zeros{i}")
            info.size = 32 * 2**20
            tar.addfile(info, io.BytesIO(bytes(info.size)))
    assert archive.stat().st_size < 2**20  # 128 MiB in a few hundred kB, far under the 4 GiB cap
    done = repro500("unpack", str(archive), "--dest", "dest", cwd=tmp_path, timeout=60)
    text = _no_traceback(done)
    assert done.returncode == 4 and "decompression bomb" in text, text
    assert not (tmp_path / "dest").exists()


def test_a_run_with_a_large_incompressible_checkpoint_still_unpacks(tmp_path: Path) -> None:
    run = make_run(tmp_path, "run-1")
    (run / "repeats" / "0" / "checkpoint.pt").write_bytes(os.urandom(80 * 2**20))  # over the bomb check's floor
    bundle.write_sums(run)
    archive = archives.pack(run, tmp_path / "run-1.tar.gz")
    target = archives.unpack(archive, tmp_path / "dest")
    assert bundle.check_sums(target).ok


# ------------------------------------------------------------------------- run directories

_SWAP = """
import os, sys
from pathlib import Path
from repro500.rundir import sums as bundle
run, kind = Path(sys.argv[1]), sys.argv[2]
scan = bundle.scan
def scan_then_swap(root):
    entries = scan(root)
    (run / "run.json").unlink()  # after the scan saw a regular file: the race a hostile writer wins
    os.mkfifo(run / "run.json") if kind == "fifo" else (run / "run.json").symlink_to("/dev/zero")
    return entries
bundle.scan = scan_then_swap
print(bundle.check_sums(run).describe())
"""


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_listed_file_swapped_for_a_fifo_or_dev_zero_is_never_read(tmp_path: Path, kind: str) -> None:
    run = make_run(tmp_path, "run-1")
    done = subprocess.run([sys.executable, "-c", _SWAP, str(run), kind], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "run.json is not a regular file" in done.stdout, done.stdout
