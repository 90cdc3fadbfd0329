"""Pure-PyTorch reference implementations of the ``repro500`` operators.

Each function computes exactly what its C++/CUDA kernel computes (docs/compression.md,
"Operators"), on any device, and is what :mod:`repro500.ext.ops` falls back to when the
compiled operators are unavailable.  Tests compare every kernel with these.

The stochastic rounding uses the same counter-based generator as csrc/rng.h (splitmix64 of
the counter (seed, i)), emulated here with wrapping int64 arithmetic, so a kernel and its
reference agree bit for bit on the same seed.
"""

from __future__ import annotations

import torch

# The positions code's reference lives with its format: repro500.ext.indexcode.
from repro500.ext.indexcode import decode as positions_decode  # noqa: F401
from repro500.ext.indexcode import encode as positions_encode  # noqa: F401

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB


def _signed(value: int) -> int:
    """A uint64 as the int64 with the same bits (torch has no full uint64 arithmetic)."""
    value &= MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def mix64_int(z: int) -> int:
    """splitmix64's finaliser on a Python int (exact uint64 arithmetic)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def _shift_right_logical(z: torch.Tensor, bits: int) -> torch.Tensor:
    # int64 >> is arithmetic; masking off the copied sign bits makes it logical.
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _mix64(z: torch.Tensor) -> torch.Tensor:
    # int64 multiplication wraps modulo 2**64 like uint64's, so the bits match csrc/rng.h.
    z = (z ^ _shift_right_logical(z, 30)) * _signed(MIX1)
    z = (z ^ _shift_right_logical(z, 27)) * _signed(MIX2)
    return z ^ _shift_right_logical(z, 31)


def uniform01(seed: int, numel: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The counter-based uniforms u_0..u_{numel-1} in [0, 1) (24 bits, float32) for *seed*."""
    key = mix64_int(seed)
    counter = torch.arange(1, numel + 1, dtype=torch.int64, device=device)
    h = _mix64(counter * _signed(GOLDEN_GAMMA) + _signed(key))
    return _shift_right_logical(h, 40).to(torch.float32) * (1.0 / 16777216.0)


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k elements of largest |x| (ties: lower index first), in index order; int32 indices."""
    flat = x.reshape(-1)
    if not 0 <= k <= flat.numel():
        raise ValueError(f"k must be in [0, {flat.numel()}], got {k}")
    # A stable descending sort keeps equal magnitudes in index order: the tie rule.
    chosen = torch.sort(flat.abs(), descending=True, stable=True).indices[:k]
    chosen = torch.sort(chosen).values
    return flat[chosen], chosen.to(torch.int32)


def _bucketed(flat: torch.Tensor, bucket_size: int) -> torch.Tensor:
    num_buckets = -(-flat.numel() // bucket_size)
    padded = flat.new_zeros(num_buckets * bucket_size)
    padded[: flat.numel()] = flat
    return padded.view(num_buckets, bucket_size)


def _per_element(scales: torch.Tensor, bucket_size: int, numel: int) -> torch.Tensor:
    return scales.repeat_interleave(bucket_size)[:numel]


def stochastic_quantize(
    x: torch.Tensor, levels: int, bucket_size: int, max_norm: bool, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """QSGD codes (int8 in [-levels, levels]) and per-bucket float32 scales."""
    if not 1 <= levels <= 127:
        raise ValueError(f"levels must be in [1, 127], got {levels}")
    if bucket_size < 1:
        raise ValueError(f"bucket_size must be positive, got {bucket_size}")
    flat = x.reshape(-1).to(torch.float32)
    n = flat.numel()
    buckets = _bucketed(flat, bucket_size)
    if max_norm:
        scales = buckets.abs().amax(dim=1)
    else:
        # double, as the kernels: a bucket's norm must not depend on summation order
        scales = buckets.double().pow(2).sum(dim=1).sqrt().to(torch.float32)
    factor = _per_element(levels / scales, bucket_size, n)
    level = flat.abs() * factor
    floor = torch.floor(level)
    up = uniform01(seed, n, flat.device) < (level - floor)
    q = torch.nan_to_num(floor, nan=0.0) + up.to(torch.float32)
    q = torch.where(torch.isnan(level), torch.zeros_like(q), q).clamp(max=levels)
    q = torch.where(_per_element(scales, bucket_size, n) == 0, torch.zeros_like(q), q)
    codes = torch.where(flat < 0, -q, q).to(torch.int8)
    return codes, scales


def stochastic_dequantize(
    codes: torch.Tensor, scales: torch.Tensor, levels: int, bucket_size: int
) -> torch.Tensor:
    """codes * scale(bucket) / levels in the dtype of *scales* (differentiable in scales)."""
    per_element = _per_element(scales, bucket_size, codes.numel()).view(codes.shape)
    return codes.to(scales.dtype) * per_element / levels


def sign_pack(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """8 signs per uint8 (bit b of byte j = element 8j+b, 1 = not negative), scale = mean |x|."""
    flat = x.reshape(-1).to(torch.float32)
    n = flat.numel()
    bits = torch.zeros(-(-n // 8) * 8, dtype=torch.int32, device=flat.device)
    bits[:n] = (~(flat < 0)).to(torch.int32)
    weights = 1 << torch.arange(8, dtype=torch.int32, device=flat.device)
    packed = (bits.view(-1, 8) * weights).sum(dim=1).to(torch.uint8)
    mean = flat.abs().double().sum() / n if n else flat.new_zeros((), dtype=torch.float64)
    return packed, mean.to(torch.float32).reshape(1)


def sign_unpack(packed: torch.Tensor, scale: torch.Tensor, numel: int) -> torch.Tensor:
    """+scale where the bit is 1, -scale where it is 0 (differentiable in scale)."""
    shifts = torch.arange(8, dtype=torch.int32, device=packed.device)
    bits = ((packed.to(torch.int32).unsqueeze(1) >> shifts) & 1).reshape(-1)[:numel]
    return scale.reshape(()) * (2 * bits - 1).to(scale.dtype)


def ef_update_(
    residual: torch.Tensor, compensated: torch.Tensor, decompressed: torch.Tensor
) -> None:
    """residual = compensated - decompressed, in place."""
    torch.sub(
        compensated.reshape(residual.shape), decompressed.reshape(residual.shape), out=residual
    )
