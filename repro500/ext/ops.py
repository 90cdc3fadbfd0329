"""Python entry points of the ``repro500`` operators: compiled kernels or the references.

Every function here takes and returns plain tensors.  With the backend ``auto`` (default)
the first call compiles and loads the C++ operators (once per machine, cached; see
:mod:`repro500.ext.build`) and uses them; if that fails (no compiler), it says so once on
stderr and uses the pure-PyTorch references (:mod:`repro500.ext.reference`), which compute
the same results.  CUDA tensors use the CUDA kernels when they have been built
(:func:`repro500.ext.build.build_cuda_ops`), else the references.

Choose the backend with ``$REPRO500_OPS`` (``auto`` | ``native`` | ``reference``) or, in
code, ``with use_backend("reference"): ...``.  ``native`` fails loudly instead of falling back.

Loading the library also registers, under the same op names, fake (meta) kernels for
torch.compile / torch.library.opcheck and autograd formulas for the differentiable ops:
``topk_threshold`` (gradient flows to the selected elements), ``stochastic_dequantize``
and ``sign_unpack`` (gradient with respect to the scales).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

import torch

from repro500.errors import UsageError
from repro500.ext import indexcode, reference

BACKENDS = ("auto", "native", "reference")
_lock = threading.Lock()
_override: list[str] = []
_cpu: dict[str, object] = {"loaded": None, "error": None}  # loaded: None = not tried yet
_cuda: dict[str, object] = {"loaded": None, "error": None}


def backend() -> str:
    """The backend in force: innermost :func:`use_backend`, else $REPRO500_OPS, else auto."""
    name = _override[-1] if _override else os.environ.get("REPRO500_OPS", "auto").strip().lower()
    if name not in BACKENDS:
        raise UsageError(
            f"REPRO500_OPS={name!r} is not a backend; use one of {', '.join(BACKENDS)}."
        )
    return name


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Run a block with the operators' backend forced to *name* (auto, native, reference)."""
    if name not in BACKENDS:
        raise UsageError(f"backend {name!r} is unknown; use one of {', '.join(BACKENDS)}.")
    _override.append(name)
    try:
        yield
    finally:
        _override.pop()


def load_native(cuda: bool = False) -> bool:
    """Compile/load the CPU operators (and the CUDA ones if *cuda*); True when they loaded.

    Tried once per process; later calls return the first outcome.
    """
    with _lock:
        if _cpu["loaded"] is None:
            try:
                from repro500.ext import build

                build.load_cpu_ops()
                _register_python_parts()
                _cpu["loaded"] = True
            except Exception as err:  # any build failure means "use the references"
                _cpu["loaded"], _cpu["error"] = False, f"{type(err).__name__}: {err}"
        if cuda and _cpu["loaded"] and _cuda["loaded"] is None:
            try:
                from repro500.ext import build

                build.build_cuda_ops()
                _cuda["loaded"] = True
            except Exception as err:  # as above: fall back
                _cuda["loaded"], _cuda["error"] = False, f"{type(err).__name__}: {err}"
        return bool(_cpu["loaded"]) and (not cuda or bool(_cuda["loaded"]))


def warm_up(device: torch.device | str = "cpu") -> bool:
    """Load (compiling on first use) the operators for *device* now, not at the first gradient.

    Returns True when the compiled kernels will be used; honours the backend like any call.
    """
    return _use_native(torch.empty(0, device=device))


def native_error() -> str | None:
    """Why the compiled operators could not be loaded (None when they loaded or were not tried)."""
    return _cuda["error"] or _cpu["error"]  # type: ignore[return-value]


_warned: set[str] = set()


def _use_native(*tensors: torch.Tensor) -> bool:
    choice = backend()
    if choice == "reference":
        return False
    on_cuda = any(t.is_cuda for t in tensors)
    if on_cuda and choice == "auto":
        # Building the CUDA kernels takes minutes: do it only when nvcc is really there.
        from repro500.ext import build

        if build.find_cuda_home() is None:
            return False
    ok = load_native(cuda=on_cuda)
    if ok:
        return True
    reason = native_error() or "unknown error"
    if choice == "native":
        raise UsageError(
            f"REPRO500_OPS=native but the compiled operators could not be loaded ({reason}); "
            "install a C++ compiler or use REPRO500_OPS=reference."
        )
    key = "cuda" if on_cuda else "cpu"
    if key not in _warned:
        _warned.add(key)
        print(
            f"repro500: compiled {key.upper()} operators unavailable ({reason}); "
            "using the PyTorch reference implementations.",
            file=sys.stderr,
        )
    return False


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exactly *k* elements of largest |x| (ties: lower index), in index order; int32 indices."""
    if _use_native(x):
        return torch.ops.repro500.topk_threshold(x, k)
    return reference.topk(x, k)


def positions_encode(positions: torch.Tensor, n: int) -> torch.Tensor:
    """Elias-Fano code (uint8) of ascending, distinct positions in [0, n): ext/indexcode.py."""
    # CPU kernel only: on an accelerator the reference's whole-tensor ops are already fast.
    if positions.device.type == "cpu" and _use_native(positions):
        return torch.ops.repro500.positions_encode(positions, n)
    return indexcode.encode(positions, n)


def positions_decode(code: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The k ascending positions (int64) that :func:`positions_encode` coded for this n."""
    if code.device.type == "cpu" and _use_native(code):
        return torch.ops.repro500.positions_decode(code, n, k)
    return indexcode.decode(code, n, k)


def quantize(
    x: torch.Tensor, levels: int, bucket_size: int, max_norm: bool, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stochastic quantization: int8 codes and one float32 scale per bucket (QSGD, TernGrad)."""
    seed = reference._signed(seed)  # the schema's int is int64; the bits are what count
    if _use_native(x):
        return torch.ops.repro500.stochastic_quantize(x, levels, bucket_size, max_norm, seed)
    return reference.stochastic_quantize(x, levels, bucket_size, max_norm, seed)


def dequantize(
    codes: torch.Tensor, scales: torch.Tensor, levels: int, bucket_size: int
) -> torch.Tensor:
    """codes * scale(bucket) / levels, in the dtype of *scales*."""
    if _use_native(codes, scales):
        return torch.ops.repro500.stochastic_dequantize(codes, scales, levels, bucket_size)
    return reference.stochastic_dequantize(codes, scales, levels, bucket_size)


def sign_pack(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """8 signs per uint8 and scale = mean |x| (float32, shape (1,))."""
    if _use_native(x):
        return torch.ops.repro500.sign_pack(x)
    return reference.sign_pack(x)


def sign_unpack(packed: torch.Tensor, scale: torch.Tensor, numel: int) -> torch.Tensor:
    """±scale per packed bit, *numel* elements, in the dtype of *scale*."""
    if _use_native(packed, scale):
        return torch.ops.repro500.sign_unpack(packed, scale, numel)
    return reference.sign_unpack(packed, scale, numel)


def ef_update_(
    residual: torch.Tensor, compensated: torch.Tensor, decompressed: torch.Tensor
) -> None:
    """Error feedback in place: residual = compensated - decompressed."""
    if _use_native(residual, compensated, decompressed):
        torch.ops.repro500.ef_update_(residual, compensated, decompressed)
    else:
        reference.ef_update_(residual, compensated, decompressed)


# --- fake kernels and autograd formulas, registered once the library defines the ops -----


def _register_python_parts() -> None:
    lib = "repro500::"

    @torch.library.register_fake(lib + "topk_threshold")
    def _topk_fake(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return x.new_empty(k), x.new_empty(k, dtype=torch.int32)

    @torch.library.register_fake(lib + "positions_encode")
    def _positions_encode_fake(positions, n):
        return positions.new_empty(indexcode.nbytes(n, positions.numel()), dtype=torch.uint8)

    @torch.library.register_fake(lib + "positions_decode")
    def _positions_decode_fake(code, n, k):
        return code.new_empty(k, dtype=torch.int64)

    @torch.library.register_fake(lib + "stochastic_quantize")
    def _quantize_fake(x, levels, bucket_size, max_norm, seed):
        n = x.numel()
        return (
            x.new_empty(n, dtype=torch.int8),
            x.new_empty((n + bucket_size - 1) // bucket_size, dtype=torch.float32),
        )

    @torch.library.register_fake(lib + "stochastic_dequantize")
    def _dequantize_fake(codes, scales, levels, bucket_size):
        return codes.new_empty(codes.shape, dtype=scales.dtype)

    @torch.library.register_fake(lib + "sign_pack")
    def _sign_pack_fake(x):
        return x.new_empty((x.numel() + 7) // 8, dtype=torch.uint8), x.new_empty(
            1, dtype=torch.float32
        )

    @torch.library.register_fake(lib + "sign_unpack")
    def _sign_unpack_fake(packed, scale, numel):
        return scale.new_empty(numel)

    @torch.library.register_fake(lib + "ef_update_")
    def _ef_update_fake(residual, compensated, decompressed):
        return None

    torch.library.register_autograd(
        lib + "topk_threshold", _topk_backward, setup_context=_topk_setup
    )
    torch.library.register_autograd(
        lib + "stochastic_dequantize", _dequantize_backward, setup_context=_dequantize_setup
    )
    torch.library.register_autograd(
        lib + "sign_unpack", _sign_unpack_backward, setup_context=_sign_unpack_setup
    )


def _topk_setup(ctx, inputs, output) -> None:
    x, _k = inputs
    ctx.x_shape = x.shape
    ctx.save_for_backward(output[1])


def _topk_backward(ctx, grad_values, _grad_indices):
    (indices,) = ctx.saved_tensors
    grad_x = grad_values.new_zeros(ctx.x_shape.numel())
    grad_x = grad_x.index_add(0, indices.long(), grad_values)
    return grad_x.view(ctx.x_shape), None


def _dequantize_setup(ctx, inputs, output) -> None:
    codes, scales, levels, bucket_size = inputs
    ctx.levels, ctx.bucket_size, ctx.num_scales = levels, bucket_size, scales.numel()
    ctx.save_for_backward(codes)


def _dequantize_backward(ctx, grad_out):
    # d out_i / d scale_b = code_i / levels for i in bucket b.
    (codes,) = ctx.saved_tensors
    per_element = (grad_out * codes.to(grad_out.dtype) / ctx.levels).reshape(-1)
    padded = per_element.new_zeros(ctx.num_scales * ctx.bucket_size)
    padded[: per_element.numel()] = per_element
    return None, padded.view(ctx.num_scales, ctx.bucket_size).sum(dim=1), None, None


def _sign_unpack_setup(ctx, inputs, output) -> None:
    packed, scale, numel = inputs
    ctx.scale_shape = scale.shape
    ctx.save_for_backward(packed)
    ctx.numel = numel


def _sign_unpack_backward(ctx, grad_out):
    # d out_i / d scale = sign_i.
    (packed,) = ctx.saved_tensors
    one = torch.ones((), dtype=grad_out.dtype, device=grad_out.device)
    signs = reference.sign_unpack(packed, one, ctx.numel)
    return None, (grad_out * signs).sum().reshape(ctx.scale_shape), None
