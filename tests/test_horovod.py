"""The Horovod adapter.  Run under two ranks: `make test-horovod`, i.e.

    horovodrun -np 2 -H localhost:2 --gloo \
        python -m pytest -q -p no:cacheprovider -m horovod tests/test_horovod.py

Tests marked `horovod` skip when Horovod is not importable or when run with one rank.
"""

from __future__ import annotations

import sys

import pytest
import torch

from repro500.errors import UsageError


def test_missing_horovod_is_a_clear_usage_error(monkeypatch):
    from repro500.ext import horovod as adapter

    monkeypatch.setitem(sys.modules, "horovod.torch", None)  # makes the import fail
    with pytest.raises(UsageError, match="Horovod is not installed .*scripts/build_horovod.sh"):
        adapter.import_horovod()


@pytest.fixture(scope="module")
def hvd():
    hvd = pytest.importorskip("horovod.torch")
    if not hvd.is_initialized():
        hvd.init()
    if hvd.size() < 2:
        pytest.skip("needs two ranks: run under horovodrun -np 2 (make test-horovod)")
    return hvd


def _setup(hvd, spec, seed_by_rank=True):
    from repro500.ext.horovod import distributed_optimizer

    torch.manual_seed(
        hvd.rank() if seed_by_rank else 0
    )  # different inits: the broadcast must fix them
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    optimizer = distributed_optimizer(torch.optim.SGD(net.parameters(), lr=0.2), net, spec)
    g = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn(128, 16, generator=g)
    y = torch.tanh(x[:, :1] - x[:, 1:2])
    return net, optimizer, x, y


def _params(net):
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def _all_same(hvd, t):
    everyone = hvd.allgather(t.unsqueeze(0))
    return all(torch.equal(everyone[0], row) for row in everyone[1:])


@pytest.mark.horovod
@pytest.mark.parametrize("spec", ["none", "fp16"])
def test_hook_path_averages_gradients(hvd, spec):
    net, optimizer, x, y = _setup(hvd, spec)
    assert _all_same(hvd, _params(net)), "rank 0's parameters were broadcast"
    before = _params(net)
    # The local gradient via autograd.grad, which bypasses Horovod's accumulate-grad hooks:
    # after backward(), p.grad is being averaged in place by Horovod's background thread.
    grads = torch.autograd.grad(torch.nn.functional.mse_loss(net(x), y), list(net.parameters()))
    local = torch.cat([g.reshape(-1) for g in grads])
    mean = hvd.allreduce(local, op=hvd.Average)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(net(x), y).backward()
    optimizer.step()
    # Horovod averages with pre/post scale factors: equal to the mean up to float rounding.
    # none: float32 averages of 2 ranks in another order, gamma_2 ~ 1.2e-7 of |grad| times lr 0.2;
    # fp16: each rank's gradient rounded to fp16 (2^-11 relative ~ 5e-4) times lr 0.2 ~ 1e-4 of |grad|
    tol = 1e-6 if spec == "none" else 2e-3
    torch.testing.assert_close(_params(net), before - 0.2 * mean, rtol=tol, atol=tol)
    stats = optimizer.step_stats()
    bytes_per_element = 4 if spec == "none" else 2
    size = hvd.size()
    # one ring allreduce per parameter tensor
    expected = sum(2 * (size - 1) * bytes_per_element * p.numel() // size for p in net.parameters())
    assert stats["bytes_sent"] == stats["bytes_received"] == expected
    assert stats["compression_ratio"] == pytest.approx(1.0 if spec == "none" else 2.0, rel=0.01)


@pytest.mark.horovod
@pytest.mark.parametrize(
    "spec",
    [
        {"name": "topk", "ratio": 0.05},
        {"name": "randomk", "ratio": 0.25},
        {"name": "qsgd", "levels": 15},
        "efsignsgd",
    ],
)
def test_custom_path_trains_and_keeps_ranks_identical(hvd, spec):
    net, optimizer, x, y = _setup(hvd, spec)
    losses = []
    for _ in range(40):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(hvd.allreduce(loss.detach(), op=hvd.Average)))
        stats = optimizer.step_stats()  # this step's costs; resets
    assert _all_same(hvd, _params(net))
    assert losses[-1] < 0.7 * losses[0]
    assert stats["tensors"] == 4 and stats["compression_ratio"] > 1.5


@pytest.mark.horovod
def test_topk_bytes_follow_the_allgather_model(hvd):
    net, optimizer, x, y = _setup(hvd, {"name": "topk", "ratio": 0.05})
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(net(x), y).backward()
    optimizer.step()
    stats = optimizer.step_stats()
    from repro500.ext import indexcode

    def aligned(nbytes):  # each packed tensor starts 8-byte aligned
        return nbytes + (-nbytes % 8)

    expected = 0
    for p in net.parameters():
        k = max(1, int(p.numel() * 0.05))
        # k bfloat16 values, then the positions Elias-Fano coded (a size set by n and k alone)
        payload = aligned(2 * k) + aligned(indexcode.nbytes(p.numel(), k))
        expected += (hvd.size() - 1) * payload
    assert stats["bytes_sent"] == expected


@pytest.mark.horovod
def test_powersgd_and_bf16_are_refused(hvd):
    with pytest.raises(UsageError, match="only with the ddp engine"):
        _setup(hvd, "powersgd")
    with pytest.raises(UsageError, match="cannot reduce bfloat16"):
        _setup(hvd, "bf16")


@pytest.mark.horovod
@pytest.mark.parametrize("spec", ["none", {"name": "topk", "ratio": 0.05}])
def test_zero_grad_takes_set_to_none_as_torch_does(hvd, spec):
    # The trainer calls zero_grad(set_to_none=True); Horovod 0.28.1's own zero_grad() takes no
    # arguments, so the adapter must accept it on both paths.
    net, optimizer, x, y = _setup(hvd, spec)
    for set_to_none in (False, True):
        optimizer.zero_grad(set_to_none=set_to_none)
        torch.nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=set_to_none)
        grads = [p.grad for p in net.parameters()]
        if set_to_none:
            assert all(g is None for g in grads)
        else:
            assert all(g is not None and not g.any() for g in grads)
    optimizer.step_stats()


@pytest.mark.horovod
def test_efsign_memory_follows_the_learning_rate_as_under_ddp(hvd):
    # EF-signSGD keeps its error in units of lr * g; the trainer tells the engine the learning
    # rate before each step (set_learning_rate), so a schedule changes it under Horovod as under DDP.
    from repro500.ext import memory

    net, optimizer, x, y = _setup(hvd, "efsignsgd")
    mem = optimizer.repro500_communicator.memory
    assert isinstance(mem, memory.EFSignMemory)
    for lr in (0.2, 0.05):
        optimizer.set_learning_rate(lr)
        assert mem.lr == lr
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()
    assert _all_same(hvd, _params(net))
