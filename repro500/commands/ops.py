"""``repro500 ops``: thin CLI over repro500.system (operator benchmarks; ``--inference RECIPE``)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from repro500.commands.system_options import finish, pairs, resolve_device, run_options


@click.command(context_settings={"show_default": True})
@click.option("--op", "operators", multiple=True, metavar="NAME",
              help="An operator to measure (repeatable): matmul, conv2d, conv2d_backward, batchnorm, allreduce, topk, "
                   "quantize, dequantize, sign_pack, sign_unpack, ef_update. Default: all (allreduce with --nproc >= 2).")
@click.option("--dtype", "dtypes", multiple=True, metavar="DTYPE",
              help="fp32, bf16 or fp16 (repeatable). Default: all three, where the device has them.")
@click.option("--sizes", default="default", metavar="PRESET", help="Size preset: tiny, default or large.")
@click.option("--size", "custom", multiple=True, metavar="OP=SPEC", callback=pairs,
              help="Sizes of one operator instead of the preset, e.g. matmul=4096 or matmul=512x1024x256, "
                   "conv2d=8x64x32x32x64x3 (n c h w out k), batchnorm=32x64x56x56, topk=1048576, allreduce=BYTES.")
@click.option("--model", default="resnet20", metavar="NAME",
              help="The all-reduce goes from 4 KiB up to this model's gradient size (repro500 model's table).")
@click.option("--tolerance", "tolerances", multiple=True, metavar="OP=EPS", callback=pairs,
              help="Replace an operator's stated tolerance (in epsilons of the dtype).")
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default=None,
              help="Where to measure (auto: the GPU when there is one). Default: auto; with --inference the recipe's device.")
@click.option("--nproc", type=click.IntRange(min=1), default=None, help="Ranks for the all-reduce (Gloo on CPUs, NCCL on GPUs).")
@click.option("--budget-s", type=click.FloatRange(min=0), default=1.0, help="Seconds of timed calls per case (at least 10 calls).")
@click.option("--inference", "inference_recipe", metavar="RECIPE", type=click.Path(dir_okay=False, path_type=Path),
              help="Instead of operators: inference latency and throughput of this recipe's model.")
@click.option("--batch-size", "batch_sizes", multiple=True, type=click.IntRange(min=1),
              help="With --inference: batch sizes to measure (repeatable). Default: 1, 8, 32.")
@click.option("--calls", type=click.IntRange(min=2), default=None,
              help="With --inference: timed calls per batch size (default 400 at batch 1: enough for a p99 interval).")
@run_options
def ops(operators: tuple[str, ...], dtypes: tuple[str, ...], sizes: str, custom: dict[str, list[str]], model: str,
        tolerances: dict[str, list[str]], device: str | None, nproc: int | None, budget_s: float, inference_recipe: Path | None,
        batch_sizes: tuple[int, ...], calls: int | None, repeats: int, seed: int, threads: int | None, out_dir: str,
        run_id: str | None, tracking: bool | None, experiment: str | None) -> None:
    """Benchmark operators: median time with its interval, FLOP/s, bytes/s and the error against a
    float64 reference, decided against a stated tolerance per dtype (docs/system.md).

    The result is a run directory (manifest, SHA256SUMS, MLflow); `repro500 verify RUN --against
    OTHER_RUN` compares two machines' operators. Exit code: the verdict's (0 every operator within
    its tolerance, 1 one is not: it is named), 2 usage error, 4 invalid input (a dtype the device
    lacks, a size that does not fit in memory).
    """
    from repro500.errors import UsageError
    from repro500.runner import run_data
    from repro500.system import ops as measure
    from repro500.system import recipes, render

    if inference_recipe is not None:
        given = [flag for flag, value in (("--op", operators), ("--dtype", dtypes), ("--size", custom),
                                          ("--tolerance", tolerances)) if value]
        if given:
            raise UsageError(f"--inference measures a model, not operators: {', '.join(given)} do not apply")
        _inference(inference_recipe, device, batch_sizes, calls, repeats, seed, threads, out_dir, run_id, tracking,
                   experiment)
        return
    if batch_sizes or calls:
        raise UsageError("--batch-size and --calls go with --inference RECIPE")
    tolerance_eps: dict[str, float] = {}
    for op, values in tolerances.items():
        try:
            tolerance_eps[op] = float(values[-1])
        except ValueError:
            raise UsageError(f"--tolerance {op}={values[-1]}: the tolerance is a number of epsilons") from None
    measure.check_names(list(operators), list(dtypes), sizes, custom, tolerance_eps)  # before torch loads
    system = {"operators": list(operators) or None, "dtypes": list(dtypes) or None, "sizes": sizes, "custom": custom,
              "model": model, "tolerances": tolerance_eps, "budget_s": budget_s}
    system = {k: v for k, v in system.items() if v not in (None, {}, [])}
    device = device or "auto"
    data = recipes.ops_recipe(system, recipes.measure_mutable(device, threads, nproc),
                              device=resolve_device(device), repeats=repeats, seed=seed)
    outcome = run_data(data, source="repro500 ops", out_dir=out_dir, run_id=run_id, tracking=tracking,
                          experiment=experiment, argv=["repro500", *sys.argv[1:]])
    render.after_run(outcome.run_dir)
    finish(outcome)


def _inference(recipe_path: Path, device: str | None, batch_sizes: tuple[int, ...], calls: int | None, repeats: int,
               seed: int, threads: int | None, out_dir: str, run_id: str | None, tracking: bool | None,
               experiment: str | None) -> None:
    from repro500.runner import run_data
    from repro500.system import inference, recipes, render

    system = inference.options_from_recipe(recipe_path, batch_sizes=list(batch_sizes) or None, calls=calls)
    device = device or system.pop("device")  # the recipe's own device unless --device says otherwise
    system.pop("device", None)
    data = recipes.inference_recipe(system, recipes.measure_mutable(device, threads),
                                    device=resolve_device(device), name=recipe_path.stem, repeats=repeats, seed=seed)
    outcome = run_data(data, source=f"repro500 ops --inference {recipe_path}", out_dir=out_dir, run_id=run_id,
                          tracking=tracking, experiment=experiment, argv=["repro500", *sys.argv[1:]])
    render.after_run(outcome.run_dir)
    finish(outcome)
