"""Data digests equal DVC's, the cache skips unchanged files, changes are reported."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import fixtures

from repro500.capture import data
from repro500.errors import InvalidInput

DVC = str(Path(sys.executable).parent / "dvc")


_own_cache = fixtures.own_cache


def make_tree(root: Path) -> None:
    """Names that exercise DVC's relpath sort order, nesting, unicode and empty files."""
    files = {
        "a.txt": b"x", "a/b.txt": b"yy\r\n", "a-b/c": b"q", "B": b"Z", "\u00e9.txt": b"u",
        "empty": b"", "deep/er/still/f.bin": os.urandom(3000), "big.bin": os.urandom(3 << 20),
        "sub/.git/config": b"ignored by dvc", "sub/file": b"h",
    }
    for rel, blob in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
    (root / "link").symlink_to("a.txt")


def old(path: Path, seconds: int = 10) -> None:
    """Backdate a file's mtime so it is outside the racy window and may be cached."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - seconds * 1_000_000_000))


@pytest.mark.slow
def test_digests_equal_what_dvc_add_writes(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    make_tree(repo / "ds")
    (repo / "single.bin").write_bytes(os.urandom(10_000))
    ours = data.digest_paths([repo / "ds", repo / "single.bin"], use_cache=False)
    subprocess.run([DVC, "init", "-q"], cwd=repo, check=True, env=env)
    subprocess.run([DVC, "add", "-q", "ds", "single.bin"], cwd=repo, check=True, env=env,
                   capture_output=True)
    for entry, name in zip(ours, ("ds", "single.bin"), strict=True):
        (out,) = yaml.safe_load((repo / f"{name}.dvc").read_text())["outs"]
        assert entry["md5"] == out["md5"]
        assert entry["size"] == out["size"] and entry["hash"] == out["hash"] == "md5"
        assert entry["nfiles"] == out.get("nfiles")
    assert ours[0]["md5"].endswith(".dir") and ours[0]["nfiles"] == 10


def test_directory_formula_is_recomputable_from_the_docs(tmp_path):
    (tmp_path / "d" / "x").mkdir(parents=True)
    (tmp_path / "d" / "x" / "1").write_bytes(b"one")
    (tmp_path / "d" / "2").write_bytes(b"two")
    listing = [{"md5": hashlib.md5(b"two").hexdigest(), "relpath": "2"},
               {"md5": hashlib.md5(b"one").hexdigest(), "relpath": "x/1"}]
    expected = hashlib.md5(json.dumps(listing, sort_keys=True).encode()).hexdigest() + ".dir"
    entry = data.digest_path(tmp_path / "d")
    assert entry == {"path": str(tmp_path / "d"), "kind": "directory", "hash": "md5",
                     "md5": expected, "size": 6, "nfiles": 2}


def test_cache_skips_unchanged_files_and_notices_changes(tmp_path, monkeypatch):
    ds = tmp_path / "ds"
    ds.mkdir()
    for i in range(5):
        (ds / f"f{i}").write_bytes(os.urandom(1000))
        old(ds / f"f{i}")
    reads: list[str] = []
    real = data.md5_file
    monkeypatch.setattr(data, "md5_file", lambda p, *a: reads.append(p) or real(p, *a))
    first = data.digest_path(ds)
    assert len(reads) == 5
    reads.clear()
    assert data.digest_path(ds) == first and reads == []  # warm: nothing read
    (ds / "f3").write_bytes(os.urandom(1000))  # same size, new content and mtime
    changed = data.digest_path(ds)
    assert reads == [str(ds / "f3")] and changed["md5"] != first["md5"]
    reads.clear()
    (ds / "fresh").write_bytes(b"new")  # too recent to cache ("racy"): re-read next time
    ahead = time.time_ns() + 60 * 10**9  # still "recent" however long this machine stalls
    os.utime(ds / "fresh", ns=(ahead, ahead))
    data.digest_path(ds)
    data.digest_path(ds)
    assert reads.count(str(ds / "fresh")) == 2
    reads.clear()
    assert data.digest_paths([ds], use_cache=False)[0]["md5"] == data.digest_path(ds)["md5"]


def test_damaged_cache_file_is_replaced_not_fatal(tmp_path):
    cache_file = tmp_path / "cache" / "hashes" / "md5.sqlite"
    cache_file.parent.mkdir(parents=True)
    cache_file.write_bytes(b"this is not a sqlite database" * 100)
    f = tmp_path / "f.bin"
    f.write_bytes(b"abc")
    assert data.digest_path(f)["md5"] == hashlib.md5(b"abc").hexdigest()
    assert (cache_file.parent / "md5.sqlite.damaged").exists()


def test_compare_reports_changed_and_missing_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("ds").mkdir()
    Path("ds/a").write_bytes(b"1")
    Path("single").write_bytes(b"2")
    recorded = data.digest_paths(["ds", "single"])
    assert data.compare(recorded) == []
    Path("ds/b").write_bytes(b"new file")
    Path("single").unlink()
    problems = data.compare(recorded)
    assert len(problems) == 2
    assert problems[0].startswith("data path 'ds' changed: ")
    assert "2 files" in problems[0] and "1 files" in problems[0]
    assert problems[1] == "data path 'single' recorded in the manifest is missing here"


def test_compare_hashes_nothing_whose_size_already_differs(tmp_path, monkeypatch):
    # a recorded input may name a large directory of the reader's: its listing says it differs
    monkeypatch.chdir(tmp_path)
    Path("ds").mkdir()
    Path("ds/a").write_bytes(b"1")
    recorded = data.digest_paths(["ds"])
    Path("ds/a").write_bytes(b"10")

    def no_hashing(path):
        raise AssertionError(f"{path} was hashed")

    monkeypatch.setattr(data, "digest_path", no_hashing)
    (problem,) = data.compare(recorded)
    assert "2 bytes" in problem and "recorded 1 bytes" in problem and "not hashed" in problem


def test_bad_paths_are_invalid_input(tmp_path):
    with pytest.raises(InvalidInput, match="does not exist"):
        data.digest_path(tmp_path / "missing")
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(InvalidInput, match="broken symbolic link"):
        data.digest_path(tmp_path / "ds")


def test_module_cli_prints_entries(tmp_path):
    (tmp_path / "f").write_bytes(b"hello\n")
    out = subprocess.run([sys.executable, "-m", "repro500.capture.data", str(tmp_path / "f")],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "REPRO500_CACHE_DIR": str(tmp_path / "c")})
    assert json.loads(out.stdout)[0]["md5"] == "b1946ac92492d2347c6235b4d2611184"
    bad = subprocess.run([sys.executable, "-m", "repro500.capture.data", str(tmp_path / "no")],
                         capture_output=True, text=True)
    assert bad.returncode == 4 and bad.stderr.startswith("repro500: error: data path")


@pytest.mark.parametrize("sizes", [
    [0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 4095, 4096, 4097, 70_000, 300_000, 2_500_000],
    [1_048_576] * 9 + [1_048_577, 1_048_575, 3],  # chunk-boundary sizes
    [5] * 40,  # many tiny files: lanes refill every round
    [700_000] * 20 + [7],  # more files than lanes, several chunks each: files move between lanes
    [100] * 70 + [1_100_000] * 3,  # more files than are opened at once
    [393_215, 393_216, 393_217] * 12,  # both 16-lane groups busy, ends at 3 x 128 KiB
])
def test_multibuffer_kernel_matches_hashlib(tmp_path, sizes):
    from repro500.capture import md5mb

    if not md5mb.available():
        pytest.skip("no C compiler with GCC vector extensions here; hashlib is used instead")
    paths = []
    for i, n in enumerate(sizes):
        path = tmp_path / f"f{i}"
        path.write_bytes(os.urandom(n))
        paths.append(str(path))
    seen: list[int] = []
    got = md5mb.md5_files(paths, on_bytes=seen.append)
    assert got == {p: hashlib.md5(Path(p).read_bytes()).hexdigest() for p in paths}
    assert sum(seen) == sum(sizes)  # progress counts the data bytes, not the padding


def test_both_engines_give_the_same_directory_digest(tmp_path, monkeypatch):
    ds = tmp_path / "ds"
    for i in range(30):
        (ds / str(i % 3)).mkdir(parents=True, exist_ok=True)
        (ds / str(i % 3) / f"{i}.bin").write_bytes(os.urandom(i * 997))
    simd = data.digest_paths([ds], use_cache=False, jobs=2)
    monkeypatch.setenv("REPRO500_MD5MB", "0")
    monkeypatch.setattr(data.md5mb, "_lib", None)
    plain = data.digest_paths([ds], use_cache=False, jobs=2)
    assert simd == plain


def test_an_interrupted_hash_stops_the_other_workers_promptly():
    import threading
    import time

    seen_stop = threading.Event()

    def work(item, stop):
        if item == "boom":
            time.sleep(0.05)
            raise KeyboardInterrupt  # what Ctrl-C looks like to the waiting caller
        if stop.wait(timeout=10):
            seen_stop.set()
        return item

    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        data._parallel(work, ["slow", "boom"], workers=2)  # the slow one is waited on first
    assert seen_stop.is_set() and time.perf_counter() - start < 5


def test_a_read_error_inside_the_kernel_names_the_file(tmp_path):
    from repro500.capture import md5mb

    if not md5mb.available():
        pytest.skip("no C compiler with GCC vector extensions here; hashlib is used instead")
    paths = []
    for i in range(20):
        path = tmp_path / f"f{i}"
        path.write_bytes(os.urandom(1000))
        paths.append(str(path))
    bad = tmp_path / "a-directory"  # opens read-only, then read() fails with EISDIR
    bad.mkdir()
    with pytest.raises(IsADirectoryError) as err:
        md5mb.md5_files([*paths, str(bad)])
    assert err.value.filename == str(bad)


def test_a_file_cut_short_while_it_is_hashed_in_place_is_named_not_a_crash(tmp_path):
    """Files of more than a chunk are hashed where the kernel maps them; one truncated midway faults
    (SIGBUS), which ends the round with that file named instead of ending the process."""
    from repro500.capture import md5mb

    if not md5mb.available():
        pytest.skip("no C compiler with GCC vector extensions here; hashlib is used instead")
    paths = []
    for i in range(20):
        path = tmp_path / f"f{i}"
        path.write_bytes(os.urandom(4 * md5mb.CHUNK_BYTES + 17))
        paths.append(str(path))
    victim = paths[7]

    def cut(_: int) -> None:  # after the first round, every file is mapped and partly hashed
        os.truncate(victim, 100)

    with pytest.raises(md5mb.ChangedWhileHashing) as err:
        md5mb.md5_files(paths, on_bytes=cut)
    assert err.value.filename == victim
    # the process goes on hashing, the truncated file as it is now included
    assert md5mb.md5_files(paths) == {p: hashlib.md5(Path(p).read_bytes()).hexdigest() for p in paths}


def test_a_sigbus_that_is_no_hashing_round_still_ends_the_process(tmp_path):
    script = ("import os, signal\nfrom repro500.capture import md5mb\nassert md5mb.available()\n"
              "os.kill(os.getpid(), signal.SIGBUS)\nprint('survived')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGBUS and "survived" not in done.stdout, (done.returncode, done.stderr)


def test_a_changed_file_is_one_sentence_about_the_change(tmp_path, monkeypatch):
    ds = tmp_path / "ds"
    ds.mkdir()
    for i in range(data.MULTIBUFFER_MIN_FILES):
        (ds / f"{i}.bin").write_bytes(b"x")

    def changed(paths, on_bytes=None, stop=None):
        raise data.md5mb.ChangedWhileHashing(14, "it changed while it was being hashed", paths[0])

    monkeypatch.setattr(data.md5mb, "available", lambda: True)
    monkeypatch.setattr(data.md5mb, "md5_files", changed)
    with pytest.raises(InvalidInput, match=r"^data file '.*\.bin' changed while it was being hashed: hash it once"):
        data.digest_paths([ds], use_cache=False, jobs=1)


@pytest.mark.parametrize("compiler", ["false", "/no/such/cc"])
def test_without_a_working_compiler_hashlib_gives_the_same_digest(tmp_path, compiler):
    ds = tmp_path / "ds"
    ds.mkdir()
    for i in range(12):
        (ds / f"{i}.bin").write_bytes(bytes([i]) * (i * 1000))
    env = {**os.environ, "CC": compiler, "REPRO500_CACHE_DIR": str(tmp_path / "fresh-cache")}
    probe = subprocess.run([sys.executable, "-c", "from repro500.capture import md5mb; print(md5mb.available())"],
                           capture_output=True, text=True, env=env, check=True)
    assert probe.stdout.strip() == "False"
    out = subprocess.run([sys.executable, "-m", "repro500.capture.data", "--no-cache", str(ds)],
                         capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout)[0]["md5"] == data.digest_paths([ds], use_cache=False)[0]["md5"]


@pytest.mark.parametrize("special", ["fifo", "device link"])
def test_a_special_file_in_a_data_directory_is_refused_not_read_forever(tmp_path, special):
    ds = tmp_path / "ds"
    ds.mkdir()
    for i in range(10):
        (ds / f"{i}.bin").write_bytes(b"x" * i)
    if special == "fifo":
        os.mkfifo(ds / "pipe")  # opening it for reading would wait for a writer forever
    else:
        (ds / "zeros").symlink_to("/dev/zero")  # reading it would never end
    out = subprocess.run([sys.executable, "-m", "repro500.capture.data", "--no-cache", str(ds)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 4
    assert out.stderr.startswith("repro500: error: data file") and "not a regular file" in out.stderr
    assert "Traceback" not in out.stderr


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((line for line in text.splitlines() if line.startswith("flags")), "").split())


@pytest.mark.parametrize(("march", "flag"), [("x86-64-v3", "avx2"), ("x86-64-v2", "sse4_2")])
@pytest.mark.slow
def test_builds_for_narrower_vectors_hash_32_lanes_as_two_groups_with_the_same_digests(tmp_path, monkeypatch,
                                                                                      march, flag):
    """AVX2 and SSE4 hold a 16-lane group in 2 and 4 registers: no md5x32, and the block is transposed
    in 8 x 8 pieces (transpose8), a path an AVX-512 CPU's own build never takes."""
    from repro500.capture import md5mb

    if flag not in _cpu_flags():
        pytest.skip(f"this CPU has no {flag} to run a {march} build")
    monkeypatch.setenv("REPRO500_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(md5mb, "_MARCH", march)
    monkeypatch.setattr(md5mb, "_lib", None)
    monkeypatch.setattr(md5mb, "_lib_failed", False)
    if not md5mb.available():
        pytest.skip("no C compiler with GCC vector extensions here")
    paths = []
    for i, n in enumerate([393_216, 131_071, 64, 0, 700_001] * 8):  # 40 files: both groups busy
        path = tmp_path / f"f{i}"
        path.write_bytes(os.urandom(n))
        paths.append(str(path))
    assert md5mb.md5_files(paths) == {p: hashlib.md5(Path(p).read_bytes()).hexdigest() for p in paths}
    assert len(list((tmp_path / "cache" / "ext").glob("md5mb-*.so"))) == 1  # built here, not this CPU's own
