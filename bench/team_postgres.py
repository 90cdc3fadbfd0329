"""A team's tracking server under load: four ``repro500 run``s at once against ``mlflow server`` on
a real PostgreSQL, set up with docs/team.md's own commands (tests/helpers/teamserver.py).

Targets: no run lost (every run finishes, with its parent and repeat runs FINISHED on
the server), and the server's share of each run's wall time <= 2 %.

How the time in MLflow is measured: each ``repro500 run`` is started through a small launcher that
wraps every public method of :class:`repro500.tracking.client.Tracker` (the one class through which a run
talks to MLflow: opening the store, creating runs, logging params, metrics, tags and artifacts,
ending runs) and ``repro500.tracking.store.check_usable`` (the pre-flight check) with a
``time.perf_counter`` clock, counting only the outermost call (``end_repeat`` calls ``set_tags``).
That sum is the run's time in MLflow calls; its wall time is timed from outside, process start to
exit.  MLflow lives in a process of its own (repro500/tracking/process.py): there each call is one
round trip from the run, timed the same way per method, holding the server's time and the client's
own work, not the 1-2 s of importing MLflow (done before the first call).  The runner makes these
calls from a background thread (repro500/runner/track.py), so most of them overlap training; the
part the run waited for (``check_usable``, and ``Tracking.close`` / ``wait_started`` draining the
queue) is printed too as "blocking".

    python bench/team_postgres.py [--recipe quickstart|tiny] [--runs 4]

Measured on the 2-core development machine, shared with other jobs.  Stop 25 (MLflow on a thread,
load average 8-12): quickstart PASS, 6.1-7.4 s in MLflow calls per run of 2,830 s (0.22-0.26 %;
the wall time was stretched by the load, so this share flatters); tiny MISS, 3.1-5.0 s of 51-54 s
(5.8-9.5 %).  Stop 27 (MLflow in its own process, metrics and tags in one request, artifacts
uploaded four at once; load average 3.5 from another training job): tiny MISS, 2.1-2.4 s of
37.6-39.1 s (5.5-6.5 %), of which the run waited for 0.5-0.7 s.  A single request to this server
took 80-120 ms under that load (create_run 92 ms, a 10-metric log_batch 116 ms, set_terminated
308 ms; single client), so a run's ~50 requests are what the tiny recipe's
share is made of; they are fixed per run and per repeat, so the share falls as runs get longer.
Stop 28, on an otherwise idle machine: quickstart PASS, 8.6-10.3 s of 737-849 s (1.01-1.40 %; four
runs of two torch threads each on two cores stretch the wall time, so this share flatters too;
the run waited 0.4-1.8 s, and MLflow's import in the niced logging process took 33-36 s under that
load, hidden by training); tiny MISS, 1.9-2.2 s of 25.3-26.8 s (7.5-8.3 %), and the run waited
2.1-2.9 s: a tiny run's repeats last a second or two, so the logging process, at nice 10 beside
four saturating runs, still has MLflow's import (4 s) and the repeats' records in hand when the
run ends.
On a 2-core AMD EPYC, otherwise idle: tiny MISS, 2.2-2.6 s of 26.4-27.8 s (8.0-9.5 %), 25 calls per
run at about 100 ms each: end_repeat 0.86 s (three repeats, each one metrics-and-tags batch, its
artifact uploads and set_terminated), log_epoch 0.48 s, start_repeat 0.33 s, start_parent 0.15 s,
end_parent 0.13 s, set_tags 0.12 s, the client's connect 0.12 s, the parent's artifacts 0.11 s;
the run waited 3.1-3.5 s at its end, MLflow's import in the logging process taking 3.8-5.2 s.
Each call is already one request (or four uploads at once); what is left is the server's latency
while four runs keep both cores busy, so the tiny recipe's share stays near 8 % and falls as runs
get longer (the quickstart's is 1-1.4 %).
Again a week later, same machine, idle: tiny MISS, 2.8-3.2 s of 32.4-34.1 s (8.3-9.9 %), end_repeat
1.26 s, log_epoch 0.50 s, start_repeat 0.32 s; the run waited 4.1-5.4 s at its end.  What the
logging processes have to do is CPU work on the two cores the four runs, the server and PostgreSQL
already fill: MLflow's client import alone is 1.4 s of CPU per run (1.05 s of it ``import mlflow``,
which loads pandas for ``mlflow.data``), about 5.6 s of the two cores' time for four runs; at nice 10
that work waits for a free core, which comes when the runs' training ends, so it lands at the end of
each run.  Unniced, the same work competes with the training instead: no less of it, and the
quickstart measured 1.016 that way, within nice 10's 0.987-1.019 (docs/run.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers import teamserver  # noqa: E402
from helpers.runs import write_recipe  # noqa: E402

TARGET_SHARE = 0.02

LAUNCHER = r"""
import atexit, functools, json, os, sys, threading, time
from repro500.tracking import store as mlflow_store
from repro500.tracking import client as tracking
from repro500.tracking import process as tracking_process
from repro500.runner import track

totals = {"mlflow_s": 0.0, "calls": 0, "blocking_s": 0.0, "import_s": 0.0, "by_call": {}}
local, lock = threading.local(), threading.Lock()

def timed(fn, key):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        depth = getattr(local, key, 0)
        setattr(local, key, depth + 1)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            setattr(local, key, depth)
            if depth == 0:
                with lock:
                    totals[key] += time.perf_counter() - start
                    totals["calls"] += key == "mlflow_s"
                    if key == "mlflow_s":
                        totals["by_call"][fn.__name__] = totals["by_call"].get(fn.__name__, 0.0) + time.perf_counter() - start
    return wrapper

for name, fn in list(vars(tracking.Tracker).items()):  # REPRO500_MLFLOW_PROCESS=0: MLflow in this process
    if callable(fn) and (not name.startswith("_") or name == "__init__"):
        setattr(tracking.Tracker, name, timed(fn, "mlflow_s"))
# the default: every Tracker call is a round trip to the MLflow process, timed here per method
call = tracking_process.ProcessTracker._call
named = {}
tracking_process.ProcessTracker.wait_ready = timed(tracking_process.ProcessTracker.wait_ready, "import_s")
def remote(self, name, *args, **kwargs):
    self.wait_ready()  # MLflow's import in that process: not the server's time
    if name not in named:
        named[name] = timed(functools.wraps(getattr(tracking.Tracker, "__init__" if name == "__connect__" else name, call))(
            lambda this, *a, **k: call(this, name, *a, **k)), "mlflow_s")
    return named[name](self, *args, **kwargs)
tracking_process.ProcessTracker._call = remote
# the pre-flight check is both: a call to the server, and one the run waits for
mlflow_store.check_usable = timed(timed(mlflow_store.check_usable, "mlflow_s"), "blocking_s")
for name in ("close", "wait_started"):
    setattr(track.Tracking, name, timed(getattr(track.Tracking, name), "blocking_s"))
atexit.register(lambda: open(os.environ["BENCH_TIMINGS"], "w").write(json.dumps(totals)))
sys.argv = ["repro500", *sys.argv[1:]]
from repro500.cli import main
main()
"""


def _recipe(work: Path, name: str) -> Path:
    if name == "tiny":
        return write_recipe(work / "tiny.yaml")
    data = work / "data"
    for split, samples in (("train", 2048), ("eval", 512)):  # as `make demo` generates them
        extra = ["--split", "eval"] if split == "eval" else []
        subprocess.run([sys.executable, "-m", "repro500.cli", "data", "generate", "classification", "--out",
                        str(data / f"quickstart-{split}.h5"), "--samples", str(samples), "--seed", "500",
                        "--noise", "0.04", *extra], check=True, capture_output=True, cwd=work)
    text = (ROOT / "experiments" / "quickstart.yaml").read_text().replace("path: data/", f"path: {data}/")
    recipe = work / "quickstart.yaml"
    recipe.write_text(text)
    return recipe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=("quickstart", "tiny"), default="quickstart")
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args(argv)
    reason = teamserver.missing()
    if reason:
        print(f"MISS: cannot start PostgreSQL here: {reason}")
        return 1
    with tempfile.TemporaryDirectory(prefix="repro500-bench-team-") as tmp:
        work = Path(tmp)
        recipe = _recipe(work, args.recipe)
        with teamserver.team_server(work / "team") as server:
            env = dict(os.environ, MLFLOW_TRACKING_URI=server.uri, MLFLOW_DISABLE_TELEMETRY="true",
                       DO_NOT_TRACK="1", DVC_NO_ANALYTICS="1")
            procs = []
            for i in range(args.runs):
                machine = work / f"machine-{i}"
                machine.mkdir()
                procs.append((machine, time.perf_counter(), subprocess.Popen(
                    [sys.executable, "-c", LAUNCHER, "run", str(recipe)], cwd=machine,
                    env=dict(env, BENCH_TIMINGS=str(machine / "timings.json")),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
            rows = []
            for machine, started, proc in procs:
                _, err = proc.communicate()
                wall = time.perf_counter() - started
                rows.append(_row(machine, wall, proc.returncode, err, server.uri))
    print(f"{args.runs} concurrent `repro500 run {args.recipe}` against mlflow server on PostgreSQL "
          f"(MLflow time: Tracker calls, timed in each run)")
    print(f"{'run':>4} {'exit':>4} {'wall s':>8} {'MLflow s':>9} {'calls':>6} {'share':>7} {'blocking s':>11} "
          f"{'import s':>9}  landed")
    for i, row in enumerate(rows):
        print(f"{i:>4} {row['exit']:>4} {row['wall_s']:>8.1f} {row['mlflow_s']:>9.2f} {row['calls']:>6} "
              f"{row['share']:>7.2%} {row['blocking_s']:>11.2f} {row['import_s']:>9.2f}  {row['landed']}")
    by_call: dict[str, float] = {}
    for row in rows:
        for name, seconds in row["by_call"].items():
            by_call[name] = by_call.get(name, 0.0) + seconds / len(rows)
    print("MLflow time per run, by call: " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in
                                                       sorted(by_call.items(), key=lambda kv: -kv[1])))
    lost = [i for i, row in enumerate(rows) if row["landed"] != "yes"]
    worst = max(row["share"] for row in rows)
    ok = not lost and worst <= TARGET_SHARE
    print(f"{'PASS' if ok else 'MISS'}: {len(rows) - len(lost)} of {len(rows)} runs landed; largest MLflow share "
          f"{worst:.2%} of a run's wall time (target <= {TARGET_SHARE:.0%})")
    return 0 if ok else 1


def _row(machine: Path, wall: float, code: int, err: str, uri: str) -> dict:
    from mlflow.tracking import MlflowClient

    timings = json.loads((machine / "timings.json").read_text()) if (machine / "timings.json").is_file() else {}
    landed = "no run directory"
    runs = sorted((machine / "runs").glob("*/run.json"))
    if code not in (0, 1, 3):
        landed = f"exit {code}: {err.strip().splitlines()[-1] if err.strip() else ''}"
    elif runs:
        meta = json.loads(runs[0].read_text()).get("mlflow") or {}
        client = MlflowClient(uri)
        ids = [meta.get("parent_run_id"), *(meta.get("repeat_run_ids") or {}).values()]
        states = [client.get_run(i).info.status for i in ids if i]
        landed = "yes" if len(states) == len(ids) > 1 and set(states) == {"FINISHED"} else f"MLflow: {states}"
    mlflow_s = float(timings.get("mlflow_s", float("nan")))
    return {"exit": code, "wall_s": wall, "mlflow_s": mlflow_s, "calls": int(timings.get("calls", 0)),
            "share": mlflow_s / wall, "by_call": timings.get("by_call", {}),
            "blocking_s": float(timings.get("blocking_s", float("nan"))),
            "import_s": float(timings.get("import_s", float("nan"))), "landed": landed}


if __name__ == "__main__":
    sys.exit(main())
