"""A run's repeats side by side: tasks of submitit's local executor, each on its own share of the node.

The head process (``repro500 run``) plans, captures, chains, logs to MLflow and verifies, as
in a serial run; only the repeats move into tasks.  A task rebuilds the run's plan from the run
directory as ``--resume`` does (the recipe and run.json, so the same seeds and design), pins
itself to its slot (a disjoint CPU set, and GPU ``i`` where the node has a GPU per slot), and
runs :func:`repro500.runner.repeat.run_one`, the serial loop's own function, into the same run
directory.  What it returns is the repeat's summary or the error it met; the head links and
logs each one as it lands, in whatever order they finish.

submitit rather than a pool of our own: it is how these repeats reach a SLURM array as well, and
it runs each task in a fresh interpreter (no state shared with the head, as on a cluster node).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from repro500 import redact
from repro500.errors import ReproError, UsageError
from repro500.rundir import layout
from repro500.runner.plan import Plan, RunOptions
from repro500.workloads.workload import Progress

# Thread pools that size themselves from the machine, not from the CPU set: each gets the slot's
# CPU count (thread counts change float results, so the count is recorded with the repeat).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# How long a task that was asked to stop may take before its controller is killed: a wrapped
# command gets its own grace (workloads/command/repeat.py GRACE_S) to end first.
STOP_GRACE_S = 20.0
_TASK_DAYS = 30  # submitit's local executor kills a task after timeout_min (default: 2 minutes)


@dataclass(frozen=True)
class Slot:
    """One share of the node: the CPUs a task runs on and the GPU it sees (None: no GPU)."""

    index: int
    cpus: tuple[int, ...]
    gpu: int | None

    @property
    def where(self) -> str:
        cpus = f"cpu{'s' if len(self.cpus) > 1 else ''} {','.join(map(str, self.cpus))}"
        return cpus + (f", GPU {self.gpu}" if self.gpu is not None else "")


@dataclass(frozen=True)
class Launch:
    """How a run's repeats fan out, decided before anything is written."""

    launcher: str
    parallel: int
    slots: tuple[Slot, ...]

    def record(self) -> dict[str, Any]:
        return {"kind": self.launcher, "parallel": self.parallel, "slots": [asdict(s) for s in self.slots]}


def _gpu_count() -> int:
    from repro500.capture.gpus import gpu_info

    return int(gpu_info().get("count") or 0)


def prepare(options: RunOptions, plan: Plan, todo: int) -> Launch | None:
    """The slots of ``--launcher local --parallel K`` on this node (None: the repeats run in turn)."""
    if options.launcher is None:  # check_launcher has refused any other launcher than local
        return None
    cpus = sorted(os.sched_getaffinity(0))
    gpus = _gpu_count()
    parallel = options.parallel or max(1, min(todo, gpus or len(cpus)))
    if parallel > len(cpus):
        raise UsageError(f"--parallel {parallel} needs a CPU core per repeat, but this process may use {len(cpus)}; "
                         f"give --parallel {len(cpus)} or fewer")
    if plan.device == "cuda" and gpus < parallel:
        raise UsageError(f"--parallel {parallel} needs a GPU per repeat of a device cuda run, but this node has "
                         f"{gpus}; give --parallel {max(gpus, 1)} or fewer")
    share = len(cpus) // parallel
    slots = tuple(Slot(i, tuple(cpus[i * share:(i + 1) * share]), i if gpus >= parallel else None)
                  for i in range(parallel))
    return Launch("local", parallel, slots)


def placement_env(slot: Slot, environ: dict[str, str]) -> dict[str, str]:
    """The variables a task's repeat runs with on top of the run's environment: its thread count
    (a count the user exported is kept, as under SLURM) and its GPU."""
    env = {name: str(len(slot.cpus)) for name in THREAD_VARIABLES if name not in environ}
    if slot.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(slot.gpu)
    return env


def placement(slot: Slot, environ: dict[str, str], launcher: str) -> dict[str, Any]:
    """What a repeat's summary records of where it ran."""
    env = {**environ, **placement_env(slot, environ)}
    threads = env.get("OMP_NUM_THREADS")
    return {"launcher": launcher, "slot": slot.index, "host": socket.gethostname(), "cpus": list(slot.cpus),
            "threads": int(threads) if threads and threads.isdigit() else len(slot.cpus), "gpu": slot.gpu}


@dataclass
class Landed:
    """What a task hands back: the repeat's summary, or the error that stopped it."""

    summary: dict[str, Any] | None = None
    error: BaseException | None = None
    traceback: str | None = None  # an unexpected error's, for the repeat's error.log
    interrupted: bool = False


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


def run_task(run_dir: str, k: int, slot: Slot, environ: dict[str, str], tracking: bool, mlflow: Any,
             launcher: str, pid_file: str, interruptible: bool = True) -> Landed:
    """One repeat in a task's process: pinned, its plan rebuilt from the run directory, run by the
    serial loop's own function.  Never raises: the head records what it returns."""
    from repro500.recipe import load as recipes
    from repro500.runner.plan import recorded_plan
    from repro500.runner.repeat import run_one
    from repro500.workloads.command import launchenv

    _stop_on_signal(interruptible)
    Path(pid_file).write_text(str(os.getpid()), encoding="utf-8")  # for the head, should it have to kill it
    os.sched_setaffinity(0, slot.cpus)
    env = {**environ, **placement_env(slot, environ)}
    os.environ.update(placement_env(slot, environ))  # before torch reads them (a trained repeat)
    if slot.gpu is None:  # the run's own setting, not the empty one submitit gives a task without GPUs
        if "CUDA_VISIBLE_DEVICES" in environ:
            os.environ["CUDA_VISIBLE_DEVICES"] = environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    run = layout.RunDir(run_dir)
    try:
        with launchenv.frozen(env):
            meta = run.meta()
            plan = recorded_plan(recipes.from_run_dir(run.path), meta, tracking=tracking, run_id=meta.get("run_id"))
            summary = run_one(plan, run, k, str(meta["run_id"]), Progress(), mlflow)
    except KeyboardInterrupt:
        return Landed(interrupted=True)
    except ReproError as err:
        return Landed(error=err)
    except Exception as err:  # noqa: BLE001 - a crash of one repeat is recorded, not lost
        return Landed(error=err, traceback=redact.redact_text(traceback.format_exc()))
    summary["placement"] = placement(slot, environ, launcher)
    run.write_repeat_summary(k, summary)  # still before the head chains it
    return Landed(summary=summary)


class Local:
    """Tasks of submitit's local executor, at most one per slot at a time."""

    def __init__(self, launch: Launch, run: layout.RunDir, environ: dict[str, str], tracking: bool) -> None:
        import submitit

        self.launch, self.run, self.environ, self.tracking = launch, run, environ, tracking
        # outside the run directory: the pickled tasks hold the run's environment (secrets included)
        self.folder = Path(tempfile.mkdtemp(prefix="repro500-tasks-"))
        self.executor = submitit.LocalExecutor(folder=self.folder)
        self.executor.update_parameters(timeout_min=_TASK_DAYS * 24 * 60)
        self.free = list(launch.slots)
        self.jobs: dict[int, tuple[Any, Slot, float]] = {}  # repeat -> (job, slot, start time)

    def submit(self, k: int, mlflow: Any) -> Slot:
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
            if not job.done():
                continue
            del self.jobs[k]
            self.free.append(slot)
            out.append((k, self._outcome(job), time.monotonic() - started))
        return out

    @staticmethod
    def _outcome(job: Any) -> Landed:
        try:
            return job.result()
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
        shutil.rmtree(self.folder, ignore_errors=True)
