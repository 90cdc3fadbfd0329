"""Error feedback ("memory"): what a compressor dropped this step is added back next step.

    compensated = memory.compensate(gradient, name)          # gradient + carried error
    payload, ctx = compressor.compress(compensated, name)
    memory.update(compensated, name, compressor, payload, ctx)
    # ... exchange payloads, decompress and average them into `aggregated` ...
    gradient_hat = memory.restore(aggregated)

Conservation (tested): at every step, compensated = decompress(own payload) + new residual,
so the sum of everything sent plus the residual equals the sum of the gradients fed in.
Residuals are keyed by *name* (a DDP bucket's index); a residual whose shape no longer
matches (DDP rebuilds its buckets after the first step) is dropped and started afresh.
"""

from __future__ import annotations

from typing import Any

import torch

from repro500.errors import UsageError
from repro500.ext import ops


class NoneMemory:
    """No error feedback: what is dropped is lost (right for unbiased compressors)."""

    name = "none"

    def compensate(self, tensor: torch.Tensor, name: object) -> torch.Tensor:
        return tensor

    def update(
        self,
        compensated: torch.Tensor,
        name: object,
        compressor: Any,
        payload: list[torch.Tensor],
        ctx: Any,
    ) -> None:
        return None

    def restore(self, aggregated: torch.Tensor) -> torch.Tensor:
        return aggregated

    def residual(self, name: object) -> torch.Tensor | None:
        return None


class ResidualMemory(NoneMemory):
    """Residual error feedback (Seide et al. 2014; Stich et al. 2018; GRACE's ResidualMemory)."""

    name = "residual"

    def __init__(self) -> None:
        self._residuals: dict[object, torch.Tensor] = {}

    def residual(self, name: object) -> torch.Tensor | None:
        return self._residuals.get(name)

    def _scaled(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def compensate(self, tensor: torch.Tensor, name: object) -> torch.Tensor:
        residual = self._residuals.get(name)
        scaled = self._scaled(tensor)
        if residual is None or residual.shape != tensor.shape or residual.dtype != tensor.dtype:
            return scaled
        return scaled + residual

    def update(
        self,
        compensated: torch.Tensor,
        name: object,
        compressor: Any,
        payload: list[torch.Tensor],
        ctx: Any,
    ) -> None:
        decompressed = compressor.decompress(payload, ctx).to(compensated.dtype)
        residual = self._residuals.get(name)
        if (
            residual is None
            or residual.shape != compensated.shape
            or residual.dtype != compensated.dtype
        ):
            residual = torch.empty_like(compensated, memory_format=torch.contiguous_format)
            self._residuals[name] = residual
        ops.ef_update_(residual, compensated, decompressed)


class EFSignMemory(ResidualMemory):
    """EF-signSGD's memory (Karimireddy et al. 2019): p = lr·g + e, e = p − Δ, step = Δ/lr.

    The error is kept in units of the update (lr·g), as in the paper, so a learning-rate
    change rescales what is carried.  Set :attr:`lr` to the optimizer's learning rate
    before each step; with a constant lr this equals :class:`ResidualMemory`.
    """

    name = "efsign"

    def __init__(self, lr: float = 1.0) -> None:
        super().__init__()
        self.lr = lr

    def _scaled(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self.lr > 0:
            raise UsageError(f"EF-signSGD needs a positive learning rate, got {self.lr}.")
        return tensor * self.lr

    def restore(self, aggregated: torch.Tensor) -> torch.Tensor:
        return aggregated / self.lr


def for_compressor(compressor: Any) -> NoneMemory:
    """The memory a compressor asks for (its ``memory`` attribute: none, residual, efsign)."""
    kinds = {"none": NoneMemory, "residual": ResidualMemory, "efsign": EFSignMemory}
    if compressor.memory not in kinds:
        raise UsageError(
            f"memory {compressor.memory!r} is unknown; valid memories: {', '.join(kinds)}."
        )
    return kinds[compressor.memory]()
