"""What the trainer asks of the other ranks, one class per engine, chosen once per repeat.

The trainer never branches on the engine's name: a repeat holds one :class:`Collectives` (the
local one does nothing), which wraps the model and optimizer for its engine's gradient exchange
and decides together whether every rank's loss is finite, whether the target was reached, and
how many bytes each rank put on the wire.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from repro500.ext import ddp_hook
from repro500.ext.horovod import distributed_optimizer
from repro500.workloads.engines import wire


class Collectives:
    """One process: nothing to exchange."""

    def __init__(self, world_size: int = 1) -> None:
        self.world_size = world_size

    def wrap(self, model: torch.nn.Module, build_optimizer: Any, compressor: dict[str, Any],
             device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
        """(the module to train, its optimizer, the gradient hook's state or None)."""
        return model, build_optimizer(model.parameters()), None

    def all_finite(self, loss_value: float) -> bool:
        return math.isfinite(loss_value)

    def broadcast_flag(self, flag: bool) -> bool:
        return flag

    def epoch_all_finite(self) -> bool:
        """Whether every rank's losses stayed finite this epoch, where :meth:`all_finite` did not
        decide it every step (parameter averaging); True where it did."""
        return True

    def gather_object(self, value: Any) -> list[Any]:
        return [value]

    def wire_per_rank(self, start: tuple[int, int] | None, steps: int) -> dict[str, Any] | None:
        """Every rank's TCP bytes since *start*, gathered on all ranks (a collective: every rank
        calls it after the same epoch); None with one process or when any rank could not read
        its counters."""
        if self.world_size <= 1:
            return None
        end = wire.tcp_bytes() if start is not None else None
        mine = None if start is None or end is None else (end[0] - start[0], end[1] - start[1])
        everyone = self.gather_object(mine)
        if any(r is None for r in everyone):
            return None
        return {"steps": steps, "bytes_sent": [r[0] for r in everyone], "bytes_received": [r[1] for r in everyone]}


class DdpCollectives(Collectives):
    """torch.distributed: DDP with repro500's compression hook (ext.ddp_hook)."""

    def wrap(self, model: torch.nn.Module, build_optimizer: Any, compressor: dict[str, Any],
             device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
        if self.world_size <= 1:
            return super().wrap(model, build_optimizer, compressor, device)
        from torch.nn.parallel import DistributedDataParallel


        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        return ddp, build_optimizer(ddp.parameters()), ddp_hook.register(ddp, compressor)

    def all_finite(self, loss_value: float) -> bool:
        """Decided together: a rank that stopped alone at its own NaN would leave the others
        waiting in the next step's gradient exchange.  One small collective per step (CPU, so
        Gloo under a ``cpu:gloo,cuda:nccl`` group)."""
        finite = math.isfinite(loss_value)
        if self.world_size <= 1:
            return finite
        import torch.distributed as tdist

        flag = torch.tensor([0.0 if finite else 1.0])
        tdist.all_reduce(flag, op=tdist.ReduceOp.MAX)
        return float(flag) == 0.0

    def broadcast_flag(self, flag: bool) -> bool:
        if self.world_size <= 1:
            return flag
        import torch.distributed as tdist

        tensor = torch.tensor([1 if flag else 0], dtype=torch.int32)
        tdist.broadcast(tensor, src=0)
        return bool(tensor.item())

    def gather_object(self, value: Any) -> list[Any]:
        import torch.distributed as tdist

        everyone: list[Any] = [None] * self.world_size
        tdist.all_gather_object(everyone, value)
        return everyone


class HorovodCollectives(Collectives):
    """Horovod: its DistributedOptimizer with repro500's compressors (ext.horovod)."""

    def wrap(self, model: torch.nn.Module, build_optimizer: Any, compressor: dict[str, Any],
             device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
        optimizer = distributed_optimizer(build_optimizer(model.parameters()), model, compressor)
        return model, optimizer, optimizer

    def all_finite(self, loss_value: float) -> bool:
        finite = math.isfinite(loss_value)
        if self.world_size <= 1:
            return finite
        import horovod.torch as hvd

        flag = torch.tensor([0.0 if finite else 1.0])
        return float(hvd.allreduce(flag, op=hvd.Sum, name="repro500.nonfinite_loss")) == 0.0

    def broadcast_flag(self, flag: bool) -> bool:
        if self.world_size <= 1:
            return flag
        import horovod.torch as hvd

        return bool(hvd.broadcast_object(flag, root_rank=0))

    def gather_object(self, value: Any) -> list[Any]:
        import horovod.torch as hvd

        return list(hvd.allgather_object(value))
