"""Compressors, error-feedback memory and the communicator's accounting (single process)."""

from __future__ import annotations

import pytest
import torch

from repro500.errors import UsageError
from repro500.ext import compressors, indexcode, memory, ops
from repro500.ext.communicator import Communicator, allgather_bytes, allreduce_bytes, pack, unpack

BACKENDS = ["native", "reference"]


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Run the test with the compiled kernels and again with the PyTorch references."""
    if request.param == "native" and not ops.load_native():
        pytest.fail(f"the C++ operators did not build: {ops.native_error()}")
    with ops.use_backend(request.param):
        yield request.param


def _grad(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


# --- registry ------------------------------------------------------------------------------


def test_get_by_name_and_by_dict():
    assert compressors.get("none").name == "none"
    assert compressors.get(None).name == "none"
    top = compressors.get({"name": "topk", "ratio": 0.05})
    assert (top.name, top.ratio, top.memory, top.summable) == ("topk", 0.05, "residual", False)
    assert compressors.get("topk").ratio == 0.01
    assert compressors.get({"name": "qsgd", "levels": 4, "bucket_size": 128}).levels == 4
    assert compressors.get({"name": "topk", "memory": "none"}).memory == "none"
    assert compressors.get("fp16").summable and compressors.get("randomk").summable
    assert compressors.get("powersgd").params["start_iter"] == 10
    assert compressors.get({"name": "TopK", "ratio": 1}).ratio == 1.0
    # plain DDP must not wait for a C++ compile: only compressors that use the operators do
    assert [n for n in compressors.names() if compressors.get(n).needs_ops] == [
        "topk",
        "randomk",
        "qsgd",
        "terngrad",
        "efsignsgd",
    ]
    assert compressors.get({"name": "topk", "ratio": 0.02}).spec() == {
        "name": "topk",
        "ratio": 0.02,
        "memory": "residual",
    }


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "zip",
            "unknown compressor 'zip'; valid compressors: none, fp16, bf16, topk, randomk, "
            "qsgd, terngrad, efsignsgd, powersgd.",
        ),
        (
            {"name": "topk", "ratio": 0},
            "compressor 'topk': ratio=0 is invalid; expected a ratio in (0, 1], e.g. 0.01.",
        ),
        ({"name": "topk", "ratio": 1.5}, "ratio=1.5 is invalid"),
        ({"name": "randomk", "ratio": "1%"}, "ratio='1%' is invalid"),
        ({"name": "topk", "ratio": True}, "ratio=True is invalid"),
        (
            {"name": "qsgd", "levels": 0},
            "levels=0 is invalid; expected an integer number of levels in 1..127",
        ),
        ({"name": "qsgd", "levels": 128}, "levels=128 is invalid"),
        ({"name": "qsgd", "levels": 2.5}, "levels=2.5 is invalid"),
        ({"name": "qsgd", "bucket_size": 0}, "bucket_size=0 is invalid; expected an integer >= 1"),
        (
            {"name": "topk", "k": 10},
            "compressor 'topk' has no parameter 'k'; valid parameters: ratio.",
        ),
        ({"name": "fp16", "ratio": 0.1}, "valid parameters: none besides name and memory"),
        (
            {"name": "topk", "memory": "big"},
            "memory='big' is unknown; valid memories: none, residual, efsign.",
        ),
        (
            {"name": "powersgd", "start_iter": 1},
            "start_iter=1 is invalid; expected an integer >= 2",
        ),
        ({"ratio": 0.1}, "unknown compressor ''"),
        (3, "is neither a name nor a mapping"),
    ],
)
def test_bad_specs_are_usage_errors_with_one_sentence(spec, message):
    with pytest.raises(UsageError) as err:
        compressors.get(spec)
    assert message in str(err.value)
    assert str(err.value).count("\n") == 0 and err.value.exit_code == 2


# --- round trips ------------------------------------------------------------------------------


def test_none_fp16_bf16_round_trip():
    x = _grad(1000, 0).view(10, 100)
    # One IEEE round-to-nearest conversion each way (the same on every CPU): |out - x| <= u |x|
    # with the 16-bit type's unit roundoff u (fp16 2^-11, bf16 2^-8), plus half fp16's subnormal
    # spacing 2^-24 below 2^-14 (bf16 has float32's exponent range: no underflow for N(0, 1)).
    for name, rtol, atol in [("none", 0.0, 0.0), ("fp16", 2.0**-11, 2.0**-25), ("bf16", 2.0**-8, 0.0)]:
        c = compressors.get(name)
        payload, ctx = c.compress(x, "w")
        out = c.decompress(payload, ctx)
        assert out.shape == x.shape and out.dtype == x.dtype
        torch.testing.assert_close(out, x, rtol=rtol, atol=atol)
    assert compressors.get("fp16").compress(x, "w")[0][0].dtype == torch.float16


def test_topk_payload_and_decompress(backend):
    x = _grad(10_000, 1)
    c = compressors.get({"name": "topk", "ratio": 0.01})
    payload, ctx = c.compress(x, "w")
    values, code = payload
    # bf16 values and Elias-Fano coded positions: 16 + 8.6 bits per kept element, not 64
    assert values.dtype == torch.bfloat16 and values.numel() == 100
    assert code.dtype == torch.uint8 and code.numel() == indexcode.nbytes(10_000, 100) == 107
    out = c.decompress(payload, ctx)
    assert int((out != 0).sum()) == 100
    kept = x.abs() >= torch.topk(x.abs(), 100).values.min()
    assert torch.equal(out[kept], x[kept].to(torch.bfloat16).float())
    assert torch.equal(out[~kept], torch.zeros_like(out[~kept]))


@pytest.mark.parametrize(("dtype", "sent"), [(torch.float64, torch.bfloat16),
                                             (torch.float16, torch.float16),
                                             (torch.bfloat16, torch.bfloat16)])
def test_topk_values_are_16_bit_whatever_the_gradient(backend, dtype, sent):
    x = _grad(5000, 2).to(dtype)
    c = compressors.get({"name": "topk", "ratio": 0.02})
    payload, ctx = c.compress(x, "w")
    assert payload[0].dtype == sent  # a 16-bit gradient keeps its own dtype: no second rounding
    out = c.decompress(payload, ctx)
    assert out.dtype == dtype and int((out != 0).sum()) == 100


def test_topk_aggregate_sums_every_ranks_positions(backend):
    c = compressors.get({"name": "topk", "ratio": 0.1})
    x, y = _grad(1000, 5), _grad(1000, 6)
    (px, ctx), (py, _) = c.compress(x, "w"), c.compress(y, "w")
    torch.testing.assert_close(c.aggregate([px, py], ctx), c.decompress(px, ctx) + c.decompress(py, ctx),
                               rtol=0, atol=0)


def test_topk_refuses_tensors_int32_positions_cannot_address():
    big = torch.empty(2**31, device="meta")  # shapes only: nothing is allocated
    with pytest.raises(UsageError, match="at most 2\\^31 - 1 elements"):
        compressors.get("topk").compress(big, "w")


def test_randomk_positions_are_shared_and_change_per_step(backend):
    a, b = (
        compressors.get({"name": "randomk", "ratio": 0.1, "seed": 3}),
        compressors.get({"name": "randomk", "ratio": 0.1, "seed": 3}),
    )
    a.bind(0, 2)
    b.bind(1, 2)
    x, y = _grad(1000, 1), _grad(1000, 2)
    (pa,), ca = a.compress(x, 7)
    (pb,), cb = b.compress(y, 7)
    assert torch.equal(ca.indices, cb.indices), "all ranks pick the same positions"
    # summable: decompress(sum of payloads) == sum of decompressions
    torch.testing.assert_close(
        a.decompress([pa + pb], ca), a.decompress([pa], ca) + b.decompress([pb], cb)
    )
    (_,), ca2 = a.compress(x, 7)
    assert not torch.equal(ca.indices, ca2.indices), "a new step draws new positions"


def test_qsgd_and_terngrad_payload_sizes(backend):
    x = _grad(10_000, 2)
    q = compressors.get({"name": "qsgd", "levels": 127, "bucket_size": 512})
    codes, scales = q.compress(x, "w")[0]
    assert codes.dtype == torch.int8 and codes.numel() == 10_000 and scales.numel() == 20
    t = compressors.get("terngrad")
    codes, scales = t.compress(x, "w")[0]
    assert set(codes.unique().tolist()) <= {-1, 0, 1}
    assert scales.numel() == 3


def test_efsign_payload(backend):
    x = _grad(1001, 3)
    c = compressors.get("efsignsgd")
    payload, ctx = c.compress(x, "w")
    assert payload[0].dtype == torch.uint8 and payload[0].numel() == 126
    out = c.decompress(payload, ctx)
    assert torch.equal(out.sign(), torch.where(x < 0, -1.0, 1.0))


def test_powersgd_is_ddp_only():
    with pytest.raises(UsageError, match="ddp_hook.register"):
        compressors.get("powersgd").compress(torch.zeros(4), "w")


# --- error feedback ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "topk", "ratio": 0.01},
        {"name": "randomk", "ratio": 0.05},
        "efsignsgd",
        {"name": "qsgd", "levels": 2, "memory": "residual"},
    ],
)
def test_error_feedback_conserves_the_gradient_sum(backend, spec):
    """sum of what was sent + the final residual == sum of the gradients fed in."""
    c = compressors.get(spec)
    mem = memory.for_compressor(c)
    sent_total = torch.zeros(5000, dtype=torch.float64)
    grad_total = torch.zeros(5000, dtype=torch.float64)
    magnitude = torch.zeros(5000, dtype=torch.float64)
    steps = 20
    for step in range(steps):
        g = _grad(5000, 100 + step).double()
        grad_total += g
        compensated = mem.compensate(g, "bucket0")
        payload, ctx = c.compress(compensated, "bucket0")
        mem.update(compensated, "bucket0", c, payload, ctx)
        sent = c.decompress(payload, ctx)
        sent_total += sent
        magnitude += g.abs() + compensated.abs() + sent.abs() + mem.residual("bucket0").abs()
    # In exact arithmetic sum(sent) + residual == sum(g) whatever the compressor sends.  Each step
    # rounds (float64) compensate's add, the residual's subtract and both running totals' adds, each
    # at most u |operand|: error <= gamma_{2 steps + 2} * sum of those magnitudes (u = 2^-53).
    unit = torch.finfo(torch.float64).eps / 2
    n = 2 * steps + 2
    bound = float(n * unit / (1 - n * unit) * magnitude.max())
    torch.testing.assert_close(sent_total + mem.residual("bucket0"), grad_total, rtol=0, atol=bound)
    assert float(mem.residual("bucket0").abs().sum()) > 0, "something was actually held back"


def test_topk_rounding_of_the_values_stays_in_the_residual(backend):
    """What bf16 does not carry of a kept value is not lost: the memory keeps it."""
    c = compressors.get({"name": "topk", "ratio": 0.01})
    mem = memory.for_compressor(c)
    g = _grad(10_000, 7)
    compensated = mem.compensate(g, "b")
    payload, ctx = c.compress(compensated, "b")
    mem.update(compensated, "b", c, payload, ctx)
    residual = mem.residual("b")
    sent = c.decompress(payload, ctx)
    kept = sent != 0
    rounding = g[kept] - g[kept].to(torch.bfloat16).float()
    assert torch.equal(residual[kept], rounding) and float(rounding.abs().max()) > 0
    assert torch.equal(residual[~kept], g[~kept])
    assert torch.equal(sent + residual, g)  # exact in float32: the rounding error is representable
    # the next step sends the carried error: compensate adds it back
    torch.testing.assert_close(mem.compensate(g, "b"), g + residual)


def test_efsign_memory_works_in_update_units():
    c = compressors.get("efsignsgd")
    mem = memory.EFSignMemory(lr=0.1)
    g = _grad(64, 9).double()
    compensated = mem.compensate(g, 0)
    torch.testing.assert_close(compensated, 0.1 * g)
    payload, ctx = c.compress(compensated, 0)
    mem.update(compensated, 0, c, payload, ctx)
    torch.testing.assert_close(compensated, c.decompress(payload, ctx) + mem.residual(0))
    torch.testing.assert_close(
        mem.restore(c.decompress(payload, ctx)), c.decompress(payload, ctx) / 0.1
    )


def test_residual_is_dropped_when_the_bucket_changes_shape():
    c = compressors.get({"name": "topk", "ratio": 0.1})
    mem = memory.for_compressor(c)
    g = _grad(100, 1)
    payload, ctx = c.compress(mem.compensate(g, 0), 0)
    mem.update(g, 0, c, payload, ctx)
    assert mem.residual(0).shape == (100,)
    bigger = _grad(150, 2)
    assert torch.equal(mem.compensate(bigger, 0), bigger)


# --- unbiasedness ------------------------------------------------------------------------------


def _z_scores(samples: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """z of each coordinate's mean; coordinates that never vary (|x| = max) must be exact."""
    draws = samples.shape[0]
    sd = samples.std(dim=0)
    # float64: a float32 mean of 4000 draws could carry gamma_4000 ~ 2e-4 of rounding, none of it
    # about bias.  A fixed coordinate repeats one decoded float32 value, which is x up to the decode's
    # roundings (scale x code / levels: 2 float32 roundings, rtol 2 u32), and float64 sums those
    # copies with gamma_4000(u64) < 1e-12 relative error.
    mean = samples.double().mean(dim=0)
    fixed = sd == 0
    u32 = torch.finfo(torch.float32).eps / 2
    torch.testing.assert_close(mean[fixed], target[fixed].double(), rtol=2 * u32 + 1e-12, atol=0)
    mean = mean.float()
    return torch.where(fixed, torch.zeros_like(mean), (mean - target) / (sd / draws**0.5))


@pytest.mark.parametrize(("levels", "max_norm"), [(2, False), (127, False), (1, True)])
def test_stochastic_quantization_is_unbiased(backend, levels, max_norm):
    """E[dequantize(quantize(x))] = x: 4000 independent draws, every |z| < 5.

    Each draw is one bucket of a long tensor holding x repeated: the counter-based RNG makes
    buckets independent.  With 64 coordinates, P(any |z| >= 5) is about 4e-5 under H0.
    """
    x = _grad(64, 11)
    draws = 4000
    codes, scales = ops.quantize(x.repeat(draws), levels, 64, max_norm, seed=2024)
    samples = ops.dequantize(codes, scales, levels, 64).view(draws, 64)
    z = _z_scores(samples, x)
    assert float(z.abs().max()) < 5.0, z
    # and the estimator really is random (not a deterministic rounding)
    assert int((samples.std(dim=0) > 0).sum()) >= 63


def test_terngrad_is_unbiased_for_the_clipped_gradient(backend):
    """TernGrad's clipping is a deliberate bias; the ternarization itself is unbiased."""
    x = _grad(64, 12)
    x[3] = 8.0  # beyond 2.5 sigma: clipped
    c = compressors.get({"name": "terngrad", "clip_sigmas": 2.5, "bucket_size": 64})
    bound = 2.5 * float(x.std())
    clipped = x.clamp(-bound, bound)
    samples = torch.stack([c.decompress(*c.compress(x, "w")) for _ in range(3000)])
    z = _z_scores(samples, clipped)
    assert float(z.abs().max()) < 5.0
    assert abs(float(samples[:, 3].mean()) - 8.0) > 1.0, "the outlier was clipped"


# --- communicator ---------------------------------------------------------------------------------


def test_ring_byte_model():
    assert allreduce_bytes(1000, 1) == 0
    assert allreduce_bytes(1000, 2) == 1000
    assert allreduce_bytes(1000, 4) == 1500
    assert allgather_bytes(1000, 2) == 1000
    assert allgather_bytes(1000, 4) == 3000


def test_pack_unpack_keeps_dtypes_and_alignment():
    payload = [
        torch.arange(5, dtype=torch.int8),
        torch.tensor([1.5, -2.0]),
        torch.tensor([7], dtype=torch.int32),
    ]
    buffer, templates = pack(payload)
    assert buffer.dtype == torch.uint8 and buffer.numel() == 8 + 8 + 8
    for got, want in zip(unpack(buffer, templates), payload, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize(
    "spec",
    ["none", "fp16", {"name": "topk", "ratio": 0.01}, {"name": "qsgd", "levels": 127}, "efsignsgd"],
)
def test_communicator_local_exchange_and_stats(backend, spec):
    c = compressors.get(spec)
    comm = Communicator(c, memory.for_compressor(c), world_size=1, rank=0)
    x = _grad(20_000, 4)
    out = comm.exchange_local(x, 0)
    assert out.shape == x.shape and out.dtype == x.dtype
    stats = comm.step_stats()
    # world size 1 sends nothing, but timing and the tensor count are recorded
    assert stats["bytes_sent"] == 0 and stats["tensors"] == 1
    assert stats["time_compress_s"] > 0 and stats["time_decompress_s"] > 0
    assert comm.step_stats()["tensors"] == 0, "step_stats() resets"
