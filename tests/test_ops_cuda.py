"""CUDA kernels: they compile wherever nvcc is (slow), and match the references on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repro500.ext import build, ops, reference

needs_nvcc = pytest.mark.skipif(build.find_cuda_home() is None, reason="no CUDA toolkit (nvcc)")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.slow
@pytest.mark.heavy
@needs_nvcc
def test_cuda_sources_compile_from_a_fresh_cache(tmp_path):
    """What a user runs: `python -m repro500.ext.build --cuda` (no GPU needed to compile)."""
    env = dict(os.environ, REPRO500_CACHE_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "repro500.ext.build", "--cuda", "--arch", "9.0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert build.COMPILING_MESSAGE in proc.stderr
    assert build.COMPILING_CUDA_MESSAGE in proc.stderr
    cpu_lib, cuda_lib = (Path(line) for line in proc.stdout.split())
    assert cpu_lib.is_file() and cuda_lib.is_file()
    assert str(tmp_path) in str(cuda_lib)


@pytest.fixture(scope="module")
def cuda_ops():
    if not ops.load_native(cuda=True):
        pytest.fail(f"the CUDA operators did not build: {ops.native_error()}")
    return torch.ops.repro500


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(1000, 7), (300_000, 3000), (2_000_000, 20_000)])
def test_cuda_topk_equals_reference(cuda_ops, n, k):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    values, indices = cuda_ops.topk_threshold(x.cuda(), k)
    ref_values, ref_indices = reference.topk(x, k)
    assert torch.equal(indices.cpu(), ref_indices) and torch.equal(values.cpu(), ref_values)


@needs_gpu
@pytest.mark.gpu
def test_cuda_topk_ties_and_retry(cuda_ops):
    many = torch.randint(-20, 21, (400_000,), generator=torch.Generator().manual_seed(1)).float()
    v, i = cuda_ops.topk_threshold(many.cuda(), 60_000)
    rv, ri = reference.topk(many, 60_000)
    assert torch.equal(i.cpu(), ri) and torch.equal(v.cpu(), rv)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("levels", "bucket", "max_norm"), [(127, 512, False), (4, 128, False), (1, 4096, True)]
)
def test_cuda_quantize_matches_reference(cuda_ops, levels, bucket, max_norm):
    x = torch.randn(100_003, generator=torch.Generator().manual_seed(levels))
    codes, scales = cuda_ops.stochastic_quantize(x.cuda(), levels, bucket, max_norm, 77)
    ref_codes, ref_scales = reference.stochastic_quantize(x, levels, bucket, max_norm, 77)
    # Norms are summed in double in another order; the float32 result is (almost always) equal,
    # and wherever it is, the counter-based draws give identical codes.
    # Derived: two float64 sums that differ by gamma_n(u64) ~ 1e-11 relative round to float32
    # values at most one ulp (2^-23 ~ 1.2e-7 relative) apart; rtol 1e-6 is that with room.
    torch.testing.assert_close(scales.cpu(), ref_scales, rtol=1e-6, atol=0)
    same = torch.repeat_interleave(scales.cpu() == ref_scales, bucket)[: x.numel()]
    assert float(same.float().mean()) > 0.99
    assert torch.equal(codes.cpu()[same], ref_codes[same])
    out = cuda_ops.stochastic_dequantize(codes, scales, levels, bucket)
    torch.testing.assert_close(
        out.cpu(), reference.stochastic_dequantize(codes.cpu(), scales.cpu(), levels, bucket)
    )


@needs_gpu
@pytest.mark.gpu
def test_cuda_sign_and_ef_update_match_reference(cuda_ops):
    x = torch.randn(200_003, generator=torch.Generator().manual_seed(9))
    packed, scale = cuda_ops.sign_pack(x.cuda())
    ref_packed, ref_scale = reference.sign_pack(x)
    assert torch.equal(packed.cpu(), ref_packed)
    torch.testing.assert_close(scale.cpu(), ref_scale, rtol=1e-6, atol=0)  # float64 sums: 1 ulp of float32
    assert torch.equal(
        cuda_ops.sign_unpack(packed, scale, x.numel()).cpu(),
        reference.sign_unpack(packed.cpu(), scale.cpu(), x.numel()),
    )
    residual = torch.zeros(1000, device="cuda")
    a, b = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    cuda_ops.ef_update_(residual, a, b)
    assert torch.equal(residual, a - b)


@needs_gpu
@pytest.mark.gpu
def test_cuda_opcheck(cuda_ops):
    x = torch.randn(1000, device="cuda")
    codes, scales = cuda_ops.stochastic_quantize(x, 7, 64, False, 3)
    packed, scale = cuda_ops.sign_pack(x)
    cases = [
        (cuda_ops.topk_threshold, (torch.randn(1000, device="cuda", requires_grad=True), 17)),
        (cuda_ops.stochastic_quantize, (x, 7, 64, False, 3)),
        (cuda_ops.stochastic_dequantize, (codes, scales.double().requires_grad_(), 7, 64)),
        (cuda_ops.sign_pack, (x,)),
        (cuda_ops.sign_unpack, (packed, scale.double().requires_grad_(), 1000)),
        (
            cuda_ops.ef_update_,
            (
                torch.zeros(50, device="cuda"),
                torch.randn(50, device="cuda"),
                torch.randn(50, device="cuda"),
            ),
        ),
    ]
    for op, args in cases:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)
