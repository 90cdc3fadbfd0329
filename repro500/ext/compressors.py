"""Gradient compressors (GRACE's split: Compressor / Memory / Communicator).

A :class:`Compressor` turns one flat gradient tensor into a *payload* (the tensors that go on
the wire) and a *ctx* (what stays on this rank to decode it), and back:

    payload, ctx = compressor.compress(tensor, name)
    tensor_hat   = compressor.decompress(payload, ctx)

``summable`` compressors have payloads that may be summed elementwise across ranks (the
communicator allreduces them); the others are allgathered and each rank's payload is
decompressed and summed (``aggregate``).  Error feedback lives in :mod:`repro500.ext.memory`,
the collectives in :mod:`repro500.ext.communicator`.

``get(spec)`` builds one from a name (``"topk"``) or a dict (``{"name": "topk", "ratio":
0.01}``); the valid names and parameters are in :data:`PARAMETERS` and docs/compression.md,
and ``resolve(spec)`` gives the spec with every default filled in (:mod:`repro500.ext.specs`,
no torch needed), which is what a run records.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from repro500.errors import UsageError
from repro500.ext import indexcode, ops
from repro500.ext.specs import DEFAULT_MEMORY, MEMORIES, PARAMETERS, names, resolve

__all__ = ["DEFAULT_MEMORY", "MEMORIES", "PARAMETERS", "Compressor", "get", "names", "resolve"]


@dataclass(frozen=True)
class Ctx:
    """What a rank keeps to decode a payload: the original shape, dtype and size."""

    shape: torch.Size
    dtype: torch.dtype
    numel: int
    indices: torch.Tensor | None = None  # random-k: the shared positions (never sent)


def _ctx(tensor: torch.Tensor, indices: torch.Tensor | None = None) -> Ctx:
    return Ctx(tensor.shape, tensor.dtype, tensor.numel(), indices)


def stable_hash(*parts: object) -> int:
    """A 63-bit hash of *parts* that is the same in every process (``hash()`` is salted)."""
    text = "\0".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


class Compressor:
    """Base class: identity compression of floating tensors ("none")."""

    name = "none"
    summable = True  # payloads may be summed across ranks (allreduce)
    default_memory = DEFAULT_MEMORY["none"]
    # Nominal wire cost per element of an fp32 gradient, for documentation and planning;
    # the communicator counts the bytes of the real payload, not this number.
    bits_per_element: float | None = 32.0
    uses_ops = False  # True when compress/decompress call the repro500 operators

    @property
    def needs_ops(self) -> bool:
        """Whether this compressor or its error feedback runs the repro500 operators."""
        return self.uses_ops or self.memory != "none"

    def __init__(self, memory: str | None = None, **params: Any) -> None:
        self.params = params
        self.memory = memory or self.default_memory
        self.rank = 0
        self.world_size = 1
        self._steps: dict[object, int] = {}

    def bind(self, rank: int, world_size: int) -> None:
        """Tell the compressor which rank it runs on (seeds of stochastic compressors)."""
        self.rank, self.world_size = rank, world_size

    def spec(self) -> dict[str, Any]:
        """The canonical JSON-able description (what the manifest and MLflow record)."""
        return {"name": self.name, **self.params, "memory": self.memory}

    def _next_step(self, name: object) -> int:
        step = self._steps.get(name, 0)
        self._steps[name] = step + 1
        return step

    def compress(self, tensor: torch.Tensor, name: object) -> tuple[list[torch.Tensor], Ctx]:
        return [tensor.reshape(-1)], _ctx(tensor)

    def decompress(self, payload: list[torch.Tensor], ctx: Ctx) -> torch.Tensor:
        return payload[0].to(ctx.dtype).view(ctx.shape)

    def aggregate(self, payloads: list[list[torch.Tensor]], ctx: Ctx) -> torch.Tensor:
        """The SUM over ranks of the decompressed payloads (allgather path)."""
        total = self.decompress(payloads[0], ctx).clone()
        for payload in payloads[1:]:
            total += self.decompress(payload, ctx)
        return total


class NoneCompressor(Compressor):
    pass


class CastCompressor(Compressor):
    """fp16 / bf16: cast on the way out, cast back on the way in (summable)."""

    def __init__(self, dtype: torch.dtype, name: str, memory: str | None = None) -> None:
        super().__init__(memory=memory)
        self.cast_dtype = dtype
        self.name = name
        self.bits_per_element = 16.0

    def compress(self, tensor: torch.Tensor, name: object) -> tuple[list[torch.Tensor], Ctx]:
        return [tensor.reshape(-1).to(self.cast_dtype)], _ctx(tensor)


def _k_of(numel: int, ratio: float) -> int:
    return min(numel, max(1, int(numel * ratio)))


class TopKCompressor(Compressor):
    """The k = max(1, int(ratio·n)) largest magnitudes (allgather), coded for the wire.

    The payload is ``[values, code]``: the k values as bfloat16 (a 16-bit tensor's own dtype
    is kept) and their positions Elias-Fano coded (:mod:`repro500.ext.indexcode`, about
    2 + log2(1/ratio) bits each).  At ratio 0.01 that is 24.6 bits per kept element, 1/130 of
    the dense tensor, against 64 bits (fp32 + int32) before.  Its size depends on n and k only,
    so every rank sends the same bytes.  The values' rounding is not lost: error feedback
    (the default ``residual`` memory) keeps ``compensated - decompress(payload)``, which
    includes it, and sends it later.
    """

    name = "topk"
    uses_ops = True
    summable = False
    default_memory = DEFAULT_MEMORY["topk"]
    value_dtype = torch.bfloat16  # fp32's range, so a large gradient cannot overflow (fp16 could)

    def __init__(self, ratio: float = 0.01, memory: str | None = None) -> None:
        super().__init__(memory=memory, ratio=ratio)
        self.ratio = ratio
        self.bits_per_element = 16.0 * ratio + indexcode.bits_per_element(ratio)

    def compress(self, tensor: torch.Tensor, name: object) -> tuple[list[torch.Tensor], Ctx]:
        flat = tensor.reshape(-1)
        n = flat.numel()
        if n > indexcode.MAX_N:
            raise UsageError(
                f"top-k compresses tensors of at most 2^31 - 1 elements (int32 positions); "
                f"got one of {n:,}: use smaller DDP buckets (bucket_cap_mb) or split the tensor."
            )
        values, indices = ops.topk(flat, _k_of(n, self.ratio))
        if values.element_size() > 2:
            values = values.to(self.value_dtype)
        return [values, ops.positions_encode(indices, n)], _ctx(tensor)

    def _positions(self, payload: list[torch.Tensor], ctx: Ctx) -> torch.Tensor:
        return ops.positions_decode(payload[1], ctx.numel, payload[0].numel())

    def decompress(self, payload: list[torch.Tensor], ctx: Ctx) -> torch.Tensor:
        out = torch.zeros(ctx.numel, dtype=ctx.dtype, device=payload[0].device)
        out[self._positions(payload, ctx)] = payload[0].to(ctx.dtype)
        return out.view(ctx.shape)

    def aggregate(self, payloads: list[list[torch.Tensor]], ctx: Ctx) -> torch.Tensor:
        # One scatter-add of every rank's (position, value) pairs instead of P dense tensors.
        values = torch.cat([p[0] for p in payloads]).to(ctx.dtype)
        positions = torch.cat([self._positions(p, ctx) for p in payloads])
        out = torch.zeros(ctx.numel, dtype=ctx.dtype, device=values.device)
        return out.index_add_(0, positions, values).view(ctx.shape)


class RandomKCompressor(Compressor):
    """k random positions shared by all ranks (seed, name, step): only values travel; summable."""

    name = "randomk"
    summable = True
    default_memory = DEFAULT_MEMORY["randomk"]

    def __init__(self, ratio: float = 0.01, seed: int = 0, memory: str | None = None) -> None:
        super().__init__(memory=memory, ratio=ratio, seed=seed)
        self.ratio, self.seed = ratio, seed
        self.bits_per_element = 32.0 * ratio

    def compress(self, tensor: torch.Tensor, name: object) -> tuple[list[torch.Tensor], Ctx]:
        flat = tensor.reshape(-1)
        n = flat.numel()
        # Every rank draws the same positions: the generator depends on nothing rank-local.
        gen = torch.Generator().manual_seed(
            stable_hash("randomk", self.seed, name, self._next_step(name))
        )
        indices = torch.randperm(n, generator=gen)[: _k_of(n, self.ratio)].sort().values
        indices = indices.to(flat.device)
        return [flat[indices]], _ctx(tensor, indices)

    def decompress(self, payload: list[torch.Tensor], ctx: Ctx) -> torch.Tensor:
        out = torch.zeros(ctx.numel, dtype=ctx.dtype, device=payload[0].device)
        out[ctx.indices] = payload[0].to(ctx.dtype)
        return out.view(ctx.shape)


class QSGDCompressor(Compressor):
    """QSGD with *levels* magnitudes per sign, stochastic rounding, an L2 norm per bucket."""

    name = "qsgd"
    uses_ops = True
    summable = False
    default_memory = DEFAULT_MEMORY["qsgd"]

    def __init__(
        self, levels: int = 127, bucket_size: int = 512, seed: int = 0, memory: str | None = None
    ) -> None:
        super().__init__(memory=memory, levels=levels, bucket_size=bucket_size, seed=seed)
        self.levels, self.bucket_size, self.seed = levels, bucket_size, seed
        # int8 codes on the wire (1 byte) plus one float32 norm per bucket.
        self.bits_per_element = 8.0 + 32.0 / bucket_size
        self.max_norm = False

    def _seed(self, name: object) -> int:
        # Independent noise per rank, tensor and step, reproducible from the recipe's seed.
        return stable_hash(self.name, self.seed, self.rank, name, self._next_step(name))

    def compress(self, tensor: torch.Tensor, name: object) -> tuple[list[torch.Tensor], Ctx]:
        codes, scales = ops.quantize(
            tensor.reshape(-1), self.levels, self.bucket_size, self.max_norm, self._seed(name)
        )
        return [codes, scales], _ctx(tensor)

    def decompress(self, payload: list[torch.Tensor], ctx: Ctx) -> torch.Tensor:
        codes, scales = payload
        return (
            ops.dequantize(codes, scales, self.levels, self.bucket_size)
            .to(ctx.dtype)
            .view(ctx.shape)
        )


class TernGradCompressor(QSGDCompressor):
    """TernGrad: clip to ±clip_sigmas·σ, then {-1, 0, 1} · max|x| per bucket, stochastically."""

    name = "terngrad"

    def __init__(
        self,
        clip_sigmas: float | None = 2.5,
        bucket_size: int = 4096,
        seed: int = 0,
        memory: str | None = None,
    ) -> None:
        Compressor.__init__(
            self, memory=memory, clip_sigmas=clip_sigmas, bucket_size=bucket_size, seed=seed
        )
        self.clip_sigmas, self.bucket_size, self.seed = clip_sigmas, bucket_size, seed
        self.levels, self.max_norm = 1, True
        self.bits_per_element = 8.0 + 32.0 / bucket_size

    def compress(self, tensor: torch.Tensor, name: object) -> tuple[list[torch.Tensor], Ctx]:
        flat = tensor.reshape(-1)
        if self.clip_sigmas is not None and flat.numel() > 1:
            # Gradient clipping of the paper (Wen et al. 2017, sec. 3.3): bounds the scale.
            bound = float(self.clip_sigmas * flat.float().std())
            flat = flat.clamp(-bound, bound)
        codes, scales = ops.quantize(flat, 1, self.bucket_size, True, self._seed(name))
        return [codes, scales], _ctx(tensor)


class EFSignCompressor(Compressor):
    """EF-signSGD: one bit per element, scaled by mean |x|; pairs with error feedback."""

    name = "efsignsgd"
    uses_ops = True
    summable = False
    default_memory = DEFAULT_MEMORY["efsignsgd"]
    bits_per_element = 1.0

    def compress(self, tensor: torch.Tensor, name: object) -> tuple[list[torch.Tensor], Ctx]:
        packed, scale = ops.sign_pack(tensor.reshape(-1))
        return [packed, scale], _ctx(tensor)

    def decompress(self, payload: list[torch.Tensor], ctx: Ctx) -> torch.Tensor:
        packed, scale = payload
        return ops.sign_unpack(packed, scale, ctx.numel).to(ctx.dtype).view(ctx.shape)


class PowerSGDCompressor(Compressor):
    """PowerSGD (Vogels et al. 2019) through torch's own ``powerSGD_hook`` (DDP only).

    Its compression communicates (two allreduces per step), so it has no stand-alone
    compress/decompress; :func:`repro500.ext.ddp_hook.register` wires it to torch's hook.
    """

    name = "powersgd"
    summable = True
    default_memory = DEFAULT_MEMORY["powersgd"]

    def __init__(
        self,
        rank: int = 1,
        start_iter: int = 10,
        min_compression_rate: float = 2.0,
        warm_start: bool = True,
        error_feedback: bool = True,
        seed: int = 0,
        memory: str | None = None,
    ) -> None:
        super().__init__(
            memory=memory,
            rank=rank,
            start_iter=start_iter,
            min_compression_rate=min_compression_rate,
            warm_start=warm_start,
            error_feedback=error_feedback,
            seed=seed,
        )
        self.matrix_rank = rank
        self.bits_per_element = None  # (n+m)·r per n×m matrix: depends on the shapes

    def compress(self, tensor: torch.Tensor, name: object) -> tuple[list[torch.Tensor], Ctx]:
        raise UsageError(
            "the powersgd compressor communicates while compressing; use it through "
            "repro500.ext.ddp_hook.register (the ddp engine), not compress()."
        )

    def decompress(self, payload: list[torch.Tensor], ctx: Ctx) -> torch.Tensor:
        raise UsageError(
            "the powersgd compressor has no stand-alone decompress; use the ddp engine."
        )


_CLASSES: dict[str, Any] = {
    "none": NoneCompressor,
    "topk": TopKCompressor,
    "randomk": RandomKCompressor,
    "qsgd": QSGDCompressor,
    "terngrad": TernGradCompressor,
    "efsignsgd": EFSignCompressor,
    "powersgd": PowerSGDCompressor,
}


def get(spec: str | Mapping[str, Any] | Compressor | None) -> Compressor:
    """Build a compressor from a name, a dict with "name" and parameters, or pass one through.

    Raises :class:`repro500.errors.UsageError` (one sentence listing the valid choices) for
    an unknown name, an unknown parameter or a value out of range.
    """
    if isinstance(spec, Compressor):
        return spec
    resolved = resolve(spec)
    name, memory = resolved.pop("name"), resolved.pop("memory")
    if name == "fp16":
        return CastCompressor(torch.float16, "fp16", memory=memory)
    if name == "bf16":
        return CastCompressor(torch.bfloat16, "bf16", memory=memory)
    return _CLASSES[name](memory=memory, **resolved)
