"""Top-k's positions on the wire: the Elias-Fano code, its kernels, its size and the wire model."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import fixtures

from repro500.errors import UsageError
from repro500.ext import compressors, indexcode, memory, ops
from repro500.ext.communicator import Communicator
from repro500.scaling import wire

native = fixtures.native


def _random_positions(n: int, k: int, seed: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:k].sort().values


# Edge cases: k = 0, k = 1 at either end, every position, runs of adjacent positions, gaps
# beyond 2^16 and 2^30, and the largest n that int32 indices address.
EDGE_CASES = [
    (1, [0]),
    (10, []),
    (10, [0]),
    (10, [9]),
    (10, list(range(10))),
    (1000, [0, 1, 2, 3, 500, 501, 998, 999]),
    (200_000, [0, 70_000, 70_001, 199_999]),
    (2**31 - 1, [0]),
    (2**31 - 1, [2**31 - 2]),
    (2**31 - 1, [0, 1, 65_535, 65_536, 65_537, 2**30, 2**31 - 3, 2**31 - 2]),
]


@pytest.mark.parametrize(("n", "positions"), EDGE_CASES)
def test_edge_cases_round_trip_exactly_in_kernel_and_reference(native, n, positions):
    p = torch.tensor(positions, dtype=torch.int64)
    code = indexcode.encode(p, n)
    assert code.dtype == torch.uint8 and code.numel() == indexcode.nbytes(n, p.numel())
    assert torch.equal(native.positions_encode(p, n), code), "kernel and reference write the same bytes"
    assert torch.equal(native.positions_encode(p.int(), n), code), "int32 positions too"
    for decoded in (indexcode.decode(code, n, p.numel()), native.positions_decode(code, n, p.numel())):
        assert decoded.dtype == torch.int64 and torch.equal(decoded, p)


@pytest.mark.parametrize(("n", "k"), [(2, 1), (64, 9), (300, 299), (4097, 64), (100_000, 1000),
                                      (1_000_003, 10_000), (1 << 20, 1), (2_000_000, 7)])
def test_random_subsets_round_trip_and_the_size_is_the_formula(native, n, k):
    p = _random_positions(n, k, seed=n + k)
    code = native.positions_encode(p, n)
    assert torch.equal(code, indexcode.encode(p, n))
    assert torch.equal(native.positions_decode(code, n, k), p)
    assert torch.equal(indexcode.decode(code, n, k), p)
    low = int(math.floor(math.log2(n / k)))
    assert code.numel() == math.ceil(k * low / 8) + math.ceil((((n - 1) >> low) + k) / 8)


def test_the_size_depends_on_n_and_k_only(native):
    """Every rank of an allgather sends the same bytes whichever positions it chose."""
    n, k = 50_000, 500
    spread = _random_positions(n, k, 1)
    packed_low = torch.arange(k)  # one run at the start
    packed_high = torch.arange(n - k, n)  # one run at the end
    sizes = {native.positions_encode(p, n).numel() for p in (spread, packed_low, packed_high)}
    assert sizes == {indexcode.nbytes(n, k)}


def test_about_two_plus_log2_n_over_k_bits_per_position():
    # top-k 1%: 8.56 bits per position (int32 took 32); close to log2 C(n, k) / k = 8.1
    assert indexcode.nbytes(25_600_000, 256_000) * 8 / 256_000 == pytest.approx(8.5625)
    for n, k in [(10**6, 10**3), (10**6, 10**5), (10**7, 1)]:
        assert indexcode.nbytes(n, k) * 8 <= k * (2 + math.log2(n / k)) + 16
    assert indexcode.bits_per_element(0.01) == pytest.approx(0.01 * 7 + 1 / 64)


def test_bad_input_is_refused(native):
    with pytest.raises(ValueError, match="2\\^31 - 1"):
        indexcode.nbytes(2**31, 1)
    with pytest.raises(RuntimeError, match="2\\^31 - 1"):
        native.positions_encode(torch.tensor([0]), 2**31)
    with pytest.raises(RuntimeError, match="ascending, distinct"):
        native.positions_encode(torch.tensor([5, 5]), 10)
    with pytest.raises(RuntimeError, match="ascending, distinct"):
        native.positions_encode(torch.tensor([3, 10]), 10)  # 10 is not in [0, 10)
    code = native.positions_encode(torch.tensor([1, 4]), 10)
    with pytest.raises(RuntimeError, match="bytes, got"):
        native.positions_decode(code[:-1], 10, 2)
    with pytest.raises(ValueError, match="bytes, got"):
        indexcode.decode(code[:-1], 10, 2)
    with pytest.raises(RuntimeError, match="positions, not 3"):
        # a code for 2 positions read as 3: the high section does not hold three ones
        native.positions_decode(torch.zeros(indexcode.nbytes(10, 3), dtype=torch.uint8), 10, 3)


def test_shapes_on_meta_tensors_for_the_wire_model():
    code = indexcode.encode(torch.empty(256_000, dtype=torch.int64, device="meta"), 25_600_000)
    assert code.device.type == "meta" and code.numel() == indexcode.nbytes(25_600_000, 256_000)
    assert indexcode.decode(code, 25_600_000, 256_000).shape == (256_000,)


def test_opcheck(native):
    p = _random_positions(5000, 50, 3)
    torch.library.opcheck(native.positions_encode, (p, 5000))
    torch.library.opcheck(native.positions_decode, (indexcode.encode(p, 5000), 5000, 50))


@pytest.mark.parametrize("backend", ["native", "reference"])
@pytest.mark.parametrize("numel", [1, 7, 100, 30_001, 262_144, 1_000_003])
def test_the_wire_model_predicts_the_payload_a_real_gradient_produces(native, backend, numel):
    """wire.payload_bytes (computed on shapes only) == the bytes prepare() hands the collective."""
    spec = {"name": "topk", "ratio": 0.01}
    c = compressors.get(spec)
    comm = Communicator(c, memory.for_compressor(c), world_size=1, rank=0)
    with ops.use_backend(backend):
        out = comm.prepare(torch.randn(numel, generator=torch.Generator().manual_seed(numel)), "b")
    measured = out.buffer.numel() * out.buffer.element_size()
    assert wire.payload_bytes(spec, numel) == measured
    k = max(1, numel // 100)

    def aligned(size: int) -> int:
        return size + (-size % 8)

    assert measured == aligned(2 * k) + aligned(indexcode.nbytes(numel, k))
    if numel >= 30_000:  # the 1/100 target holds per bucket, alignment included
        assert measured * 100 <= 4 * numel


def test_too_large_a_bucket_is_a_usage_error_in_the_wire_model_too():
    with pytest.raises(UsageError, match="2\\^31 - 1"):
        wire.payload_bytes("topk", 2**31)
