"""Repeats side by side: ``repro500 run --launcher local --parallel 2`` vs the same run in turn.

A one-thread command burns ``--seconds`` of CPU per repeat and prints a score that depends on
its seed only.  The same ``--repeats`` run serially and with ``--launcher local --parallel 2``
(each repeat a submitit task on its own core), interleaved round by round (serial, parallel,
serial, ...) so machine noise hits both alike, both timed from outside, with everything a run
does (capture, chain, seal, verify; MLflow off in both).  Target: parallel <= 0.6 x serial wall
time, and the same verdict and per-repeat scores; exits 1 when either is missed.

    python bench/parallel_repeats.py [--seconds 8] [--repeats 4] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 0.6  # two repeats at once on two cores: the ideal is 0.5, the rest is the tasks' start
SCRIPT = """
import os, random, sys, time
rng = random.Random(int(os.environ["REPRO500_SEED"]))
end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    rng.random()
rng = random.Random(int(os.environ["REPRO500_SEED"]))
print(f"score {sum(rng.random() for _ in range(1000)) / 1000:.9f}")
"""


def timed_run(work: Path, run_id: str, seconds: float, repeats: int, *options: str) -> float:
    cmd = [sys.executable, "-m", "repro500.cli", "run", "--command", "--no-tracking", "-n", str(repeats),
           "--run-id", run_id, *options, "--metric", "score=regex:score ([0-9.]+)", "--accept", "score>=0.4",
           "--", sys.executable, "script.py", str(seconds)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1, 3):  # a verdict of any kind: the run finished
        raise SystemExit(f"repro500 run failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    return elapsed


def outcome(run: Path, repeats: int) -> tuple[str, list[float]]:
    verdict = json.loads((run / "verdict.json").read_text())["status"]
    scores = [json.loads((run / "repeats" / str(k) / "summary.json").read_text())["metrics"]["score"]
              for k in range(repeats)]
    return verdict, scores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    serial, fanned, same = [], [], True
    with tempfile.TemporaryDirectory(prefix="repro500-bench-parallel-") as tmp:
        work = Path(tmp)
        (work / "script.py").write_text(SCRIPT)
        for r in range(args.rounds):
            serial.append(timed_run(work, f"serial-{r}", args.seconds, args.repeats))
            fanned.append(timed_run(work, f"parallel-{r}", args.seconds, args.repeats,
                                    "--launcher", "local", "--parallel", "2"))
            a, b = outcome(work / "runs" / f"serial-{r}", args.repeats), outcome(work / "runs" / f"parallel-{r}", args.repeats)
            same &= a == b
            print(f"round {r}: serial {serial[-1]:.2f} s, parallel {fanned[-1]:.2f} s; verdicts {a[0]} / {b[0]}, "
                  f"scores {'equal' if a[1] == b[1] else 'DIFFERENT'}")
    ratio = statistics.median(fanned) / statistics.median(serial)
    met = ratio <= TARGET and same
    print(f"{args.repeats} repeats x {args.seconds:g} s of one-thread CPU, {args.rounds} round(s): "
          f"parallel/serial wall time {ratio:.3f} (target <= {TARGET}); same verdict and scores: {same}")
    print("PASS" if met else "MISS")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
