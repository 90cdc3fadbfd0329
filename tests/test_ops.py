"""The repro500 C++ operators against their pure-PyTorch references, opcheck, fallback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import fixtures

from repro500.errors import UsageError
from repro500.ext import ops, reference

native = fixtures.native


# --- top-k -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "k"),
    [
        (1, 1),
        (10, 0),
        (10, 10),
        (1000, 7),
        (4096, 4096),
        (300_000, 3000),
        (1_000_003, 1000),
        (2_000_000, 20),
    ],
)
def test_topk_kernel_equals_reference_exactly(native, n, k):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n + k))
    values, indices = native.topk_threshold(x, k)
    ref_values, ref_indices = reference.topk(x, k)
    assert indices.dtype == torch.int32 and values.shape == (k,)
    assert torch.equal(indices, ref_indices)
    assert torch.equal(values, ref_values)


def test_topk_value_set_matches_torch_topk(native):
    x = torch.randn(500_000, generator=torch.Generator().manual_seed(3))
    values, indices = native.topk_threshold(x, 5000)
    expected = torch.topk(x.abs(), 5000).values
    assert torch.equal(torch.sort(values.abs()).values, torch.sort(expected).values)
    assert torch.equal(x[indices.long()], values)
    assert bool((indices[1:] > indices[:-1]).all()), "indices are returned in ascending order"


def test_topk_ties_go_to_the_lowest_index(native):
    x = torch.tensor([1.0, -3.0, 3.0, 2.0, 3.0, -1.0])
    values, indices = native.topk_threshold(x, 2)
    assert indices.tolist() == [1, 2]
    assert values.tolist() == [-3.0, 3.0]
    # Massive ties through the sampled path: integer-valued magnitudes, 1% kept.
    many = torch.randint(-20, 21, (400_000,), generator=torch.Generator().manual_seed(1)).float()
    v, i = native.topk_threshold(many, 4000)
    rv, ri = reference.topk(many, 4000)
    assert torch.equal(i, ri) and torch.equal(v, rv)


def test_topk_mostly_zero_gradient_takes_zeros_by_index(native):
    x = torch.zeros(100_000)
    x[[5, 70_000, 99_999]] = torch.tensor([2.0, -4.0, 1.0])
    values, indices = native.topk_threshold(x, 5)
    assert indices.tolist() == [0, 1, 5, 70_000, 99_999]
    assert values.tolist() == [0.0, 0.0, 2.0, -4.0, 1.0]


def test_topk_threshold_retry_when_the_sample_misleads(native):
    # Every sampled position is large, everything else small: the sampled threshold keeps
    # too few candidates, so the kernel must lower it (finally to 0) and stay exact.
    n, k = 400_000, 60_000
    x = torch.rand(n, generator=torch.Generator().manual_seed(2))
    sample_size = max(2048, -(-512 * n // k))
    positions = torch.arange(sample_size) * n // sample_size
    x[positions] = 10.0
    values, indices = native.topk_threshold(x, k)
    ref_values, ref_indices = reference.topk(x, k)
    assert torch.equal(indices, ref_indices) and torch.equal(values, ref_values)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_topk_other_dtypes(native, dtype):
    x = torch.randn(50_000, generator=torch.Generator().manual_seed(4)).to(dtype)
    values, indices = native.topk_threshold(x, 321)
    ref_values, ref_indices = reference.topk(x, 321)
    assert values.dtype == dtype
    assert torch.equal(indices, ref_indices) and torch.equal(values, ref_values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_topk_sampled_path_with_clusters_ties_and_non_finite_values(native, dtype):
    # Large enough to be sampled; a run of large values fills whole 64-element words (the
    # screening writes four hits per word without a branch and loops for the rest); 16-bit
    # types tie massively; NaN ranks above inf (as torch.sort), and -inf as inf.
    n, k = 300_000, 3000
    x = torch.randn(n, generator=torch.Generator().manual_seed(5))
    x[100_000:101_000] = 50.0 + torch.arange(1000) % 7
    x[[7, 65_536, 299_999]] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    x = x.to(dtype)
    values, indices = native.topk_threshold(x, k)
    ref_values, ref_indices = reference.topk(x, k)
    assert torch.equal(indices, ref_indices)
    torch.testing.assert_close(values, ref_values, rtol=0, atol=0, equal_nan=True)
    assert {7, 65_536, 299_999} <= set(indices.tolist())


def test_topk_does_not_depend_on_the_thread_count(native):
    x = torch.randint(-50, 51, (2_000_000,), generator=torch.Generator().manual_seed(6)).float()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.topk_threshold(x, 20_000)
    finally:
        torch.set_num_threads(threads)
    many = native.topk_threshold(x, 20_000)
    assert torch.equal(one[0], many[0]) and torch.equal(one[1], many[1])
    ref = reference.topk(x, 20_000)
    assert torch.equal(many[1], ref[1])


def test_topk_rejects_bad_k(native):
    with pytest.raises(RuntimeError, match="k must be in"):
        native.topk_threshold(torch.randn(10), 11)


# --- stochastic quantization ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "levels", "bucket", "max_norm"),
    [
        (1, 127, 512, False),
        (10_007, 127, 512, False),
        (10_007, 4, 128, False),
        (4096, 1, 4096, True),
        (70_001, 1, 1000, True),
    ],
)
def test_quantize_kernel_equals_reference_bit_for_bit(native, n, levels, bucket, max_norm):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    codes, scales = native.stochastic_quantize(x, levels, bucket, max_norm, 1234)
    ref_codes, ref_scales = reference.stochastic_quantize(x, levels, bucket, max_norm, 1234)
    assert codes.dtype == torch.int8 and scales.dtype == torch.float32
    assert torch.equal(scales, ref_scales)
    assert torch.equal(codes, ref_codes)
    assert int(codes.abs().max()) <= levels
    out = native.stochastic_dequantize(codes, scales, levels, bucket)
    assert torch.equal(out, reference.stochastic_dequantize(codes, scales, levels, bucket))


def test_quantize_is_reproducible_and_seed_dependent(native):
    x = torch.randn(5000, generator=torch.Generator().manual_seed(0))
    a = native.stochastic_quantize(x, 3, 256, False, 7)[0]
    b = native.stochastic_quantize(x, 3, 256, False, 7)[0]
    c = native.stochastic_quantize(x, 3, 256, False, 8)[0]
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_quantize_does_not_depend_on_thread_count(native):
    x = torch.randn(300_000, generator=torch.Generator().manual_seed(5))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.stochastic_quantize(x, 15, 512, False, 99)
        sign_one = native.sign_pack(x)
        torch.set_num_threads(max(2, before))
        many = native.stochastic_quantize(x, 15, 512, False, 99)
        sign_many = native.sign_pack(x)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one[0], many[0]) and torch.equal(one[1], many[1])
    assert torch.equal(sign_one[0], sign_many[0]) and torch.equal(sign_one[1], sign_many[1])


def test_quantize_zero_bucket_and_nan(native):
    x = torch.zeros(1024)
    x[600] = float("nan")
    codes, scales = native.stochastic_quantize(x, 127, 512, False, 1)
    assert scales[0].item() == 0.0 and bool((codes[:512] == 0).all())
    assert torch.isnan(scales[1]), "a NaN gradient must reach the scale, not vanish"
    assert torch.isnan(native.stochastic_dequantize(codes, scales, 127, 512)[512:]).all()


def test_quantize_rejects_bad_levels(native):
    with pytest.raises(RuntimeError, match="levels must be in"):
        native.stochastic_quantize(torch.randn(10), 128, 8, False, 0)


def test_counter_rng_is_uniform():
    u = reference.uniform01(42, 200_000)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    # mean 1/2, variance 1/12: within 5 standard errors
    assert abs(float(u.mean()) - 0.5) < 5 * (1 / 12) ** 0.5 / 200_000**0.5
    counts = torch.histc(u, bins=10, min=0, max=1)
    chi2 = float(((counts - 20_000) ** 2 / 20_000).sum())
    assert chi2 < 27.9  # chi-square, 9 degrees of freedom, p = 0.001


# --- signs -------------------------------------------------------------------------------


def test_sign_pack_layout(native):
    x = torch.tensor([-1.0, 2.0, -3.0, 4.0, 5.0, -6.0, 7.0, 8.0, -9.0])
    packed, scale = native.sign_pack(x)
    # element 8j+b is bit b of byte j, 1 = not negative: 0b11011010, then 0
    assert packed.tolist() == [0b11011010, 0]
    assert scale.tolist() == [pytest.approx(5.0)]


@pytest.mark.parametrize("n", [1, 8, 9, 1000, 65_537, 200_003])
def test_sign_round_trip_and_reference(native, n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    x[0] = 0.0  # zero counts as positive
    packed, scale = native.sign_pack(x)
    ref_packed, ref_scale = reference.sign_pack(x)
    assert packed.numel() == (n + 7) // 8
    assert torch.equal(packed, ref_packed) and torch.equal(scale, ref_scale)
    out = native.sign_unpack(packed, scale, n)
    expected = torch.where(x < 0, -scale, scale)
    assert torch.equal(out, expected)
    assert torch.equal(out, reference.sign_unpack(packed, scale, n))
    # the kernel sums |x| in float64 then rounds once to float32: against a float64 mean, relative
    # error <= u32 + 2 gamma_n(u64) (a float32 reference mean could itself be gamma_n(u32) off)
    n64 = (n + 1) * 2.0**-53
    exact = float(x.double().abs().mean())
    assert float(scale) == pytest.approx(exact, rel=2.0**-24 + 2 * n64 / (1 - n64), abs=0)


# --- error feedback ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_ef_update_in_place(native, dtype):
    g = torch.Generator().manual_seed(6)
    compensated = torch.randn(100_001, generator=g).to(dtype)
    decompressed = torch.randn(100_001, generator=g).to(dtype)
    residual = torch.full_like(compensated, 99.0)
    pointer = residual.data_ptr()
    native.ef_update_(residual, compensated, decompressed)
    assert residual.data_ptr() == pointer
    assert torch.equal(residual, compensated - decompressed)
    ref = torch.empty_like(residual)
    reference.ef_update_(ref, compensated, decompressed)
    assert torch.equal(ref, residual)


# --- opcheck ---------------------------------------------------------------------------------


def _opcheck_cases():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    codes, scales = reference.stochastic_quantize(x, 7, 64, False, 3)
    packed, scale = reference.sign_pack(x)
    return {
        "topk_threshold": [(torch.randn(1000, requires_grad=True), 17), (torch.randn(8, 16), 5)],
        "stochastic_quantize": [(x, 7, 64, False, 3), (x.double(), 1, 100, True, -5)],
        "stochastic_dequantize": [
            (codes, scales, 7, 64),
            (codes, scales.double().requires_grad_(), 7, 64),
        ],
        "sign_pack": [(x,), (torch.randn(3, 5),)],
        "sign_unpack": [(packed, scale, 1000), (packed, scale.double().requires_grad_(), 1000)],
        "ef_update_": [(torch.zeros(50), torch.randn(50), torch.randn(50))],
    }


@pytest.mark.parametrize("op_name", list(_opcheck_cases()))
def test_opcheck(native, op_name):
    op = getattr(native, op_name)
    for args in _opcheck_cases()[op_name]:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, result


# --- backends and fallback -------------------------------------------------------------------


def test_use_backend_switches_implementation(native, monkeypatch):
    calls = []
    monkeypatch.setattr(
        reference,
        "topk",
        lambda x, k: calls.append(k) or (x[:k], torch.arange(k, dtype=torch.int32)),
    )
    x = torch.randn(100)
    ops.topk(x, 3)
    assert calls == [], "auto uses the compiled kernel when it loads"
    with ops.use_backend("reference"):
        ops.topk(x, 4)
    assert calls == [4]


def test_bad_backend_names_are_usage_errors(monkeypatch):
    monkeypatch.setenv("REPRO500_OPS", "fastest")
    with pytest.raises(UsageError, match="REPRO500_OPS='fastest' is not a backend"):
        ops.topk(torch.randn(4), 1)
    with pytest.raises(UsageError, match="unknown"), ops.use_backend("gpu"):
        pass


def test_without_a_compiler_the_references_take_over(tmp_path):
    """A fresh cache and no compiler: one clear line on stderr, correct results all the same."""
    script = textwrap.dedent(
        """
        import torch
        from repro500.ext import compressors, indexcode, ops, reference
        x = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
        c = compressors.get({"name": "topk", "ratio": 0.01})
        payload, ctx = c.compress(x, "w")
        assert torch.equal(payload[1], indexcode.encode(reference.topk(x, 100)[1], 10_000))
        assert not ops.load_native()
        print("ok")
        """
    )
    env = dict(os.environ, REPRO500_CACHE_DIR=str(tmp_path), CXX=str(tmp_path / "no-such-compiler"))
    env.pop("REPRO500_OPS", None)
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert "using the PyTorch reference implementations" in proc.stderr
    assert proc.stderr.count("operators unavailable") == 1


def test_native_backend_fails_loudly_without_a_compiler(tmp_path):
    script = "import torch\nfrom repro500.ext import ops\nops.topk(torch.randn(10), 2)\n"
    env = dict(
        os.environ,
        REPRO500_CACHE_DIR=str(tmp_path),
        CXX=str(tmp_path / "no-such-compiler"),
        REPRO500_OPS="native",
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert "REPRO500_OPS=native but the compiled operators could not be loaded" in proc.stderr


def test_a_finished_build_is_loaded_as_it_is_and_was_one_translation_unit():
    """Once built, a process loads the library without torch's JIT builder (whose ninja file names
    the checkout's path, so a second checkout would compile again); the CPU sources were compiled
    as one unit including them all."""
    from repro500.ext import build

    if not ops.load_native():
        pytest.skip(f"no compiled operators here: {ops.native_error()}")
    path = build.load_cpu_ops()
    objects = sorted(p.name for p in path.parent.glob("*.o"))
    assert objects == [f"{path.stem}.o"], objects
    assert re.findall(r'#include "([^"]+)"', path.with_suffix(".cpp").read_text()) == list(build.CPU_SOURCES)
    script = ("import sys, torch\nfrom repro500.ext import ops\nassert ops.load_native(), ops.native_error()\n"
              "print(torch.ops.repro500.topk_threshold(torch.arange(6.0), 2)[1].tolist(),"
              " 'torch.utils.cpp_extension' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if k != "REPRO500_OPS"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[4,", "5]", "False"], done.stdout
