"""Data hashing: repro500 vs ``dvc add --no-commit`` vs ``md5sum`` on 1 GB in 100 files.

Targets: cold repro500 hashing <= 0.1 x DVC's wall time with identical digests;
a warm rehash (hash cache hit, nothing re-read) <= 5 % of the cold time.

* cold repro500: ``python -m repro500.capture.data --no-cache DIR`` (a fresh process, like
  ``dvc add``; the multi-buffer MD5 kernel is compiled once beforehand and reported apart,
  since it is built once per machine and cached);
* DVC: ``dvc add --no-commit DIR`` in a fresh git+DVC repository, its state database (in a
  per-repository ``core.site_cache_dir``) and ``.dvc`` file removed before each round so
  every round hashes from scratch;
* md5sum: coreutils over the 100 files (one thread), as the floor of a plain tool.

Rounds are interleaved; medians are reported.  Everything runs from the page cache (the
files were just written), so this compares hashing and overhead, not the disk.  The
gigabyte is deleted at the end.  Run: ``python bench/hashing.py [ROUNDS]``; exits 1 when a
target is missed.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from repro500.capture import data

BIN = Path(sys.executable).parent
N_FILES = 100
FILE_BYTES = 10 * 1024 * 1024  # 100 x 10 MiB = 1 GiB (~1.05 GB)
DVC_TARGET = 0.1
WARM_TARGET = 0.05


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, text=True)
    return time.perf_counter() - start, out.stdout


def make_data(ds: Path) -> None:
    ds.mkdir(parents=True)
    block = os.urandom(FILE_BYTES)
    old_ns = time.time_ns() - 60 * 1_000_000_000  # outside the racy window: cacheable
    for i in range(N_FILES):
        path = ds / f"part-{i:03d}.bin"
        # distinct content per file without generating 1 GB of entropy
        path.write_bytes(i.to_bytes(8, "little") + block[8:])
        os.utime(path, ns=(old_ns, old_ns))


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    work = Path(tempfile.mkdtemp(prefix="repro500-hashbench-"))
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "REPRO500_CACHE_DIR": str(work / "cache")}
    try:
        repo = work / "repo"
        ds = repo / "ds"
        make_data(ds)
        subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
        subprocess.run([str(BIN / "dvc"), "init", "-q"], cwd=repo, check=True, env=env)
        subprocess.run([str(BIN / "dvc"), "config", "core.site_cache_dir", str(work / "dvcsite")],
                       cwd=repo, check=True, env=env)
        build_s, _ = timed([sys.executable, "-c", "from repro500.capture import md5mb; "
                            "print(md5mb.available())"], repo, env)
        print(f"one-time multi-buffer MD5 kernel build + self-test: {build_s:.2f} s "
              "(cached afterwards; not counted below)")
        files = sorted(str(p) for p in ds.iterdir())
        times: dict[str, list[float]] = {"repro500": [], "dvc": [], "md5sum": []}
        digests: dict[str, str] = {}
        for _ in range(rounds):
            t, out = timed([sys.executable, "-m", "repro500.capture.data", "--no-cache", "ds"],
                           repo, env)
            times["repro500"].append(t)
            digests["repro500"] = json.loads(out)[0]["md5"]

            shutil.rmtree(work / "dvcsite", ignore_errors=True)
            (repo / "ds.dvc").unlink(missing_ok=True)
            t, _ = timed([str(BIN / "dvc"), "add", "-q", "--no-commit", "ds"], repo, env)
            times["dvc"].append(t)
            digests["dvc"] = yaml.safe_load((repo / "ds.dvc").read_text())["outs"][0]["md5"]

            t, out = timed(["md5sum", *files], repo, env)
            times["md5sum"].append(t)
            md5sum = {Path(line.split(None, 1)[1]).name: line.split()[0]
                      for line in out.splitlines()}
        ours_files = {f.name: data.md5_file(f) for f in map(Path, files[:3])}
        assert all(md5sum[name] == md5 for name, md5 in ours_files.items()), "md5sum differs"
        assert digests["repro500"] == digests["dvc"], f"digests differ: {digests}"
        listing = [(name, md5sum[name]) for name in sorted(md5sum)]
        assert data.dir_md5(listing) == digests["dvc"], "md5sum-derived .dir digest differs"

        # In-process cold (empty hash cache) vs warm (every file a cache hit).  Only the hash
        # cache (cache/hashes/, data.HashCache) is emptied: the compiled MD5 kernel in
        # cache/ext/ stays, so "cold" is hashing, not a recompile of the kernel.
        os.environ["REPRO500_CACHE_DIR"] = str(work / "cache")
        cold_s, warm_s = [], []
        for _ in range(rounds):
            shutil.rmtree(work / "cache" / "hashes", ignore_errors=True)
            start = time.perf_counter()
            cold = data.digest_path(ds)
            cold_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            warm = data.digest_path(ds)
            warm_s.append(time.perf_counter() - start)
            assert cold == warm and cold["md5"] == digests["dvc"]

        med = {k: statistics.median(v) for k, v in times.items()}
        gb = N_FILES * FILE_BYTES / 1e9
        print(f"data: {N_FILES} files, {gb:.2f} GB, {rounds} interleaved rounds, page cache warm")
        for name, t in med.items():
            print(f"{name:9s} cold median {t:.2f} s  ({gb / t:.2f} GB/s; all {[round(x, 2) for x in times[name]]})")
        print(f"identical digest: {digests['repro500']}")
        ratio = med["repro500"] / med["dvc"]
        print(f"repro500 / dvc add = {ratio:.3f}  target <= {DVC_TARGET}: "
              f"{'met' if ratio <= DVC_TARGET else 'MISSED'} ({ratio:.3f}x)")
        print(f"repro500 / md5sum  = {med['repro500'] / med['md5sum']:.2f} (information)")
        cold_med, warm_med = statistics.median(cold_s), statistics.median(warm_s)
        warm_ratio = warm_med / cold_med
        print(f"in-process cold {cold_med:.3f} s, warm {warm_med * 1000:.1f} ms: warm/cold = "
              f"{warm_ratio:.3%}  target <= {WARM_TARGET:.0%}: "
              f"{'met' if warm_ratio <= WARM_TARGET else 'MISSED'} ({warm_ratio:.3%})")
        # in-process rounds take a quarter of a second: nine of them steady the medians that the
        # estimate subtracts and adds (with three, the AVX2 median moved from 0.125 to 0.163 s
        # between sittings)
        avx2 = avx2_figures(ds, work, max(rounds, 9), digests["dvc"])
        if avx2 is not None:
            native_s, avx2_s = avx2
            # the process figure less this CPU's kernel time plus the AVX2 build's: what a CPU
            # with AVX2 only (x86-64-v3) would show at this clock, other costs alike
            estimate = med["repro500"] - native_s + avx2_s
            print(f"AVX2 build (x86-64-v3) in process: cold median {avx2_s:.3f} s against this CPU's build "
                  f"{native_s:.3f} s (x{avx2_s / native_s:.2f}); the repro500 figure with it about "
                  f"{estimate:.2f} s = {estimate / med['dvc']:.3f} x dvc add (information)")
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the gigabyte goes
    return 0 if ratio <= DVC_TARGET and warm_ratio <= WARM_TARGET else 1


def avx2_figures(ds: Path, work: Path, rounds: int, dvc_md5: str) -> tuple[float, float] | None:
    """(this CPU's build, the AVX2 build): in-process cold hashing medians, interleaved, on a CPU
    with AVX-512 (where the two builds differ), each digest checked against ``dvc add``'s; None
    elsewhere.  The AVX2 build hashes 32 files as two groups of 16 lanes one after the other, where
    AVX-512 takes them in one group of 32."""
    from repro500.capture import md5mb

    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    if "avx512f" not in flags.split() or "avx2" not in flags.split():
        return None
    times: dict[str, list[float]] = {"native": [], "x86-64-v3": []}
    digests: set[str] = set()
    for _ in range(rounds):
        for march in times:
            md5mb._MARCH, md5mb._lib, md5mb._lib_failed = march, None, False
            if not md5mb.available():  # built (once per build) and self-tested outside the timing
                return None
            shutil.rmtree(work / "cache" / "hashes", ignore_errors=True)
            start = time.perf_counter()
            entry = data.digest_path(ds)
            times[march].append(time.perf_counter() - start)
            digests.add(entry["md5"])
    md5mb._MARCH, md5mb._lib, md5mb._lib_failed = "native", None, False
    assert digests == {dvc_md5}, f"a build's digest differs from dvc add's {dvc_md5}: {digests}"
    return statistics.median(times["native"]), statistics.median(times["x86-64-v3"])


if __name__ == "__main__":
    sys.exit(main())
