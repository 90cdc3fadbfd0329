"""``repro500 roofline``: thin CLI over repro500.system.roofline."""

from __future__ import annotations

import sys

import click

from repro500.commands.system_options import finish, resolve_device, run_options


@click.command(context_settings={"show_default": True})
@click.option("--dtype", "dtypes", multiple=True, metavar="DTYPE",
              help="fp32, bf16 or fp16 (repeatable): the GEMM peaks to measure. Default: all three.")
@click.option("--sizes", default="default", metavar="PRESET",
              help="tiny, default (CPU: GEMM n=2048, 256 MiB arrays) or large.")
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="auto",
              help="cpu, or cuda as well (auto: the GPU when there is one); the CPU is always measured.")
@click.option("--nproc", type=click.IntRange(min=1), default=None,
              help="Ranks for the interconnect's alpha/beta (the all-reduce, as repro500 model fits it).")
@click.option("--budget-s", type=click.FloatRange(min=0), default=2.0, help="Seconds of timed calls per figure (at least 10 calls).")
@run_options
def roofline(dtypes: tuple[str, ...], sizes: str, device: str, nproc: int | None, budget_s: float, repeats: int,
             seed: int, threads: int | None, out_dir: str, run_id: str | None, tracking: bool | None,
             experiment: str | None) -> None:
    """Measure the machine's ceilings (peak FLOP/s per dtype, memory bandwidth, and with --nproc
    the interconnect's alpha/beta), each beside an independent tool's figure (numpy's matmul,
    sysbench memory), as a run directory (docs/system.md).

    `repro500 report TRAINING_RUN --roofline THIS_RUN` places a training run on the roofline.
    Exit code: the verdict's (0 the ceilings agree with the tools, 1 one does not), 2 usage
    error, 4 invalid input (sizes that do not fit in memory).
    """
    from repro500.runner import run_data
    from repro500.system import recipes, render
    from repro500.system.roofline import check_names

    check_names(list(dtypes), sizes)  # before torch loads
    system = {"dtypes": list(dtypes) or None, "sizes": sizes, "budget_s": budget_s}
    data = recipes.roofline_recipe({k: v for k, v in system.items() if v is not None},
                                   recipes.measure_mutable(device, threads, nproc),
                                   device=resolve_device(device), repeats=repeats, seed=seed)
    outcome = run_data(data, source="repro500 roofline", out_dir=out_dir, run_id=run_id, tracking=tracking,
                          experiment=experiment, argv=["repro500", *sys.argv[1:]])
    render.after_run(outcome.run_dir)
    finish(outcome)
