"""What one repeat keeps while it trains: its parts, its counters and its records.

``train.py``'s loop reads as the training it is; everything it hands off lands here: building
the parts from the resolved recipe, the learning rate of a step, the step and epoch records
(``metrics.jsonl``, ``params.jsonl``, the MLPerf log, the runner's callbacks), divergence,
evaluation and time-to-quality, and the repeat's summary.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from repro500.capture import seeds as seeding
from repro500.rundir import atomic, layout
from repro500.statuses import REPEAT_COMPLETED, REPEAT_DIVERGED
from repro500.workloads.engines import registry, wire
from repro500.workloads.trainer import build as blocks
from repro500.workloads.trainer import metrics as measure
from repro500.workloads.trainer import records, sampling
from repro500.workloads.trainer.optim import build_optimizer, lr_factor
from repro500.workloads.trainer.spec import Dist, TrainSpec
from repro500.workloads.trainer.step import Step
from repro500.workloads.workload import Progress

_UNMEASURED_COMM = ("time_comm_s", "time_comm_wait_s", "time_compress_s", "time_decompress_s", "bytes_sent",
                    "bytes_received", "dense_bytes_sent", "compression_ratio", "compressed")


class RepeatState:
    """One repeat of a trained workload (rank 0 writes its files)."""

    def __init__(self, spec: TrainSpec, repeat: int, seeds: seeding.Seeds, out_dir: Path, dist: Dist,
                 callbacks: Progress) -> None:
        self.spec, self.repeat, self.seeds, self.dist, self.callbacks = spec, repeat, seeds, dist, callbacks
        self.out_dir = Path(out_dir)
        self.writer = records.RepeatFiles(self.out_dir) if dist.is_main else None
        self.mllog = records.mlperf_logger(spec, self.out_dir, seeds, dist) if dist.is_main else None
        self.status, self.error = REPEAT_COMPLETED, None
        self.summary: dict[str, Any] = {}
        self.samples_seen = self.global_step = self.epochs_run = 0
        self.train_time_s = 0.0
        self.epochs_to_quality: int | None = None
        self.time_to_quality_s: float | None = None
        self.eval_metrics: dict[str, Any] = {}
        self.epoch_digests: list[str] = []
        self.sampling_epochs: list[dict[str, Any]] = []
        self.traffic = records.Traffic()

    # -- building ------------------------------------------------------------------------------
    def start(self) -> None:
        """Seeds, data, model, engine and step, then the clock starts."""
        spec, dist = self.spec, self.dist
        if self.mllog:
            self.mllog.init_start()
        if spec.threads:
            torch.set_num_threads(int(spec.threads))
        blocks.set_determinism(spec.deterministic)
        seeding.apply(self.seeds)
        self.device = blocks.torch_device(spec.device, dist)
        self.task = blocks.Task(spec.workload)
        self.train_loader, self.eval_loader, self.info = blocks.build_data(spec, dist, self.seeds)
        self.batches: sampling.RecordingBatches = self.train_loader.batch_sampler
        self.labels, self.labels_why = sampling.dataset_labels(self.train_loader.dataset)
        if self.mllog:
            self.mllog.log_samples(len(self.train_loader.dataset), len(self.eval_loader.dataset))
            records.log_data(self.mllog, self.train_loader.dataset, self.eval_loader.dataset)
        self.model = blocks.build_model(spec, self.info).to(self.device)
        self.comm = registry.for_engine(dist.engine, dist.world_size, spec.sync, dist.rank)
        compressor = records.compressor_spec(spec.compressor, self.seeds)
        train_model, self.optimizer, self.hook_state = self.comm.wrap(
            self.model, lambda params: build_optimizer(params, spec.optimizer), compressor, self.device)
        self.step = Step(self.task, train_model, self.optimizer, self.device, spec.precision, spec.micro_batch_size,
                         after_step=getattr(self.hook_state, "after_step", None))
        self.base_lrs = [g["lr"] for g in self.optimizer.param_groups]
        self.steps_per_epoch = len(self.train_loader)
        self.flops_per_sample = blocks.flops_per_sample(self.task, self.model, self.train_loader, self.device,
                                                        spec.batch_size)
        if self.mllog:
            self.mllog.init_stop()
            self.mllog.run_start()
        self.run_start = time.perf_counter()

    # -- per epoch and per step ------------------------------------------------------------------
    def epoch_start(self, epoch: int) -> None:
        self.batches.set_epoch(epoch)
        if self.callbacks.on_epoch_start:
            self.callbacks.on_epoch_start(epoch, self.steps_per_epoch)
        if self.mllog:
            self.mllog.epoch_start(epoch)
        self.wire_start = wire.tcp_bytes() if self.dist.world_size > 1 else None

    def set_lr(self, epoch: int, i: int) -> None:
        factor = lr_factor(self.spec.lr_schedule, epoch - 1 + i / self.steps_per_epoch, self.spec.epochs)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * factor
        if self.hook_state is not None and hasattr(self.hook_state, "set_learning_rate"):
            self.hook_state.set_learning_rate(self.optimizer.param_groups[0]["lr"])  # EF-signSGD scales by lr

    def record_step(self, epoch: int, times: dict[str, Any], batch: int, t_mark: float, t_data: float) -> dict[str, Any]:
        """The step's record, written and passed on; its time runs from the last step's end."""
        end = time.perf_counter()
        n = batch * self.dist.world_size
        self.samples_seen += n
        self.global_step += 1
        backward_end = times.pop("backward_end")
        loss = times.pop("loss")
        record: dict[str, Any] = {
            "kind": "step", "repeat": self.repeat, "epoch": epoch, "step": self.global_step,
            "loss": measure.finite_or_none(loss), "lr": self.optimizer.param_groups[0]["lr"], "samples": n,
            "time_data_s": t_data - t_mark, **times, "step_time_s": end - t_mark,
            **dict.fromkeys(_UNMEASURED_COMM), "peak_memory_bytes": measure.peak_memory_bytes(self.device),
            "wall_s": end - self.run_start,
        }
        if self.hook_state is not None:
            if hasattr(self.hook_state, "comm_wait_s"):  # DDP: the backward pass ended at backward_end
                record["time_comm_wait_s"] = self.hook_state.comm_wait_s(backward_end)
            record.update(self.hook_state.step_stats())
        self.traffic.add(record)
        if self.writer:
            self.writer.metric(record)
        if self.callbacks.on_step:
            self.callbacks.on_step(record)
        if not self.comm.all_finite(loss):
            self.status = REPEAT_DIVERGED
            what = f"loss became {loss}" if not math.isfinite(loss) else "another rank's loss became non-finite"
            self.error = f"{what} at epoch {epoch}, step {self.global_step}"
        return record

    @property
    def diverged(self) -> bool:
        return self.status == REPEAT_DIVERGED

    def end_epoch(self, epoch: int, steps: list[dict[str, Any]]) -> bool:
        """Close the epoch (evaluate, digest, record); True when training stops here."""
        epoch_s = sum(r["step_time_s"] for r in steps)
        self.train_time_s += epoch_s
        self.epochs_run = epoch
        # before the wire is read: parameter averaging's epoch-end all-reduce (buffers and the
        # ranks' agreement on the loss, engines/averaging.py) is part of the epoch's traffic
        finite = self.diverged or self.comm.epoch_all_finite()
        epoch_wire = self.comm.wire_per_rank(self.wire_start, len(steps))
        self.traffic.add_wire(epoch_wire)
        if self.mllog:
            self.mllog.epoch_stop(epoch)
        record: dict[str, Any] = {"kind": "epoch", "repeat": self.repeat, "epoch": epoch, "metrics": {},
                                  "train_samples": self.samples_seen, "train_time_s": epoch_s, "wire": epoch_wire}
        if not finite:
            self.status = REPEAT_DIVERGED
            self.error = f"a rank's loss became non-finite in epoch {epoch} (found at its end)"
        if self.diverged:
            # No evaluation, but the epoch is closed like any other, so that its steps up to the
            # divergence reach MLflow (the ddp engine replays callbacks from this file).
            self._epoch_record({**record, "diverged": True, "wall_s": time.perf_counter() - self.run_start}, steps)
            return True
        record["sampling"] = self._sampling(epoch, len(steps))
        if self.mllog:
            self.mllog.eval_start(epoch)
        self.eval_metrics = (blocks.evaluate(self.task, self.model, self.eval_loader, self.device, self.info,
                                             self.spec.evaluate, self.spec.search_paths) if self.dist.is_main else {})
        if self.mllog:
            self.mllog.eval_stop(epoch)
            self.mllog.log_eval(self.eval_metrics, epoch)
        target = self.spec.target
        reached = measure.target_reached(self.eval_metrics.get(target["metric"]), float(target["value"]),
                                         target.get("direction", "higher"))
        reached = self.comm.broadcast_flag(reached)
        wall_s = time.perf_counter() - self.run_start
        if reached and self.epochs_to_quality is None:
            self.epochs_to_quality, self.time_to_quality_s = epoch, wall_s
        record.update(metrics=self.eval_metrics, wall_s=wall_s)
        if self.dist.is_main:
            digest, tensors = measure.state_digests(self.model)
            self.epoch_digests.append(digest)
            record["param_digest"] = digest
            self.writer.params({"epoch": epoch, "digest": digest, "tensors": tensors})
        self._epoch_record(record, steps)
        return reached

    def _sampling(self, epoch: int, steps: int) -> dict[str, Any] | None:
        """This epoch's coverage and class balance over every rank's trained indices."""
        mine = self.batches.drawn[:steps * self.spec.batch_size]  # a loader may draw ahead of training
        everyone = self.comm.gather_object(mine)
        if not self.dist.is_main:
            return None
        drawn = [i for indices in everyone for i in indices]
        rec = sampling.epoch_record(drawn, len(self.train_loader.dataset), self.spec.batch_size * self.dist.world_size,
                                    self.labels, self.labels_why, self.spec.epochs)
        self.sampling_epochs.append({"epoch": epoch, **rec})
        return rec

    def _epoch_record(self, record: dict[str, Any], steps: list[dict[str, Any]]) -> None:
        if self.writer:
            self.writer.metric(record)
        if self.callbacks.on_epoch_end:
            self.callbacks.on_epoch_end(record, steps)

    # -- the end ---------------------------------------------------------------------------------
    def finish(self) -> None:
        total_s = time.perf_counter() - self.run_start
        if self.mllog:
            self.mllog.run_stop(self.epochs_to_quality is not None)
        if not self.dist.is_main:
            return
        final_digest, tensors = measure.state_digests(self.model)
        self.writer.params({"epoch": "final", "digest": final_digest, "tensors": tensors})
        self.summary = records.summarise(
            self.spec, self.repeat, self.seeds, self.status, self.error, self.epochs_run, self.epochs_to_quality,
            self.time_to_quality_s, self.train_time_s, total_s, self.samples_seen, self.flops_per_sample,
            self.eval_metrics, self.epoch_digests, final_digest, self.dist, self.traffic,
        )
        self.summary["sampling"] = sampling.summarise(self.sampling_epochs)
        # the variant trained, beside its figures: verify --against sets them side by side
        self.summary["training"] = {"precision": self.spec.precision, "micro_batch_size": self.spec.micro_batch_size,
                                    "batch_size": self.spec.batch_size, "sync": self.spec.sync}

    def interrupted(self) -> None:
        if self.mllog:
            self.mllog.run_stop(False)

    def close(self) -> None:
        if self.writer:
            self.writer.close()
        if self.mllog:
            self.mllog.close()

    def write_summary(self) -> dict[str, Any]:
        if self.dist.is_main:
            atomic.write_json(self.out_dir / layout.REPEAT_SUMMARY, self.summary)
        return self.summary
