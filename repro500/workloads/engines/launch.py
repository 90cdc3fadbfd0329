"""Launch one repeat on several ranks with an existing distributed launcher.

- ``ddp``: torch's elastic launcher (``python -m torch.distributed.run``, i.e. torchrun), Gloo on
  CPU and NCCL on GPU; multi-node through torchrun's standard rendezvous options.
- ``horovod``: ``horovodrun -np N -H localhost:N --gloo``.

The launching process (the one that owns the run directory and MLflow) follows the workers by
reading rank 0's ``metrics.jsonl`` as it grows, so progress bars and MLflow stay live.  When a
rank dies, torchrun stops the others; the failure is reported naming the rank.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from repro500.capture import seeds as seeding
from repro500.capture.hardware import usable_cpus
from repro500.errors import RunFailed, UsageError
from repro500.rundir import layout
from repro500.workloads.engines import nodes
from repro500.workloads.trainer.train import TrainSpec
from repro500.workloads.workload import Progress

POLL_S = 0.5
COLLECTIVE_TIMEOUT_S = 300


class RankFailed(RunFailed):
    """A rank of a distributed repeat exited with an error: the repeat did not complete (exit 5)."""


def launcher_command(engine: str, nproc: int, job_path: Path, rendezvous: dict[str, Any] | None = None) -> list[str]:
    worker = ["-m", "repro500.workloads.engines.worker", str(job_path)]
    if engine == "ddp":
        rdzv = rendezvous or {}
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
               "--max-restarts=0", "--monitor-interval=1"]
        if rdzv.get("nnodes", 1) > 1:
            # Static rendezvous: global rank = node_rank * nproc + local_rank, so rank 0 (which
            # writes the run directory) is always on node 0. c10d would assign ranks by arrival.
            host, _, port = str(rdzv["endpoint"]).rpartition(":")
            cmd += [f"--nnodes={rdzv['nnodes']}", f"--node-rank={rdzv.get('node_rank', 0)}",
                    f"--master-addr={host}", f"--master-port={port}"]
        else:
            cmd.append("--standalone")
        return cmd + worker
    if engine == "horovod":
        horovodrun = shutil.which("horovodrun")
        if horovodrun is None:
            raise UsageError("engine horovod needs Horovod: build it with scripts/build_horovod.sh (see docs/distributed.md)")
        return [horovodrun, "-np", str(nproc), "-H", f"localhost:{nproc}", "--gloo", sys.executable, *worker]
    raise UsageError(f"unknown engine {engine!r}; choose local, ddp or horovod")


_ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", re.IGNORECASE)
# horovodrun (Gloo) names the first process that failed; its process index is the rank.
_HOROVOD_FIRST = (re.compile(r"after failure of Process (\d+)\."),
                  re.compile(r"The first process to do so was:\s*Process name: (\d+)"))


def failed_rank(stderr_text: str) -> int | None:
    """The rank the launcher's failure report names as the first to fail, if any."""
    # torchrun lists the ranks it stopped under "Failures:" and the one that failed first under
    # "Root Cause"; only the latter is the culprit.
    _, marker, root = stderr_text.rpartition("Root Cause")
    if marker:
        match = _ROOT_CAUSE.search(root)
        return int(match.group(1)) if match else None
    for pattern in _HOROVOD_FIRST:
        match = pattern.search(stderr_text)
        if match:
            return int(match.group(1))
    match = _ROOT_CAUSE.search(stderr_text)
    return int(match.group(1)) if match else None


def failure_detail(output: str, rank: int | None) -> str:
    """What the launcher says about the failed rank's end: torchrun's exitcode / traceback lines
    under "Root Cause", or horovodrun's exit status of that process; "" when it says nothing."""
    _, marker, cause = output.rpartition("Root Cause")
    if marker:
        return next((line.split(":", 1)[1].strip() for line in cause.splitlines()
                     if line.strip().startswith(("traceback", "exitcode"))), "")
    if rank is not None:
        match = re.search(rf"Process {rank} exit with status code (-?\d+)\.", output)
        if match:
            code = int(match.group(1))
            # horovodrun starts ranks through a shell: a signal shows as 128 + its number
            signum = -code if code < 0 else code - 128 if code > 128 else None
            return f"exitcode {code}" + (f" (killed by signal {signum})" if signum else "")
    return ""


def launcher_env(nproc: int) -> dict[str, str]:
    """The ranks' environment: this one, with each of this node's ``nproc`` ranks given an equal
    share of the CPUs this process may use (a SLURM allocation's, not the node's) as its
    ``OMP_NUM_THREADS``, unless the user set one."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", str(max(1, usable_cpus() // nproc)))
    return env


def run_distributed(engine: str, nproc: int, spec: TrainSpec, repeat: int, seeds: seeding.Seeds, out_dir: Path,
                    callbacks: Progress | None = None, rendezvous: dict[str, Any] | None = None,
                    expect_summary: bool = True, varied: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Run one repeat of ``spec`` on ``nproc`` ranks of ``engine`` (this node's); returns rank 0's
    summary.  The plan resolved engine, device and ranks: the workers take them as given."""
    job = {
        "spec": dataclasses.asdict(spec),
        "repeat": repeat,
        "master_seed": seeds.master,
        "seed_repeat": seeds.repeat,
        "seed_varied": list(varied) if varied is not None else None,  # a factorial run's cell
        "out_dir": str(Path(out_dir).resolve()),
        "engine": engine,
        "timeout_s": COLLECTIVE_TIMEOUT_S,
    }
    with tempfile.TemporaryDirectory(prefix="repro500-job-") as tmp:
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(job), encoding="utf-8")
        log_path = Path(tmp) / "launcher.log"
        cmd = launcher_command(engine, nproc, job_path, rendezvous)
        env = launcher_env(nproc)
        with open(log_path, "w+", encoding="utf-8") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            follower = _MetricsFollower(Path(out_dir) / layout.METRICS, callbacks)
            try:
                while proc.poll() is None:
                    follower.poll()
                    time.sleep(POLL_S)
                follower.poll()
            except KeyboardInterrupt:
                _stop(proc)
                raise
            log.seek(0)
            output = log.read()
        multinode = engine == "ddp" and rendezvous is not None and int(rendezvous.get("nnodes", 1)) > 1
        if multinode:
            failure = _node_failure(output, proc.returncode, repeat, Path(out_dir), rendezvous or {})
            if failure is not None:
                raise failure
        elif proc.returncode != 0:
            raise _local_failure(engine, output, proc.returncode, Path(out_dir))
    summary_path = Path(out_dir) / layout.REPEAT_SUMMARY
    if not expect_summary:
        return {}
    if not summary_path.is_file():
        raise RankFailed(f"the {engine} job ended without rank 0 writing {summary_path}")
    return json.loads(summary_path.read_text(encoding="utf-8"))


def _local_failure(engine: str, output: str, returncode: int, out_dir: Path) -> RankFailed:
    log_path = out_dir / layout.LAUNCHER_LOG
    log_path.write_text(output, encoding="utf-8")
    if engine == "ddp":
        culprit = nodes.launcher_report(output, returncode)
        if culprit["rank"] is not None:
            return RankFailed(f"{nodes.describe({**culprit, 'node_rank': 0})}; the other ranks of the {engine} job "
                              f"were stopped; full log: {log_path}")
    rank = failed_rank(output)
    detail = failure_detail(output, rank)
    known = _started_rank(out_dir, rank)
    if known is not None:  # horovodrun names the rank and its exit status; ranks.json the rest
        code = _horovod_status(output, rank)
        signum = -code if code is not None and code < 0 else code - 128 if code is not None and code > 128 else None
        culprit = {"rank": rank, "node_rank": 0, "host": known.get("host"), "local_rank": known.get("local_rank"),
                   "pid": known.get("pid"), "signal": signum, "exitcode": code, "detail": detail}
        return RankFailed(f"{nodes.describe(culprit)} (horovodrun: {detail or f'launcher exit {returncode}'}); the "
                          f"other ranks of the {engine} job were stopped; full log: {log_path}")
    who = f"rank {rank}" if rank is not None else "a rank"
    return RankFailed(f"{who} of the {engine} job failed ({detail or f'launcher exit {returncode}'}); "
                      f"the other ranks were stopped; full log: {log_path}")


def _started_rank(out_dir: Path, rank: int | None) -> dict[str, Any] | None:
    """What rank *rank* reported of itself once started (ranks.json: host, local rank, pid), if it got
    that far: the launcher's report of a horovodrun job names only the rank."""
    path = out_dir / layout.RANKS
    if rank is None or not path.is_file():
        return None
    try:
        ranks = json.loads(path.read_text(encoding="utf-8")).get("ranks") or []
    except (OSError, ValueError):
        return None
    return next((r for r in ranks if isinstance(r, dict) and r.get("rank") == rank), None)


def _horovod_status(output: str, rank: int | None) -> int | None:
    match = re.search(rf"Process {rank} exit with status code (-?\d+)\.", output) if rank is not None else None
    return int(match.group(1)) if match else None


def _node_failure(output: str, returncode: int, repeat: int, out_dir: Path,
                  rendezvous: dict[str, Any]) -> RankFailed | None:
    """A multi-node repeat: tell the other nodes how this node's ranks ended and, if any node
    failed, name the same culprit as they do; node 0 keeps every node's launcher log."""
    link = nodes.link(rendezvous)
    ended = nodes.launcher_report(output, returncode)
    if not link.leader and returncode != 0:
        ended["log_chunks"] = link.send_log(repeat, output)  # the whole log, before the report says so
    link.report(repeat, ended)
    if returncode == 0:
        return None
    reports = link.reports(repeat) or [{**ended, "node_rank": link.node_rank}]
    if link.leader:
        (out_dir / layout.LAUNCHER_LOG).write_text(output, encoding="utf-8")
        for r in reports:
            text = link.read_log(repeat, int(r["node_rank"]), int(r["log_chunks"])) if r.get("log_chunks") else None
            if text is not None:
                (out_dir / layout.node_launcher_log(int(r["node_rank"]))).write_text(text, encoding="utf-8")
        logs = f"launcher logs of every node that reported: {out_dir}/launcher*.log"
    else:
        where = layout.RunDir(link.run_dir).repeat(repeat) if link.run_dir else "its repeat directory"
        logs = f"node 0 keeps every node's launcher log in {where}"
    culprit = nodes.blame(reports)
    missing = sorted(set(range(link.nnodes)) - {int(r["node_rank"]) for r in reports})
    silent = f"; node(s) {', '.join(map(str, missing))} sent no report (stopped or unreachable)" if missing else ""
    if culprit is None:
        return RankFailed(f"a rank of the ddp job failed (launcher exit {returncode}){silent}; {logs}")
    return RankFailed(f"{nodes.describe(culprit)}{silent}; the other ranks were stopped; {logs}")


def _stop(proc: subprocess.Popen) -> None:
    """Ctrl-C: ask the launcher's process group to stop, then insist."""
    for sig, wait_s in ((signal.SIGINT, 20), (signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


class _MetricsFollower:
    """Reads new lines of rank 0's metrics.jsonl and replays them into the trainer callbacks."""

    def __init__(self, path: Path, callbacks: Any) -> None:
        self.path = path
        self.callbacks = callbacks
        self.offset = 0
        self.steps: list[dict[str, Any]] = []
        self.epoch = 0

    def poll(self) -> None:
        if self.callbacks is None or not self.path.is_file():
            return
        with open(self.path, encoding="utf-8") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
        complete, _, _ = chunk.rpartition("\n")
        if not complete:
            return
        self.offset += len((complete + "\n").encode("utf-8"))
        for line in complete.splitlines():
            record = json.loads(line)
            if record.get("kind") == "step":
                if record["epoch"] != self.epoch:
                    self.epoch = record["epoch"]
                    if self.callbacks.on_epoch_start:
                        self.callbacks.on_epoch_start(self.epoch, None)  # step count unknown here
                self.steps.append(record)
                if self.callbacks.on_step:
                    self.callbacks.on_step(record)
            elif record.get("kind") == "epoch":
                if self.callbacks.on_epoch_end:
                    self.callbacks.on_epoch_end(record, self.steps)
                self.steps = []
