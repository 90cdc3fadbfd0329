"""Bytes on the wire: 2-rank Gloo DDP of a ResNet-20-sized model, top-k 1% vs dense allreduce.

    python bench/wire_bytes.py [--steps 5] [--ratio 0.01]

Two processes (torch.multiprocessing, localhost Gloo) train ResNet-20 (CIFAR-10 shape,
0.27M parameters) for a few steps, once with the "none" compressor (dense ring allreduce)
and once with top-k 1% + error feedback, through repro500.ext.ddp_hook.  Reported per step
per rank:

- bytes_sent by the hook's accounting (ring model, docs/compression.md), and
- bytes actually sent on rank 0's TCP sockets (the kernel's tcp_info via `ss`; Gloo's
  framing included; repro500.workloads.engines.wire, which runs also record per rank and epoch),
  as an independent check of the model.

Targets, printed side by side at the end: top-k's bytes on TCP <= 1/100 of the dense
allreduce's, and the CPU top-k selection of a 25.6M-element gradient <= 2.5x one read pass
over it (bench/compress.py's measurement, repeated here so one run shows both).  A miss
prints MISSED and exits 1.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from compress import (  # bench/compress.py, beside this file
    TARGET_FLOOR_RATIO,
    floor_ratio,
    floor_verdict,
    selection_vs_floor,
)
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from repro500.workloads.engines.wire import tcp_bytes
from repro500.workloads.models import build_model

TARGET_RATIO = 1 / 100
WORLD = 2
SELECTION_NUMEL = 25_600_000  # ResNet-50's gradient, as bench/compress.py


def _worker(rank: int, port: int, spec: object, steps: int, out_path: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from repro500.ext import ddp_hook

    torch.manual_seed(0)
    # forward_sync_buffers=False: measure the gradient exchange alone, not the BatchNorm
    # buffers DDP would otherwise broadcast before every forward.
    model = DistributedDataParallel(build_model("resnet20", num_classes=10, in_channels=3),
                                    forward_sync_buffers=False)
    state = ddp_hook.register(model, spec)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)

    def step() -> dict:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        return state.step_stats()

    # Two warm-up steps: DDP rebuilds its buckets after the first, and the ops load then.
    step()
    step()
    dist.barrier()
    before = tcp_bytes(os.getpid())
    stats = [step() for _ in range(steps)]
    dist.barrier()
    after = tcp_bytes(os.getpid())
    if rank == 0:
        torch.save(
            {
                "stats": stats,
                "params": sum(p.numel() for p in model.parameters()),
                "tcp": None if before is None else (after[0] - before[0], after[1] - before[1]),
            },
            out_path,
        )
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(spec: object, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pt")
        mp.spawn(_worker, args=(_free_port(), spec, steps, out), nprocs=WORLD, join=True)
        return torch.load(out, weights_only=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=5, help="measured steps (after 2 warm-up steps)"
    )
    parser.add_argument("--ratio", type=float, default=0.01, help="top-k ratio")
    args = parser.parse_args()
    from repro500.ext import ops

    ops.load_native()  # compile once here, not in both ranks
    dense = run("none", args.steps)
    sparse = run({"name": "topk", "ratio": args.ratio}, args.steps)
    print(
        f"ResNet-20 ({dense['params']:,} parameters), {WORLD} ranks, Gloo on localhost, "
        f"{args.steps} steps"
    )
    rows = []
    for name, result in [("none (dense allreduce)", dense), (f"topk {args.ratio:g} + EF", sparse)]:
        model_bytes = sum(s["bytes_sent"] for s in result["stats"]) / args.steps
        tcp = result["tcp"][0] / args.steps if result["tcp"] else None
        comp = sum(s["time_compress_s"] for s in result["stats"]) / args.steps
        decomp = sum(s["time_decompress_s"] for s in result["stats"]) / args.steps
        rows.append((model_bytes, tcp))
        tcp_text = (
            f"{tcp:12,.0f} B measured on TCP"
            if tcp is not None
            else "(ss not available: no TCP measurement)"
        )
        print(
            f"  {name:<24} {model_bytes:12,.0f} B/step/rank by the ring model; {tcp_text}; "
            f"compress {comp * 1e3:.2f} ms, decompress {decomp * 1e3:.2f} ms per step"
        )
    ratio = rows[1][0] / rows[0][0]
    print(f"  top-k / dense bytes (model)    = {ratio:.4f} = 1/{1 / ratio:.1f}")
    tcp_text = "(ss not available: no TCP measurement) MISSED"
    met = False
    if rows[0][1] and rows[1][1]:
        tcp_ratio = rows[1][1] / rows[0][1]
        met = tcp_ratio <= TARGET_RATIO
        tcp_verdict = "met" if met else "MISSED"
        tcp_text = f"1/{1 / tcp_ratio:.1f} (target <= 1/100: {tcp_verdict})"
        print(f"  top-k / dense bytes (TCP)      = {tcp_ratio:.4f} = {tcp_text}")
        print(
            f"  model vs TCP, dense: {rows[0][0] / rows[0][1]:.3f}; "
            f"top-k: {rows[1][0] / rows[1][1]:.3f} (1.0 = the model is exact)"
        )
    # The other half of the target, measured in the same run.
    g = torch.randn(SELECTION_NUMEL, generator=torch.Generator().manual_seed(0))
    times = selection_vs_floor(g, SELECTION_NUMEL // 100, 15, lambda: None)
    print(
        f"Side by side: wire bytes top-k 1% / dense on TCP {tcp_text}; "
        f"CPU top-k 1% selection of {SELECTION_NUMEL:,} fp32 / one read pass "
        f"({times['custom top-k'] * 1e3:.2f} / {times['read floor'] * 1e3:.2f} ms) = "
        f"{floor_verdict(times)}"
    )
    return 0 if met and floor_ratio(times) <= TARGET_FLOOR_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
