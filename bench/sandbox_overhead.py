"""The cost of the sandbox: ``reproduce --run-code`` (bubblewrap) vs ``reproduce --run-code --no-sandbox``.

A command publication whose script burns CPU for ``--seconds`` (default 10) a repeat is made once;
then it is reproduced with and without the sandbox, interleaved (boxed, open, boxed, ...) so
machine noise hits both alike, each timed from outside over the whole reproduction (opening and
checking the publication, the rerun, the verdict).  Target: sandboxed <= 1.02 x unsandboxed;
exits 1 when missed (and 4 when bwrap cannot sandbox here).  Beside it, what bubblewrap adds to one
start (``python -c pass`` as it is and in the sandbox, median of 21): the sandbox's whole fixed
cost, since a reproduction starts it once; on a shared machine the ratio's noise is larger.

    python bench/sandbox_overhead.py [--seconds 10] [--repeats 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from repro500 import sandbox

TARGET = 1.02  # the sandbox adds at most 2 % to a reproduction's wall time
SCRIPT = """
import os, sys, time
end = time.process_time() + float(sys.argv[1])
x = 0
while time.process_time() < end:
    x += 1
print(f"Acc@1 {90 + int(os.environ.get('REPRO500_SEED', '0')) % 7}")
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "repro500.cli", *args], cwd=cwd, capture_output=True, text=True,
                          check=False)


def publish(work: Path, seconds: float, repeats: int) -> Path:
    lab = work / "lab"
    lab.mkdir()
    (lab / "script.py").write_text(SCRIPT)
    recipe = {"schema": "repro500/recipe/v1", "name": "burn",
              "fixed": {"command": [sys.executable, "script.py", str(seconds)]},
              "metrics": {"accuracy": {"regex": "Acc@1 ([0-9]+)"}},
              "acceptance": {"accuracy": {"target": 90, "direction": "higher", "tolerance": 10}},
              "repeats": repeats, "seed": 3}
    (lab / "exp.yaml").write_text(yaml.safe_dump(recipe))
    for args in (("run", "exp.yaml", "--no-tracking", "--run-id", "orig"),
                 ("publish", "runs/orig", "--out", str(work / "pub"))):
        done = _cli(*args, cwd=lab)
        if done.returncode not in (0, 1, 3):
            raise SystemExit(f"repro500 {args[0]} failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    return work / "pub"


def reproduce(work: Path, pub: Path, out: str, *flags: str) -> float:
    target = work / out
    shutil.rmtree(target, ignore_errors=True)
    start = time.perf_counter()
    done = _cli("reproduce", str(pub), "--out", str(target), "--run-code", *flags, cwd=work)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1, 3):
        raise SystemExit(f"repro500 reproduce {' '.join(flags)} failed (exit {done.returncode}): "
                         f"{done.stderr.strip()[-400:]}")
    return elapsed


def start_cost(n: int) -> tuple[float, float]:
    """Median seconds to start and end ``python -c pass`` as it is and inside the rerun's sandbox (what
    bubblewrap adds once a reproduction: its namespaces and mounts), interleaved."""
    import os
    import statistics

    work = Path(tempfile.mkdtemp(prefix="repro500-bench-bwrap-"))
    try:
        prefix = sandbox.wrap(sandbox.Grants(write=(work,)), os.environ, cwd=work)
        plain, boxed = [], []
        for _ in range(n):
            for argv, into in (([sys.executable, "-c", "pass"], plain), ([*prefix, sys.executable, "-c", "pass"], boxed)):
                start = time.perf_counter()
                subprocess.run(argv, check=True, capture_output=True)
                into.append(time.perf_counter() - start)
        return statistics.median(plain), statistics.median(boxed)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    why = sandbox.unavailable()
    if why is not None:
        print(why, file=sys.stderr)
        return 4
    boxed, open_ = [], []
    with tempfile.TemporaryDirectory(prefix="repro500-bench-sandbox-") as tmp:
        work = Path(tmp)
        pub = publish(work, args.seconds, args.repeats)
        reproduce(work, pub, "warm", "--no-sandbox")  # first imports and page cache, for neither side
        for r in range(args.rounds):
            # the order alternates, so neither side always runs on a warmer machine
            pair = [("boxed", ()), ("open", ("--no-sandbox",))]
            for name, flags in pair if r % 2 == 0 else reversed(pair):
                (boxed if name == "boxed" else open_).append(reproduce(work, pub, f"{name}-{r}", *flags))
    plain, inside = start_cost(21)
    ratio = sum(boxed) / sum(open_)
    n = args.rounds * args.repeats
    print(f"reproduce --run-code, {args.rounds} round(s) of {args.repeats} repeats x {args.seconds:g} s ({n} repeats "
          "a side)")
    print(f"  sandboxed (bubblewrap): {sum(boxed):.2f} s   ({', '.join(f'{t:.2f}' for t in boxed)})")
    print(f"  --no-sandbox:           {sum(open_):.2f} s   ({', '.join(f'{t:.2f}' for t in open_)})")
    print(f"  start of a Python, median of 21: {plain * 1000:.1f} ms as it is, {inside * 1000:.1f} ms in the sandbox "
          f"(+{(inside - plain) * 1000:.1f} ms, {(inside - plain) / (sum(open_) / args.rounds) * 100:.3f} % of a "
          "reproduction)")
    print(f"  ratio {ratio:.4f}x (+{(sum(boxed) - sum(open_)) / args.rounds:.2f} s a reproduction); "
          f"target <= {TARGET}x: {'PASS' if ratio <= TARGET else 'MISS'}")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
