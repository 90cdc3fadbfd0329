"""``repro500 io``: thin CLI over repro500.system.dataio."""

from __future__ import annotations

import sys

import click

from repro500.commands.system_options import finish, run_options


def _ints(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None


def _words(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


@click.command(context_settings={"show_default": True})
@click.option("--samples", type=click.IntRange(min=1), default=2048, help="Samples generated (classification images).")
@click.option("--image-size", "size", default="128x128", metavar="HxW", help="Image size (uint8, 3 channels).")
@click.option("--formats", callback=_words, default=None, metavar="LIST",
              help="HDF5 layouts: contiguous, chunked (what repro500 data generate writes), gzip.  [default: all]")
@click.option("--files", callback=_ints, default=None, metavar="LIST", help="File counts to split the samples over.  [default: 1,4]")
@click.option("--access", callback=_words, default=None, metavar="LIST",
              help="sequential, random (with replacement), shuffled (an epoch's permutation).  [default: all]")
@click.option("--workers", callback=_ints, default=None, metavar="LIST",
              help="DataLoader worker counts (0: the main process).  [default: 0 and min(4, cores)]")
@click.option("--cache", "caches", callback=_words, default=None, metavar="LIST", help="cold, warm.  [default: both]")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, help="DataLoader batch size.")
@click.option("--scratch", type=click.Path(file_okay=False), default=None,
              help="Where the data files are written (removed at the end; default: the system's temporary directory).")
@run_options
def io(samples: int, size: str, formats: list[str] | None, files: list[int] | None, access: list[str] | None,
       workers: list[int] | None, caches: list[str] | None, batch_size: int, scratch: str | None, repeats: int,
       seed: int, threads: int | None, out_dir: str, run_id: str | None, tracking: bool | None,
       experiment: str | None) -> None:
    """Measure read throughput of repro500's HDF5 data: contiguous vs chunked vs compressed, one
    file vs many, sequential, random and shuffled access, DataLoader workers, cold vs warm page
    cache, each against a raw read of the same bytes (docs/system.md).

    Exit code: the verdict's (0 every sample read back as written, 1 not), 2 usage error.
    """
    from repro500.runner import run_data
    from repro500.system import recipes, render

    system = {"samples": samples, "size": size, "formats": formats, "files": files, "access": access,
              "workers": workers, "caches": caches, "batch_size": batch_size, "scratch": scratch}
    data = recipes.io_recipe({k: v for k, v in system.items() if v is not None},
                             recipes.measure_mutable(threads=threads), repeats=repeats, seed=seed)
    outcome = run_data(data, source="repro500 io", out_dir=out_dir, run_id=run_id, tracking=tracking,
                          experiment=experiment, argv=["repro500", *sys.argv[1:]])
    render.after_run(outcome.run_dir)
    finish(outcome)
