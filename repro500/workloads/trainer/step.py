"""One optimisation step: forward, backward and the optimizer, in the recipe's precision and
micro-batches.

The loop (``train.py``) calls a :class:`Step` once per batch and never asks how it is computed:

* **precision** (``mutable.precision``): ``fp32``, or automatic mixed precision through
  ``torch.autocast`` in ``amp-bf16`` or ``amp-fp16``.  fp16's five exponent bits underflow small
  gradients, so fp16 scales the loss (``torch.amp.GradScaler``: a step whose scaled gradients
  overflowed is skipped and the scale lowered, which the step record says); bf16 keeps fp32's
  exponent range and needs no scaler.  Parameters and optimizer state stay fp32 in both.
* **micro-batching** (``mutable.micro_batch_size``): the batch is split into
  ``batch_size / micro_batch_size`` parts whose gradients accumulate before one optimizer step
  (Deep500 level 1, as micro-batching fits a batch that does not fit in memory).  Each part's
  loss is weighted by its share of the batch, so the accumulated gradient is the full batch's
  mean gradient; under DDP the gradient exchange runs once, after the last part
  (``no_sync`` for the others).  Layers that depend on the batch (batch norm's statistics) see
  a micro-batch instead: docs/run.md says what that changes.

What watches the steps from outside without changing them (the operator replay, ``replay.py``)
registers a watcher with :meth:`Step.register_watcher` rather than replacing the call.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from repro500.errors import InvalidInput
from repro500.workloads.trainer.build import sync

# what Step.register_watcher takes: told a step's (inputs, targets), a context to run it in
Watcher = Callable[[Any, Any], contextlib.AbstractContextManager[Any]]

PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}


def check_precision(precision: str, device: str) -> None:
    """A precision the device cannot run is refused before anything is captured (exit 4)."""
    if precision not in PRECISIONS:
        raise InvalidInput(f"mutable.precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "amp-fp16" and device == "cpu":
        raise InvalidInput("mutable.precision amp-fp16 needs a CUDA device: CPUs run fp16 arithmetic emulated, "
                           "so its speed and accuracy would not be fp16's; use amp-bf16 on a CPU")
    if precision == "amp-bf16" and device == "cuda" and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        raise InvalidInput(f"mutable.precision amp-bf16: this GPU ({torch.cuda.get_device_name(0)}) has no bf16 "
                           "arithmetic; use amp-fp16 or fp32")


def check_micro_batch(micro_batch_size: int | None, batch_size: int) -> None:
    """A micro-batch must split the batch into equal parts (exit 4 otherwise)."""
    if micro_batch_size is None:
        return
    if micro_batch_size < 1:
        raise InvalidInput(f"mutable.micro_batch_size must be at least 1, got {micro_batch_size}")
    if batch_size % micro_batch_size:
        raise InvalidInput(f"mutable.micro_batch_size {micro_batch_size} does not divide mutable.batch_size "
                           f"{batch_size}: the parts of a batch must be equal so its gradient is the batch's mean")


def _parts(inputs: Any, targets: Any, size: int, total: int) -> list[tuple[Any, Any]]:
    """The batch cut into consecutive parts of ``size`` samples (tensors and lists alike)."""
    return [(inputs[i:i + size], targets[i:i + size]) for i in range(0, total, size)]


class Step:
    """The step of one repeat: built once, called once per batch."""

    def __init__(self, task: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                 precision: str = "fp32", micro_batch_size: int | None = None,
                 after_step: Callable[[float], None] | None = None) -> None:
        self.task, self.model, self.optimizer, self.device = task, model, optimizer, device
        self.precision, self.micro_batch_size = precision, micro_batch_size
        self.dtype = PRECISIONS[precision]
        self.scaler = torch.amp.GradScaler(device.type) if precision == "amp-fp16" else None
        self.after_step = after_step  # parameter averaging (engines/averaging.py), after the optimizer
        # an OrderedDict, as torch keeps its hooks: RemovableHandle holds it by a weak reference
        self._watchers: OrderedDict[int, Watcher] = OrderedDict()

    def register_watcher(self, watcher: Watcher) -> RemovableHandle:
        """Enter ``watcher(inputs, targets)``, a context manager, around each later call, before
        anything of the step runs and until its optimizer and ``after_step`` are done; watchers
        registered earlier are entered first.  ``remove()`` on the handle returned takes it off.

        A watcher observes the step (the replay records every operator of it under one) and must
        not change what it computes; training registers none.  An exception it raises ends the
        call, as the step's own would."""
        handle = RemovableHandle(self._watchers)
        self._watchers[handle.id] = watcher
        return handle

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def _no_sync(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        # DDP exchanges gradients in backward; the parts before the last only accumulate
        if last or not hasattr(self.model, "no_sync"):
            return contextlib.nullcontext()
        return self.model.no_sync()

    def __call__(self, inputs: Any, targets: Any, n: int) -> dict[str, Any]:
        """Train on one batch of ``n`` samples; the step's loss (the batch mean) and its times."""
        with contextlib.ExitStack() as watched:
            for watcher in list(self._watchers.values()):
                watched.enter_context(watcher(inputs, targets))
            return self._train(inputs, targets, n)

    def _train(self, inputs: Any, targets: Any, n: int) -> dict[str, Any]:
        size = self.micro_batch_size or n
        parts = _parts(inputs, targets, size, n) if size < n else [(inputs, targets)]
        self.optimizer.zero_grad(set_to_none=True)
        forward_s = backward_s = 0.0
        loss_value = 0.0
        sync(self.device)
        for j, (x, y) in enumerate(parts):
            with self._no_sync(last=j == len(parts) - 1):
                t0 = time.perf_counter()
                with self._autocast():
                    loss = self.task.loss(self.model, x, y)
                if len(parts) > 1:
                    loss = loss * (len(y) / n)  # the part's share of the batch mean
                sync(self.device)
                t1 = time.perf_counter()
                (self.scaler.scale(loss) if self.scaler else loss).backward()
                sync(self.device)
                t2 = time.perf_counter()
            forward_s, backward_s = forward_s + t1 - t0, backward_s + t2 - t1
            loss_value += float(loss.detach())
        skipped = False
        if self.scaler:
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            skipped = self.scaler.get_scale() < scale  # inf/NaN gradients: the step was not taken
        else:
            self.optimizer.step()
        sync(self.device)
        t3 = time.perf_counter()
        if self.after_step:  # told the loss: averaging folds the ranks' agreement on it into its all-reduce
            self.after_step(loss_value)
        record: dict[str, Any] = {"loss": loss_value, "time_forward_s": forward_s, "time_backward_s": backward_s,
                                  "time_optimizer_s": t3 - t2, "backward_end": t2}
        if len(parts) > 1:
            record["micro_batches"] = len(parts)
        if self.scaler:
            record["loss_scale"] = self.scaler.get_scale()
            record["step_skipped"] = skipped
        return record
