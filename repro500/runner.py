"""``repro500 run``: capture -> repeats -> summaries -> digest list -> MLflow -> verdict.

The run directory is the source of truth (docs/contracts.md); MLflow mirrors it.  Finished
repeats are complete on disk (their ``summary.json`` is written last and atomically) and
FINISHED in MLflow before the next one starts, so Ctrl-C, SIGTERM or a crash loses at most
the repeat in flight; ``--resume`` reruns exactly the missing repeats with the same seeds.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from repro500 import atomic, bundle
from repro500 import recipe as recipes
from repro500.capture import seeds as seeding
from repro500.errors import EXIT_INTERRUPTED, InvalidInput, ReproError, RunFailed, UsageError
from repro500.publish.datafiles import record_specs

FINISHED_STATUSES = ("completed", "diverged")


@dataclass
class RunOptions:
    recipe: str | None = None
    repeats: int | None = None
    overrides: list[str] = field(default_factory=list)
    params_file: str | None = None
    out_dir: str = "runs"
    deterministic: bool = False
    same_seed: bool = False
    open_division: bool = False
    resume: str | None = None
    nproc: int | None = None
    tracking: bool = True
    experiment: str | None = None
    run_id: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    argv: list[str] = field(default_factory=lambda: list(sys.argv))


@dataclass
class RunOutcome:
    run_dir: Path
    exit_code: int
    verdict: Any = None
    summaries: dict[int, dict[str, Any]] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
def _utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _new_run_id(name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:40]
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{safe}-{secrets.token_hex(2)}"


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a batch system's preemption) is handled like Ctrl-C: keep what finished."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _data_paths(recipe: recipes.Recipe) -> list[str]:
    ds = recipe.fixed["dataset"]
    paths: list[str] = []
    for key in ("path", "eval_path"):
        value = ds.get(key)
        if isinstance(value, str):
            paths.append(value)
        elif isinstance(value, list):
            paths.extend(str(v) for v in value)
    out = []
    for p in dict.fromkeys(paths):
        if any(ch in p for ch in "*?["):
            import glob

            matches = sorted(glob.glob(p))
            if not matches:
                raise InvalidInput(f"fixed.dataset.path {p!r} matches no file; generate the data first (repro500 data generate)")
            out.extend(matches)
        else:
            if not Path(p).exists():
                raise InvalidInput(f"dataset {p} does not exist; generate it first (repro500 data generate ...) or fix fixed.dataset.path")
            out.append(p)
    return out


# The run-level metrics every repeat's summary reports next to its evaluator's
# (repro500.workloads.train._summarise writes them; docs/run.md lists them).
SUMMARY_METRICS = ("throughput_samples_per_s", "train_flops", "flops_per_s", "valid_flops",
                   "time_to_quality_s", "epochs_to_quality", "train_time_s", "total_time_s",
                   # gradient traffic per step (None on one process): train.Traffic.per_step
                   "bytes_sent_per_step", "bytes_received_per_step", "dense_bytes_per_step",
                   "compression_ratio", "time_compress_per_step_s", "time_decompress_per_step_s",
                   "time_comm_per_step_s",
                   # measured on each rank's TCP sockets (engines.wire), mean over ranks
                   "wire_bytes_sent_per_step", "wire_bytes_received_per_step")


def resolve_device(requested: str) -> str:
    """``cpu`` or ``cuda``: what ``mutable.device`` means on this machine (auto: cuda when visible)."""
    if requested == "cpu":
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if requested == "cuda":
        raise InvalidInput("mutable.device is cuda but this machine has no usable CUDA device "
                           "(torch.cuda.is_available() is false); run with --set device=cpu or --set device=auto")
    return "cpu"


def comm_backend(engine: str, device: str) -> str | None:
    """The collective backend a distributed engine uses on ``device`` (none for ``local``)."""
    if engine == "local":
        return None
    if engine == "horovod":
        if device != "cuda":
            return "horovod-gloo"
        try:
            import horovod.torch as hvd
        except ImportError:  # reported when the launch needs it
            return "horovod-gloo"
        return "horovod-nccl" if hvd.nccl_built() else "horovod-gloo"
    return "nccl" if device == "cuda" else "gloo"


def evaluation_metrics(workload: str, info: dict[str, Any]) -> list[str]:
    """The metric names the workload's evaluator reports on this dataset.

    Asked of the evaluator itself (built as the trainer builds it, computed on nothing: every
    name with a null value), so this list cannot drift from what training reports.
    """
    from repro500.workloads.evaluation import make_evaluator

    kwargs: dict[str, Any] = {}
    if workload == "classification":
        kwargs["num_classes"] = int(info.get("num_classes") or 2)
    elif workload == "detection" and info.get("class_names"):
        kwargs["class_names"] = list(info["class_names"])
    return list(make_evaluator(workload, **kwargs).compute())


def _unknown_metric(where: str, name: str, allowed: list[str], kind: str) -> InvalidInput:
    import difflib

    close = difflib.get_close_matches(name, allowed, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return InvalidInput(f"{where} {name!r} is not {kind}; {hint}allowed: {', '.join(allowed)}")


def check_metric_names(recipe: recipes.Recipe, info: dict[str, Any]) -> None:
    """The target must be an evaluation metric (it is checked after each epoch's evaluation), and
    every acceptance metric one a repeat's summary reports."""
    evaluated = evaluation_metrics(recipe.fixed["workload"], info)
    target = recipe.fixed["target"]["metric"]
    if target not in evaluated:
        raise _unknown_metric(f"{recipe.source}: fixed.target.metric", target, evaluated,
                              "an evaluation metric of this workload")
    reported = [*evaluated, *SUMMARY_METRICS]
    for name in recipe.acceptance:
        if name not in reported:
            raise _unknown_metric(f"{recipe.source}: acceptance", name, reported, "a metric this workload reports")


@dataclass
class Preflight:
    """What the checks before training learnt: the dataset's info and the device ranks will use."""

    dataset_info: dict[str, Any]
    device: str  # cpu | cuda (mutable.device resolved on this machine)


def preflight(recipe: recipes.Recipe) -> Preflight:
    """Everything that can be checked before any training: model, dataset, data paths, device,
    compressor and engine, metric names.  Warns when CPU ranks would oversubscribe the cores."""
    from repro500.workloads.data import open_dataset
    from repro500.workloads.models import model_task

    fixed, mutable = recipe.fixed, recipe.mutable
    try:
        task = model_task(fixed["model"])
    except UsageError as err:  # a recipe's content is input, not command-line usage: exit 4
        raise InvalidInput(f"{recipe.source}: fixed.model: {err}") from None
    if task != fixed["workload"]:
        raise InvalidInput(f"{recipe.source}: model {fixed['model']} is a {task} model but fixed.workload is {fixed['workload']}")
    _data_paths(recipe)
    ds = fixed["dataset"]
    params = dict(ds.get("params") or {})
    data_seed = int(params.pop("seed", 0))
    try:
        dataset = open_dataset(ds["name"], "train", path=ds.get("path"), seed=data_seed, params=params)
    except UsageError as err:
        raise InvalidInput(f"{recipe.source}: fixed.dataset: {err}") from None
    info = dict(getattr(dataset, "info", {}))
    if info.get("task") and info["task"] != fixed["workload"]:
        raise InvalidInput(f"{recipe.source}: dataset {ds['name']} is for {info['task']}, but fixed.workload is {fixed['workload']}")
    device = resolve_device(mutable["device"])
    compressor = mutable.get("compressor", "none")
    if compressor not in ("none", None):
        from repro500.ext.compressors import get as get_compressor

        get_compressor(compressor)  # an unknown name or a bad ratio: UsageError before any work
        if mutable["engine"] == "local":
            raise UsageError("a gradient compressor needs a distributed engine: add --nproc 2 (or more)")
    if mutable["engine"] == "local" and mutable.get("nproc", 1) > 1:
        raise UsageError("mutable.nproc > 1 needs a distributed engine: --set engine=ddp (or horovod)")
    check_metric_names(recipe, info)
    if mutable["engine"] != "local":
        cores = os.cpu_count() or 1
        if device == "cpu" and mutable["nproc"] > cores:
            print(f"repro500: warning: {mutable['nproc']} ranks on {cores} CPU cores will oversubscribe the machine", file=sys.stderr)
    return Preflight(info, device)


# ---------------------------------------------------------------------------------------------
class _Run:
    """The state of one ``repro500 run`` while it executes."""

    def __init__(self, options: RunOptions, console: Console) -> None:
        self.options = options
        self.console = console
        self.tracker: Any = None
        self.parent_ended = False
        self.resumed = False
        self.repeat_errors: dict[int, ReproError] = {}
        if options.resume:
            self._open_existing(Path(options.resume))
        else:
            self._create_new()

    # ----- setup ----------------------------------------------------------------------------
    def _create_new(self) -> None:
        opts = self.options
        if not opts.recipe:
            raise UsageError("give a RECIPE file, or --resume RUN_DIR")
        self.recipe = recipes.load(opts.recipe, overrides=opts.overrides, params_file=opts.params_file,
                                   open_division=opts.open_division, repeats=opts.repeats)
        if opts.nproc is not None:
            if opts.nproc < 1:
                raise UsageError("--nproc must be at least 1")
            self.recipe.mutable["nproc"] = opts.nproc
            self.recipe.overrides["mutable.nproc"] = opts.nproc
            if (opts.nproc > 1 or opts.nnodes > 1) and self.recipe.mutable["engine"] == "local":
                self.recipe.mutable["engine"] = "ddp"
        if opts.nnodes > 1 and self.recipe.mutable["engine"] == "local":
            self.recipe.mutable["engine"] = "ddp"
        if opts.deterministic:
            self.recipe.mutable["deterministic"] = True
        self.checked = preflight(self.recipe)
        self.run_id = opts.run_id or _new_run_id(self.recipe.name)
        self.run_dir = Path(opts.out_dir) / self.run_id
        if self.run_dir.exists():
            resume = f", or complete it with: repro500 run --resume {self.run_dir}" if (self.run_dir / "run.json").is_file() else ""
            raise InvalidInput(f"run directory {self.run_dir} already exists; choose another --run-id{resume}")
        self.meta: dict[str, Any] = {
            "schema": bundle.RUN_SCHEMA,
            "run_id": self.run_id,
            "status": "running",
            "created_utc": _utc(),
            "finished_utc": None,
            "argv": self._safe_argv(),
            "recipe_path": str(opts.recipe),
            "recipe_name": self.recipe.name,
            "repeats": self.recipe.repeats,
            "same_seed": bool(opts.same_seed),
            "deterministic": bool(self.recipe.mutable.get("deterministic")),
            "open_division": self.recipe.open_division,
            "overrides": self.recipe.overrides,
            "engine": self.recipe.mutable["engine"],
            "world_size": int(self.recipe.mutable.get("nproc", 1)) * opts.nnodes,
            "nnodes": opts.nnodes,
            "compressor": self.recipe.mutable.get("compressor", "none"),
            "mlflow": None,
            "resumes": [],
        }

    def _open_existing(self, run_dir: Path) -> None:
        run_json = run_dir / "run.json"
        if not run_json.is_file():
            raise InvalidInput(f"{run_dir} is not a repro500 run directory (no run.json); nothing to resume")
        try:
            self.meta = json.loads(run_json.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise InvalidInput(f"{run_json} cannot be read ({err})") from None
        if self.meta.get("schema") != bundle.RUN_SCHEMA:
            raise InvalidInput(f"{run_json} is not a {bundle.RUN_SCHEMA} document")
        self.recipe = recipes.from_run_dir(run_dir)
        self.checked = preflight(self.recipe)
        self.run_dir = run_dir
        self.run_id = self.meta["run_id"]
        self.resumed = True
        self.meta["status"] = "running"

    def _safe_argv(self) -> list[str]:
        from repro500.redact import scrub

        return scrub(list(self.options.argv))

    # ----- the run --------------------------------------------------------------------------
    def execute(self) -> RunOutcome:
        """Run, and whatever happens close the run: run.json never stays ``running`` and the MLflow
        parent never stays RUNNING (KILLED on Ctrl-C or SIGTERM, FAILED on an error)."""
        from repro500.workloads import train

        train.environment_for_determinism()
        if self.options.tracking:
            from repro500 import tracking

            tracking.check_reachable()
        self._open_directory()
        try:
            with _sigterm_as_interrupt():
                return self._execute()
        except KeyboardInterrupt:
            self._abandon("interrupted", "KILLED")
            self.console.print(f"[yellow]Interrupted.[/] Complete the run with: repro500 run --resume {self.run_dir}")
            return RunOutcome(self.run_dir, EXIT_INTERRUPTED)
        except BaseException:
            self._abandon("failed", "FAILED")
            raise

    def _open_directory(self) -> None:
        """Create the run directory with ``recipe.yaml`` and ``run.json`` first, so that a run stopped
        at any later point can be resumed (and its --run-id is not left unusable)."""
        try:
            self.run_dir.mkdir(parents=True, exist_ok=self.resumed)
            if not self.resumed:
                atomic.write_text(self.run_dir / "recipe.yaml", self.recipe.to_yaml())
            self._write_meta()
        except FileExistsError:
            raise InvalidInput(f"run directory {self.run_dir} already exists; choose another --run-id") from None
        except OSError as err:
            raise InvalidInput(f"cannot write the run directory {self.run_dir} ({err.strerror or err}); "
                               "choose a writable --out directory") from None

    def _abandon(self, status: str, mlflow_status: str) -> None:
        """Record a run that stopped outside the repeat loop.  Best effort: the error that got us
        here is what the user must see, not a second one from the cleanup."""
        if self.meta.get("status") == "running":
            self.meta["status"] = status
            self.meta["finished_utc"] = _utc()
            with suppress(OSError):
                self._write_meta()
                bundle.write_sums(self.run_dir)  # a resumed run's earlier digest list must not call run.json edited
        with suppress(Exception):
            self._end_parent(mlflow_status)

    def _end_parent(self, status: str, **logged: Any) -> None:
        if self.tracker and not self.parent_ended:
            self.tracker.end_parent(status, **logged)
            self.parent_ended = True

    def _execute(self) -> RunOutcome:
        manifest = self._capture()
        if self.options.tracking:
            self._start_tracking(manifest)

        summaries = self._existing_summaries()
        todo = [k for k in range(self.recipe.repeats) if k not in summaries]
        if self.resumed:
            self.console.print(f"Resuming [bold]{self.run_id}[/]: {len(summaries)} of {self.recipe.repeats} repeats already finished; running {todo}")
        else:
            self.console.print(f"Run [bold]{self.run_id}[/] -> {self.run_dir}")
        interrupted = False
        try:
            with self._progress() as progress:
                repeats_task = progress.add_task("repeats", total=self.recipe.repeats, completed=len(summaries))
                for k in todo:
                    summaries[k] = self._run_repeat(k, progress)
                    progress.advance(repeats_task)
                    if summaries[k]["status"] == "failed":
                        break
        except KeyboardInterrupt:
            interrupted = True
        failed = [k for k, s in summaries.items() if s.get("status") == "failed"]
        status = "interrupted" if interrupted else "failed" if failed else "completed"
        self._finalise(summaries, status)
        if interrupted:
            self.console.print(f"[yellow]Interrupted.[/] Finished repeats are kept in {self.run_dir}; "
                               f"complete the run with: repro500 run --resume {self.run_dir}")
            self._end_parent("KILLED")
            return RunOutcome(self.run_dir, EXIT_INTERRUPTED, summaries=summaries)
        self._table(summaries)
        if failed:
            self._end_parent("FAILED")
            known = self.repeat_errors.get(failed[0])
            if known is not None:
                raise known
            err = summaries[failed[0]].get("error") or "unknown error"
            raise RunFailed(f"repeat {failed[0]} failed: {err}; the traceback is in "
                            f"{bundle.repeat_dir(self.run_dir, failed[0]) / 'error.log'} and finished repeats are kept")
        verdict = self._verify()
        return RunOutcome(self.run_dir, verdict.exit_code, verdict=verdict, summaries=summaries)

    def _capture(self) -> dict[str, Any]:
        from repro500.capture import env as env_facet
        from repro500.capture.manifest import build_manifest, write_manifest

        mutable = self.recipe.mutable
        world = int(self.meta.get("world_size") or mutable.get("nproc", 1))
        facets = {
            "runtime": self._runtime_state(env_facet),
            "distributed": {"engine": mutable["engine"], "world_size": world,
                            "backend": comm_backend(mutable["engine"], self.checked.device),
                            "compressor": mutable.get("compressor", "none"),
                            "comm_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "GLOO_"))},
                            "rank_plan": rank_plan(int(mutable.get("nproc", 1)), int(self.meta.get("nnodes") or 1),
                                                   self.options.node_rank, self.checked.device)},
        }
        manifest, artifacts = build_manifest(
            _data_paths(self.recipe), extra_facets=facets, progress=True, seed=self.recipe.seed,
            repeats=self.recipe.repeats, world_size=world, same_seed=bool(self.meta.get("same_seed")))
        if self.resumed and (self.run_dir / "manifest.json").is_file():
            self._record_resume(manifest)
            return json.loads((self.run_dir / "manifest.json").read_text(encoding="utf-8"))
        if self.resumed:  # the first attempt stopped before its capture finished: this one is the run's
            self.meta.setdefault("resumes", []).append({
                "utc": _utc(), "manifest_digest": manifest["digest"]["value"], "result_relevant_differences": []})
        write_manifest(manifest, artifacts, self.run_dir)
        record_specs(manifest, self.run_dir)  # while the data is here: how to recreate it elsewhere
        return manifest

    def _runtime_state(self, env_facet: Any) -> dict[str, Any]:
        from repro500.workloads import train

        train.set_determinism(bool(self.recipe.mutable.get("deterministic")))
        state = env_facet.runtime_state()
        train.set_determinism(False)
        return state

    def _record_resume(self, manifest: dict[str, Any]) -> None:
        from repro500.capture.manifest import load_manifest
        from repro500.verify.diff import diff_manifests, is_result_relevant

        original = load_manifest(self.run_dir / "manifest.json")
        relevant = [d for d in diff_manifests(original, manifest) if is_result_relevant(d)]
        if relevant:
            shown = "; ".join(f"{d.facet}.{d.key}: {d.a!r} -> {d.b!r}" for d in relevant[:3])
            self.console.print(f"[yellow]warning:[/] the environment changed since the run started: {shown}")
        self.meta.setdefault("resumes", []).append({
            "utc": _utc(), "manifest_digest": manifest["digest"]["value"],
            "result_relevant_differences": [f"{d.facet}.{d.key}" for d in relevant],
        })

    def _start_tracking(self, manifest: dict[str, Any]) -> None:
        from repro500 import tracking
        from repro500.capture.hardware import gpu_model

        self.tracker = tracking.Tracker(self.options.experiment or f"repro500/{self.recipe.name}")
        previous = self.meta.get("mlflow") or {}
        if self.resumed and previous.get("parent_run_id") and previous.get("tracking_uri") == tracking._safe_uri(self.tracker.uri):
            self.tracker.resume_parent(previous["parent_run_id"])
            self.meta["mlflow"]["repeat_run_ids"] = previous.get("repeat_run_ids", {})
        else:
            code = manifest.get("facets", {}).get("code", {}) or {}
            mutable = self.recipe.mutable
            compressor = mutable.get("compressor", "none")
            tags = {
                "repro500.run_id": self.run_id,
                "repro500.manifest_digest": manifest["digest"]["value"],
                "repro500.recipe": self.recipe.name,
                "repro500.dirty": str(bool(code.get("dirty"))).lower(),
                "repro500.gpu_model": gpu_model(manifest),
                "repro500.world_size": str(self.meta.get("world_size", 1)),
                "repro500.engine": mutable["engine"],
                "repro500.compressor": compressor if isinstance(compressor, str) else compressor.get("name", "?"),
                "repro500.open_division": str(self.recipe.open_division).lower(),
                "repro500.deterministic": str(bool(mutable.get("deterministic"))).lower(),
                "repro500.repeats": str(self.recipe.repeats),
                "mlflow.source.name": str(self.options.recipe or self.recipe.source),
                "mlflow.source.type": "LOCAL",
            }
            if code.get("commit"):
                tags["mlflow.source.git.commit"] = code["commit"]
            if code.get("branch"):
                tags["mlflow.source.git.branch"] = code["branch"]
            remotes = {r["name"]: r["url"] for r in code.get("remotes") or [] if r.get("url")}
            if remotes:
                tags["mlflow.source.git.repoURL"] = remotes.get("origin") or next(iter(remotes.values()))
            parent = self.tracker.start_parent(self.run_id, self.recipe.flat_params(), tags)
            self.meta["mlflow"] = {"tracking_uri": tracking._safe_uri(self.tracker.uri),
                                   "experiment_id": self.tracker.experiment_id,
                                   "parent_run_id": parent, "repeat_run_ids": {}}
            files = [self.run_dir / n for n in ("manifest.json", "code.diff", "recipe.yaml")]
            self.tracker.log_artifacts(parent, files)
        self._write_meta()

    def _existing_summaries(self) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for k in range(self.recipe.repeats):
            path = bundle.repeat_dir(self.run_dir, k) / "summary.json"
            if path.is_file():
                try:
                    summary = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, json.JSONDecodeError):
                    continue
                if summary.get("status") in FINISHED_STATUSES:
                    out[k] = summary
        return out

    def _repeat_seeds(self, k: int, rank: int = 0) -> seeding.Seeds:
        source = 0 if self.meta.get("same_seed") else k
        return seeding.derive(self.recipe.seed, source, rank)

    def _run_repeat(self, k: int, progress: Progress) -> dict[str, Any]:
        from repro500.workloads import train

        out = bundle.repeat_dir(self.run_dir, k)
        if out.exists():
            shutil.rmtree(out)  # an unfinished attempt: start this repeat afresh with the same seeds
        out.mkdir(parents=True)
        seeds = self._repeat_seeds(k)
        spec = train.TrainSpec.from_recipe(self.recipe.fixed, self.recipe.mutable)
        mlflow_id = None
        epoch_task = progress.add_task(f"repeat {k} epoch 1/{spec.epochs}", total=None)

        def on_epoch_start(epoch: int, steps: int) -> None:
            progress.reset(epoch_task, total=steps, description=f"repeat {k} epoch {epoch}/{spec.epochs}")

        def on_step(record: dict[str, Any]) -> None:
            progress.advance(epoch_task)

        def on_epoch_end(record: dict[str, Any], steps: list[dict[str, Any]]) -> None:
            if self.tracker and mlflow_id:
                self.tracker.log_epoch(mlflow_id, record, steps)

        callbacks = train.Callbacks(on_epoch_start, on_step, on_epoch_end)
        try:
            if self.tracker:
                mlflow_id = self.tracker.start_repeat(k, {"repro500.seed": str(seeds.torch), "repro500.run_id": self.run_id},
                                                      params=self.recipe.flat_params())
                self.meta["mlflow"]["repeat_run_ids"][str(k)] = mlflow_id
                self._write_meta()
            if self.recipe.mutable.get("engine", "local") == "local":
                summary = train.train_repeat(spec, k, seeds, out, callbacks=callbacks)
            else:
                from repro500.workloads.engines import launch

                summary = launch.run_distributed(self.recipe, spec, k, seeds, out, callbacks=callbacks,
                                                 rendezvous=rendezvous(self.options))
        except KeyboardInterrupt:
            self._mark_killed(k, seeds, out, mlflow_id, "interrupted by the user")
            progress.remove_task(epoch_task)
            raise
        except Exception as err:  # noqa: BLE001 - a crash of one repeat is recorded, not lost
            if isinstance(err, ReproError):
                self.repeat_errors[k] = err  # re-raised with its own exit code once the run is closed
            else:
                (out / "error.log").write_text(traceback.format_exc(), encoding="utf-8")
            summary = {"schema": bundle.REPEAT_SUMMARY_SCHEMA, "repeat": k, "status": "failed",
                       "seeds": seeds.as_dict(), "metrics": {}, "error": f"{type(err).__name__}: {err}"}
            atomic.write_json(out / "summary.json", summary)
            if self.tracker and mlflow_id:
                self.tracker.end_repeat(mlflow_id, summary, [out / "summary.json", out / "error.log"], "FAILED")
            progress.remove_task(epoch_task)
            return summary
        progress.remove_task(epoch_task)
        self._record_rank_map(k, out)
        if self.tracker and mlflow_id:
            files = [out / n for n in ("summary.json", "metrics.jsonl", "mllog.txt")]
            try:
                self.tracker.end_repeat(mlflow_id, summary, files, "FINISHED")
            except BaseException:
                # the repeat is complete on disk: whatever stopped the logging, MLflow must not
                # keep it RUNNING (a Ctrl-C here used to leave it so)
                with suppress(Exception):
                    self.tracker.client.set_terminated(mlflow_id, status="FINISHED")
                raise
        return summary

    def _record_rank_map(self, k: int, out: Path) -> None:
        """Copy repeat k's rank -> host / device map from ``ranks.json`` into ``run.json``.

        It is known only once the ranks have started, after the manifest was captured and digested,
        so it lives in run.json (docs/distributed.md)."""
        path = out / "ranks.json"
        if not path.is_file():
            return
        try:
            ranks = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return
        record = self.meta.setdefault("distributed", {})
        record["backend"] = ranks.get("backend")
        record.setdefault("rank_maps", {})[str(k)] = rank_map(ranks, self.checked.device)
        self._write_meta()

    def _mark_killed(self, k: int, seeds: seeding.Seeds, out: Path, mlflow_id: str | None, reason: str) -> None:
        summary = {"schema": bundle.REPEAT_SUMMARY_SCHEMA, "repeat": k, "status": "killed",
                   "seeds": seeds.as_dict(), "metrics": {}, "error": reason}
        atomic.write_json(out / "summary.json", summary)
        if self.tracker and mlflow_id:
            self.tracker.kill(mlflow_id, reason)

    def _finalise(self, summaries: dict[int, dict[str, Any]], status: str) -> None:
        # include killed/failed repeats' summaries too, so the aggregate says what happened to each
        all_summaries = dict(summaries)
        for k in range(self.recipe.repeats):
            path = bundle.repeat_dir(self.run_dir, k) / "summary.json"
            if k not in all_summaries and path.is_file():
                with suppress(OSError, json.JSONDecodeError):
                    all_summaries[k] = json.loads(path.read_text(encoding="utf-8"))
        atomic.write_json(self.run_dir / "summary.json", aggregate(self.run_id, self.recipe, all_summaries))
        self.meta["status"] = status
        self.meta["finished_utc"] = _utc()
        self._write_meta()
        bundle.write_sums(self.run_dir)

    def _write_meta(self) -> None:
        atomic.write_json(self.run_dir / "run.json", self.meta)

    def _verify(self) -> Any:
        from repro500.verify.verdict import render, verify_run, write_verdict

        verdict = verify_run(self.run_dir)
        write_verdict(verdict, self.run_dir)
        render(verdict, self.console)
        if self.tracker:
            self.tracker.log_artifacts(self.tracker.parent_id, [self.run_dir / "summary.json", self.run_dir / "verdict.json"])
            means = {f"mean_{name}": sum(m["values"]) / len(m["values"])
                     for name, m in json.loads((self.run_dir / "summary.json").read_text())["metrics"].items()
                     if m["values"]}
            self._end_parent("FINISHED", metrics=means, tags={"repro500.verdict": verdict.status})
        return verdict

    @contextmanager
    def _progress(self) -> Iterator[Progress]:
        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=self.console, transient=True)
        with progress:
            yield progress

    def _table(self, summaries: dict[int, dict[str, Any]]) -> None:
        metric = self.recipe.fixed["target"]["metric"]
        table = Table(title=f"{self.recipe.name}: {len(summaries)} repeats")
        for col in ("repeat", "status", "epochs", metric, "time_to_quality_s", "throughput_samples_per_s", "params"):
            table.add_column(col)
        for k in sorted(summaries):
            s = summaries[k]
            m = s.get("metrics") or {}
            table.add_row(str(k), s.get("status", "?"), str(s.get("epochs_run", "")), _fmt(m.get(metric)),
                          _fmt(s.get("time_to_quality_s")), _fmt(m.get("throughput_samples_per_s")),
                          (s.get("final_param_digest") or "")[:12])
        self.console.print(table)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def rank_plan(nproc: int, nnodes: int, node_rank: int, device: str) -> dict[str, dict[str, Any]]:
    """The rank -> host / GPU map the launch will make, known before any rank starts.

    Keyed by global rank (``node_rank * nproc + local_rank``, torchrun's static rendezvous and
    horovodrun alike); a rank on a CUDA device uses GPU ``local_rank % count`` as the workers
    choose it.  Hosts and GPU models are known only for this node's ranks (the capturing node);
    other nodes' are null.  What the ranks then reported is ``run.json``'s ``rank_maps``.
    """
    host = socket.gethostname()
    gpus: list[str] = []
    if device == "cuda":
        import torch

        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    plan = {}
    for node in range(nnodes):
        for local in range(nproc):
            here = node == node_rank
            index = local % len(gpus) if gpus else local
            plan[str(node * nproc + local)] = {
                "node_rank": node, "local_rank": local, "host": host if here else None,
                "device": f"cuda:{index}" if device == "cuda" else "cpu",
                "gpu": gpus[index] if gpus and here else None,
            }
    return plan


def rank_map(ranks: dict[str, Any], device: str) -> list[dict[str, Any]]:
    """Per rank of a ``repro500/ranks/v1`` document: host, local rank, device, GPU model and the
    ``NCCL_*`` / ``GLOO_*`` variables it ran with.  A CUDA rank uses GPU ``local_rank % count``, as
    the ddp worker chooses; the model is read from that host's hardware facet (NVML order)."""
    out = []
    for r in ranks.get("ranks") or []:
        entry: dict[str, Any] = {"rank": r.get("rank"), "host": r.get("host"), "local_rank": r.get("local_rank"),
                                 "device": "cpu", "gpu": None, "env": r.get("env") or {}}
        gpus = (r.get("hardware") or {}).get("gpus") or []
        if device == "cuda" and gpus and isinstance(r.get("local_rank"), int):
            index = r["local_rank"] % len(gpus)
            entry["device"] = f"cuda:{index}"
            entry["gpu"] = gpus[index].get("name")
        out.append(entry)
    return out


def aggregate(run_id: str, recipe: recipes.Recipe, summaries: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The aggregate ``summary.json`` (repro500/summary/v1): values of completed repeats per metric."""
    metrics: dict[str, dict[str, list[Any]]] = {}
    for k in sorted(summaries):
        s = summaries[k]
        if s.get("status") != "completed":
            continue
        for name, value in (s.get("metrics") or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                entry = metrics.setdefault(name, {"repeats": [], "values": []})
                entry["repeats"].append(k)
                entry["values"].append(value)
    return {
        "schema": bundle.SUMMARY_SCHEMA,
        "run_id": run_id,
        "recipe_name": recipe.name,
        "workload": recipe.fixed["workload"],
        "repeats_planned": recipe.repeats,
        "repeats": {str(k): summaries[k].get("status", "unknown") for k in sorted(summaries)},
        "acceptance": recipe.acceptance,
        "target": recipe.fixed["target"],
        "metrics": metrics,
        "final_param_digests": {str(k): s.get("final_param_digest") for k, s in sorted(summaries.items()) if s.get("final_param_digest")},
        "seeds": {str(k): (s.get("seeds") or {}).get("torch") for k, s in sorted(summaries.items())},
    }


def rendezvous(options: RunOptions) -> dict[str, Any] | None:
    """torchrun's multi-node rendezvous (static: node 0 hosts rank 0)."""
    if options.nnodes <= 1:
        return None
    return {"nnodes": options.nnodes, "node_rank": options.node_rank, "endpoint": options.rdzv_endpoint}


def _check_multinode(options: RunOptions) -> None:
    if options.nnodes <= 1:
        return
    if not options.rdzv_endpoint or not options.run_id:
        raise UsageError("a multi-node run needs --rdzv-endpoint HOST:PORT and the same --run-id on every node")
    if not 0 <= options.node_rank < options.nnodes:
        raise UsageError(f"--node-rank must be in 0..{options.nnodes - 1}")
    if options.resume:
        raise UsageError("--resume is for single-node runs; rerun the multi-node run with a new --run-id")


def _follow_node(options: RunOptions, console: Console) -> RunOutcome:
    """A node other than 0 of a multi-node run: it only hosts ranks; node 0 captures, logs and writes."""
    import tempfile

    from repro500.workloads import train
    from repro500.workloads.engines import launch

    recipe = recipes.load(options.recipe or "", overrides=options.overrides, params_file=options.params_file,
                          open_division=options.open_division, repeats=options.repeats)
    if options.nproc:
        recipe.mutable["nproc"] = options.nproc
    if recipe.mutable["engine"] == "local":
        recipe.mutable["engine"] = "ddp"
    if options.deterministic:
        recipe.mutable["deterministic"] = True
    preflight(recipe)
    spec = train.TrainSpec.from_recipe(recipe.fixed, recipe.mutable)
    assert options.run_id is not None
    with tempfile.TemporaryDirectory(prefix="repro500-node-") as scratch:
        for k in range(recipe.repeats):
            seeds = seeding.derive(recipe.seed, 0 if options.same_seed else k, 0)
            console.print(f"node {options.node_rank}: repeat {k} of run {options.run_id}")
            out = Path(scratch) / str(k)
            out.mkdir()
            launch.run_distributed(recipe, spec, k, seeds, out, rendezvous=rendezvous(options),
                                   expect_summary=False)
    return RunOutcome(Path(options.out_dir) / options.run_id, 0)


def run(options: RunOptions, console: Console | None = None) -> RunOutcome:
    """Run a recipe (or resume a run); the library entry point behind ``repro500 run``."""
    console = console or Console(stderr=False)
    _check_multinode(options)
    if options.node_rank > 0:
        return _follow_node(options, console)
    return _Run(options, console).execute()
