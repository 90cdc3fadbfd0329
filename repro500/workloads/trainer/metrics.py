"""Measurements the trainer takes besides the loss: parameter digests, FLOPs, memory, Valid FLOPS.

Parameter digests (docs/contracts.md, "params.jsonl"): a tensor's digest is the SHA-256 of its
contiguous CPU bytes; the model digest is the SHA-256 of the text lines
``name<TAB>dtype<TAB>shape<TAB>tensor-digest\\n`` over the ``state_dict`` in order, so each
tensor is hashed once and the first differing tensor between two runs can be named.
"""

from __future__ import annotations

import copy
import hashlib
import math
import resource
from collections.abc import Callable
from typing import Any

import torch


def tensor_digest(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes (any dtype, any device)."""
    flat = tensor.detach().reshape(-1).contiguous().cpu()
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()


def state_digests(module: torch.nn.Module) -> tuple[str, dict[str, str]]:
    """(model digest, {tensor name: tensor digest}) over parameters and buffers."""
    per_tensor: dict[str, str] = {}
    model_hash = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        digest = tensor_digest(tensor)
        per_tensor[name] = digest
        shape = "x".join(str(s) for s in tensor.shape)
        model_hash.update(f"{name}\t{str(tensor.dtype).removeprefix('torch.')}\t{shape}\t{digest}\n".encode())
    return model_hash.hexdigest(), per_tensor


def count_train_flops(model: torch.nn.Module, step: Callable[[torch.nn.Module], torch.Tensor]) -> int | None:
    """FLOPs of one training step's forward and backward, counted by ``torch.utils.flop_counter``.

    The count runs on a deep copy so that batch-norm statistics, gradients and optimizer state of
    the real model are untouched (the run stays bit-identical to one without counting).
    ``step(model_copy)`` must run the forward pass and return the loss.
    """
    from torch.utils.flop_counter import FlopCounterMode

    probe = copy.deepcopy(model)
    try:
        with FlopCounterMode(display=False) as counter:
            loss = step(probe)
            loss.backward()
        return int(counter.get_total_flops())
    except Exception:  # noqa: BLE001 - an op the counter cannot trace: FLOPs unknown, not a crash
        return None
    finally:
        del probe


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory so far: allocated CUDA memory on a GPU, the process's peak RSS on the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def quality_ratio(achieved: float, target: float, direction: str) -> float | None:
    """achieved/target for higher-is-better metrics, target/achieved for lower-is-better; not capped.

    HPC AI500 (Jiang et al., section 4.3): the penalty coefficient "penalize[s] or award[s] the
    FLOPS if the achieved quality is lower or greater than the target", so a ratio above 1 counts.
    None when the ratio is undefined (a zero or negative denominator, a non-finite input).
    """
    if not (math.isfinite(achieved) and math.isfinite(target)) or target <= 0 or achieved < 0:
        return None
    if direction == "higher":
        return achieved / target
    return target / achieved if achieved > 0 else None


def valid_flops(flops_per_s: float, achieved: float, target: float, direction: str, exponent: int) -> float | None:
    """HPC AI500's Valid FLOPS: ``FLOPS * (achieved / target) ** n``; None when undefined."""
    ratio = quality_ratio(achieved, target, direction)
    if ratio is None:
        return None
    try:
        value = flops_per_s * ratio**exponent
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def target_reached(value: float | None, target: float, direction: str) -> bool:
    if value is None or not math.isfinite(value):
        return False
    return value >= target if direction == "higher" else value <= target


def finite_or_none(value: Any) -> Any:
    """JSON has no NaN: a non-finite float becomes ``None``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
