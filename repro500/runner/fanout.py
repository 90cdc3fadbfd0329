"""A run's repeats side by side: tasks of submitit's local executor, each on its own share of the
node, or the tasks of one SLURM job array, each on whatever node SLURM gives it.

The head process (``repro500 run``) plans, captures, chains, logs to MLflow and verifies, as
in a serial run; only the repeats move into tasks.  A task rebuilds the run's plan from the run
directory as ``--resume`` does (the recipe and run.json, so the same seeds and design), pins
itself to its slot (a disjoint CPU set, and GPU ``i`` where the node has a GPU per slot), and
runs :func:`repro500.runner.repeat.run_one`, the serial loop's own function, into the same run
directory.  What it returns is the repeat's summary or the error it met; the head links and
logs each one as it lands, in whatever order they finish.

submitit rather than a pool of our own: one task function and one head loop for both launchers
(only :class:`Local` and :class:`Slurm` differ), and each task in a fresh interpreter (no state
shared with the head, as on a cluster node).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from repro500 import redact
from repro500.capture.data import digest_paths
from repro500.errors import InvalidInput, ReproError, UsageError
from repro500.recipe import load as recipes
from repro500.rundir import layout
from repro500.runner import multinode
from repro500.runner.plan import Plan, RunOptions, recorded_plan, slurm_pairs, slurm_resources
from repro500.runner.repeat import run_one
from repro500.statuses import REPEAT_FAILED
from repro500.workloads.command import launchenv
from repro500.workloads.engines import nodes
from repro500.workloads.workload import Progress

# Thread pools that size themselves from the machine, not from the CPU set: each gets the slot's
# CPU count (thread counts change float results, so the count is recorded with the repeat).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# How long a task that was asked to stop may take before its controller is killed: a wrapped
# command gets its own grace (workloads/command/repeat.py GRACE_S) to end first.
STOP_GRACE_S = 20.0
_TASK_DAYS = 30  # submitit's local executor kills a task after timeout_min (default: 2 minutes)
# What the head writes into run.json's launcher record at each fan-out and hands each SLURM task: a
# task whose node reads another value reads another copy of the run directory, not the head's.
SUBMISSION = "submission"
# run.json's launcher record of a head that left (--detach): the tasks' folder, beside the run, and
# each repeat's SLURM task, for the resume to collect rather than submit again.
DETACHED = "detached"


@dataclass(frozen=True)
class Slot:
    """One share of the node: the CPUs a task runs on and the GPU it sees (None: no GPU); a
    repeat of several ranks (``mutable.nproc``) sees its GPUs in ``gpus``, one per rank."""

    index: int
    cpus: tuple[int, ...]
    gpu: int | None
    # per rank: None: one per CPU; a SLURM task: the CPUs SLURM gave it (its CPU set may be wider)
    threads: int | None = None
    ranks: int = 1
    gpus: tuple[int, ...] = ()

    @property
    def where(self) -> str:
        cpus = f"cpu{'s' if len(self.cpus) > 1 else ''} {','.join(map(str, self.cpus))}"
        ranks = f", {self.ranks} ranks" if self.ranks > 1 else ""
        if self.gpus:
            return cpus + ranks + f", GPUs {','.join(map(str, self.gpus))}"
        return cpus + ranks + (f", GPU {self.gpu}" if self.gpu is not None else "")


@dataclass(frozen=True)
class Launch:
    """How a run's repeats fan out, decided before anything is written."""

    launcher: str
    parallel: int
    slots: tuple[Slot, ...]  # local: this node's shares; slurm: none (SLURM places each task)
    resources: dict[str, Any] = field(default_factory=dict)  # slurm: a task's (plan.slurm_resources)
    ranks: int = 1  # the processes of one repeat on each of its nodes (mutable.nproc): a CPU each
    nodes: int = 1  # slurm: the nodes of one repeat's task (--nnodes), its ranks `ranks` on each

    def record(self) -> dict[str, Any]:
        """run.json's launcher record of this fan-out, marked with a value of its own (SUBMISSION)."""
        recorded = {"kind": self.launcher, "parallel": self.parallel, "slots": [asdict(s) for s in self.slots],
                    "ranks": self.ranks, "nodes": self.nodes, SUBMISSION: secrets.token_hex(8)}
        return {**recorded, "slurm": dict(self.resources)} if self.launcher == "slurm" else recorded


_ARRAY_TASK = re.compile(r"\d+_\d+")


def detached_jobs(record: dict[str, Any]) -> tuple[str, dict[int, str]] | None:
    """The task folder and each repeat's array task that run.json's launcher *record* says a head
    left to SLURM (:data:`DETACHED`) and no head has collected yet; None when there are none.  Read
    in one place and checked: the folder is a name under ``runs/.tasks``, never a path."""
    left = record.get(DETACHED)
    if not left:
        return None
    folder, jobs = (left.get("folder"), left.get("jobs")) if isinstance(left, dict) else (None, None)
    if not isinstance(folder, str) or Path(folder).name != folder or folder in ("", ".", ".."):
        raise InvalidInput(f"run.json's launcher.{DETACHED} names no task folder ({folder!r}): the tasks a head left "
                           "to SLURM cannot be collected; remove the record to rerun those repeats")
    if not isinstance(jobs, dict) or not all(str(k).isdigit() and _ARRAY_TASK.fullmatch(str(v))
                                             for k, v in jobs.items()):
        raise InvalidInput(f"run.json's launcher.{DETACHED}.jobs is not a map of repeats to SLURM array tasks: the "
                           "tasks a head left to SLURM cannot be collected")
    return (folder, {int(k): str(v) for k, v in jobs.items()}) if jobs else None


def collecting(options: RunOptions, record: dict[str, Any]) -> RunOptions:
    """The options of a resume that collects the repeats a detached head left to SLURM (run.json's
    launcher *record*): the same launcher, and unless given, the same parallelism and resources."""
    left = detached_jobs(record)
    if left is None:
        return options
    jobs = left[1]
    if options.launcher not in (None, "slurm"):
        raise UsageError(f"the run's repeats {', '.join(map(str, sorted(jobs)))} are SLURM's tasks (job array "
                         f"{', '.join(arrays(jobs.values()))}), submitted by a head that left; resume it with --launcher slurm (or no "
                         "--launcher) to collect them")
    pairs = tuple(f"{key}={value}" for key, value in (record.get("slurm") or {}).items())
    return replace(options, launcher="slurm", parallel=options.parallel or record.get("parallel"),
                               slurm=options.slurm or pairs)


def _gpu_count() -> int:
    from repro500.capture.gpus import gpu_info

    return int(gpu_info().get("count") or 0)


def prepare(options: RunOptions, plan: Plan, todo: int) -> Launch | None:
    """How the repeats fan out: ``--launcher local``'s slots on this node, or ``--launcher slurm``'s
    array and task resources, the recipe's launcher section under the options (None: in turn)."""
    if options.launcher is None:  # check_launcher has refused any other launcher
        return None
    # the recipe's launcher section under the command line's choices (a later --slurm pair wins)
    section = plan.recipe.launcher
    wanted = options.parallel or section.get("parallel")
    if options.until_decided and options.launcher == "slurm" and not wanted:
        raise UsageError("--until-decided --launcher slurm needs --parallel B: it submits B repeats at a time and "
                         "looks at the verdict after each batch")
    ranks = max(1, int(plan.nproc))  # a repeat of several ranks: one task, its ranks on its share
    if options.launcher == "slurm":  # every repeat at once unless --parallel says fewer: SLURM queues the rest
        pairs = [f"{key}={value}" for key, value in (section.get("slurm") or {}).items()] + list(options.slurm)
        resources = slurm_resources(pairs)
        if ranks > 1 and "cpus" not in slurm_pairs(pairs):  # a CPU per rank unless the user sized the task
            resources["cpus"] = ranks
        return Launch("slurm", min(wanted or todo, max(todo, 1)), (), resources, ranks, max(1, plan.nnodes))
    cpus = sorted(os.sched_getaffinity(0))
    gpus = _gpu_count()
    parallel = wanted or max(1, min(todo, (gpus or len(cpus)) // ranks))
    per = "repeat" if ranks == 1 else f"rank ({ranks} ranks a repeat)"
    if parallel * ranks > len(cpus):
        raise UsageError(f"--parallel {parallel} needs a CPU core per {per}, but this process may use {len(cpus)}; "
                         f"give --parallel {max(1, len(cpus) // ranks)} or fewer")
    if plan.device == "cuda" and gpus < parallel * ranks:
        raise UsageError(f"--parallel {parallel} needs a GPU per {per} of a device cuda run, but this node has "
                         f"{gpus}; give --parallel {max(1, gpus // ranks)} or fewer")
    share = len(cpus) // parallel
    slots = tuple(Slot(i, tuple(cpus[i * share:(i + 1) * share]), i if ranks == 1 and gpus >= parallel else None,
                       max(1, share // ranks) if ranks > 1 else None, ranks,
                       tuple(range(i * ranks, (i + 1) * ranks)) if ranks > 1 and gpus >= parallel * ranks else ())
                  for i in range(parallel))
    return Launch("local", parallel, slots, ranks=ranks)


def placement_env(slot: Slot, environ: dict[str, str]) -> dict[str, str]:
    """The variables a task's repeat runs with on top of the run's environment: its thread count
    (a count the user exported is kept, as under SLURM) and its GPU."""
    env = {name: str(slot.threads or len(slot.cpus)) for name in THREAD_VARIABLES if name not in environ}
    if slot.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, slot.gpus))
    elif slot.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(slot.gpu)
    return env


def placement(slot: Slot, environ: dict[str, str], launcher: str) -> dict[str, Any]:
    """What a repeat's summary records of where it ran."""
    env = {**environ, **placement_env(slot, environ)}
    threads = env.get("OMP_NUM_THREADS")
    where = {"launcher": launcher, "slot": slot.index, "host": socket.gethostname(), "cpus": list(slot.cpus),
             "threads": int(threads) if threads and threads.isdigit() else slot.threads or len(slot.cpus),
             "gpu": slot.gpu, "ranks": slot.ranks}
    if slot.gpus:
        where["gpus"] = ",".join(map(str, slot.gpus))
    if launcher == "slurm":  # the node by SLURM's name (several may share a host name), the task, what it was given
        where.update(node=environ.get("SLURMD_NODENAME"), partition=environ.get("SLURM_JOB_PARTITION"),
                     job_id=f"{environ.get('SLURM_ARRAY_JOB_ID')}_{environ.get('SLURM_ARRAY_TASK_ID')}",
                     gpus=environ.get("CUDA_VISIBLE_DEVICES"),
                     # how often SLURM requeued the task (preempted, or out of time) before this attempt
                     restarts=int(environ.get("SLURM_RESTART_COUNT") or 0))
    return where


def node_hardware() -> dict[str, Any]:
    """The hardware a SLURM task's node gives its repeat, in the few facts that change results or
    speed (the head's manifest has the head's whole hardware facet, not the nodes')."""
    from repro500.capture.gpus import gpu_info
    from repro500.capture.hardware import cpu_info, memory_info

    cpu, gpus = cpu_info(), gpu_info()
    return {"cpu": cpu.get("model"), "cpu_threads": cpu.get("threads"),
            "memory_bytes": memory_info().get("total_bytes"),
            "gpus": [g.get("name") for g in gpus.get("gpus") or []], "gpu_driver": gpus.get("driver_version")}


def hardware_note(summaries: dict[int, dict[str, Any]]) -> str | None:
    """A sentence naming the nodes when the repeats ran on nodes whose hardware differs (results
    and times may then differ by node, not by seed); None when it is the same everywhere."""
    seen: dict[str, dict[str, Any]] = {}
    for summary in summaries.values():
        place = summary.get("placement") or {}
        if place.get("node") and isinstance(place.get("hardware"), dict):
            seen.setdefault(str(place["node"]), place["hardware"])

    def said(h: dict[str, Any]) -> str:  # what is compared is what is shown: a note never lists equal lines
        gpus = ", ".join(map(str, h.get("gpus") or [])) or "no GPU"
        driver = f" (driver {h['gpu_driver']})" if h.get("gpu_driver") else ""
        return f"{h.get('cpu')} ({h.get('cpu_threads')} threads), {gpus}{driver}"

    if len({said(h) for h in seen.values()}) < 2:
        return None
    return ("the repeats ran on nodes whose hardware differs: "
            + "; ".join(f"{node}: {said(h)}" for node, h in sorted(seen.items())))


def slurm_slot(environ: dict[str, str], ranks: int = 1) -> tuple[Slot, dict[str, str]]:
    """A SLURM task's own share, as SLURM gave it, and the environment its repeat runs with: the
    head's, with the head's own SLURM variables (an allocation it may run in) replaced by the
    task's, and the GPUs SLURM gave the task."""
    own = {name: value for name, value in os.environ.items()
           if name.startswith(("SLURM_", "SLURMD_")) or name in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")}
    env = {name: value for name, value in environ.items()
           if not name.startswith(("SLURM_", "SLURMD_")) and name not in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")}
    env.update(own)
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    given = env.get("SLURM_CPUS_PER_TASK", "")
    threads = int(given) if given.isdigit() and int(given) > 0 else len(cpus)
    return Slot(int(env.get("SLURM_ARRAY_TASK_ID") or 0), cpus, None, max(1, threads // ranks), ranks), env


@dataclass
class Landed:
    """What a task hands back: the repeat's summary, or the error that stopped it."""

    summary: dict[str, Any] | None = None
    error: BaseException | None = None
    traceback: str | None = None  # an unexpected error's, for the repeat's error.log
    interrupted: bool = False

    @property
    def failed(self) -> bool:
        """The repeat did not finish: an error, a stop, or a summary that says so."""
        return self.summary is None or self.summary.get("status") == REPEAT_FAILED


def _stop_on_signal(interruptible: bool) -> None:
    """A task stops its repeat as Ctrl-C does on the terminal's SIGINT or the head's SIGTERM
    (forwarded by its controller), whichever comes first; the other one, which follows it, must
    not cut the repeat's own grace short (a wrapped command is killed at once on a second one)."""
    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    if interruptible:  # inherited ignored from the controller (Local.submit); kept so where the head ignores it
        signal.signal(signal.SIGINT, handler)


def node_fingerprint(plan: Plan, run_id: str) -> dict[str, str]:
    """What a SLURM task checks against the head before its repeat: the recipe, the code (repro500,
    the experiment's files, plug-ins, torch for a trained workload) and the data digests, a
    command's declared inputs included (multinode.fingerprint, as the nodes of one repeat compare)."""
    out = multinode.fingerprint(plan, run_id, with_torch=plan.recipe.kind == "trained")
    inputs = getattr(plan.workload, "input_paths", None)
    for entry in digest_paths(inputs() if callable(inputs) else []):
        out[f"data:{entry['path']}"] = entry["md5"]
    return out


def _differs(expected: dict[str, str], plan: Plan, run_id: str, node: str) -> InvalidInput | None:
    """The sentence refusing this node, when it would not run what the head planned."""
    try:
        mine = node_fingerprint(plan, run_id)
    except ReproError as err:  # an input or data file missing here
        return InvalidInput(f"node {node} cannot run what the head planned: {err}")
    keys = sorted(key for key in set(expected) | set(mine) if expected.get(key) != mine.get(key))
    if not keys:
        return None
    shown = "; ".join(f"{key} is {mine.get(key, 'absent')} on node {node} but {expected.get(key, 'absent')} on "
                      f"the head" for key in keys[:3])
    more = f" (and {len(keys) - 3} more)" if len(keys) > 3 else ""
    return InvalidInput(f"node {node} does not run what the head planned: {shown}{more}; every node needs the same "
                        "code, environment and data")


def _task_rendezvous(pid_file: Path, environ: dict[str, str], nnodes: int, node_rank: int) -> dict[str, Any]:
    """Where the nodes of one SLURM task meet (torchrun's static rendezvous, and the nodes' store of
    multinode.agree): node 0 takes a free port on its host and writes ``HOST:PORT`` beside the
    task's files, on the filesystem every node shares with the run directory; the others read it.
    A port of the task's own, since several tasks may share a node; a file per attempt, so that a
    requeued task never reads the endpoint of the attempt before."""
    where = pid_file.with_name(f"{pid_file.stem}-{environ.get('SLURM_RESTART_COUNT') or 0}.rendezvous")
    if node_rank == 0:
        with socket.socket() as probe:  # the OS's free port; node 0's store takes it at once (NodeLink)
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        written = where.with_suffix(".tmp")
        written.write_text(f"{socket.gethostname()}:{port}", encoding="utf-8")
        written.replace(where)  # whole or not at all: a node never reads half an endpoint
    else:
        deadline = time.monotonic() + nodes.START_WAIT_S
        while not where.exists():
            if time.monotonic() > deadline:
                raise InvalidInput(f"node {node_rank} of the task waited {nodes.START_WAIT_S} s for node 0 to say "
                                   f"where they meet ({where} never appeared): the task's nodes need the filesystem "
                                   "of the run directory")
            time.sleep(_POLL_S)
    return {"nnodes": nnodes, "node_rank": node_rank, "endpoint": where.read_text(encoding="utf-8").strip()}


def _checked_plan(run: layout.RunDir, node: str, expected: dict[str, str] | None, tracking: bool,
                  meeting: dict[str, Any] | None) -> tuple[Plan | None, str, InvalidInput | None]:
    """The run's plan as this node rebuilds it from the run directory, and its run id; or the
    sentence refusing this node (it does not see the head's run directory, or would not run what
    the head planned), with nothing of the repeat written."""
    if not run.is_run():  # a node that does not see the head's filesystem: said, and nothing written there
        return None, "", InvalidInput(f"the run directory {run.path} does not exist on node {node}: the repeats' "
                                      "tasks need a filesystem every node sees")
    meta = run.meta()
    if expected is not None and (meta.get("launcher") or {}).get(SUBMISSION) != expected.get(SUBMISSION):
        return None, "", InvalidInput(
            f"node {node} sees another copy of the run directory {run.path}: its run.json is not the one the head "
            "wrote when it submitted this repeat; the repeats' tasks need a filesystem every node shares")
    run_id = str(meta["run_id"])
    plan = recorded_plan(recipes.from_run_dir(run.path), meta, tracking=tracking, run_id=run_id,
                         **({"nnodes": meeting["nnodes"], "node_rank": meeting["node_rank"],
                             "rdzv_endpoint": meeting["endpoint"]} if meeting else {}))
    if expected is not None:  # before anything of the repeat is written
        refused = _differs({key: v for key, v in expected.items() if key != SUBMISSION}, plan, run_id, node)
        if refused is not None:
            return None, run_id, refused
    return plan, run_id, None


def _pinned(slot: Slot | None, environ: dict[str, str], launcher: str, ranks: int,
            pid_file: Path | None) -> tuple[Slot, dict[str, str], dict[str, str]]:
    """This task process on its share (the head's *slot*, or SLURM's where it is None), with the
    thread counts and GPUs of its placement in its own environment (before torch reads them):
    the slot, the run's environment as the task sees it, and the one its repeat runs with."""
    if slot is None:  # a SLURM task: SLURM chose its CPUs and GPUs
        if pid_file is not None:  # the node, for the head to name should this task die before squeue showed it running
            pid_file.with_suffix(".node").write_text(environ.get("SLURMD_NODENAME") or socket.gethostname(),
                                                     encoding="utf-8")
        slot, environ = slurm_slot(environ, ranks)
    else:
        os.sched_setaffinity(0, slot.cpus)
    os.environ.update(placement_env(slot, environ))
    if slot.gpu is None and launcher == "local":  # the run's own setting, not the empty one submitit gives a task without GPUs
        if "CUDA_VISIBLE_DEVICES" in environ:
            os.environ["CUDA_VISIBLE_DEVICES"] = environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    return slot, environ, {**environ, **placement_env(slot, environ)}


def run_task(run_dir: str, k: int, slot: Slot | None, environ: dict[str, str], tracking: bool, mlflow: Any,
             launcher: str, pid_file: str, interruptible: bool = True,
             expected: dict[str, str] | None = None, ranks: int = 1, nnodes: int = 1) -> Landed:
    """One repeat in a task's process: pinned (by the head's *slot*, or by SLURM where it is None),
    its plan rebuilt from the run directory, run by the serial loop's own function.  A SLURM task of
    *nnodes* nodes runs this on each: node 0 (SLURM's task 0) runs the repeat and writes it, the
    others host their ranks, as the nodes of a multi-node run do.  Never raises: the head records
    what node 0 returns."""

    _stop_on_signal(interruptible)
    node_rank = int(os.environ.get("SLURM_PROCID") or 0) if nnodes > 1 else 0  # one task per node
    if node_rank == 0:
        Path(pid_file).write_text(str(os.getpid()), encoding="utf-8")  # for the head, should it have to kill it
    slot, environ, env = _pinned(slot, environ, launcher, ranks, Path(pid_file) if node_rank == 0 else None)
    run = layout.RunDir(run_dir)
    node = environ.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        meeting = _task_rendezvous(Path(pid_file), environ, nnodes, node_rank) if nnodes > 1 else None
        with launchenv.frozen(env):
            plan, run_id, refused = _checked_plan(run, node, expected, tracking, meeting)
            if meeting is not None:  # every node states what it runs, or why it cannot, before any trains
                assert plan is not None or refused is not None
                stated = {nodes.REFUSED: str(refused)} if refused else multinode.fingerprint(plan, run_id)  # type: ignore[arg-type]
                try:  # on a refusal, every node stops with it
                    nodes.link(meeting).agree(stated, [k], run_dir)
                except UsageError as err:  # as a one-node task's refusal: the nodes' data or code, exit 4
                    return Landed(error=InvalidInput(str(err)))
            elif refused is not None:
                return Landed(error=refused)
            assert plan is not None
            if node_rank > 0:
                with tempfile.TemporaryDirectory(prefix="repro500-node-") as scratch:
                    multinode.follow_repeat(plan, k, Path(scratch))
                return Landed()
            summary = run_one(plan, run, k, run_id, Progress(), mlflow)
    except KeyboardInterrupt:
        return Landed(interrupted=True)
    except ReproError as err:
        return Landed(error=err)
    except Exception as err:  # noqa: BLE001 - a crash of one repeat is recorded, not lost
        return Landed(error=err, traceback=redact.redact_text(traceback.format_exc()))
    summary["placement"] = placement(slot, environ, launcher)
    if launcher == "slurm":
        summary["placement"]["hardware"] = node_hardware()
    if meeting is not None:  # the task's nodes by SLURM's names, node 0 first (placement's node)
        import submitit

        summary["placement"]["nodes"] = list(submitit.JobEnvironment().hostnames)
    run.write_repeat_summary(k, summary)  # still before the head chains it
    return Landed(summary=summary)


class SlurmRepeat:
    """A repeat as a SLURM task that SLURM may preempt or run out of time: submitit signals the task
    (USR2, ``signal_delay_s`` before its time ends, or when a preempting job needs the node), calls
    :meth:`checkpoint` and requeues the task with what it returns, then ends this attempt.  The
    requeued task runs the repeat again with the same seeds, into its repeat directory emptied but
    for the state a command saved in ``checkpoint/`` (layout.fresh_repeat), which it continues from;
    the head, which
    chains and logs a repeat when its task's result lands, sees one result and links it once.
    submitit knows a checkpointable task by its ``checkpoint`` method (no base class needed, so
    this module does not import submitit for a run that never fans out)."""

    def __init__(self) -> None:
        self.requeued = False

    def __call__(self, *args: Any, **kwargs: Any) -> Landed:
        landed = run_task(*args, **kwargs)
        if self.requeued:  # SLURM's SIGTERM after the requeue stopped the repeat: no result from this attempt
            raise SystemExit(-1)
        return landed

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        from submitit.helpers import DelayedSubmission

        self.requeued = True  # this attempt's result must not land: the requeued one's will
        return DelayedSubmission(type(self)(), *args, **kwargs)


class Local:
    """Tasks of submitit's local executor, at most one per slot at a time."""

    def __init__(self, launch: Launch, run: layout.RunDir, environ: dict[str, str], tracking: bool) -> None:
        import submitit

        self.launch, self.run, self.environ, self.tracking = launch, run, environ, tracking
        # outside the run directory: the pickled tasks hold the run's environment (secrets included)
        self.folder = Path(tempfile.mkdtemp(prefix="repro500-tasks-"))
        self.executor = submitit.LocalExecutor(folder=self.folder)
        self.executor.update_parameters(timeout_min=_TASK_DAYS * 24 * 60)
        # submitit spaces submissions 0.2 s apart to spare a cluster's scheduler; here each is a
        # process on this node, and the spacing delays every slot but the first of each round
        self.executor._throttling = 0.0
        self.ended: list[Any] = []  # the controllers of tasks that have handed back their result
        self.free = list(launch.slots)
        self.jobs: dict[int, tuple[Any, Slot, float]] = {}  # repeat -> (job, slot, start time)
        self.expected: dict[str, str] | None = None  # this node's tasks need not check it is this node

    def room(self) -> int:
        """How many more repeats may start now."""
        return len(self.free)

    def with_results(self) -> list[int]:
        """None kept for a resume: a local task's result lives in a folder that goes with the head."""
        return []

    def submit(self, batch: dict[int, Any]) -> list[tuple[int, str, str]]:
        """Start each repeat of *batch* (repeat -> its MLflow target): (repeat, state, where)."""
        return [(k, "running", self._submit(k, mlflow).where) for k, mlflow in batch.items()]

    def progress(self) -> list[tuple[int, str, str]]:
        """Repeats whose state changed since they were submitted: none here, a task runs at once."""
        return []

    def _submit(self, k: int, mlflow: Any) -> Slot:
        slot = self.free.pop(0)
        # The controller starts with SIGINT ignored (inherited): a terminal's Ctrl-C reaches every
        # process of its group, and a controller that gets it SIGKILLs its task a second later, before
        # a wrapped command's own grace.  The task itself takes SIGINT back (run_task), and the head
        # stops the tasks with SIGTERM, which the controller forwards.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            job = self.executor.submit(run_task, str(self.run.path.resolve()), k, slot, self.environ, self.tracking,
                                       mlflow, self.launch.launcher, str(self.folder / f"task-{k}.pid"),
                                       previous is not signal.SIG_IGN)
        finally:
            signal.signal(signal.SIGINT, previous)
        self.jobs[k] = (job, slot, time.monotonic())
        return slot

    def landed(self) -> list[tuple[int, Landed, float]]:
        """The tasks that ended since the last call: (repeat, outcome, seconds it ran)."""
        out = []
        for k, (job, slot, started) in list(self.jobs.items()):
            # the result file is there when the repeat has ended, a few tenths of a second before
            # the task's interpreter and its controller have (what job.done() waits for)
            if job.paths.result_pickle.exists():
                outcome = self._result(job)
            elif job.done():
                outcome = self._outcome(job)
            else:
                continue
            del self.jobs[k]
            self.free.append(slot)
            self.ended.append(job)
            out.append((k, outcome, time.monotonic() - started))
        return out

    @staticmethod
    def _result(job: Any) -> Landed:
        """What a task handed back, read from its result file (submitit's own ("success", value)
        or ("error", traceback)): job.result() would wait for the controller's end, in 1 s steps."""
        from submitit.core.utils import pickle_load

        try:
            outcome, value = pickle_load(job.paths.result_pickle)
        except Exception as err:  # noqa: BLE001 - a result file that cannot be read is a repeat without a result
            return Landed(error=RuntimeError(f"the repeat's task left a result that cannot be read ({type(err).__name__})"))
        if outcome == "success" and isinstance(value, Landed):
            return value
        reason = str(value).strip().splitlines()[-1] if str(value).strip() else outcome
        return Landed(error=RuntimeError(f"the repeat's task process ended without a result ({reason})"))

    @staticmethod
    def _outcome(job: Any) -> Landed:
        try:  # task 0's: a SLURM task of several nodes runs the repeat on its node 0
            return job.task(0).result()
        except Exception as err:  # noqa: BLE001 - the task's process died without a result
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            return Landed(error=RuntimeError(f"the repeat's task process ended without a result ({reason})"))

    def stop(self) -> list[int]:
        """Stop every running task (SIGTERM through its controller), wait for them to end, and
        say which repeats were running."""
        running = list(self.jobs)
        for job, _, _ in self.jobs.values():
            if job._process is not None and job._process.poll() is None:  # submitit keeps the controller here
                job._process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(not job.done() for job, _, _ in self.jobs.values()):
            time.sleep(0.1)
        for k, (job, _, _) in self.jobs.items():
            if not job.done():  # the task first (its controller would leave it running), then the controller
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int((self.folder / f"task-{k}.pid").read_text(encoding="utf-8")), signal.SIGKILL)
                if job._process is not None:
                    job._process.kill()
        self.jobs.clear()
        return running

    def close(self) -> None:
        for job in self.ended:  # none left behind the head: a controller ends within moments of its task
            with contextlib.suppress(subprocess.TimeoutExpired, AttributeError):
                job._process.wait(timeout=STOP_GRACE_S)
        shutil.rmtree(self.folder, ignore_errors=True)


# squeue's states of a task that has not ended (anything else, or no line: it has)
_ALIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED", "STOPPED")
# a task seen running that is back in these was requeued (REQUEUED while SLURM ends its attempt)
_REQUEUED = ("PENDING", "REQUEUED")
_POLL_S = 1.0  # squeue at most this often: the controller serves every user of the cluster
_GONE_S = 5.0  # a task gone from squeue this long without a result ended without one (a network
# filesystem may show its result file a little after SLURM has ended the task)
_CANCEL_WAIT_S = 120.0  # after scancel: SLURM's KillWait (30 s by default) plus the repeat's own grace


def arrays(job_ids: Iterable[str]) -> list[str]:
    """The SLURM job arrays of the array tasks *job_ids* (``<array>_<task>``), in order."""
    return sorted({job_id.split("_")[0] for job_id in job_ids})


def queue_states(job_ids: list[str]) -> dict[str, tuple[str, str]] | None:
    """What ``squeue`` says of the array tasks *job_ids* (``<array>_<task>``): task -> (state, node);
    a task it does not list has left the queue (an array SLURM no longer knows, past its MinJobAge,
    is an empty answer).  None when the controller did not answer."""
    try:
        done = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%T|%N", "-j", ",".join(arrays(job_ids))],
                              capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 and "invalid job id" not in done.stderr.lower():
        return None
    states = {}
    for line in done.stdout.splitlines():
        task, state, node = (line.strip().split("|") + ["", ""])[:3]
        states[task] = (state, node)
    return states


def _result_file(folder: Path, job_id: str) -> Path:
    """Where submitit puts the result of array task *job_id* in *folder* (its own naming)."""
    from submitit.core.utils import JobPaths

    return JobPaths(folder, job_id=job_id, task_id=0).result_pickle


def standing(run: layout.RunDir, meta: dict[str, Any], planned: int) -> list[tuple[int, str]]:
    """Where each repeat of a run stands, in words, from its records and, for the repeats a head
    left to SLURM (--detach), from SLURM's queue and the task's result: (repeat, state).  Reads
    only: nothing is collected or written."""
    left = detached_jobs(meta.get("launcher") or {})
    folder, jobs = (run.path.resolve().parent / ".tasks" / left[0], left[1]) if left else (None, {})
    queue = (queue_states(list(jobs.values())) if shutil.which("squeue") else None) if jobs else {}
    out = []
    for k in range(planned):
        summary = run.repeat_summary(k)
        if k in jobs:
            job_id = jobs[k]
            state, node = (queue or {}).get(job_id, ("", ""))
            if folder is not None and _result_file(folder, job_id).exists():
                said = f"ended ({summary.get('status') if summary else 'no summary'}; SLURM job {job_id}), " \
                       "its result not yet collected"
            elif queue is None:
                said = f"SLURM job {job_id}: squeue did not answer"
            elif state == "RUNNING":
                said = f"running on {node} (SLURM job {job_id})"
            elif state in _ALIVE:
                said = f"{state.lower()} (SLURM job {job_id})"
            else:
                said = f"SLURM job {job_id} has left the queue without a result (a failed repeat once collected)"
        else:
            said = str(summary.get("status")) if summary else "not run"
        out.append((k, said))
    return out


@dataclass
class _Kept:
    text: str = ""


@contextlib.contextmanager
def _stderr_kept() -> Any:
    """Keep what a child writes on our stderr (submitit runs sbatch with ours): sbatch's refusal
    reaches the user once, in the head's sentence, not as its own lines before it."""
    kept = _Kept()
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield kept
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept.text = sink.read().decode("utf-8", "replace")


class Slurm:
    """The repeats as one SLURM job array (submitit's executor, ``slurm_array_parallelism`` at a
    time), each task on the node SLURM gives it; the head follows them with ``squeue``, which
    needs no accounting database (submitit's own states come from ``sacct``)."""

    def __init__(self, launch: Launch, run: layout.RunDir, environ: dict[str, str], tracking: bool,
                 detached: tuple[str, dict[int, str]] | None = None) -> None:
        import submitit

        self.launch, self.run, self.environ, self.tracking = launch, run, environ, tracking
        # Beside the run directory, on the filesystem the tasks must share with it, but not in it:
        # the pickled tasks hold the run's environment (secrets included); removed when the head
        # ends, unless it leaves them to SLURM (--detach): then the resume collects them from there.
        tasks_dir = run.path.resolve().parent / ".tasks"
        if detached is not None:
            self.folder = tasks_dir / detached[0]
        else:
            self.folder = tasks_dir / f"{run.path.name}-{secrets.token_hex(4)}"
            self.folder.mkdir(parents=True, mode=0o700)
        self.executor = submitit.AutoExecutor(folder=self.folder, cluster="slurm")
        r = launch.resources
        self.expected: dict[str, str] | None = None  # the head's fingerprint (set by the session before submit)
        self.executor.update_parameters(
            slurm_array_parallelism=launch.parallel, slurm_partition=r["partition"], slurm_time=r["time"],
            # a repeat of several nodes is one task of each: SLURM starts run_task on every node
            slurm_nodes=launch.nodes, slurm_ntasks_per_node=1,
            slurm_cpus_per_task=r.get("cpus", 1), slurm_gpus_per_task=r.get("gpus") or None,
            slurm_account=r.get("account"), slurm_qos=r.get("qos"), slurm_job_name=f"repro500-{run.path.name}",
            # as given (8G, 500M): submitit's own mem parameter reads a number of GB
            slurm_additional_parameters={"mem": r["mem"]} if r.get("mem") else None)
        self.jobs: dict[int, Any] = {}  # repeat -> its task (a submitit job)
        self._since: dict[int, float] = {}  # repeat -> when it was submitted, then when it was seen running
        self._node: dict[int, str] = {}  # repeat -> the node it runs on, once seen running
        self._gone: dict[int, float] = {}  # repeat -> when squeue first no longer showed its task alive
        self._queue: dict[str, tuple[str, str]] = {}  # task id -> (state, node), as squeue said last
        self._polled = 0.0
        self._adopted: set[int] = set()  # repeats whose tasks a head that left submitted (adopt)

    def room(self) -> int:
        # every repeat in one array; a sequential run's next batch once the last one has landed
        return 0 if self.jobs else 1 << 30

    def submit(self, batch: dict[int, Any]) -> list[tuple[int, str, str]]:
        """The repeats of *batch* as one job array (one sbatch: it is queued whole or not at all)."""
        run_dir = str(self.run.path.resolve())
        # Ctrl-C waits until sbatch has answered: an array queued but not yet known here could not
        # be cancelled (stop scancels what self.jobs holds)
        interrupted: list[int] = []
        previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
        try:
            with _stderr_kept() as said, self.executor.batch():
                pending = [(k, self.executor.submit(SlurmRepeat(), run_dir, k, None, self.environ, self.tracking, mlflow,
                                                    "slurm", str(self.folder / f"task-{k}.pid"), True,
                                                    self.expected, self.launch.ranks, self.launch.nodes))
                           for k, mlflow in batch.items()]
        except Exception as err:  # noqa: BLE001 - sbatch's refusal, said in its own words
            lines = [line.strip().removeprefix("sbatch: error:").strip()
                     for line in (said.text or str(err)).splitlines() if line.strip()]
            raise InvalidInput(f"sbatch refused the repeats' job array: {'; '.join(lines[-2:]) or type(err).__name__}"
                               ) from None
        finally:
            signal.signal(signal.SIGINT, previous)
        if said.text.strip():  # sbatch's warnings on an array it queued: the user's to read
            print(said.text.rstrip(), file=sys.stderr)
        now = time.monotonic()
        for k, job in pending:
            self.jobs[k], self._since[k] = job, now
        if interrupted:
            raise KeyboardInterrupt
        return [(k, "queued", f"SLURM job {job.job_id}") for k, job in pending]

    def adopt(self, detached: tuple[str, dict[int, str]], pending: list[int]) -> list[tuple[int, str, str]]:
        """Follow the tasks a head that left (--detach) submitted, for the repeats in *pending*, as
        if this head had submitted them: (repeat, "queued", the task) for each."""
        import submitit

        jobs = {k: job_id for k, job_id in detached[1].items() if k in pending}
        now = time.monotonic()
        for k, job_id in jobs.items():
            self.jobs[k] = submitit.SlurmJob(folder=self.folder, job_id=job_id)
            self._since[k] = now
            self._adopted.add(k)
        return [(k, "queued", f"SLURM job {job_id} (submitted before the head left)") for k, job_id in sorted(jobs.items())]

    def leave(self, ks: list[int] | None = None) -> dict[str, Any]:
        """What a resume needs to collect the tasks of *ks* (default: all in flight; --detach): their
        folder, kept, and each repeat's task.  Nothing is cancelled."""
        ks = sorted(self.jobs) if ks is None else sorted(ks)
        submitted = {str(k): self.jobs.pop(k).job_id for k in ks}
        return {"folder": self.folder.name, "jobs": submitted}

    def with_results(self) -> list[int]:
        """The repeats whose tasks have handed back a result this head has not collected yet."""
        return [k for k, job in self.jobs.items() if job.paths.result_pickle.exists()]

    def _poll(self) -> None:
        if time.monotonic() - self._polled < _POLL_S or not self.jobs:
            return
        answer = queue_states([job.job_id for job in self.jobs.values()])
        self._polled = time.monotonic()
        if answer is not None:  # None: the controller busy or restarting: the tasks keep their last states
            self._queue = answer

    def progress(self) -> list[tuple[int, str, str]]:
        """Repeats SLURM has started since the last call, (repeat, "running", node and task), and
        those it requeued, (repeat, "requeued", the task and the node it left)."""
        self._poll()
        out = []
        for k, job in self.jobs.items():
            state, node = self._queue.get(job.job_id, ("", ""))
            if k not in self._node and state == "RUNNING" and node:
                self._node[k], self._since[k] = node, time.monotonic()
                out.append((k, "running", f"{node} (SLURM job {job.job_id})"))
            elif k in self._node and state in _REQUEUED:
                left = self._node.pop(k)
                out.append((k, "requeued", f"SLURM job {job.job_id} (preempted or out of time on {left}; its repeat "
                                           "starts again, from the state its command saved in $REPRO500_CHECKPOINT_DIR "
                                           "where it saved one)"))
        return out

    def landed(self) -> list[tuple[int, Landed, float]]:
        """The tasks that ended since the last call: (repeat, outcome, seconds it ran)."""
        self._poll()
        out = []
        for k, job in list(self.jobs.items()):
            if job.paths.result_pickle.exists():
                outcome = Local._outcome(job)
            elif self._queue.get(job.job_id, ("",))[0] in _ALIVE or self._polled < self._since[k]:
                self._gone.pop(k, None)
                continue
            else:  # gone from the queue: its result may still be on its way over a network filesystem
                if time.monotonic() - self._gone.setdefault(k, time.monotonic()) < _GONE_S:
                    continue
                node = self._node.get(k) or self._task_node(k)
                on = f" on {node}" if node else ""
                outcome = Landed(error=RuntimeError(
                    f"SLURM task {job.job_id}{on} ended without a result (cancelled, out of time or memory, or its "
                    f"node failed; scontrol show job {job.job_id} says which, while SLURM remembers it)"))
            del self.jobs[k]
            ran = time.monotonic() - self._since[k]
            if k not in self._node and outcome.summary is not None and k in self._adopted:
                # ended before this head looked: the time is the repeat's own, not the wait to collect it
                ran = float(outcome.summary.get("total_time_s") or 0.0)
            out.append((k, outcome, ran))
        return out

    def _task_node(self, k: int) -> str:
        """The node repeat *k*'s task said it started on ("" if it never started)."""
        try:
            return (self.folder / f"task-{k}.node").read_text(encoding="utf-8").strip()
        except OSError:
            return ""

    def stop(self) -> list[int]:
        """scancel the array (its queued tasks never start; a running one stops its repeat as on
        Ctrl-C), wait (bounded) until SLURM has ended them, and say which repeats were submitted."""
        submitted = list(self.jobs)
        submitted_arrays = arrays(job.job_id for job in self.jobs.values())
        if submitted_arrays:
            subprocess.run(["scancel", *submitted_arrays], capture_output=True, timeout=60, check=False)
        deadline = time.monotonic() + _CANCEL_WAIT_S
        while submitted_arrays and time.monotonic() < deadline:
            self._polled = 0.0
            self._poll()
            if not any(state in _ALIVE for state, _ in self._queue.values()):
                break
            time.sleep(_POLL_S)
        self.jobs.clear()
        return submitted

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        with contextlib.suppress(OSError):  # the other runs' tasks may be there
            self.folder.parent.rmdir()


def tasks(launch: Launch, run: layout.RunDir, environ: dict[str, str], tracking: bool,
          detached: tuple[str, dict[int, str]] | None = None) -> Local | Slurm:
    """The launcher's tasks, behind one interface (room, submit, progress, landed, stop, close);
    *detached*: the record of a head that left them to SLURM (:data:`DETACHED`), whose folder the
    tasks keep (their results land there)."""
    if launch.launcher == "slurm":
        return Slurm(launch, run, environ, tracking, detached)
    return Local(launch, run, environ, tracking)
