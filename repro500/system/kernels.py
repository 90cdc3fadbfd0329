"""repro500's own C++/CUDA operators (the compressors' kernels, ``repro500.ext.ops``) as
``repro500 ops`` cases: each called through ``repro500.ext.ops`` exactly as the compressors call
it (the compiled kernel when it loads, else the PyTorch reference: the record says which), and
checked against the same mathematics in float64.

Outputs that are codes or bits (top-k indices, quantisation codes, packed signs) are compared
through what they decode to, so a wrong code shows as an error of the size of one step.
"""

from __future__ import annotations

import torch

from repro500.ext import ops as ext
from repro500.ext import reference
from repro500.system.operators import REGISTRY, Operator, as64, normal

TOPK_FRACTION = 0.01
LEVELS = 127  # QSGD with 8-bit codes
BUCKET = 512
SEED = 500


def backend(device: str) -> str:
    """``native`` when the compiled kernels serve ``device`` (compiling them on first use), else
    ``reference`` (repro500.ext.ops falls back and says why on stderr)."""
    return "native" if ext.warm_up(device) else "reference"


class TopK(Operator):
    name = "topk"

    def call(self, x):
        t, k = x["x"], max(1, int(x["x"].numel() * TOPK_FRACTION))
        return lambda: ext.topk(t, k)

    def outputs64(self, out, x):
        return [as64(out[0]), out[1].to("cpu", torch.float64)]

    def reference(self, x64):
        values, indices = reference.topk(x64["x"], max(1, int(x64["x"].numel() * TOPK_FRACTION)))
        return [values, indices.to(torch.float64)]

    def bytes(self, d, itemsize):
        k = max(1, int(d["n"] * TOPK_FRACTION))
        return float(d["n"] * itemsize + k * (itemsize + 4))


def _decode(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return reference.stochastic_dequantize(codes.cpu(), scales.to("cpu", torch.float64), LEVELS, BUCKET)


class Quantize(Operator):
    name = "quantize"

    def call(self, x):
        t = x["x"]
        return lambda: ext.quantize(t, LEVELS, BUCKET, False, SEED)

    def outputs64(self, out, x):
        return [_decode(*out)]

    def reference(self, x64):
        codes, _ = reference.stochastic_quantize(x64["x"], LEVELS, BUCKET, False, SEED)
        flat = x64["x"].reshape(-1)
        padded = flat.new_zeros(-(-flat.numel() // BUCKET) * BUCKET)
        padded[: flat.numel()] = flat
        norms = padded.view(-1, BUCKET).pow(2).sum(dim=1).sqrt()  # the bucket norms, in float64
        return [_decode(codes, norms)]

    def flops(self, d):
        return 6.0 * d["n"]  # norm (2), scale, floor, compare, sign per element

    def bytes(self, d, itemsize):
        return float(d["n"] * (itemsize + 1) + 4 * -(-d["n"] // BUCKET))


class Dequantize(Operator):
    name = "dequantize"

    def make(self, d, dtype, device, gen):
        codes = torch.randint(-LEVELS, LEVELS + 1, (d["n"],), generator=gen, dtype=torch.int8)
        scales = normal((-(-d["n"] // BUCKET),), dtype, "cpu", gen).abs()
        return {"codes": codes.to(device), "scales": scales.to(device)}

    def call(self, x):
        codes, scales = x["codes"], x["scales"]
        return lambda: ext.dequantize(codes, scales, LEVELS, BUCKET)

    def reference(self, x64):
        return [reference.stochastic_dequantize(x64["codes"], x64["scales"], LEVELS, BUCKET)]

    def flops(self, d):
        return 2.0 * d["n"]

    def bytes(self, d, itemsize):
        return float(d["n"] * (1 + itemsize) + itemsize * -(-d["n"] // BUCKET))


class SignPack(Operator):
    name = "sign_pack"

    def call(self, x):
        t = x["x"]
        return lambda: ext.sign_pack(t)

    def outputs64(self, out, x):
        return [reference.sign_unpack(out[0].cpu(), out[1].to("cpu", torch.float64), x["x"].numel())]

    def reference(self, x64):
        t = x64["x"]
        signs = torch.where(t < 0, -1.0, 1.0).to(torch.float64)
        return [signs * t.abs().mean()]

    def flops(self, d):
        return 1.0 * d["n"]  # the mean of |x|

    def bytes(self, d, itemsize):
        return float(d["n"] * itemsize + -(-d["n"] // 8) + 4)


class SignUnpack(Operator):
    name = "sign_unpack"

    def make(self, d, dtype, device, gen):
        packed = torch.randint(0, 256, (-(-d["n"] // 8),), generator=gen, dtype=torch.uint8)
        return {"packed": packed.to(device), "scale": normal((1,), dtype, "cpu", gen).abs().to(device),
                "numel": torch.tensor(d["n"])}

    def call(self, x):
        packed, scale, n = x["packed"], x["scale"], int(x["numel"])
        return lambda: ext.sign_unpack(packed, scale, n)

    def reference(self, x64):
        return [reference.sign_unpack(x64["packed"], x64["scale"], int(x64["numel"]))]

    def bytes(self, d, itemsize):
        return float(-(-d["n"] // 8) + d["n"] * itemsize)


class EfUpdate(Operator):
    """Error feedback, in place: residual = compensated - decompressed."""

    name = "ef_update"

    def make(self, d, dtype, device, gen):
        shape = (d["n"],)
        return {"residual": torch.empty(shape, dtype=dtype, device=device),
                "compensated": normal(shape, dtype, device, gen), "decompressed": normal(shape, dtype, device, gen)}

    def call(self, x):
        residual, compensated, decompressed = x["residual"], x["compensated"], x["decompressed"]

        def update() -> torch.Tensor:
            ext.ef_update_(residual, compensated, decompressed)
            return residual
        return update

    def reference(self, x64):
        return [x64["compensated"] - x64["decompressed"]]

    def flops(self, d):
        return 1.0 * d["n"]

    def bytes(self, d, itemsize):
        return 3.0 * d["n"] * itemsize


for _op in (TopK(), Quantize(), Dequantize(), SignPack(), SignUnpack(), EfUpdate()):
    REGISTRY[_op.name] = _op
