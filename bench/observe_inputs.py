"""What watching a command's reads costs: the audit hook on a script that reads many small files.

The script opens and reads ``--files`` small files (default 10,000) from a
directory outside its own, as a data loader over an image folder does.  It runs by hand and under
repro500's hook (the environment a repeat gets: ``childsite`` first on PYTHONPATH), interleaved,
``--rounds`` times each; the added time per file opened is the hook's cost inside the repeat.
After the repeat, repro500 reads the hook's log, selects the inputs and groups them (one DVC
directory digest here), then hashes them beside the next repeat: both are timed too, the hashing
once with an empty digest cache and once with a warm one.

Budget (docs/command.md): the hook adds at most 10 us per distinct file opened (0.1 s for 10,000).

    python bench/observe_inputs.py [--files 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGET_US_PER_FILE = 10.0
SCRIPT = """
import os, sys
root = sys.argv[1]
total = 0
for name in sorted(os.listdir(root)):
    with open(os.path.join(root, name), "rb") as fh:
        total += len(fh.read())
print(total)
"""


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    from repro500.capture import inputs
    from repro500.workloads.command.observe import Watch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="repro500-bench-observe-") as tmp:
        work, data = Path(tmp) / "exp", Path(tmp) / "images"
        work.mkdir()
        data.mkdir()
        (work / "read_all.py").write_text(SCRIPT)
        for i in range(args.files):
            (data / f"{i:06d}.bin").write_bytes(os.urandom(512))
        cmd = [sys.executable, "read_all.py", str(data)]
        plain = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        timed(cmd, plain, work)  # warm the page cache for both
        hand, hooked, results = [], [], []
        for _ in range(args.rounds):
            hand.append(timed(cmd, plain, work))
            watch = Watch("auto")
            hooked.append(timed(cmd, watch.env(plain), work))
            start = time.perf_counter()
            results.append((watch.result(exclude=[work]), time.perf_counter() - start))
        seen, select_s = results[-1]
        cache = Path(tmp) / "cache"
        os.environ["REPRO500_CACHE_DIR"] = str(cache)  # an empty digest cache: the first repeat's cost
        start = time.perf_counter()
        entries, _ = inputs.digest(seen["paths"])
        cold_s = time.perf_counter() - start
        start = time.perf_counter()
        inputs.digest(seen["paths"])
        warm_s = time.perf_counter() - start
    by_hand, under_hook = statistics.median(hand), statistics.median(hooked)
    per_file_us = (under_hook - by_hand) / args.files * 1e6
    verdict = "OK" if per_file_us <= BUDGET_US_PER_FILE else "MISSED"
    print(f"script reading {args.files} files of 512 B: by hand {by_hand:.3f} s, under the hook {under_hook:.3f} s "
          f"(medians of {args.rounds}); ratio {under_hook / by_hand:.3f}")
    print(f"  hook cost per file opened = {per_file_us:.2f} us (budget <= {BUDGET_US_PER_FILE:g} us) {verdict}")
    print(f"  after the repeat: reading the log and selecting the inputs {select_s:.3f} s -> "
          f"{len(seen['paths'])} entry ({entries[0]['kind'] if entries else '-'}, {entries[0].get('nfiles') if entries else 0} files)")
    print(f"  hashing them beside the next repeat: {cold_s:.3f} s with an empty digest cache, {warm_s:.3f} s warm")
    return 0 if per_file_us <= BUDGET_US_PER_FILE else 1


if __name__ == "__main__":
    sys.exit(main())
