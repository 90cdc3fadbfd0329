"""DistributedDataParallel communication hook for any repro500 compressor.

    model = DistributedDataParallel(net)
    state = repro500.ext.ddp_hook.register(model, {"name": "topk", "ratio": 0.01})
    for batch in loader:
        loss(model(batch)).backward(); optimizer.step()
        metrics.update(state.step_stats())   # bytes_sent, compression_ratio, time_*_s ...

DDP hands the hook each gradient bucket (flat, *not* divided by the world size) and expects
a Future holding one tensor of the bucket's shape: the averaged gradient.  Summable payloads
(none, fp16, bf16, random-k) are allreduced; the others (top-k, QSGD, TernGrad, EF-signSGD)
are packed into one uint8 buffer per rank and allgathered, then every rank decodes and
averages all of them.  Error-feedback state is keyed by ``bucket.index()``.

``powersgd`` uses torch's own ``powerSGD_hook`` and ``PowerSGDState`` (warm start and error
feedback included), wrapped to count its bytes and time and, on any backend but NCCL, to run
one bucket's PowerSGD to completion before the next bucket starts (see :func:`_powersgd_hook`).
"""

# No `from __future__ import annotations`: DDP's register_comm_hook inspects the hook's
# annotations and rejects them as strings.
import time
from typing import Any

import torch
import torch.distributed as dist

from repro500.ext import compressors, memory, ops
from repro500.ext.communicator import Communicator, allreduce_bytes

# torch 2.14 renamed all_gather_into_tensor (now deprecated) to all_gather_single.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class HookState:
    """What the hook keeps between calls; :meth:`step_stats` gives the last step's costs."""

    def __init__(self, communicator: Communicator, process_group: Any = None) -> None:
        self.communicator = communicator
        self.process_group = process_group
        self.compressor = communicator.compressor
        self.memory = communicator.memory

    def step_stats(self, reset: bool = True) -> dict[str, Any]:
        """bytes_sent, bytes_received, dense_bytes_sent, compression_ratio, time_compress_s,
        time_decompress_s, time_comm_s and tensors (buckets), summed since the last reset."""
        return self.communicator.step_stats(reset=reset)

    def comm_wait_s(self, backward_end: float) -> float | None:
        """Seconds the backward pass waited for communication after the last bucket was
        launched (*backward_end* is ``time.perf_counter()`` after ``loss.backward()``). Call it
        before :meth:`step_stats`, which resets it."""
        return self.communicator.comm_wait_s(backward_end)

    def set_learning_rate(self, lr: float) -> None:
        """Tell EF-signSGD's memory the optimizer's learning rate (no effect otherwise)."""
        if isinstance(self.memory, memory.EFSignMemory):
            self.memory.lr = lr


def _on_done(state: HookState, started: float, finish: Any) -> Any:
    def callback(fut: torch.futures.Future) -> torch.Tensor:
        state.communicator.record_comm_time(time.perf_counter() - started)
        return finish(fut.value()[0])

    return callback


def _compressed_hook(
    state: HookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    buffer = bucket.buffer()
    comm = state.communicator
    out = comm.prepare(buffer, bucket.index())
    comm.mark_launched()
    started = time.perf_counter()
    if out.summable:
        work = dist.all_reduce(out.buffer, group=state.process_group, async_op=True)

        def finish(reduced: torch.Tensor) -> torch.Tensor:
            return comm.finish_allreduce(out, reduced).to(buffer.dtype).view_as(buffer)
    else:
        gathered = out.buffer.new_empty(out.buffer.numel() * comm.world_size)
        work = _all_gather_single(gathered, out.buffer, group=state.process_group, async_op=True)

        def finish(_result: torch.Tensor) -> torch.Tensor:
            return comm.finish_allgather(out, gathered).to(buffer.dtype).view_as(buffer)

    return work.get_future().then(_on_done(state, started, finish))


class PowerSGDHookState(HookState):
    """torch's PowerSGDState plus the accounting; ``torch_state`` is torch's own object.

    *serialize*: finish each bucket's PowerSGD inside the hook (every backend but NCCL, see
    :func:`_powersgd_hook`)."""

    def __init__(
        self,
        communicator: Communicator,
        torch_state: Any,
        process_group: Any = None,
        serialize: bool = True,
    ) -> None:
        super().__init__(communicator, process_group)
        self.torch_state = torch_state
        self.serialize = serialize


def _powersgd_hook(
    state: PowerSGDHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's ``powerSGD_hook`` on one bucket, with its bytes and times recorded.

    torch's hook launches a bucket's first allreduce (the uncompressed tensors) here, and the
    next two (P, then Q) from callbacks of the previous one's future.  On Gloo those callbacks
    run on Gloo's worker thread whenever the previous allreduce finishes, while the training
    thread goes on launching the next bucket's first allreduce: with two or more buckets the
    collectives reach Gloo in a different order on different ranks, and Gloo aborts the job
    ("collective mismatch").  So on any backend but NCCL the hook waits for the
    bucket's whole chain before it returns: every rank then issues U0 P0 Q0 U1 P1 Q1 ... in
    bucket order, at the price of not overlapping that bucket's communication with the rest of
    the backward pass (the time the backward pass spent waiting is in ``time_comm_wait_s``).
    NCCL keeps the overlap: its futures are marked complete as soon as the collective is
    enqueued on the stream, so the callbacks run inline on this thread and all three
    allreduces of a bucket are enqueued before the hook returns, in bucket order on every rank.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    buffer = bucket.buffer()
    comm = state.communicator
    before = state.torch_state.total_numel_after_compression
    started = time.perf_counter()
    fut = powerSGD_hook.powerSGD_hook(state.torch_state, bucket)
    # The hook's synchronous part (error feedback, P = MQ) is its compression work.
    comm._add(time_compress_s=time.perf_counter() - started)
    if state.serialize:
        waited_from = time.perf_counter()
        fut.wait()
        comm.record_blocked(time.perf_counter() - waited_from)
    comm.mark_launched()
    moved_numel = state.torch_state.total_numel_after_compression - before
    compressed = moved_numel > 0
    if not compressed:  # before start_iter torch runs a plain allreduce of the bucket
        moved_numel = buffer.numel()
    # torch allreduces the uncompressed tensors, then P, then Q: all allreduces.
    moved = allreduce_bytes(moved_numel * buffer.element_size(), comm.world_size)
    dense = allreduce_bytes(buffer.numel() * buffer.element_size(), comm.world_size)
    comm.record_bytes(moved, moved, dense, compressed=compressed, numel=buffer.numel())

    def record(done: torch.futures.Future) -> torch.Tensor:
        comm.record_comm_time(time.perf_counter() - started)
        return done.value()

    return fut.then(record)


def _gradient_backend(group: Any, device: torch.device) -> str:
    """The backend that carries *device*'s gradients: the worker's GPU group is
    "cpu:gloo,cuda:nccl" (get_backend returns that string), a CPU one plain "gloo"."""
    backend = str(dist.get_backend(group)).lower()
    if ":" not in backend:
        return backend
    by_device = dict(part.split(":", 1) for part in backend.split(",") if ":" in part)
    return by_device.get(device.type, "")


def register(
    ddp_model: torch.nn.parallel.DistributedDataParallel, spec: Any, process_group: Any = None
) -> HookState:
    """Register the compressor *spec* (see :func:`repro500.ext.compressors.get`) on *ddp_model*.

    Call once, before the first backward.  Returns the state whose :meth:`HookState.step_stats`
    the trainer reads after each optimizer step.
    """
    compressor = compressors.get(spec)
    # Compile/load the operators before training starts: inside the first backward every
    # rank would wait on the compiler instead.
    if compressor.needs_ops:
        ops.warm_up(next(ddp_model.parameters()).device)
    group = process_group if process_group is not None else dist.group.WORLD
    world_size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    communicator = Communicator(compressor, memory.for_compressor(compressor), world_size, rank)
    if isinstance(compressor, compressors.PowerSGDCompressor):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        params = compressor.params
        torch_state = powerSGD_hook.PowerSGDState(
            process_group=process_group,
            matrix_approximation_rank=params["rank"],
            start_powerSGD_iter=params["start_iter"],
            min_compression_rate=params["min_compression_rate"],
            use_error_feedback=params["error_feedback"],
            warm_start=params["warm_start"],
            random_seed=params["seed"],
            # torch logs its own statistics at this period; ours are in step_stats().
            compression_stats_logging_frequency=10**12,
        )
        # NCCL alone enqueues a bucket's chained allreduces inline (see _powersgd_hook).
        device = next(ddp_model.parameters()).device
        serialize = _gradient_backend(group, device) != "nccl"
        state: HookState = PowerSGDHookState(communicator, torch_state, process_group, serialize)
        ddp_model.register_comm_hook(state, _powersgd_hook)
        return state
    state = HookState(communicator, process_group)
    ddp_model.register_comm_hook(state, _compressed_hook)
    return state
