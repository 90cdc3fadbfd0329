"""The operators ``repro500 ops`` measures: inputs, the call, a float64 reference, FLOPs and bytes.

Each operator is a small object (Deep500 level 0: an operator, its reference and its cost):

* ``make``: inputs drawn from N(0, 1) in float64 with a seeded generator, then rounded to the
  case's dtype and moved to its device.  The reference starts from those *rounded* inputs, so
  the error measured is the operator's, not the rounding of its inputs;
* ``call``: the operator itself, as a model runs it (torch's kernels here, repro500's C++/CUDA
  kernels in ``kernels.py``);
* ``reference``: the same mathematics in float64 on the CPU;
* ``flops``/``bytes``: the operation's arithmetic and the minimal memory traffic (every input
  read once, every output written once), the formulas docs/system.md lists;
* ``reduction``: the length of the longest sum behind one output element, which sets the
  tolerance (``tolerance_eps``).

The error of a case is taken normwise: max |y - r| (absolute), that over max |r| (relative), and
the relative error in units of the dtype's machine epsilon (``torch.finfo(dtype).eps``).  The
stated tolerance is ``2 sqrt(k) + 4`` epsilons for a reduction of length k: the probabilistic
rounding-error bound of a sum of k terms (Higham & Mary, SIAM J. Sci. Comput. 2019) with a
constant of 2 and 4 epsilons for the final rounding and the operator's own few operations.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from repro500.errors import UsageError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2}
BN_EPS = 1e-5


@dataclass(frozen=True)
class Case:
    """One measured combination: an operator at one size, in one dtype, on one device."""

    op: str
    dtype: str
    device: str
    shape: tuple[tuple[str, int], ...]

    @property
    def dims(self) -> dict[str, int]:
        return dict(self.shape)

    @property
    def id(self) -> str:
        """The metric prefix, e.g. ``matmul.fp32.cpu.1024x1024x1024``."""
        return f"{self.op}.{self.dtype}.{self.device}.{REGISTRY[self.op].label(self.dims)}"


class Operator:
    """The defaults are a vector operator's: one ``n``-element input (repro500's kernels)."""

    name = ""
    keys: tuple[str, ...] = ("n",)
    presets: dict[str, list[dict[str, int]]] = {"tiny": [{"n": 4096}], "default": [{"n": 1 << 20}, {"n": 1 << 23}],
                                                "large": [{"n": 1 << 26}]}

    def label(self, d: dict[str, int]) -> str:
        return f"n{d['n']}"

    def parse(self, text: str) -> dict[str, int]:
        """``--size OP=SPEC``: numbers separated by ``x`` or ``,`` in the order of ``keys``."""
        parts = [p for p in text.replace(",", "x").split("x") if p]
        if not all(p.isdigit() and int(p) > 0 for p in parts) or len(parts) not in (1, len(self.keys)):
            raise UsageError(f"--size {self.name}={text}: expected {len(self.keys)} positive integers "
                             f"({'x'.join(self.keys)}){' or one for all' if len(self.keys) > 1 else ''}")
        values = [int(p) for p in parts] * (len(self.keys) if len(parts) == 1 else 1)
        return dict(zip(self.keys, values, strict=True))

    def make(self, d: dict[str, int], dtype: torch.dtype, device: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {"x": normal((d["n"],), dtype, device, gen)}

    def call(self, x: dict[str, torch.Tensor]) -> Callable[[], Any]:
        raise NotImplementedError

    def outputs64(self, out: Any, x: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        return [as64(out)]

    def reference(self, x64: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        raise NotImplementedError

    def flops(self, d: dict[str, int]) -> float | None:
        return None

    def bytes(self, d: dict[str, int], itemsize: int) -> float:
        return 2.0 * d["n"] * itemsize

    def reduction(self, d: dict[str, int]) -> int:
        return 1

    def footprint(self, d: dict[str, int], itemsize: int) -> int:
        """Bytes the case holds at once: its traffic, and the float64 copies of the reference."""
        return int(self.bytes(d, itemsize) * (1 + 8 / itemsize) * 2)


def normal(shape: tuple[int, ...], dtype: torch.dtype, device: str, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype).to(device)


def as64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float64)


def inputs64(x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The float64 CPU copies the references start from (codes and bits keep their integer type)."""
    return {k: as64(v) if v.is_floating_point() else v.cpu() for k, v in x.items()}


class MatMul(Operator):
    name = "matmul"
    keys = ("m", "n", "k")
    presets = {"tiny": [{"m": 64, "n": 64, "k": 64}],
               "default": [{"m": s, "n": s, "k": s} for s in (256, 1024, 2048)],
               "large": [{"m": s, "n": s, "k": s} for s in (4096, 8192)]}

    def label(self, d: dict[str, int]) -> str:
        return f"{d['m']}x{d['n']}x{d['k']}"

    def make(self, d, dtype, device, gen):
        return {"a": normal((d["m"], d["k"]), dtype, device, gen), "b": normal((d["k"], d["n"]), dtype, device, gen)}

    def call(self, x):
        a, b = x["a"], x["b"]
        return lambda: torch.matmul(a, b)

    def reference(self, x64):
        return [x64["a"] @ x64["b"]]

    def flops(self, d):
        return 2.0 * d["m"] * d["n"] * d["k"]

    def bytes(self, d, itemsize):
        return float(d["m"] * d["k"] + d["k"] * d["n"] + d["m"] * d["n"]) * itemsize

    def reduction(self, d):
        return d["k"]


class Conv2d(Operator):
    """A 2-D convolution, stride 1, zero padding k // 2 (the output keeps the input's size)."""

    name = "conv2d"
    keys = ("n", "c", "h", "w", "o", "k")
    presets = {"tiny": [dict(n=2, c=8, h=8, w=8, o=8, k=3)],
               "default": [dict(n=8, c=64, h=32, w=32, o=64, k=3), dict(n=16, c=128, h=28, w=28, o=128, k=3)],
               "large": [dict(n=32, c=256, h=56, w=56, o=256, k=3)]}

    def label(self, d):
        return "".join(f"{key}{d[key]}" for key in self.keys)

    def make(self, d, dtype, device, gen):
        return {"x": normal((d["n"], d["c"], d["h"], d["w"]), dtype, device, gen),
                "w": normal((d["o"], d["c"], d["k"], d["k"]), dtype, device, gen) / math.sqrt(d["c"] * d["k"] ** 2)}

    def call(self, x):
        inp, w = x["x"], x["w"]
        pad = w.shape[-1] // 2
        return lambda: F.conv2d(inp, w, padding=pad)

    def reference(self, x64):
        return [F.conv2d(x64["x"], x64["w"], padding=x64["w"].shape[-1] // 2)]

    def flops(self, d):
        return 2.0 * d["n"] * d["o"] * d["h"] * d["w"] * d["c"] * d["k"] ** 2

    def bytes(self, d, itemsize):
        return float(d["n"] * d["c"] * d["h"] * d["w"] + d["o"] * d["c"] * d["k"] ** 2
                     + d["n"] * d["o"] * d["h"] * d["w"]) * itemsize

    def reduction(self, d):
        return d["c"] * d["k"] ** 2


class Conv2dBackward(Conv2d):
    """The backward pass of ``conv2d``: the gradients of the input and of the weight, from a
    given output gradient (``aten.convolution_backward``, what autograd calls)."""

    name = "conv2d_backward"

    def make(self, d, dtype, device, gen):
        x = super().make(d, dtype, device, gen)
        x["grad"] = normal((d["n"], d["o"], d["h"], d["w"]), dtype, device, gen)
        return x

    def call(self, x):
        inp, w, grad = x["x"], x["w"], x["grad"]
        pad = w.shape[-1] // 2
        return lambda: torch.ops.aten.convolution_backward(grad, inp, w, None, [1, 1], [pad, pad], [1, 1], False,
                                                           [0, 0], 1, [True, True, False])[:2]

    def outputs64(self, out, x):
        return [as64(out[0]), as64(out[1])]

    def reference(self, x64):
        pad = x64["w"].shape[-1] // 2
        grads = torch.ops.aten.convolution_backward(x64["grad"], x64["x"], x64["w"], None, [1, 1], [pad, pad], [1, 1],
                                                    False, [0, 0], 1, [True, True, False])
        return [grads[0], grads[1]]

    def flops(self, d):
        return 2.0 * super().flops(d)

    def bytes(self, d, itemsize):
        activations = d["n"] * d["c"] * d["h"] * d["w"]
        weights = d["o"] * d["c"] * d["k"] ** 2
        return float(d["n"] * d["o"] * d["h"] * d["w"] + 2 * activations + 2 * weights) * itemsize

    def reduction(self, d):
        return max(d["o"] * d["k"] ** 2, d["n"] * d["h"] * d["w"])


class BatchNorm(Operator):
    """Batch normalisation in training mode (batch statistics), with an affine scale and shift."""

    name = "batchnorm"
    keys = ("n", "c", "h", "w")
    presets = {"tiny": [dict(n=4, c=8, h=8, w=8)], "default": [dict(n=32, c=64, h=56, w=56)],
               "large": [dict(n=64, c=256, h=56, w=56)]}

    def label(self, d):
        return "".join(f"{key}{d[key]}" for key in self.keys)

    def make(self, d, dtype, device, gen):
        c = d["c"]
        return {"x": normal((d["n"], c, d["h"], d["w"]), dtype, device, gen),
                "weight": normal((c,), dtype, device, gen), "bias": normal((c,), dtype, device, gen)}

    def call(self, x):
        inp, weight, bias = x["x"], x["weight"], x["bias"]
        return lambda: F.batch_norm(inp, None, None, weight, bias, training=True, eps=BN_EPS)

    def reference(self, x64):
        return [F.batch_norm(x64["x"], None, None, x64["weight"], x64["bias"], training=True, eps=BN_EPS)]

    def flops(self, d):
        # mean (1), variance (3), normalise (2), scale and shift (2) per element
        return 8.0 * d["n"] * d["c"] * d["h"] * d["w"]

    def bytes(self, d, itemsize):
        return float(2 * d["n"] * d["c"] * d["h"] * d["w"] + 2 * d["c"]) * itemsize

    def reduction(self, d):
        return d["n"] * d["h"] * d["w"]


class AllReduce(Operator):
    """The engine's all-reduce (sum) of a message, timed on several ranks (``allreduce.py``)."""

    name = "allreduce"
    keys = ("bytes",)
    presets = {"tiny": [{"bytes": 4096}, {"bytes": 16384}]}  # otherwise: 4 KiB up to the model's gradient

    def label(self, d):
        return f"{d['bytes']}B"

    def bytes(self, d, itemsize):
        return float(d["bytes"])

    def footprint(self, d, itemsize):
        return int(d["bytes"] * (3 + 8 / itemsize))


REGISTRY: dict[str, Operator] = {op.name: op for op in (MatMul(), Conv2d(), Conv2dBackward(), BatchNorm(), AllReduce())}


def error(outputs: list[torch.Tensor], references: list[torch.Tensor], dtype: str) -> dict[str, Any]:
    """Normwise error of each output against its reference; the worst output counts."""
    eps = torch.finfo(DTYPES[dtype]).eps
    worst: dict[str, Any] = {"max_abs_err": 0.0, "max_rel_err": 0.0, "err_eps": 0.0, "eps": eps, "finite": True}
    for out, ref in zip(outputs, references, strict=True):
        if out.shape != ref.shape:
            raise ValueError(f"output shape {tuple(out.shape)} differs from the reference's {tuple(ref.shape)}")
        if not bool(torch.isfinite(out).all()):
            # JSON has no infinity: the largest float stands for it, and the record says so
            worst.update(max_abs_err=sys.float_info.max, max_rel_err=sys.float_info.max,
                         err_eps=sys.float_info.max, finite=False)
            continue
        diff = float((out - ref).abs().max()) if out.numel() else 0.0
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        rel = diff / scale if scale > 0 else (0.0 if diff == 0 else sys.float_info.max)
        if rel >= worst["max_rel_err"]:
            worst.update(max_abs_err=max(diff, worst["max_abs_err"]), max_rel_err=rel,
                         err_eps=min(rel / eps, sys.float_info.max))
        worst["max_abs_err"] = max(diff, worst["max_abs_err"])
    return worst


def tolerance_for(reduction: int) -> float:
    """The stated tolerance, in epsilons of the dtype, of a result summing ``reduction`` terms."""
    return round(2.0 * math.sqrt(reduction) + 4.0, 3)


def tolerance_eps(op: str, d: dict[str, int]) -> float:
    """The stated tolerance of a case, in epsilons of its dtype (see the module docstring)."""
    return tolerance_for(REGISTRY[op].reduction(d))
