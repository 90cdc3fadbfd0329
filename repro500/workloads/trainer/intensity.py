"""Arithmetic intensity of a training step: counted FLOPs / bytes moved (a documented estimate).

One forward and backward pass of a deep copy of the model (so the model's own state stays
untouched, as the trainer's FLOP count does) runs under two of torch's dispatch modes at once:

* FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` (matrix multiplications and convolutions,
  which is what a network's FLOPs are; the trainer's ``train_flops`` counts the same way);
* bytes: every ATen operator that is not a view is taken to read each of its tensor inputs and
  write each of its outputs once from main memory.  That is the traffic of an execution with no
  reuse between operators and perfect reuse inside each: fused kernels and caches holding a
  tensor from one operator to the next move less, a GEMM too large for the caches moves more.

The intensity places a run on the roofline (report.html, with ``repro500 roofline``'s
ceilings): below the ridge point (peak FLOP/s / bandwidth) a step is memory-bound, above it
compute-bound.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

METHOD = ("FLOPs: torch.utils.flop_counter.FlopCounterMode over one forward+backward; bytes: every non-view ATen "
          "operator reads its tensor inputs and writes its outputs once (no reuse between operators)")


def _byte_counter() -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class ByteCounter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bytes = 0
            self.operators = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if not any(r.alias_info is not None for r in func._schema.returns):  # a view moves nothing
                tensors = [t for t in tree_flatten((args, kwargs or {}, out))[0] if isinstance(t, torch.Tensor)]
                self.bytes += sum(t.numel() * t.element_size() for t in tensors)
                self.operators += 1
            return out

    return ByteCounter()


def estimate(model: Any, step: Callable[[Any], Any], samples: int) -> dict[str, Any]:
    """FLOPs, bytes and their ratio for one training step of ``samples`` samples;
    ``step(model_copy)`` runs the forward pass and returns the loss."""
    from torch.utils.flop_counter import FlopCounterMode

    probe = copy.deepcopy(model)
    counter = _byte_counter()
    try:
        with FlopCounterMode(display=False) as flops, counter:
            loss = step(probe)
            loss.backward()
    finally:
        del probe
    total_flops, moved = int(flops.get_total_flops()), int(counter.bytes)
    return {"flops_per_step": total_flops, "bytes_per_step": moved, "samples_per_step": samples,
            "arithmetic_intensity_flop_per_byte": total_flops / moved if moved else None,
            "operators": counter.operators, "method": METHOD}
