"""MLPerf-format logs (``:::MLLOG`` lines) for each repeat, written with mlperf-logging's mllog.

The trainer drives one ``MLPerfLogger`` per repeat::

    with MLPerfLogger(run_dir / "repeats/0/mllog.txt", benchmark="resnet", seed=1234,
                      global_batch_size=128, train_samples=50000, eval_samples=10000,
                      optimizer=OptimizerInfo("sgd", base_lr=0.1, momentum=0.9)) as mll:
        mll.init_start(); ...build model and data...; mll.init_stop()
        mll.run_start()
        for epoch in range(1, epochs + 1):
            mll.epoch_start(epoch); ...train...; mll.epoch_stop(epoch)
            mll.eval_start(epoch); metrics = ...; mll.eval_stop(epoch)
            mll.log_eval(metrics, epoch)
        mll.run_stop("success" if reached_target else "aborted")

``mlperf_check.check_compliance(path)`` runs MLPerf's own compliance checker on a finished log:
ResNet logs against ``--usage training --ruleset 4.0.0`` and CosmoFlow logs against
``--usage hpc --ruleset 3.0.0``.  What those rules require, and what a short CPU run can
satisfy, is in docs/workloads.md ("MLPerf-format logs").

mllog's module-level logger is process-global and prints to stdout; every
``MLPerfLogger`` instead owns a private ``logging.Logger`` (not registered with the
logging module, so nothing else can attach to it) with one file handler, closed at the
end, so several repeats in one process never write into each other's files.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro500.errors import UsageError

# the hyperparameter records live beside the logger; importers of this module find them here too
from repro500.mlperf.hparams import OPTIMIZER_NAMES, OptimizerInfo, optimizer_records  # noqa: F401


@dataclass(frozen=True)
class BenchmarkRules:
    usage: str | None  # compliance checker --usage; None: MLPerf has no such benchmark
    ruleset: str | None  # compliance checker --ruleset
    eval_key: str  # the MLLOG key of the quality figure
    eval_metric: str  # the repro500 evaluation metric logged under eval_key


BENCHMARKS: dict[str, BenchmarkRules] = {
    "resnet": BenchmarkRules("training", "4.0.0", "eval_accuracy", "accuracy"),
    # MLPerf HPC CosmoFlow scores the mean absolute error of the normalised parameters.
    "cosmoflow": BenchmarkRules("hpc", "3.0.0", "eval_error", "mae"),
    # No MLPerf counterpart (HPC AI500's Extreme Weather): same format, no official rules.
    "extreme_weather": BenchmarkRules(None, None, "eval_accuracy", "map_50"),
}

# Which MLPerf benchmark a repro500 task's log is written as.
BENCHMARK_FOR_TASK = {
    "classification": "resnet",
    "regression": "cosmoflow",
    "detection": "extreme_weather",
}

RUN_STATUSES = ("success", "aborted")
SUBMISSION_STATUSES = ("cloud", "onprem", "preview", "research")
DIVISIONS = ("open", "closed")


def run_division(declared: str | None, overridden: bool) -> tuple[str, str]:
    """(division, why) of a run: what its MLPerf logs say and ``export mlperf`` labels it, the one
    rule for both.  Closed only where the recipe declares ``fixed.mlperf_division: closed`` (it
    claims to be MLPerf's reference benchmark) and the run kept that definition."""
    if overridden:
        return "open", "the run overrode fixed keys of its recipe (--open-division)"
    if declared == "closed":
        return "closed", "its recipe declares fixed.mlperf_division: closed and the run kept its definition"
    if declared == "open":
        return "open", "its recipe declares fixed.mlperf_division: open (not MLPerf's reference benchmark)"
    return "open", "its recipe does not declare fixed.mlperf_division: closed (MLPerf's reference benchmark)"


def _plain(value: Any) -> Any:
    """A value mllog can encode as strict JSON (torch scalars, tuples; no NaN)."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    return value


def _default_platform() -> str:
    return f"{os.cpu_count() or 1}x{platform.machine() or 'cpu'}"


def _check_submission(division: str, submission_status: str) -> None:
    if division not in DIVISIONS:
        raise UsageError(f"MLPerf division {division!r} is not one of {', '.join(DIVISIONS)}.")
    if submission_status not in SUBMISSION_STATUSES:
        raise UsageError(
            f"MLPerf status {submission_status!r} is not one of {', '.join(SUBMISSION_STATUSES)}."
        )


def _run_records(
    benchmark: str,
    global_batch_size: int,
    world_size: int,
    target: Mapping[str, Any] | None,
    hyperparameters: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The records of this run beyond the submission's and the optimizer's; ``hyperparameters``
    last, so a caller's own value wins."""
    records: dict[str, Any] = {}
    if benchmark == "resnet":
        # Samples each BatchNorm normalises over: the per-process batch, no sync-BN.
        records["model_bn_span"] = int(global_batch_size) // max(1, world_size)
    if target:
        # repro500's own quality target (the recipe's), next to MLPerf's fixed one.
        records["repro500_quality_target"] = dict(target)
    records.update(hyperparameters or {})
    return records


class MLPerfLogger:
    """One repeat's MLPerf log, written line by line (each line flushed) to ``path``.

    ``benchmark``: "resnet", "cosmoflow", "extreme_weather" or any other name (logged as
    ``submission_benchmark``; only the first two have official rules).  ``optimizer`` is an
    ``OptimizerInfo`` or a recipe's optimizer mapping (with ``lr_schedule`` and the epoch
    budget ``epochs``, see ``OptimizerInfo.from_recipe``).  ``target`` (the recipe's
    ``{metric, value, direction}``) is logged as ``repro500_quality_target``.  The set sizes
    may be given here or later with ``log_samples``.  ``division`` is
    "open" (default: repro500's workloads and data are not MLPerf's) or "closed".
    ``cache_cleared`` is logged as ``cache_clear``'s value: repro500 does not drop the
    operating system's page cache (that needs root), so it is ``False`` unless the caller
    did.  Calls must come in MLPerf's order (init, run, epochs/evals, run_stop); an out of
    order call raises ``RuntimeError`` (a bug in the caller, not a user error).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        benchmark: str,
        seed: int,
        global_batch_size: int,
        optimizer: OptimizerInfo | Mapping[str, Any],
        lr_schedule: Mapping[str, Any] | None = None,
        epochs: int | None = None,
        target: Mapping[str, Any] | None = None,
        train_samples: int | None = None,
        eval_samples: int | None = None,
        gradient_accumulation_steps: int = 1,
        world_size: int = 1,
        nodes: int = 1,
        accelerators_per_node: int = 0,
        division: str = "open",
        org: str = "repro500",
        platform_name: str | None = None,
        submission_status: str = "research",
        cache_cleared: bool = False,
        hyperparameters: Mapping[str, Any] | None = None,
    ) -> None:
        _check_submission(division, submission_status)
        rules = BENCHMARKS.get(benchmark, BenchmarkRules(None, None, "eval_accuracy", "accuracy"))
        if not isinstance(optimizer, OptimizerInfo):
            optimizer = OptimizerInfo.from_recipe(optimizer, lr_schedule, epochs)
        self.path = Path(path)
        self.benchmark = benchmark
        self.rules = rules
        self._state = "new"
        self._staging = False
        self._records: dict[str, Any] = {
            "submission_benchmark": benchmark,
            "submission_division": division,
            "submission_org": org,
            "submission_platform": platform_name or _default_platform(),
            "submission_status": submission_status,
            "cache_clear": bool(cache_cleared),
            "seed": int(seed),
            "global_batch_size": int(global_batch_size),
            "gradient_accumulation_steps": int(gradient_accumulation_steps),
            "number_of_nodes": int(nodes),
            "accelerators_per_node": int(accelerators_per_node),
            **optimizer_records(benchmark, optimizer),
        }
        self._records.update(_run_records(benchmark, global_batch_size, world_size, target, hyperparameters))
        self._samples_logged = False
        self._samples = (train_samples, eval_samples)
        self._open_log_file()

    def _open_log_file(self) -> None:
        """The log's own file handler and the mllog logger writing through it."""
        from mlperf_logging.mllog import mllog

        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A private logger, not logging.getLogger(): nothing global, nothing left behind.
        self._logger = logging.Logger(f"repro500.mllog:{self.path}", level=logging.INFO)
        self._handler = logging.FileHandler(self.path, mode="w", encoding="utf-8")
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        self._logger.addHandler(self._handler)
        # stack_offset=2 makes mllog's file/lineno metadata name the public method below.
        self._mllog = mllog.MLLogger(logger=self._logger, default_stack_offset=2)

    # -- plumbing -------------------------------------------------------------------------
    def _log(
        self, kind: str, key: str, value: Any = None, metadata: Mapping[str, Any] | None = None
    ) -> None:
        if self._handler is None:
            raise RuntimeError(f"MLPerf log {self.path} is already closed.")
        write = {"start": self._mllog.start, "end": self._mllog.end, "event": self._mllog.event}[
            kind
        ]
        write(key=key, value=_plain(value), metadata=_plain(dict(metadata)) if metadata else None)

    def _advance(self, expected: tuple[str, ...], new_state: str, call: str) -> None:
        if self._state not in expected:
            raise RuntimeError(
                f"MLPerfLogger.{call}() called in state {self._state!r}; expected {expected}."
            )
        self._state = new_state

    # -- what the trainer calls -----------------------------------------------------------
    def init_start(self) -> None:
        """Start of initialisation; also logs the submission, seed and hyperparameter keys."""
        self._advance(("new",), "init", "init_start")
        self._log("start", "init_start")
        # submission_division must precede init_stop: it sets the checker's init time limit.
        for key, value in self._records.items():
            self._log("event", key, value)
        if None not in self._samples:
            self.log_samples(*self._samples)

    def log_samples(self, train_samples: int, eval_samples: int) -> None:
        """The training and evaluation set sizes (samples); once, e.g. once the data is built."""
        if self._samples_logged:
            raise RuntimeError("MLPerfLogger.log_samples() may be called only once per log.")
        self._samples_logged = True
        self._log("event", "train_samples", int(train_samples))
        self._log("event", "eval_samples", int(eval_samples))

    def init_stop(self) -> None:
        self._advance(("init",), "initialised", "init_stop")
        self._log("end", "init_stop")

    def run_start(self) -> None:
        """Start of the timed run (MLPerf's time-to-train runs from here to run_stop)."""
        self._advance(("initialised",), "running", "run_start")
        if not self._samples_logged:
            # Not fatal to the training run, but MLPerf's checker will reject this log.
            warnings.warn(
                f"MLPerf log {self.path}: train_samples/eval_samples not logged; call log_samples().",
                RuntimeWarning,
                stacklevel=2,
            )
        self._log("start", "run_start")

    def staging_start(self) -> None:
        """Data staging: during initialisation or the run (HPC 3.0 need not time it)."""
        if self._state not in ("init", "initialised", "running"):
            raise RuntimeError(
                f"MLPerfLogger.staging_start() needs init_start() first (state {self._state!r})."
            )
        self._staging = True
        self._log("start", "staging_start")

    def staging_stop(self) -> None:
        # The HPC checker fails on a staging_stop that no staging_start preceded.
        if not self._staging:
            raise RuntimeError("MLPerfLogger.staging_stop() needs staging_start() first.")
        self._staging = False
        self._log("end", "staging_stop")

    def _require_running(self, call: str) -> None:
        if self._state != "running":
            raise RuntimeError(
                f"MLPerfLogger.{call}() needs run_start() first (state {self._state!r})."
            )

    def block_start(self, first_epoch: int, epoch_count: int = 1) -> None:
        self._require_running("block_start")
        self._log(
            "start",
            "block_start",
            metadata={"first_epoch_num": first_epoch, "epoch_count": epoch_count},
        )

    def block_stop(self, first_epoch: int) -> None:
        self._require_running("block_stop")
        self._log("end", "block_stop", metadata={"first_epoch_num": first_epoch})

    def epoch_start(self, epoch: int) -> None:
        self._require_running("epoch_start")
        self._log("start", "epoch_start", metadata={"epoch_num": epoch})

    def epoch_stop(self, epoch: int) -> None:
        self._require_running("epoch_stop")
        self._log("end", "epoch_stop", metadata={"epoch_num": epoch})

    def eval_start(self, epoch: int) -> None:
        self._require_running("eval_start")
        self._log("start", "eval_start", metadata={"epoch_num": epoch})

    def eval_stop(self, epoch: int) -> None:
        self._require_running("eval_stop")
        self._log("end", "eval_stop", metadata={"epoch_num": epoch})

    def eval_accuracy(self, value: float | None, epoch: int) -> bool:
        """Log the quality figure under the benchmark's key (``eval_error`` for cosmoflow).

        An undefined value (None, NaN, inf: e.g. a diverged model) is logged as
        ``eval_undefined`` instead, because the checker's rules compare the value with
        numbers and would fail on it.  Returns whether the quality figure was logged.
        """
        self._require_running("eval_accuracy")
        number = None if value is None else float(value)
        if number is None or not math.isfinite(number):
            self._log("event", "eval_undefined", self.rules.eval_key, metadata={"epoch_num": epoch})
            return False
        self._log("event", self.rules.eval_key, number, metadata={"epoch_num": epoch})
        return True

    def log_eval(self, metrics: Mapping[str, float | None], epoch: int) -> bool:
        """Log ``metrics[benchmark's eval metric]`` (accuracy, mae, map_50) as the eval figure."""
        return self.eval_accuracy(metrics.get(self.rules.eval_metric), epoch)

    def event(self, key: str, value: Any = None, metadata: Mapping[str, Any] | None = None) -> None:
        """Any other key (e.g. ``trained_samples``); the checker ignores keys it has no rule for."""
        self._log("event", key, value, metadata)

    def run_stop(self, status: str | bool) -> None:
        """End of the timed run: ``"success"`` (or True: target reached) or ``"aborted"`` (False).

        Idempotent, and a no-op when ``run_start`` never came (nothing was timed), so error
        handlers can always call it.
        """
        if isinstance(status, bool):
            status = "success" if status else "aborted"
        if status not in RUN_STATUSES:
            raise UsageError(
                f"MLPerf run status {status!r} is not one of {', '.join(RUN_STATUSES)}."
            )
        if self._state != "running":
            return
        self._state = "stopped"
        self._log("end", "run_stop", metadata={"status": status})

    def close(self) -> None:
        """Flush and close the file; further calls raise RuntimeError."""
        if self._handler is not None:
            self._logger.removeHandler(self._handler)
            self._handler.close()
            self._handler = None

    def __enter__(self) -> MLPerfLogger:
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        # A crash or Ctrl-C inside the run still ends the log with an aborted run_stop.
        try:
            if exc_type is not None:
                self.run_stop("aborted")
        finally:
            self.close()
