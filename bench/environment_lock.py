"""What recording the environment that ran, and its lock, cost; and what a rebuild costs.

    python bench/environment_lock.py [--rounds 5] [--quickstart-s 60] [--rebuild PUB]

1. ``lock``: building ``environment.lock.json`` + ``requirements.lock.txt`` from the manifest of
   this interpreter's environment (all its distributions), and writing them: the whole addition
   to a run (it happens on the main thread between repeats).  Reported against a quickstart run's
   wall time (``--quickstart-s``, default 60 s: ``make demo``'s run on 2 cores).
2. ``hook``: a wrapped command's Python start-up with and without repro500's interpreter record
   (``python -c pass``, the first process of an interpreter: the one that pays).
3. ``--rebuild PUB``: ``reproduce PUB --run-code --env venv`` twice into one OUT, the second time
   with the completion marker removed (a full rebuild from a warm installer cache), and a third
   time as it is (the finished venv reused).
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

from repro500.capture import env as env_facet
from repro500.capture import lock
from repro500.rundir import atomic
from repro500.workloads.command.observe import CHILD_SITE


def bench_lock(rounds: int) -> float:
    manifest = {"digest": {"value": "x"}, "facets": {"environment": env_facet.environment()}}
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            start = time.perf_counter()
            doc = lock.build(manifest, source_root=tmp)
            atomic.write_json(Path(tmp) / "environment.lock.json", doc)
            atomic.write_text(Path(tmp) / "requirements.lock.txt", lock.requirements(doc))
            times.append(time.perf_counter() - start)
    print(f"lock: {len(manifest['facets']['environment']['distributions'])} distributions, "
          f"median {statistics.median(times) * 1000:.1f} ms over {rounds} rounds")
    return statistics.median(times)


def bench_hook(rounds: int) -> None:
    def once(with_hook: bool) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, PYTHONPATH=str(CHILD_SITE))
            if with_hook:
                env["REPRO500_INTERPRETER_DIR"] = tmp
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
            return time.perf_counter() - start

    plain = statistics.median(once(False) for _ in range(rounds))
    hooked = statistics.median(once(True) for _ in range(rounds))
    print(f"hook: python -c pass {plain * 1000:.1f} ms without the interpreter record, {hooked * 1000:.1f} ms with "
          f"(+{(hooked - plain) * 1000:.1f} ms, once per interpreter per repeat)")


def bench_rebuild(pub: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rep"
        for label in ("first (cache as it is)", "again, marker removed (warm cache)", "again, finished venv reused"):
            if label.startswith("again, marker"):
                (out / "env" / ".repro500-built").unlink()
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "repro500.cli", "reproduce", pub, "--run-code", "--env", "venv",
                                   "--out", str(out)], capture_output=True, text=True, check=False)
            wall = time.perf_counter() - start
            print(f"rebuild {label}: exit {done.returncode}, reproduce wall {wall:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quickstart-s", type=float, default=60.0)
    parser.add_argument("--rebuild", metavar="PUB")
    args = parser.parse_args()
    cost = bench_lock(args.rounds)
    print(f"lock share of a {args.quickstart_s:.0f} s quickstart run: {cost / args.quickstart_s * 100:.3f}% (target <= 1%)")
    bench_hook(args.rounds)
    if args.rebuild:
        bench_rebuild(args.rebuild)


if __name__ == "__main__":
    main()
