"""Capture speed: ``repro500 capture`` vs ``python -m torch.utils.collect_env``.

Targets: median wall of ``repro500 capture`` (no data) <= 0.1 x the median wall
of torch's own collect_env, while capturing a superset (collect_env's compiler, CMake and
nvcc versions too, plus code, all packages, seeds, data, NUMA/cgroup/NIC topology); ``repro500 --help`` < 0.3 s.  The commands run interleaved in
one loop so that machine load affects both alike.  Run: ``python bench/capture.py [N]``.
Prints MISSED with the figure when a target is missed, and then exits 1.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CAPTURE_TARGET = 0.1
HELP_TARGET_S = 0.3


def wall_s(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def verdict(ok: bool, figure: str) -> str:
    return f"{'met' if ok else 'MISSED'} ({figure})"


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    out_dir = Path(tempfile.mkdtemp(prefix="repro500-bench-"))
    commands = {
        "repro500 capture": [str(BIN / "repro500"), "capture", "-o", str(out_dir / "m.json")],
        "torch collect_env": [sys.executable, "-W", "ignore", "-m", "torch.utils.collect_env"],
        "repro500 --help": [str(BIN / "repro500"), "--help"],
    }
    for cmd in commands.values():  # warm the page cache once; not timed
        wall_s(cmd, ROOT)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(n):
        for name, cmd in commands.items():
            times[name].append(wall_s(cmd, ROOT))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, ts in times.items():
        print(f"{name:18s} median {med[name]:.3f} s  (min {min(ts):.3f}, max {max(ts):.3f}, n={n})")
    ratio = med["repro500 capture"] / med["torch collect_env"]
    print(f"capture / collect_env = {ratio:.3f}  target <= {CAPTURE_TARGET}: "
          + verdict(ratio <= CAPTURE_TARGET, f"{ratio:.3f}x"))
    help_ok = med["repro500 --help"] < HELP_TARGET_S
    print(f"repro500 --help = {med['repro500 --help']:.3f} s  target < {HELP_TARGET_S} s: "
          + verdict(help_ok, f"{med['repro500 --help'] / HELP_TARGET_S:.2f}x of the limit"))
    return 0 if ratio <= CAPTURE_TARGET and help_ok else 1


if __name__ == "__main__":
    sys.exit(main())
