"""Horovod adapter: any repro500 compressor on a Horovod-distributed optimizer.

    import horovod.torch as hvd
    hvd.init()
    optimizer = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, "fp16")
    ...; loss.backward(); optimizer.step(); metrics.update(optimizer.step_stats())

Horovod's own compression hook (``hvd.DistributedOptimizer(compression=...)``) *sums* the
compressed tensors, which is right only for stateless casts: ``none`` and ``fp16`` go that
way (Horovod 0.28.1 has no bfloat16 support, so ``bf16`` is refused).  Everything else (top-k, random-k, QSGD, TernGrad, EF-signSGD) needs names,
error feedback or an allgather, so it runs in a step pre-hook on the optimizer itself:
per parameter (in name order, identical on every rank) compensate → compress →
``hvd.allreduce_async`` (summable) or ``hvd.allgather_async`` (the rest) → decode and average
into ``p.grad``, then the optimizer steps.  The optimizer object stays the same (so learning
rate schedulers keep working) and gains a ``step_stats()`` method (see
:mod:`repro500.ext.communicator` for the accounting).  ``powersgd`` is DDP-only.

Horovod is optional: build it with ``scripts/build_horovod.sh``.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch

from repro500.errors import UsageError
from repro500.ext import compressors, memory, ops
from repro500.ext.communicator import Communicator, allreduce_bytes
from repro500.ext.specs import UNSUPPORTED

HOROVOD_HOOK_COMPRESSORS = ("none", "fp16")
_instances = [0]  # distributed_optimizer calls so far in this process


def import_horovod() -> Any:
    """``horovod.torch``, initialised; a UsageError saying how to install it if it is absent."""
    try:
        import horovod.torch as hvd
    except ImportError as err:
        raise UsageError(
            f"Horovod is not installed ({err}); build it with scripts/build_horovod.sh "
            "or use the ddp engine."
        ) from err
    if not hvd.is_initialized():
        hvd.init()
    return hvd


class _HookCompression:
    """Horovod's compression interface (compress/decompress) around a cast compressor."""

    def __init__(self, communicator: Communicator, size: int) -> None:
        self.communicator = communicator
        self.size = size

    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        comm = self.communicator
        start = time.perf_counter()
        payload, ctx = comm.compressor.compress(tensor, None)
        comm._add(time_compress_s=time.perf_counter() - start)
        sent = payload[0]
        moved = allreduce_bytes(sent.numel() * sent.element_size(), self.size)
        comm.record_bytes(
            moved, moved, allreduce_bytes(tensor.numel() * tensor.element_size(), self.size), numel=tensor.numel()
        )
        return sent.view(tensor.shape), ctx

    def decompress(self, tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        comm = self.communicator
        start = time.perf_counter()
        out = comm.compressor.decompress([tensor.reshape(-1)], ctx)
        comm._add(time_decompress_s=time.perf_counter() - start)
        return out


def _timed_synchronize(synchronize: Any, communicator: Communicator) -> Any:
    @functools.wraps(synchronize)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        before = communicator.step_stats(reset=False)["time_decompress_s"]
        start = time.perf_counter()
        result = synchronize(*args, **kwargs)
        elapsed = time.perf_counter() - start
        decompress = communicator.step_stats(reset=False)["time_decompress_s"] - before
        communicator.record_comm_time(max(0.0, elapsed - decompress))
        return result

    return wrapper


def _zero_grad_with_set_to_none(wrapped: Any, base: type) -> Any:
    """Horovod 0.28.1's ``zero_grad()`` takes no arguments; torch's takes ``set_to_none``.

    Keeps Horovod's guard (no zeroing while allreduces of this step are in flight) and then
    calls the wrapped optimizer class's own ``zero_grad``, so ``zero_grad(set_to_none=...)``
    works as on any torch optimizer.
    """

    def zero_grad(set_to_none: bool = True) -> None:
        if wrapped._handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(); Horovod prohibits this (a race)."
            )
        base.zero_grad(wrapped, set_to_none=set_to_none)

    return zero_grad


def _exchange_all(
    hvd: Any,
    communicator: Communicator,
    params: list[tuple[str, torch.nn.Parameter]],
    prefix: str,
) -> None:
    """Compress every gradient, launch all collectives, then decode each into p.grad."""
    pending = []
    for name, param in params:
        if param.grad is None:
            # Every rank must launch the same collectives; a missing gradient is a zero one.
            param.grad = torch.zeros_like(param)
        out = communicator.prepare(param.grad, name)
        if out.summable:
            handle = hvd.allreduce_async(out.buffer, name=f"{prefix}.{name}", op=hvd.Sum)
        else:
            handle = hvd.allgather_async(out.buffer, name=f"{prefix}.{name}")
        pending.append((param, out, handle))
    for param, out, handle in pending:
        start = time.perf_counter()
        result = hvd.synchronize(handle)
        communicator.record_comm_time(time.perf_counter() - start)
        if out.summable:
            averaged = communicator.finish_allreduce(out, result)
        else:
            averaged = communicator.finish_allgather(out, result)
        param.grad.copy_(averaged.view_as(param.grad))


def distributed_optimizer(
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    spec: Any,
    broadcast: bool = True,
) -> torch.optim.Optimizer:
    """Make *optimizer* average gradients across Horovod ranks with the compressor *spec*.

    With *broadcast* (default) rank 0's parameters and optimizer state are broadcast first,
    so every rank starts from the same point.  The returned optimizer has ``step_stats()``.
    """
    hvd = import_horovod()
    compressor = compressors.get(spec)
    refusal = UNSUPPORTED.get(("horovod", compressor.name))
    if refusal:  # powersgd, bf16
        raise UsageError(refusal)
    communicator = Communicator(
        compressor, memory.for_compressor(compressor), hvd.size(), hvd.rank()
    )
    if compressor.needs_ops:  # compile before training, not inside a step
        ops.warm_up(next(model.parameters()).device)
    if broadcast:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    named = sorted(
        ((n, p) for n, p in model.named_parameters() if p.requires_grad), key=lambda item: item[0]
    )
    if compressor.name in HOROVOD_HOOK_COMPRESSORS and compressor.memory == "none":
        wrapped = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=named,
            compression=_HookCompression(communicator, hvd.size()),
        )
        wrapped.synchronize = _timed_synchronize(wrapped.synchronize, communicator)
        wrapped.zero_grad = _zero_grad_with_set_to_none(wrapped, type(optimizer))
        wrapped.step_stats = communicator.step_stats
        wrapped.repro500_communicator = communicator
        return wrapped

    def exchange(_optimizer: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        _exchange_all(hvd, communicator, named, prefix)

    # Collective names unique per optimizer (the same on every rank: this call is collective),
    # so Horovod never matches a tensor against another optimizer's cached shape.
    _instances[0] += 1
    prefix = f"repro500.{_instances[0]}"
    optimizer.register_step_pre_hook(exchange)
    optimizer.step_stats = communicator.step_stats
    optimizer.repro500_communicator = communicator
    if isinstance(communicator.memory, memory.EFSignMemory):
        # EF-signSGD keeps its error in units of lr * g: the trainer tells it the learning
        # rate before each step, as it tells the DDP hook's state (ddp_hook.HookState).
        optimizer.set_learning_rate = functools.partial(setattr, communicator.memory, "lr")
    return optimizer
