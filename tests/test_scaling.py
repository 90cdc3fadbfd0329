"""The scaling model: the alpha-beta fit, the predictions and the wire bytes they rest on."""

from __future__ import annotations

import math

import pytest

from repro500.errors import InvalidInput, UsageError
from repro500.scaling import fit, predict, sizes, wire
from repro500.scaling.alphabeta import CollectiveFit, coefficients
from repro500.scaling.fit import Point

SIZES = [4 * 4**k for k in range(13)]  # 4 B .. 64 MiB


def synthetic_points(latency_s: float, gamma: float, p_values=(2,), collective="allreduce") -> list[Point]:
    out = []
    for p in p_values:
        for m in SIZES:
            a_l, a_g = coefficients(collective, m, p)
            out.append(Point(collective, p, m, a_l * latency_s + a_g * gamma))
    return out


def exact_fits(latency_s: float = 50e-6, gamma: float = 1e-9) -> dict[str, CollectiveFit]:
    return {c: CollectiveFit(c, latency_s, gamma, 1.0, 0.0, 0.0, 13) for c in ("allreduce", "allgather")}


@pytest.mark.parametrize("collective", ["allreduce", "allgather"])
@pytest.mark.parametrize("p_values", [(2,), (2, 3, 4, 8)])
def test_fit_recovers_known_latency_and_gamma_exactly(collective, p_values):
    points = synthetic_points(37e-6, 0.8e-9, p_values, collective)
    result = fit.fit_collective(collective, points)
    # Double least squares (nnls: Householder QR, column-scale invariant) on exact data: error ~
    # m kappa u per coefficient, kappa = 1.3 once columns are scaled, m <= 52 rows: ~1e-14 (0 to
    # 5e-16 measured); 1e-9 is headroom that any BLAS order keeps, a wrong coefficient is O(1) off
    assert result.latency_s == pytest.approx(37e-6, rel=1e-9)
    assert result.gamma_s_per_byte == pytest.approx(0.8e-9, rel=1e-9)
    assert result.r2 == pytest.approx(1.0, abs=1e-12)
    assert result.max_rel_residual < 1e-9
    assert result.points == len(points)
    assert result.bandwidth_bytes_per_s == pytest.approx(1 / 0.8e-9)


def test_fit_reports_noise_as_worse_r2_and_residuals():
    points = [Point(pt.collective, pt.p, pt.message_bytes, pt.time_s * (1.3 if i % 2 else 0.75))
              for i, pt in enumerate(synthetic_points(40e-6, 1e-9))]
    result = fit.fit_collective("allreduce", points)
    assert result.latency_s > 0 and result.gamma_s_per_byte > 0
    assert result.r2 < 0.99
    assert 0.1 < result.rms_rel_residual < 0.5
    rows = fit.residuals({"allreduce": result}, points)
    assert len(rows) == len(points)
    assert max(abs(r["rel_residual"]) for r in rows) == pytest.approx(result.max_rel_residual)


def test_fit_needs_two_points():
    with pytest.raises(InvalidInput, match="fewer than two"):
        fit.fit_collective("allgather", synthetic_points(1e-5, 1e-9)[:1])


def test_formulas_match_ben_nun_hoefler():
    f = CollectiveFit("allreduce", 1e-4, 2e-9, 1, 0, 0, 2)
    # 2 L log2 P + 2 gamma m (P-1)/P at P = 8, m = 1 MB
    assert f.time_s(1e6, 8) == pytest.approx(2 * 1e-4 * 3 + 2 * 2e-9 * 1e6 * 7 / 8)
    g = CollectiveFit("allgather", 1e-4, 2e-9, 1, 0, 0, 2)
    # L log2 P + gamma m (P-1)
    assert g.time_s(1e6, 8) == pytest.approx(1e-4 * 3 + 2e-9 * 1e6 * 7)
    assert f.time_s(1e6, 1) == 0.0 and g.time_s(1e6, 1) == 0.0


def test_prediction_matches_hand_computation():
    bucket = wire.Bucket(numel=1000, count=2, payload_bytes=4000)
    work = predict.Workload(params=2000, buckets=[bucket], summable=True, compute_time_s=0.1, data_time_s=0.01)
    fits = exact_fits(1e-4, 1e-9)
    (at8,) = predict.predict(work, fits, [8])
    comm = 2 * (2 * 1e-4 * 3 + 2 * 1e-9 * 4000 * 7 / 8)
    assert at8.comm_time_s == pytest.approx(comm)
    assert at8.step_time_s == pytest.approx(0.11 + comm)
    assert at8.efficiency == pytest.approx(0.11 / (0.11 + comm))
    assert at8.bytes_per_rank == 2 * (2 * 7 * 4000 // 8)  # ring allreduce, per bucket
    gathered = predict.Workload(params=2000, buckets=[bucket], summable=False, compute_time_s=0.1,
                                compress_time_s=0.002, decompress_time_s=0.001, decompress_p=2)
    (g16,) = predict.predict(gathered, fits, [16])
    comm = 2 * (1e-4 * 4 + 1e-9 * 4000 * 15)
    assert g16.comm_time_s == pytest.approx(comm)
    assert g16.compression_time_s == pytest.approx(0.002 + 0.001 * 16 / 2)  # one payload per process
    assert g16.step_time_s == pytest.approx(0.1 + 0.002 + 0.008 + comm)
    assert g16.bytes_per_rank == 2 * 15 * 4000
    (one,) = predict.predict(work, fits, [1])
    assert one.comm_time_s == 0 and one.efficiency == 1.0 and one.bytes_per_rank == 0


def test_overlap_hides_communication_up_to_the_compute_time():
    work = predict.Workload(params=10, buckets=[wire.Bucket(10, 1, 40)], summable=True, compute_time_s=0.001)
    fits = exact_fits(1e-3, 0.0)  # comm at P=4: 2 * 1e-3 * 2 = 4 ms > compute
    none, half, full = (predict.predict_one(work, fits, 4, overlap) for overlap in (0.0, 0.5, 1.0))
    assert none.step_time_s == pytest.approx(0.005)
    assert half.step_time_s == pytest.approx(0.005 - 0.001)  # 2 ms hideable, only 1 ms of compute
    assert full.step_time_s == pytest.approx(0.004)
    with pytest.raises(UsageError, match="not a fraction"):
        predict.predict_one(work, fits, 4, 1.5)


def test_efficiency_falls_with_p_and_compression_helps():
    params = sizes.params_of("resnet50")
    fits = exact_fits(50e-6, 1e-9)

    def curve(spec):
        work = predict.Workload(params=params, buckets=wire.buckets(spec, params),
                                summable=wire.is_summable(spec), compute_time_s=0.25)
        return {p.p: p for p in predict.predict(work, fits, predict.DEFAULT_P)}

    dense, half, topk = curve("none"), curve("fp16"), curve({"name": "topk", "ratio": 0.01})
    efficiencies = [dense[p].efficiency for p in predict.DEFAULT_P]
    assert efficiencies == sorted(efficiencies, reverse=True) and efficiencies[0] > efficiencies[-1]
    assert all(0 < e < 1 for e in efficiencies)
    for p in predict.DEFAULT_P:
        assert half[p].efficiency > dense[p].efficiency
        # integers: each of the 5 buckets' ring floor may drop a byte off an exact half of >= 9e7 B: < 1e-7
        assert half[p].bytes_per_rank == pytest.approx(dense[p].bytes_per_rank / 2, rel=1e-6)
    # top-k sends 1/130 of the bytes at P = 2, but an allgather grows with P: by 1024 it loses.
    assert topk[8].efficiency > half[8].efficiency
    assert topk[1024].bytes_per_rank > dense[1024].bytes_per_rank
    assert topk[1024].efficiency < dense[1024].efficiency


def test_wire_bytes_are_ext_accounting_on_real_tensors():
    import torch

    from repro500.ext import compressors, memory, ops
    from repro500.ext.communicator import Communicator

    for spec in ("none", "fp16", {"name": "topk", "ratio": 0.01}, "randomk", "qsgd", "terngrad", "efsignsgd"):
        compressor = compressors.get(spec)
        comm = Communicator(compressor, memory.for_compressor(compressor), world_size=1, rank=0)
        with ops.use_backend("reference"):
            out = comm.prepare(torch.randn(30_001), "b")
        assert wire.payload_bytes(spec, 30_001) == out.buffer.numel() * out.buffer.element_size(), spec
    with pytest.raises(UsageError, match="powersgd"):
        wire.payload_bytes("powersgd", 1000)
    with pytest.raises(UsageError, match="unknown compressor 'zip'"):
        wire.buckets("zip", 1000)


def test_bucket_plan_follows_ddp_caps_and_the_run_bytes():
    assert wire.bucket_plan(1000) == [(1000, 1)]
    assert wire.bucket_plan(25_557_032) == [(262_144, 1), (6_553_600, 3), (5_634_088, 1)]
    assert sum(n * c for n, c in wire.bucket_plan(25_557_032)) == 25_557_032
    # ResNet-20 on 2 ranks with no compression: the bytes a real run records per step
    plan = wire.buckets("none", sizes.params_of("resnet20"))
    assert wire.bytes_per_rank(plan, 2, summable=True) == 1_078_888
    assert wire.dense_params_from_bytes(1_078_888, 2) == 269_722
    assert wire.payload_from_bytes_sent(7000 * 2, 8, summable=True) == 8000
    assert wire.payload_from_bytes_sent(7000, 8, summable=False) == 1000


def test_parse_p_list():
    assert predict.parse_p_list("16, 8,8,1024") == [8, 16, 1024]
    for bad in ("8,x", "0", "", "-4"):
        with pytest.raises(UsageError):
            predict.parse_p_list(bad)


def test_known_sizes_are_the_registry_models():
    from repro500.workloads.models import build_model

    for name in ("resnet20", "resnet56", "resnet18", "cosmoflow"):
        model = build_model(name)
        assert sizes.params_of(name) == sum(p.numel() for p in model.parameters() if p.requires_grad), name
    with pytest.raises(UsageError, match="no parameter count is known for model 'gpt5'"):
        sizes.params_of("gpt5")
    assert math.isclose(sizes.params_of("ResNet50"), 25_557_032)
