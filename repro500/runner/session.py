"""``repro500 run`` as a sequence of stages over one run directory:

    plan -> open -> capture -> track -> repeats -> summaries -> seal -> verify

Each stage is a method below a screen long; what a stage knows lives in its own module (the
plan in ``plan.py``, tags in ``track.py``, the display in ``display.py``, the layout in
``repro500.rundir.layout``, rank maps in ``workloads.engines.ranks``).  Finished repeats are complete
on disk (their ``summary.json`` is written last, atomically) and FINISHED in MLflow before the
next one starts, so Ctrl-C, SIGTERM or a crash loses at most the repeat in flight; ``--resume``
reruns exactly the missing repeats with the same seeds.
"""

from __future__ import annotations

import threading
import time
import traceback
from concurrent.futures import Future
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from repro500 import redact
from repro500.capture import inputs, source
from repro500.errors import EXIT_INTERRUPTED, EXIT_OK, InvalidInput, ReproError, RunFailed
from repro500.rundir import layout, ownership
from repro500.runner import capture, decide, fanout
from repro500.runner import summaries as aggregation
from repro500.runner.background import call_in_background, warm_verify, yields_cpu
from repro500.runner.display import Display
from repro500.runner.plan import Plan
from repro500.runner.repeat import run_one
from repro500.runner.track import Tracking, now_ms
from repro500.statuses import (
    REPEAT_FAILED,
    REPEAT_KILLED,
    RUN_COMPLETED,
    RUN_FAILED,
    RUN_INTERRUPTED,
    RUN_RUNNING,
    RUN_SUBMITTED,
)
from repro500.tracking import store as mlflow_store
from repro500.untrusted import shown
from repro500.workloads.command import launchenv
from repro500.workloads.command.repeat import MlflowTarget
from repro500.workloads.engines.ranks import record_rank_map


@dataclass
class RunOutcome:
    run_dir: Path
    exit_code: int
    verdict: Any = None
    summaries: dict[int, dict[str, Any]] = field(default_factory=dict)


class Session:
    """One execution of a plan over a run directory (new or resumed)."""

    def __init__(self, plan: Plan, run: layout.RunDir, meta: dict[str, Any], console: Console, *,
                 resumed: bool, tracking: bool, experiment: str | None, source_name: str,
                 sign: tuple[str, str | None] | None = None, artifacts: str | None = None,
                 started_ms: int | None = None) -> None:
        self.plan, self.run, self.meta, self.console = plan, run, meta, console
        # the MLflow parent's start: the run's (as its user started it), not when its record lands
        self.started_ms = started_ms or now_ms()
        self.resumed, self.tracking_on, self.experiment, self.source_name = resumed, tracking, experiment, source_name
        self.tracking: Any = None
        self.artifacts = artifacts
        self.repeat_errors: dict[int, ReproError] = {}
        self.sign = sign  # (key path, principal): sign the finished run
        # The capture's slow part runs beside the first repeat (background.py); the manifest is
        # written, and the chain started, at the first point the runner needs them.
        self._prepared: Any = None
        self._gathered: Future[Any] | None = None
        # A wrapped command's background work waits until its first process runs (background.py:
        # it would share the GIL with the thread starting it); the trainer's starts at once.
        self._launched = threading.Event()
        # the reproduce command this run is the rerun of (REPRODUCTION_ENV), or None
        self.reproduction: str | None = None
        self._settled: Future[dict[str, Any]] = Future()
        self._inputs: dict[int, Future[Any]] = {}  # hashing what repeat k's command read, beside the next
        self.reference: Any = None  # what the run is verified against (runner/decide.py)
        self.launch: fanout.Launch | None = None  # the repeats side by side (--launcher), or in turn
        self._in_flight: set[int] = set()  # repeats whose tasks are running (side by side)
        self.detach = False  # --detach: leave the submitted repeats to SLURM (runner/fanout.py)
        self._left: dict[str, Any] | None = None  # what the head left to SLURM, once it has (fanout.DETACHED)

    @property
    def recipe(self) -> Any:
        return self.plan.recipe

    @property
    def resume_command(self) -> str:
        """What completes this run: ``run --resume``, or the reproduction it is the rerun of."""
        if self.reproduction:
            return self.reproduction
        again = "" if self.launch is None else f" --launcher {self.launch.launcher} --parallel {self.launch.parallel}"
        # the resources as they were asked for, so that the rest of the repeats fan out as the first did
        again += "".join(f" --slurm {key}={value}" for key, value in (self.launch.resources if self.launch else {}).items())
        return f"repro500 run --resume {self.run}{again}"

    # ----- the stages -----------------------------------------------------------------------
    def execute(self) -> RunOutcome:
        """Run, and whatever happens close the run: run.json never stays ``running`` and the MLflow
        parent never stays RUNNING (KILLED on Ctrl-C or SIGTERM, FAILED on an error)."""
        try:
            return self._stages()
        except KeyboardInterrupt:
            if self.meta.get("status") == RUN_COMPLETED:  # only MLflow's last records were still being written
                with suppress(Exception):
                    self._close_tracking("KILLED")  # ended KILLED, not left RUNNING (a no-op once closing)
                self.console.print(f"[yellow]Interrupted[/] while MLflow's last records were written; the run is "
                                   f"complete: repro500 verify {self.run}")
                return RunOutcome(self.run.path, EXIT_INTERRUPTED)
            self._abandon(RUN_INTERRUPTED, "KILLED")
            self.console.print(f"[yellow]Interrupted.[/] Complete the run with: {self.resume_command}", soft_wrap=True)
            return RunOutcome(self.run.path, EXIT_INTERRUPTED)
        except BaseException:
            self._abandon(RUN_FAILED, "FAILED")
            raise

    def _stages(self) -> RunOutcome:
        self.capture()
        if self.tracking_on:
            self.track()
        summaries, interrupted = self.repeats()
        if self._left is not None:
            return self._leave()
        if not interrupted or self._gathered is None or self._gathered.done():
            self.settle()  # an interrupted run does not wait for a capture still hashing: --resume redoes it
        self.summarise(summaries, RUN_INTERRUPTED if interrupted else
                       RUN_FAILED if any(s.get("status") == REPEAT_FAILED for s in summaries.values()) else RUN_COMPLETED)
        if interrupted:
            self.console.print(f"[yellow]Interrupted.[/] Finished repeats are kept in {self.run}; "
                               f"complete the run with: {self.resume_command}", soft_wrap=True)
            self._close_tracking("KILLED")
            return RunOutcome(self.run.path, EXIT_INTERRUPTED, summaries=summaries)
        self._table(summaries)
        self._raise_if_failed(summaries)
        verdict = self.verify()
        if self.sign:
            from repro500.verify.vouching import sign_run

            envelope = sign_run(self.run.path, *self.sign)
            self.console.print(f"Signed: {envelope}")
        self.conclude(verdict)
        return RunOutcome(self.run.path, verdict.exit_code, verdict=verdict, summaries=summaries)

    def capture(self) -> None:
        """What ran, now (the source copy, torch's runtime state); the rest of the manifest beside
        the first repeat (docs/run.md, "What a run costs")."""
        from repro500.attest import chain

        # A run resumed from before chains existed gets none rather than a chain that starts late;
        # one whose first attempt stopped before its manifest was written starts it now.
        self._chain_wanted = not self.run.file(chain.CHAIN_NAME).is_file() and (
            not self.resumed or not self.run.manifest_path().is_file()
            or not self.run.summaries(self.recipe.repeats, finished_only=False))
        self._prepared = capture.prepare(self.plan, self.run, resumed=self.resumed)
        if not yields_cpu(self.recipe):
            self._launched.set()
        self._gathered = call_in_background("repro500-capture", capture.gather, self.plan, self._prepared,
                                            yielding=yields_cpu(self.recipe), after=self._launched)

    def settle(self) -> dict[str, Any]:
        """The manifest written (or the resume recorded) and the chain started: once, on the main
        thread, the first time the run needs them; waits for the capture if it is still running."""
        from repro500.attest import chain

        if self._settled.done():
            return self._settled.result()
        assert self._gathered is not None
        self._launched.set()  # a command that never started a process: the capture goes on regardless
        if not self._gathered.done():
            self.console.print("waiting for the capture (hashing data, reading the environment) to finish ...")
        try:
            manifest = capture.settle(self.run, self.meta, self.console, self._prepared, self._gathered.result(),
                                      resumed=self.resumed)
        except BaseException as err:
            self._settled.set_exception(err)
            raise
        if self.tracking:  # the parent's manifest tags and artifacts (a resume into another store needs them too)
            self.tracking.describe(manifest, [self.run.file(n) for n in (layout.MANIFEST, layout.CODE_DIFF, layout.RECIPE)])
        started = self._chain_wanted and not self.run.file(chain.CHAIN_NAME).is_file()
        if started:
            chain.start(self.run.path, manifest["digest"]["value"], self.recipe.repeats)
        self._settled.set_result(manifest)
        ownership.record_own_run(self.run.path)  # made here: one's own even if killed before its seal
        if started:  # the repeats that ended before the chain could start, this attempt's or earlier ones
            for k in sorted(self.run.summaries(self.recipe.repeats, finished_only=False)):
                if k not in self._in_flight:  # a task's summary on disk is linked once the task has landed
                    self._link(k)
        return manifest

    def _link(self, k: int) -> None:
        """Chain repeat k's summary (once the chain exists: :meth:`settle` links what came before)."""
        from repro500.attest import chain

        if (self._settled.done() and self.run.file(chain.CHAIN_NAME).is_file()
                and self.run.repeat_summary(k) is not None):
            chain.append(self.run.path, k, self.run.repeat(k) / layout.REPEAT_SUMMARY)

    def track(self) -> None:
        # a resume cannot repeat --experiment: the run's own is in run.json
        recorded = (self.meta.get("mlflow") or {}).get("experiment")
        self.tracking = Tracking(self.experiment or recorded or f"repro500/{self.recipe.name}",
                                 mlflow_store.tracking_uri(), self.artifacts)
        if self.tracking.open(self.plan, self.meta, self.run.path.name, self.source_name, str(self.run.path.resolve()),
                              started_ms=self.started_ms):
            self.tracking.replay(self.run, self.recipe.repeats, self.meta["run_id"], self.recipe.flat_params())

    def _sync(self, k: int) -> None:
        """After repeat k: the manifest and chain (first time), k's link, what MLflow has so far,
        and whether MLflow failed behind the scenes (then the run stops here, repeats kept)."""
        linked_all = not self._settled.done() and self._chain_wanted
        self.settle()  # the first time: writes the manifest (and starts the chain, linking what ended)
        if not linked_all:
            self._link(k)
        if self.tracking:
            self.tracking.check()
            self._notes()
            self.tracking.record(self.meta)
            self.run.write_meta(self.meta)

    def repeats(self) -> tuple[dict[int, dict[str, Any]], bool]:
        """Run the repeats not yet finished; stop at the first failed one (the rest would fail alike)."""
        planned = self.recipe.repeats
        # a repeat a detached head left to SLURM is collected from its task (linked, logged), even
        # where the task has already written its summary
        uncollected = self._detached_jobs()
        summaries = {k: s for k, s in self.run.summaries(planned, finished_only=True).items() if k not in uncollected}
        todo = [k for k in range(planned) if k not in summaries]
        if self.resumed:
            self.console.print(f"Resuming [bold]{shown(self.meta['run_id'])}[/]: {len(summaries)} of {planned} repeats "
                               f"already finished; running {todo}")
        else:
            self.console.print(f"Run [bold]{shown(self.meta['run_id'])}[/] -> {shown(self.run)}")
        display = Display(self.console, planned, len(summaries))
        warm_verify(yielding=yields_cpu(self.recipe), after=self._launched)
        try:
            with display.running():
                if self.launch is not None:
                    self._fan_out(todo, summaries, display)
                    return summaries, False
                for k in todo:
                    summaries[k] = self._repeat(k, display)
                    self._prefetch_inputs(k, summaries[k])
                    self._sync(k)
                    display.finished(k, summaries[k])
                    if summaries[k]["status"] == REPEAT_FAILED or decide.look(self, summaries):
                        break
        except KeyboardInterrupt:
            return summaries, True
        return summaries, False

    def _fan_out(self, todo: list[int], summaries: dict[int, dict[str, Any]], display: Display) -> None:
        """The repeats as tasks, ``launch.parallel`` at a time (runner/fanout.py); each is linked,
        logged and shown as it lands.  After a failed repeat no new one starts (the rest would fail
        alike; a SLURM array's tasks were all submitted at once and run on); Ctrl-C stops the
        running ones (scancels the array) and keeps what finished."""
        tasks, queue = self._open_tasks(todo, display)
        looked = len(summaries)  # a sequential run's repeats up to its next look run side by side, then it looks
        failed = False  # as in turn, a run with a failed repeat takes no look
        try:
            while queue or tasks.jobs:
                # what landed frees its slot before the next repeat is submitted, and is recorded after:
                # a task's start (a fresh interpreter, seconds) then overlaps the head's linking and logging
                landed = tasks.landed()
                if any(outcome.failed for _, outcome, _ in landed):  # after a failed repeat none starts
                    queue.clear()
                    failed = True
                room, limit = tasks.room(), decide.next_look(self, looked)
                if limit is not None:  # not past the next look, which waits for every repeat before it
                    room = min(room, max(0, limit - len(summaries) - len(landed) - len(tasks.jobs)))
                starting, queue = queue[:room], queue[room:]
                self._start(tasks, starting, display)
                for k, outcome, elapsed in landed:
                    self._in_flight.discard(k)
                    summaries[k] = self._landed(k, outcome)
                    self._prefetch_inputs(k, summaries[k])
                    self._sync(k)
                    self._collected([k])  # linked: a resume after a stop here collects it again, never not at all
                    display.ended(k, summaries[k], elapsed)
                if limit is not None and landed and not tasks.jobs and len(summaries) >= limit and not failed:
                    looked = limit
                    if decide.look(self, summaries):
                        queue.clear()
                if self.detach and not queue and tasks.jobs:  # every repeat is SLURM's: the head leaves
                    self._left = tasks.leave()
                    # recorded before anything else can stop the head: a resume then collects them
                    self.meta["launcher"][fanout.DETACHED] = self._left
                    self.meta["status"] = RUN_SUBMITTED
                    self.run.write_meta(self.meta)
                    return
                time.sleep(0.1)
            note = fanout.hardware_note(self.run.summaries(self.recipe.repeats, finished_only=False))
            if note:
                self.console.print(f"[yellow]note:[/] {shown(note)}", highlight=False, soft_wrap=True)
        except BaseException as err:  # Ctrl-C, or the run stopping (MLflow failed): no task outlives the head
            reason = "interrupted by the user" if isinstance(err, KeyboardInterrupt) else "the run stopped"
            self._keep_results(tasks)
            for k in tasks.stop():
                self._in_flight.discard(k)
                self._collected([k])
                self._mark_killed(k, self.plan.seeds(k), reason)
            raise
        finally:
            if self._left is None and not self._detached_jobs():  # a folder a resume collects from stays
                tasks.close()

    def _open_tasks(self, todo: list[int], display: Display) -> tuple[Any, list[int]]:
        """The launcher's tasks, with what a detached head left to SLURM adopted (followed, not
        submitted again), and the repeats still to submit."""
        assert self.launch is not None
        recorded = self.meta.get("launcher") or {}
        left = fanout.detached_jobs(recorded)
        self.meta["launcher"] = self.launch.record()
        if left is not None:  # the tasks submitted before carry the earlier mark: it stays the run's
            self.meta["launcher"].update({fanout.SUBMISSION: recorded.get(fanout.SUBMISSION),
                                          fanout.DETACHED: recorded[fanout.DETACHED]})
        self.run.write_meta(self.meta)
        # each SLURM task checks, before its repeat, that its node runs what this one planned
        # (and, by the mark the launcher record carries, that it reads the run directory this one wrote)
        expected = {**fanout.node_fingerprint(self.plan, str(self.meta["run_id"])),
                    fanout.SUBMISSION: self.meta["launcher"][fanout.SUBMISSION]} \
            if self.launch.launcher == "slurm" else None
        tasks = fanout.tasks(self.launch, self.run, launchenv.user_environ(), self.tracking is not None, left)
        tasks.expected = expected
        display.queued(list(todo))
        for k, state, where in tasks.adopt(left, todo) if left is not None else []:
            self._in_flight.add(k)
            display.waiting(k, f"{state} as {where}")
        return tasks, [k for k in todo if k not in self._in_flight]

    def _detached_jobs(self) -> set[int]:
        """The repeats a head that left (--detach) handed to SLURM and no head has collected yet."""
        left = fanout.detached_jobs(self.meta.get("launcher") or {})
        return set(left[1]) if left else set()

    def _keep_results(self, tasks: Any) -> None:
        """Before the tasks are stopped: the repeats whose results have landed but were not yet
        collected (linked, logged) are left for the resume to collect, not stopped as killed."""
        ready = tasks.with_results()
        if not ready:
            return
        kept = tasks.leave(ready)
        left = (self.meta.get("launcher") or {}).get(fanout.DETACHED) or {"folder": kept["folder"], "jobs": {}}
        left["jobs"].update(kept["jobs"])
        self.meta["launcher"][fanout.DETACHED] = left
        self.run.write_meta(self.meta)

    def _collected(self, ks: list[int]) -> None:
        """Repeats whose detached tasks this head has collected (landed, or stopped): a later resume
        must not wait for them again."""
        left = (self.meta.get("launcher") or {}).get(fanout.DETACHED)
        if not left:
            return
        for k in ks:
            left.get("jobs", {}).pop(str(k), None)
        if not left.get("jobs"):
            del self.meta["launcher"][fanout.DETACHED]
        self.run.write_meta(self.meta)

    def _leave(self) -> RunOutcome:
        """--detach: the manifest and the chain written, the MLflow repeats opened and named, run.json
        saying what SLURM was left with; the head returns and ``--resume`` concludes the run later."""
        assert self._left is not None
        self.settle()
        if self.tracking:
            self.tracking.wait_started()
            self.tracking.leave()  # everything queued has landed: run.json names every repeat's run
            self.tracking.record(self.meta)
            self._notes()
        self.run.write_meta(self.meta)
        self.seal()
        queued = fanout.arrays(self._left["jobs"].values())
        self.console.print(f"Submitted: {len(self._left['jobs'])} repeat(s) queued as SLURM job array "
                           f"{', '.join(queued)}; the head leaves them to SLURM (squeue -j {','.join(queued)}). "
                           f"Collect them and conclude the run with: {self.resume_command}", soft_wrap=True)
        return RunOutcome(self.run.path, EXIT_OK)

    def _start(self, tasks: Any, starting: list[int], display: Display) -> None:
        """Submit *starting* as tasks, open their MLflow repeats, and show what each task is doing."""
        # submitted first: an array sbatch refuses leaves no MLflow repeat open (a task waits
        # for its MLflow run's file, so it may start before the run does)
        events = tasks.submit({k: self._mlflow_target(k, waits=False) for k in starting}) if starting else []
        for k in starting:
            if self.tracking:
                self.tracking.start_repeat(k, self.plan.seeds(k).as_dict(), self.meta["run_id"],
                                           self.recipe.flat_params())
            self._in_flight.add(k)
        for k, state, where in [*events, *tasks.progress()]:
            if state == "running":
                display.started(k, where)
            else:
                display.waiting(k, f"{state} as {where}")
        if starting:
            self._launched.set()

    def _landed(self, k: int, landed: fanout.Landed) -> dict[str, Any]:
        """Record a task's outcome as the serial loop records its repeat's."""
        if landed.interrupted:  # stopped from outside the head (its task was signalled): not this run's choice
            landed = fanout.Landed(error=RuntimeError("the repeat's task was stopped by a signal"))
        if landed.summary is None:
            return self._record_failure(k, self.plan.seeds(k), self.run.repeat(k), landed.error or RuntimeError(),
                                        landed.traceback)
        summary = landed.summary
        self._record_rank_map(k, self.run.repeat(k))
        if self.tracking:
            self.tracking.log_epochs(self.run, k)
            status = "FINISHED" if summary.get("status") != REPEAT_FAILED else "FAILED"
            self.tracking.end_repeat(k, summary, self.run.repeat_artifacts(k), status,
                                     script_runs_of=self.meta["run_id"] if self.recipe.is_command else None)
        return summary

    def _prefetch_inputs(self, k: int, summary: dict[str, Any]) -> None:
        """Hash what repeat k's command read while the next repeat runs (the digest cache makes
        the closing record of inputs.json a lookup)."""
        observed = summary.get("observed_inputs") or {}
        if observed.get("paths"):
            # one hashing thread: the next repeat is running beside it
            self._inputs[k] = call_in_background("repro500-inputs", inputs.digest, list(observed["paths"]),
                                                 inputs.budget(observed), jobs=1, budget_s=inputs.budget_s(observed),
                                                 yielding=yields_cpu(self.recipe))

    def summarise(self, summaries: dict[int, dict[str, Any]], status: str) -> None:
        """The aggregate over every repeat that has a summary (killed and failed ones too, so it
        says what happened to each), run.json's status, then the seal."""
        every = {**self.run.summaries(self.recipe.repeats, finished_only=False), **summaries}
        self.run.write_summary(aggregation.aggregate(self.meta["run_id"], self.recipe, every))
        if status != RUN_INTERRUPTED:  # an interrupted run does not hash now: the resume records them all
            for pending in self._inputs.values():
                with suppress(Exception):
                    pending.result()  # only warms the cache; the document below decides
            index = layout.read_optional_json(self.run.file(source.INDEX))  # the experiment's directory
            observed = inputs.document(every, root=index.get("root"))
            if observed is not None:
                self.run.write_inputs(observed)
                said = inputs.skipped_line(observed["skipped"])
                if said:
                    self.console.print(f"[yellow]note:[/] {said}", highlight=False, soft_wrap=True)
        if self.tracking:  # run.json names every repeat's MLflow run before the seal
            self.tracking.wait_started()
            self.tracking.record(self.meta)
        self.meta["status"] = status
        self.meta["finished_utc"] = aggregation.utc()
        self.run.write_meta(self.meta)
        self.seal()

    def seal(self) -> None:
        self.run.seal()

    def verify(self) -> Any:
        from repro500.verify.judge import verdict_for
        from repro500.verify.render import render
        from repro500.verify.verdict import write_verdict

        reference = self.meta.get("reference") or {}
        try:  # the verdict verify RUN would give, the repeat chain included
            verdict = verdict_for(self.run.path, against=reference.get("against"),
                                  margins=reference.get("margins") or None)
        except ReproError as err:  # e.g. a history with no earlier run on this system (exit 3)
            self._close_tracking("FINISHED")
            raise type(err)(f"the run itself is complete ({self.run}), but verifying it against "
                            f"{reference.get('against')} stopped: {err}") from None
        write_verdict(verdict, self.run.path)
        if self.reproduction:  # the reproduction prints one verdict, this check a section of it
            self.console.print(f"the rerun's own verdict: {verdict.status} ({self.run.path / layout.VERDICT}); "
                               "verifying it against the publication", highlight=False, soft_wrap=True)
        else:
            render(verdict, self.console)
        return verdict

    def conclude(self, verdict: Any) -> None:
        """The MLflow parent's last records (the verdict's figures, the sealed run), then end it."""
        if not self.tracking:
            return
        self.tracking.conclude(self.run, verdict, self.meta.get("design"))
        try:
            self._close_tracking("FINISHED")
        except ReproError as err:  # MLflow failed behind the repeats; the run directory has it all
            raise InvalidInput(f"the run itself is complete and verified ({verdict.status}; repro500 verify "
                               f"{self.run}), but {err}") from None

    # ----- one repeat ---------------------------------------------------------------------------
    def _repeat(self, k: int, display: Display) -> dict[str, Any]:
        out = self.run.repeat(k)
        seeds = self.plan.seeds(k)
        tracked = self.tracking is not None
        with display.repeat(k, self.recipe.fixed.get("epochs")) as hooks:
            hooks.on_started = self._launched.set
            try:
                if tracked:
                    self.tracking.start_repeat(k, seeds.as_dict(), self.meta["run_id"], self.recipe.flat_params())
                    tracking, show = self.tracking, hooks.on_epoch_end

                    def on_epoch_end(record: dict[str, Any], steps: list[dict[str, Any]]) -> None:
                        tracking.log_epoch(k, record, steps)
                        if show:
                            show(record, steps)

                    hooks.on_epoch_end = on_epoch_end
                summary = run_one(self.plan, self.run, k, self.meta["run_id"], hooks, self._mlflow_target(k))
            except KeyboardInterrupt:
                self._mark_killed(k, seeds, "interrupted by the user")
                raise
            except Exception as err:  # noqa: BLE001 - a crash of one repeat is recorded, not lost
                return self._record_failure(k, seeds, out, err)
        self._record_rank_map(k, out)
        if tracked:
            status = "FINISHED" if summary.get("status") != REPEAT_FAILED else "FAILED"
            self.tracking.end_repeat(k, summary, self.run.repeat_artifacts(k), status,
                                     script_runs_of=self.meta["run_id"] if self.recipe.is_command else None)
        return summary

    def _mlflow_target(self, k: int, waits: bool = True) -> Any:
        """Where repeat *k*'s wrapped script's own MLflow runs go (none for a trained workload or
        untracked), and the file naming the repeat's own run once it exists (track.py).  A task in
        another process cannot wait on this one's store (*waits* false): it waits for the file."""
        if self.tracking is None or not self.recipe.is_command:
            return None

        return MlflowTarget(self.tracking.uri, self.tracking.experiment, self.tracking.repeat_file(k),
                            self.tracking.wait_ready if waits else None)

    def _record_failure(self, k: int, seeds: Any, out: Path, err: BaseException,
                        trace: str | None = None) -> dict[str, Any]:
        """A crashed repeat's summary (failed); *trace*: a task's traceback, taken where it crashed."""
        out.mkdir(parents=True, exist_ok=True)
        if isinstance(err, ReproError):
            self.repeat_errors[k] = err  # re-raised with its own exit code once the run is closed
        else:
            (out / layout.ERROR_LOG).write_text(trace or redact.redact_text(traceback.format_exc()), encoding="utf-8")
        summary = {"schema": layout.REPEAT_SUMMARY_SCHEMA, "repeat": k, "status": REPEAT_FAILED,
                   "seeds": seeds.as_dict(), "metrics": {}, "error": redact.redact_text(f"{type(err).__name__}: {err}")}
        self.run.write_repeat_summary(k, summary)
        if self.tracking:
            self.tracking.end_repeat(k, summary, self.run.repeat_artifacts(k), "FAILED")
        return summary

    def _mark_killed(self, k: int, seeds: Any, reason: str) -> None:
        existing = self.run.repeat_summary(k)
        if not existing or existing.get("status") != REPEAT_KILLED:
            self.run.write_repeat_summary(k, {"schema": layout.REPEAT_SUMMARY_SCHEMA, "repeat": k, "status": REPEAT_KILLED,
                                              "seeds": seeds.as_dict(), "metrics": {}, "error": reason})
        self._link(k)
        if self.tracking:
            self.tracking.kill(k, reason)

    def _record_rank_map(self, k: int, out: Path) -> None:
        """Known only once the ranks have started (after the manifest was digested)."""
        if record_rank_map(self.meta, out / layout.RANKS, k, self.plan.device):
            self.run.write_meta(self.meta)

    # ----- closing ----------------------------------------------------------------------------
    def _table(self, summaries: dict[int, dict[str, Any]]) -> None:
        target = (self.recipe.fixed.get("target") or {}).get("metric")
        metrics = list(dict.fromkeys([*([target] if target else []), *self.recipe.acceptance]))[:4]
        Display(self.console, self.recipe.repeats, 0).table(self.recipe.name, summaries, metrics,
                                                            trained=self.recipe.kind == "trained")

    def _raise_if_failed(self, summaries: dict[int, dict[str, Any]]) -> None:
        failed = [k for k, s in summaries.items() if s.get("status") == REPEAT_FAILED]
        if not failed:
            return
        self._close_tracking("FAILED")
        resume = f"finished repeats are kept; rerun the failed one(s) with: {self.resume_command}"
        known = self.repeat_errors.get(failed[0])
        if known is not None:
            raise type(known)(f"{known}; {resume}") from None
        err = summaries[failed[0]].get("error") or "unknown error"
        where = self.run.repeat(failed[0])
        detail = (f"its output is in {where / layout.STDOUT} and {where / layout.STDERR}" if self.recipe.is_command
                  else f"the traceback is in {where / layout.ERROR_LOG}")
        raise RunFailed(f"repeat {failed[0]} failed: {err}; {detail}; {resume}")

    def _abandon(self, status: str, mlflow_status: str) -> None:
        """Record a run that stopped outside the repeat loop.  Best effort: the error that got us
        here is what the user must see, not a second one from the cleanup."""
        if not self._settled.done() and self._gathered is not None and self._gathered.done():
            with suppress(BaseException):
                self.settle()  # the manifest of a run that stopped is still the run's
        if not self._settled.done():
            self._settled.set_exception(RuntimeError("the capture did not finish"))
        with suppress(Exception):
            self._close_tracking(mlflow_status)
        if self.tracking:
            self.tracking.record(self.meta)
        if self.meta.get("status") == RUN_RUNNING:
            self.meta["status"] = status
            self.meta["finished_utc"] = aggregation.utc()
            with suppress(OSError):
                self.run.write_meta(self.meta)
                self.seal()  # a resumed run's earlier digest list must not call run.json edited

    def _close_tracking(self, status: str, **logged: Any) -> None:
        """End the MLflow parent and wait until every queued record has landed."""
        if self.tracking:
            try:
                self.tracking.close(status, **logged)
            finally:
                self._notes()

    def _notes(self) -> None:
        for note in self.tracking.take_notes():  # MLflow's side says them here, not over the display
            self.console.print(f"[yellow]warning:[/] {note}", highlight=False, soft_wrap=True)
