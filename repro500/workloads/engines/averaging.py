"""Synchronising parameters instead of gradients: local SGD and decentralized (gossip) averaging.

Deep500's level 3 compares distributed schemes beyond synchronous all-reduce of gradients
(``mutable.sync``, docs/distributed.md):

* ``{mode: average, every: H}`` (local SGD, model averaging): every rank steps alone on its own
  batches and the ranks replace their parameters by the average of all ranks' every H steps
  (one all-reduce of the parameters, so about 1/H of DDP's bytes per step);
* ``{mode: gossip, every: H}`` (decentralized averaging): every H steps each rank averages its
  parameters with its ring neighbours' only (ranks r-1 and r+1, point-to-point through
  torch.distributed), so no collective spans all ranks between epochs (the epoch's end has one,
  below).

The parameters are averaged every H steps; floating-point buffers (batch norm's running
statistics) at the end of each epoch, before the evaluation, in one all-reduce with the ranks'
agreement on the loss: a training step never reads them (batch norm normalises by the batch's own
statistics in training mode), only the evaluation does, so averaging them at every
synchronisation would send them H-fold more often for the same evaluated model (PyTorch's own
model averagers average parameters only).  Between synchronisations the ranks' models differ:
rank 0's is evaluated and digested.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from repro500.ext.communicator import allreduce_bytes
from repro500.workloads.engines.collectives import DdpCollectives

MODES = ("allreduce", "average", "gossip")


def _parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    return [t for t in model.parameters() if t.is_floating_point()]


def _buffers(model: torch.nn.Module) -> list[torch.Tensor]:
    return [t for t in model.buffers() if t.is_floating_point()]


def ring_neighbours(rank: int, world_size: int) -> list[int]:
    """Ranks r-1 and r+1 on the ring; one rank when there are two."""
    return sorted({(rank - 1) % world_size, (rank + 1) % world_size} - {rank})


class Averager:
    """Called after each optimizer step: averages every ``every`` steps; its costs per step.

    Whether any rank's loss went non-finite since the last synchronisation travels as one more
    element of the parameters' all-reduce (``average``): the ranks agree on it without a
    collective of its own, which on TCP costs its framing at every synchronisation."""

    def __init__(self, model: torch.nn.Module, mode: str, every: int, rank: int, world_size: int) -> None:
        self.tensors, self.buffers, self.mode, self.every = _parameters(model), _buffers(model), mode, every
        self.rank, self.world_size = rank, world_size
        self.steps = 0
        self.last_synced = False
        self.nonfinite = False  # a non-finite loss seen on this rank since the ranks last agreed
        self.agreed_finite: bool | None = None  # what the last averaging all-reduce decided (average mode)
        self._stats: dict[str, Any] = {}

    def after_step(self, loss_value: float | None = None) -> None:
        import torch.distributed as tdist
        from torch.nn.utils import parameters_to_vector, vector_to_parameters

        if loss_value is not None:
            self.nonfinite |= not math.isfinite(loss_value)
        self.steps += 1
        synced = self.last_synced = self.steps % self.every == 0
        self._stats = {"synced": synced, "time_comm_s": 0.0, "bytes_sent": 0, "bytes_received": 0}
        self.agreed_finite = None
        if not synced:
            return
        start = time.perf_counter()
        flat = parameters_to_vector(self.tensors)
        nbytes = flat.numel() * flat.element_size()
        if self.mode == "average":
            flag = torch.tensor([1.0 if self.nonfinite else 0.0], dtype=flat.dtype, device=flat.device)
            both = torch.cat([flat, flag])
            tdist.all_reduce(both)
            self.agreed_finite = float(both[-1]) == 0.0
            flat = both[:-1] / self.world_size
            sent = allreduce_bytes(nbytes + flag.element_size(), self.world_size)
            received = sent
        else:
            neighbours = ring_neighbours(self.rank, self.world_size)
            inbox = [torch.empty_like(flat) for _ in neighbours]
            ops = [tdist.P2POp(tdist.isend, flat, peer) for peer in neighbours]
            ops += [tdist.P2POp(tdist.irecv, box, peer) for box, peer in zip(inbox, neighbours, strict=True)]
            for request in tdist.batch_isend_irecv(ops):
                request.wait()
            flat = (flat + sum(inbox)) / (1 + len(neighbours))
            sent = received = nbytes * len(neighbours)
        vector_to_parameters(flat, self.tensors)
        self._stats.update(time_comm_s=time.perf_counter() - start, bytes_sent=sent, bytes_received=received)

    def step_stats(self) -> dict[str, Any]:
        stats, self._stats = self._stats, {}
        return stats


class AveragingCollectives(DdpCollectives):
    """The ddp engine's process group without DDP: each rank's optimizer steps alone, and an
    :class:`Averager` runs after every step."""

    def __init__(self, world_size: int, mode: str, every: int, rank: int) -> None:
        super().__init__(world_size)
        self.mode, self.every, self.rank = mode, every, rank
        self.averager: Averager | None = None

    def all_finite(self, loss_value: float) -> bool:
        """Decided together only when the ranks synchronise anyway: between averagings no rank
        waits for another, so a rank whose loss went non-finite keeps stepping until the next
        averaging, where all stop together.  (Deciding every step, as DDP must, would put a
        collective in every step of a scheme whose point is not to communicate.)"""
        averager = self.averager
        if averager is None:
            return math.isfinite(loss_value)
        averager.nonfinite |= not math.isfinite(loss_value)
        if not averager.last_synced:
            return True
        if averager.agreed_finite is not None:  # agreed inside the averaging all-reduce
            return averager.agreed_finite
        return self._agree()

    def epoch_all_finite(self) -> bool:
        """The epoch's end, before its evaluation: the buffers averaged over all ranks and the ranks'
        agreement on the loss, in one all-reduce (the flag is its last element)."""
        import torch.distributed as tdist
        from torch.nn.utils import parameters_to_vector, vector_to_parameters

        averager = self.averager
        if averager is None or not averager.buffers:
            return self._agree()
        flat = parameters_to_vector(averager.buffers)
        flag = torch.tensor([1.0 if averager.nonfinite else 0.0], dtype=flat.dtype, device=flat.device)
        both = torch.cat([flat, flag])
        tdist.all_reduce(both)
        vector_to_parameters(both[:-1] / self.world_size, averager.buffers)
        return float(both[-1]) == 0.0

    def _agree(self) -> bool:
        import torch.distributed as tdist

        nonfinite = self.averager is not None and self.averager.nonfinite
        flag = torch.tensor([1.0 if nonfinite else 0.0])
        tdist.all_reduce(flag, op=tdist.ReduceOp.MAX)
        return float(flag) == 0.0

    def wrap(self, model: torch.nn.Module, build_optimizer: Any, compressor: dict[str, Any],
             device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
        import torch.distributed as tdist

        for t in [*_parameters(model), *_buffers(model)]:  # every rank starts from rank 0's initialisation, as DDP does
            tdist.broadcast(t.data, src=0)
        self.averager = Averager(model, self.mode, self.every, self.rank, self.world_size)
        return model, build_optimizer(model.parameters()), self.averager
