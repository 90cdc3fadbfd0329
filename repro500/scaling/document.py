"""The ``repro500/scaling/v1`` document: fit, workload, predictions, the check, assumptions.

:func:`build` gathers the inputs (a run directory and/or explicit values), fits the model to
this machine's collective timings and predicts; :func:`write` stores the document as
``RUN/derived/scaling.json`` (a view: ``derived/`` is not covered by SHA256SUMS, and
``repro500 report`` plots it).  docs/scaling.md documents every field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from repro500 import __version__
from repro500.errors import UsageError
from repro500.ext import specs
from repro500.rundir import atomic, layout
from repro500.rundir.names import SCALING_SCHEMA
from repro500.rundir.writable import writing
from repro500.scaling import fit as fitting
from repro500.scaling import measure, predict, sizes, wire
from repro500.scaling.alphabeta import FORMULAS
from repro500.scaling.rundir import RunTimings, read_run

SCHEMA = SCALING_SCHEMA
PATH = Path(layout.SCALING)
# The check at the run's P compares the communication cost of a step, measured and predicted.
# The alpha-beta fits on a shared loopback leave relative residuals of 17-35 % (docs/scaling.md);
# within +-50 % means "predicted between half and one and a half times the measured cost".
COMM_TOLERANCE = 0.5


@dataclass(frozen=True)
class Inputs:
    """What a prediction is asked for; None means "take it from the run directory"."""

    run_dir: Path | None = None
    params: int | None = None
    model_name: str | None = None
    compressor: str | Mapping[str, Any] | None = None
    compute_time_s: float | None = None
    compute_run_dir: Path | None = None  # a single-rank run whose steps give the compute time
    p_values: tuple[int, ...] = predict.DEFAULT_P
    overlap: float = 0.0


def _ran_with(run: RunTimings | None, spec: Mapping[str, Any]) -> bool:
    """Whether *run* exchanged gradients on several ranks with the compressor *spec*."""
    if run is None or run.world_size < 2:
        return False

    # run.json records a seed the trainer derives per repeat as None (ext/specs.py): resolvable here.
    ran = specs.resolve(run.compressor, seed_per_repeat=True)
    # The trainer derives a compressor's seed from the repeat when the recipe gives none.
    return {k: v for k, v in ran.items() if k != "seed"} == {k: v for k, v in spec.items() if k != "seed"}


def _params(inputs: Inputs, run: RunTimings | None) -> tuple[int, str]:
    if inputs.params is not None and inputs.model_name is not None:
        raise UsageError("give either --params or --model, not both")
    if inputs.params is not None:
        if inputs.params < 1:
            raise UsageError(f"--params {inputs.params} must be a positive number of parameters")
        return inputs.params, "given (--params)"
    if inputs.model_name is not None:
        return sizes.params_of(inputs.model_name), f"table of known models ({inputs.model_name}, default options)"
    if run is not None and run.world_size > 1 and run.dense_bytes_sent:
        n = wire.dense_params_from_bytes(run.dense_bytes_sent, run.world_size)
        return n, f"the run's recorded dense_bytes_sent on {run.world_size} ranks (float32 gradients)"
    if run is not None and run.model_name:
        return sizes.params_of(run.model_name), f"table of known models ({run.model_name}, the run's model)"
    raise UsageError("the model size is unknown: give --params N, --model NAME or a RUN_DIR")


def _workload(inputs: Inputs, run: RunTimings | None, spec: dict[str, Any], params: int,
              notes: list[str]) -> predict.Workload:
    """One step of the workload: what its exchange sends, and what the step costs besides it."""
    same = _ran_with(run, spec)
    summable = wire.is_summable(spec)
    buckets, every = _exchange(run, spec, params, same, summable, notes)
    compute, data = _compute_time(inputs, run, notes)
    compress, decompress, decompress_p = _compression_time(run, spec, same, summable, notes)
    return predict.Workload(params=params, buckets=buckets, summable=summable, compute_time_s=compute,
                            data_time_s=data, compress_time_s=compress, decompress_time_s=decompress,
                            decompress_p=decompress_p, every=every)


def _exchange(run: RunTimings | None, spec: dict[str, Any], params: int, same: bool, summable: bool,
              notes: list[str]) -> tuple[list[wire.Bucket], int]:
    """The buckets one exchange sends, and every how many steps it runs."""
    sync = run.sync if run is not None else {"mode": "allreduce"}
    if sync.get("mode") == "gossip":
        raise UsageError(f"{run.path} averages parameters by gossip, point to point between ring neighbours; "
                         "repro500 model fits collectives (all-reduce, all-gather), so it does not predict it")
    if sync.get("mode") == "average":
        # local SGD: one all-reduce of every parameter each H steps (engines/averaging.py); float
        # buffers (batch norm's statistics, a fraction of a percent for ResNets) once per epoch, not counted
        every = int(sync.get("every", 1))
        notes.append(f"local SGD: one all-reduce of the {params} parameters every {every} step(s), its cost "
                     "spread over those steps; float buffers (batch norm's statistics) are averaged once per epoch, "
                     "not counted")
        return [wire.Bucket(params, 1, params * wire.GRADIENT_BYTES_PER_ELEMENT)], every
    if spec["name"] == "powersgd":
        return _powersgd_buckets(run, spec, params, same, summable, notes), 1
    return wire.buckets(spec, params), 1


def _powersgd_buckets(run: RunTimings | None, spec: dict[str, Any], params: int, same: bool, summable: bool,
                      notes: list[str]) -> list[wire.Bucket]:
    """PowerSGD's buckets, sized from a run that compressed with the same settings.

    Its payload depends on every layer's shape, which only such a run's recorded bytes tell.
    """
    if not (same and run.last_bytes_sent):
        raise UsageError("powersgd's wire size depends on every layer's shape: give a RUN_DIR of a "
                         "multi-rank run that used the same powersgd settings")
    if run.last_compressed is False:  # its bytes are a plain allreduce's, not powersgd's
        raise UsageError(f"{run.path} never compressed: its last step ran before powersgd's start_iter "
                         f"({spec.get('start_iter')}); give a run with more steps than start_iter")
    total = wire.payload_from_bytes_sent(run.last_bytes_sent, run.world_size, summable)
    notes.append(f"powersgd payload: {total} bytes per step, from the run's last step, spread over the "
                 "buckets by size; torch's hook runs several allreduces per bucket, counted here as one")
    return wire.scaled_buckets(params, total)


def _compute_time(inputs: Inputs, run: RunTimings | None, notes: list[str]) -> tuple[float, float]:
    """The compute and data-loading time per step: as given, or from a run's steps."""
    if inputs.compute_time_s is not None and inputs.compute_run_dir is not None:
        raise UsageError("give either --compute-s or --compute-from, not both")
    compute_run = read_run(inputs.compute_run_dir) if inputs.compute_run_dir is not None else run
    if inputs.compute_time_s is not None:
        if not inputs.compute_time_s > 0:
            raise UsageError(f"--compute-s {inputs.compute_time_s} must be a positive number of seconds")
        notes.append(f"compute time per step {inputs.compute_time_s:.6g} s as given (--compute-s), "
                     "data loading not included")
        return inputs.compute_time_s, 0.0
    if compute_run is None:
        raise UsageError("the compute time per step is unknown: give --compute-s SECONDS, --compute-from "
                         "a single-rank run, or a RUN_DIR")
    compute, data = compute_run.compute_time_s, compute_run.data_time_s
    notes.append(f"compute time per step {compute:.6g} s from {compute_run.path} "
                 f"({compute_run.world_size} rank(s); mean of {compute_run.steps} steps, each repeat's first "
                 f"step left out), plus {data:.6g} s of data loading")
    notes.extend(_compute_time_caveats(compute_run))
    return compute, data


def _compute_time_caveats(compute_run: RunTimings) -> list[str]:
    """What a multi-rank run's compute time still contains, or leaves out, of its communication."""
    if compute_run.world_size > 1 and compute_run.comm_wait_s is not None:
        return ["that compute time is forward + backward + optimizer minus the compression and the "
                "communication the backward pass waited for after launching its last bucket "
                "(time_comm_wait_s); collectives that ran while it still computed are not taken out"]
    if compute_run.world_size > 1:
        # Recorded before time_comm_wait_s: DDP overlaps the first buckets' collectives with
        # the rest of the backward pass, so removing their whole recorded time removes
        # some computation too.
        return ["that compute time is forward + backward + optimizer minus the recorded communication "
                "and compression time (the run has no time_comm_wait_s); DDP overlaps part of the "
                "communication with the backward pass, so it is biased low: give --compute-from a "
                "single-rank run (same per-rank batch and threads) for an independent check"]
    return []


def _compression_time(run: RunTimings | None, spec: dict[str, Any], same: bool, summable: bool,
                      notes: list[str]) -> tuple[float, float, int]:
    """Compression and decompression time per step, and the P the decompression was timed at.

    Only a multi-rank run with the same compressor measured them; otherwise they count as zero.
    """
    if same and run.compress_time_s is not None:
        # Even "none" costs something here: the bucket is divided by P before the allreduce.
        compress, decompress = run.compress_time_s, run.decompress_time_s or 0.0
        notes.append(f"compression {compress:.6g} s and decompression {decompress:.6g} s per step as "
                     f"recorded on {run.world_size} ranks" + ("" if summable else
                     "; decompression grows with P (one allgathered payload per process)"))
        return compress, decompress, run.world_size
    if spec["name"] != "none":
        notes.append(f"compression time of {spec['name']} not measured (no multi-rank RUN_DIR with it): "
                     "left out, so the step time is optimistic by that much")
    return 0.0, 0.0, 2


def _model_summary(fits: Mapping[str, Any], measurement: measure.Measurement) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, f in fits.items():
        out[f"{name}_latency_s"] = f.latency_s
        out[f"{name}_gamma_s_per_byte"] = f.gamma_s_per_byte
        out[f"{name}_r2"] = f.r2
        out[f"{name}_rms_rel_residual"] = f.rms_rel_residual
    out.update(host=measurement.host, torch_version=measurement.torch_version,
               measured_utc=measurement.measured_utc, measured_p=list(measurement.settings.p_values))
    return out


def _check(run: RunTimings, prediction: predict.Prediction, workload: predict.Workload) -> dict[str, Any]:
    """The prediction at the run's P against the run, like with like.

    Both step times share data + compute + compression (measured), so their difference is all
    communication: the measured communication cost is what the step took beyond them, the
    predicted one the model's collectives (less any overlap).  That pair carries the tolerance;
    the step-time error alone would shrink with the communication's share of the step.
    """
    base = workload.data_time_s + workload.compute_time_s
    not_comm = base + prediction.compression_time_s
    comm_cost = run.step_time_s - not_comm
    predicted_cost = prediction.step_time_s - not_comm
    comm_error = (predicted_cost - comm_cost) / comm_cost if comm_cost > 0 else None
    out: dict[str, Any] = {
        "p": run.world_size, "step_time_s": run.step_time_s, "steps": run.steps,
        "efficiency": base / run.step_time_s if run.step_time_s > 0 else None,
        "comm_time_s": run.comm_time_s, "comm_wait_s": run.comm_wait_s, "bytes_per_rank": run.bytes_sent,
        "predicted_step_time_s": prediction.step_time_s,
        "predicted_comm_time_s": prediction.comm_time_s,
        "predicted_bytes_per_rank": prediction.bytes_per_rank,
        "relative_error": ((prediction.step_time_s - run.step_time_s) / run.step_time_s
                           if run.step_time_s > 0 else None),
        "comm_cost_s": comm_cost,
        "predicted_comm_cost_s": predicted_cost,
        "comm_relative_error": comm_error,
        "tolerance": COMM_TOLERANCE,
        "within_tolerance": comm_error is not None and abs(comm_error) <= COMM_TOLERANCE,
    }
    if run.bytes_sent:
        out["bytes_relative_error"] = (prediction.bytes_per_rank - run.bytes_sent) / run.bytes_sent
    return out


def build(inputs: Inputs, *, settings: measure.Settings | None = None, remeasure: bool = False,
          measurement: measure.Measurement | None = None) -> dict[str, Any]:
    """The scaling document for *inputs* (measuring the collectives first if nothing is cached)."""
    run = read_run(inputs.run_dir) if inputs.run_dir is not None else None
    requested = inputs.compressor if inputs.compressor is not None else (run.compressor if run else "none")
    spec = wire.compressor_spec(requested)
    params, params_source = _params(inputs, run)
    notes: list[str] = []
    workload = _workload(inputs, run, spec, params, notes)
    if measurement is None:
        measurement = measure.measured(settings, remeasure=remeasure)
    fits = fitting.fit_all(measurement.points)
    p_values = set(inputs.p_values)
    same_run = _ran_with(run, spec)
    if same_run:
        p_values.add(run.world_size)
    predictions = predict.predict(workload, fits, p_values, inputs.overlap)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "created_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "repro500_version": __version__,
        "model": _model_summary(fits, measurement),
        "collectives": {name: f.as_dict() for name, f in fits.items()},
        "measurement": _measurement_section(fits, measurement),
        "workload": _workload_section(inputs, run, workload, spec, params, params_source),
        "predictions": [p.as_dict() for p in predictions],
        "assumptions": _assumptions(inputs, workload, spec, measurement, f"{params} from {params_source}", notes),
    }
    if same_run:
        _add_check(doc, run, predictions, workload)
    elif run is not None and run.world_size > 1:
        doc["assumptions"].append(f"no check against the run: it used compressor "
                                  f"{wire.compressor_spec(run.compressor)['name']}, "
                                  f"the prediction is for {spec['name']}")
    return doc


def _measurement_section(fits: Mapping[str, Any], measurement: measure.Measurement) -> dict[str, Any]:
    """Where and how the collectives were timed, and each timing's residual against its fit."""
    return {"host": measurement.host, "torch_version": measurement.torch_version,
            "measured_utc": measurement.measured_utc, "cached": measurement.cached,
            "settings": measurement.as_dict()["settings"],
            "points": fitting.residuals(fits, measurement.points)}


def _workload_section(inputs: Inputs, run: RunTimings | None, workload: predict.Workload, spec: dict[str, Any],
                      params: int, params_source: str) -> dict[str, Any]:
    """The workload predicted for, and where its numbers came from."""
    return {"params": params, "params_source": params_source, "compressor": spec,
            "collective": workload.collective,
            "buckets": [b.as_dict() for b in workload.buckets],
            "compute_time_s": workload.compute_time_s, "data_time_s": workload.data_time_s,
            "compress_time_s": workload.compress_time_s,
            "decompress_time_s": workload.decompress_time_s, "overlap": inputs.overlap,
            "run_dir": str(run.path) if run else None,
            "compute_run_dir": str(inputs.compute_run_dir) if inputs.compute_run_dir else None}


def _assumptions(inputs: Inputs, workload: predict.Workload, spec: dict[str, Any],
                 measurement: measure.Measurement, params_from: str, notes: list[str]) -> list[str]:
    """Every assumption the predictions rest on, in words, the workload's *notes* included."""
    measured_p = sorted(set(measurement.settings.p_values))
    assumptions = [
        "weak scaling: every process keeps the run's per-rank batch, so its compute time per step does not "
        "change with P (true when every rank has cores or a GPU of its own)",
        ("no overlap of communication and computation: predicted step times are upper bounds"
         if inputs.overlap == 0 else
         f"{inputs.overlap:.0%} of the communication time is hidden behind computation (at most the compute time)"),
        f"one {workload.collective} per DDP gradient bucket (1 MiB first, then 25 MiB; "
        f"{sum(b.count for b in workload.buckets)} buckets), float32 gradients; payload bytes from repro500.ext's "
        f"accounting for compressor {spec['name']}",
        f"collective times from the alpha-beta model ({FORMULAS[workload.collective]}) fitted to Gloo timings "
        f"on {measurement.host} with P = {', '.join(map(str, measured_p))}; larger P assumes every link "
        "behaves like this machine's loopback",
        f"parameters: {params_from}",
        *notes,
    ]
    if measured_p == [2]:
        assumptions.append("measured on 2 processes only, where log2 P and (P-1)/P coincide: L and gamma are "
                           "extrapolated to every P")
    return assumptions


def _add_check(doc: dict[str, Any], run: RunTimings, predictions: list[predict.Prediction],
               workload: predict.Workload) -> None:
    """Add to *doc* the check of the prediction at the run's P against the run itself."""
    at_run = next(p for p in predictions if p.p == run.world_size)
    doc["measured"] = _check(run, at_run, workload)
    if doc["measured"]["comm_relative_error"] is None:
        doc["assumptions"].append(f"the run's mean step ({run.step_time_s:.6g} s) took no longer than its data, "
                                  "compute and compression: no communication cost to compare, so the check fails")


def measured_check(doc: Mapping[str, Any], run_dir: Path | None) -> dict[str, Any]:
    """The check against the run that *doc* holds; a UsageError when it holds none to make."""
    measured = doc.get("measured")
    if not measured or "within_tolerance" not in measured:
        raise UsageError(f"--check: {run_dir} gives nothing to check the prediction against (a single-rank "
                         "run, or a run with another compressor than the one predicted)")
    return measured


def write(run_dir: str | Path, doc: Mapping[str, Any]) -> Path:
    """Write *doc* to RUN/derived/scaling.json atomically; returns the path."""
    path = Path(run_dir) / PATH
    with writing("the scaling model", path, "run without --write (the table and --json need no write access)"):
        atomic.write_json(path, doc)
    return path

