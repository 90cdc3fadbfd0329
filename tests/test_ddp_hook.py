"""Two real Gloo processes on localhost running DistributedDataParallel with the hook adapter.

One 2-rank job runs every scenario (process start-up is the expensive part) and rank 0
saves the results; the tests below assert on them.
"""

from __future__ import annotations

import math
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from repro500.ext import ops

WORLD = 2
# bucket_cap_mb large enough that each model is one DDP bucket, so the expected bytes are
# a formula of the parameter count alone.
BUCKET_CAP_MB = 64


def _model(seed: int, hidden: int = 32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1)
    ).double()


def _data(rank: int, seed: int = 0, rows: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * seed + rank)
    x = torch.randn(rows, 16, generator=g, dtype=torch.float64)
    teacher = torch.Generator().manual_seed(77)
    w = torch.randn(16, 1, generator=teacher, dtype=torch.float64)
    return x, torch.tanh(x @ w) + 0.01 * torch.randn(rows, 1, generator=g, dtype=torch.float64)


def _flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _train(spec, rank: int, steps: int, lr: float, hidden: int = 32, float32: bool = False) -> dict:
    from repro500.ext import ddp_hook

    net = _model(0, hidden)
    if float32:
        net = net.float()
    model = DistributedDataParallel(net, bucket_cap_mb=BUCKET_CAP_MB)
    state = ddp_hook.register(model, spec) if spec is not None else None
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = _data(rank)
    if float32:
        x, y = x.float(), y.float()
    losses, stats = [], []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        waited = state.comm_wait_s(time.perf_counter()) if state is not None else None
        optimizer.step()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        losses.append(float(global_loss) / WORLD)
        if state is not None:
            record = state.step_stats()
            # what the trainer records as time_comm_wait_s; the reset clears it for the next step
            record.update(comm_wait_s=waited, comm_wait_after_reset=state.comm_wait_s(time.perf_counter()))
            stats.append(record)
    params = _flat_params(model.module)
    everyone = [torch.empty_like(params) for _ in range(WORLD)]
    dist.all_gather(everyone, params)
    return {
        "losses": losses,
        "stats": stats,
        "params": params,
        "ranks_agree": all(torch.equal(everyone[0], p) for p in everyone[1:]),
        "numel": params.numel(),
        "element_size": params.element_size(),
    }


def _worker(rank: int, port: int, out_path: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    results = {
        "plain": _train(None, rank, steps=5, lr=0.1),
        "none": _train("none", rank, steps=5, lr=0.1),
        "topk": _train(
            {"name": "topk", "ratio": 0.01}, rank, steps=150, lr=0.2, hidden=256, float32=True
        ),
        "topk_no_ef": _train(
            {"name": "topk", "ratio": 0.01, "memory": "none"},
            rank,
            steps=3,
            lr=0.2,
            hidden=256,
            float32=True,
        ),
        "fp16": _train("fp16", rank, steps=40, lr=0.2, float32=True),
        "bf16": _train("bf16", rank, steps=40, lr=0.2, float32=True),
        "randomk": _train({"name": "randomk", "ratio": 0.25}, rank, steps=40, lr=0.2, float32=True),
        "qsgd": _train({"name": "qsgd", "levels": 15}, rank, steps=40, lr=0.2, float32=True),
        "terngrad": _train("terngrad", rank, steps=40, lr=0.2, float32=True),
        "efsignsgd": _train("efsignsgd", rank, steps=40, lr=0.2, float32=True),
        "powersgd": _train(
            {"name": "powersgd", "rank": 1, "start_iter": 3},
            rank,
            steps=40,
            lr=0.2,
            hidden=64,
            float32=True,
        ),
    }
    # The trainer's divergence decision is collective: one rank's NaN stops every rank.
    from repro500.workloads.engines.collectives import for_engine

    here = for_engine("ddp", WORLD)
    results["all_finite"] = {
        "one_rank_nan": here.all_finite(math.nan if rank == 1 else 0.5),
        "one_rank_inf": here.all_finite(math.inf if rank == 0 else 0.5),
        "all_finite": here.all_finite(0.5 + rank),
    }
    if rank == 0:
        torch.save(results, out_path)
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    # Compile (or find) the operators once here, so the two ranks only load them.
    assert ops.load_native(), ops.native_error()
    out = tmp_path_factory.mktemp("ddp") / "results.pt"
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=True)
    return torch.load(out, weights_only=False)


def test_none_equals_plain_ddp_allreduce_bitwise(results):
    assert torch.equal(results["none"]["params"], results["plain"]["params"])
    assert results["none"]["losses"] == results["plain"]["losses"]


def test_two_ranks_match_one_process_with_the_global_batch(results):
    model = _model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.cat([_data(r)[0] for r in range(WORLD)])
    y = torch.cat([_data(r)[1] for r in range(WORLD)])
    for _ in range(5):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    torch.testing.assert_close(
        results["none"]["params"], _flat_params(model), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize(
    "name", ["none", "topk", "fp16", "bf16", "randomk", "qsgd", "terngrad", "efsignsgd", "powersgd"]
)
def test_every_rank_ends_with_the_same_parameters(results, name):
    assert results[name]["ranks_agree"]


def test_topk_with_error_feedback_still_trains(results):
    losses = results["topk"]["losses"]
    assert losses[-1] < 0.5 * losses[0], losses[::10]


@pytest.mark.parametrize("name", ["fp16", "bf16", "randomk", "qsgd", "terngrad", "efsignsgd", "powersgd"])
def test_other_compressors_decrease_the_loss(results, name):
    losses = results[name]["losses"]
    assert losses[-1] < 0.7 * losses[0], losses[::5]


def test_dense_bytes_follow_the_ring_allreduce_model(results):
    r = results["none"]
    m = r["numel"] * r["element_size"]
    for stats in r["stats"]:
        assert stats["tensors"] == 1  # one bucket
        assert stats["bytes_sent"] == stats["bytes_received"] == 2 * (WORLD - 1) * m // WORLD
        assert stats["compression_ratio"] == 1.0
        assert stats["time_comm_s"] > 0 and stats["time_compress_s"] > 0


@pytest.mark.parametrize("name", ["none", "topk", "qsgd", "powersgd"])
def test_the_wait_for_communication_is_measured_per_step(results, name):
    for stats in results[name]["stats"]:
        assert math.isfinite(stats["comm_wait_s"]) and 0 <= stats["comm_wait_s"] < 10
        assert stats["comm_wait_after_reset"] is None


def test_topk_bytes_are_what_the_allgather_moves(results):
    r = results["topk"]
    n = r["numel"]
    k = int(n * 0.01)
    aligned = 4 * k + (-(4 * k) % 8)  # each packed tensor starts 8-byte aligned
    payload = 2 * aligned  # fp32 values + int32 indices
    for stats in r["stats"]:
        assert stats["tensors"] == 1
        assert stats["bytes_sent"] == (WORLD - 1) * payload
        assert stats["dense_bytes_sent"] == 2 * (WORLD - 1) * 4 * n // WORLD
    assert r["stats"][-1]["compression_ratio"] == pytest.approx(4 * n / payload)
    assert r["stats"][-1]["compression_ratio"] > 40


def test_fp16_halves_the_bytes_and_powersgd_compresses_after_start_iter(results):
    for name in ("fp16", "bf16"):
        for stats in results[name]["stats"]:
            assert stats["compression_ratio"] == 2.0
    power = results["powersgd"]["stats"]
    assert power[0]["compression_ratio"] == 1.0  # plain allreduce before start_iter
    assert power[-1]["compression_ratio"] > 3.0


def test_one_ranks_non_finite_loss_stops_every_rank(results):
    # rank 0 saved these: it saw a finite loss itself in "one_rank_nan" yet must stop too
    assert results["all_finite"] == {"one_rank_nan": False, "one_rank_inf": False, "all_finite": True}
