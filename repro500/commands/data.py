"""``repro500 data generate | check``: thin click commands over repro500.data."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from repro500.data.layout import KINDS, SPLITS

_COMPRESSIONS = ("none", "gzip", "lzf")


@click.group("data")
def data() -> None:
    """Generate synthetic scientific datasets and check dataset files.

    \b
    Examples:
      repro500 data generate ewa --out data/ewa/train.h5 --samples 64 --size 96x144
      repro500 data generate ewa --out data/ewa/eval.h5 --samples 16 --size 96x144 --split eval
      repro500 data generate cosmo --out data/cosmo/train.h5 --samples 128 --size 64
      repro500 data generate classification --out data/cls/train.h5 --samples 1024
      repro500 data check data/ewa --manifest runs/<run-id>
    """


@data.command("generate")
@click.argument("kind", type=click.Choice(KINDS))
@click.option("-o", "--out", required=True, type=click.Path(path_type=Path),
              help="HDF5 file to write (written under a temporary name, renamed when complete).")
@click.option("-n", "--samples", type=click.IntRange(min=1), default=None,
              help="Samples in the whole data set (all shards together). "
                   "Default: ewa 16, cosmo 32, classification 1024.")
@click.option("--size", default=None,
              help="ewa and classification: HxW (default 768x1152 and 32x32); cosmo: D voxels "
                   "per side (default 64).")
@click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1), default=0, show_default=True,
              help="Data seed: same seed and options give byte-identical files.")
@click.option("--split", type=click.Choice(SPLITS), default="train", show_default=True,
              help="Which split to write; train and eval draw different samples from one seed.")
@click.option("--shard", default="0/1", show_default=True,
              help="i/K: write only the i-th of K contiguous blocks of samples; the K files "
                   "together hold exactly the samples of one pass.")
@click.option("--compression", type=click.Choice(_COMPRESSIONS), default="none", show_default=True,
              help="HDF5 filter (with byte shuffle). none reads fastest; lzf is cheap; gzip is smallest.")
@click.option("--force", is_flag=True, help="Replace an existing output file.")
@click.option("--classes", type=click.IntRange(min=2), default=None,
              help="classification: number of classes (default 10).")
@click.option("--channels", type=click.IntRange(min=1), default=None,
              help="classification: image channels (default 3); cosmo: redshift bins (default 4).")
@click.option("--noise", type=click.FloatRange(0.0, 1.0), default=None,
              help="classification: per-pixel noise on a 0..1 scale (default 0.06).")
@click.option("--mean-count", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="cosmo: mean particles per voxel and redshift bin (default 8); more means "
                   "less Poisson noise.")
@click.option("--fixed-amplitude", is_flag=True, default=False,
              help="cosmo: fixed initial conditions (|mode| = sqrt(P(k)), random phases), "
                   "removing the cosmic variance of small boxes' power spectra.")
def generate(kind: str, out: Path, samples: int | None, size: str | None, seed: int, split: str,
             shard: str, compression: str, force: bool, classes: int | None, channels: int | None,
             noise: float | None, mean_count: float | None, fixed_amplitude: bool) -> None:
    """Generate a synthetic data set of KIND (ewa, cosmo or classification) into an HDF5 file.

    \b
    Exit codes: 0 written; 2 bad option values; 4 the output exists (without --force)
    or cannot be written; 130 interrupted by Ctrl-C or SIGTERM (no file is left at --out).
    """
    from repro500.data.generate import generate as run_generate
    from repro500.data.generate import parse_shard
    from repro500.errors import UsageError

    options: dict[str, Any] = {}
    for name, value, kinds in (("classes", classes, ("classification",)),
                               ("channels", channels, ("classification", "cosmo")),
                               ("noise", noise, ("classification",)),
                               ("mean_count", mean_count, ("cosmo",)),
                               ("fixed_amplitude", fixed_amplitude or None, ("cosmo",))):
        if value is None:
            continue
        if kind not in kinds:
            raise UsageError(f"--{name.replace('_', '-')} applies to {' and '.join(kinds)} data, not {kind}")
        options[name] = value
    result = run_generate(
        kind, out, samples=samples, seed=seed, split=split, size=size, shard=parse_shard(shard),
        compression=compression, force=force, progress=sys.stderr.isatty(), options=options,
    )
    last = result.sample_offset + result.samples - 1
    click.echo(
        f"wrote {result.path}: {kind} {split}, samples {result.sample_offset}..{last} of "
        f"{result.samples_total}, {result.file_bytes / 1e6:.1f} MB in {result.time_s:.1f} s "
        f"({result.mb_per_s:.0f} MB/s)"
    )


@data.command("check")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("-m", "--manifest", type=click.Path(path_type=Path), default=None,
              help="A manifest.json (or run directory) whose data facet recorded PATH: its "
                   "digest must still match.")
@click.option("--quick", is_flag=True,
              help="Scan at most 16 evenly spaced samples per file for NaN/Inf instead of all.")
def check(path: Path, manifest: Path | None, quick: bool) -> None:
    """Check data files under PATH: layout, values, and (with --manifest) digests.

    PATH is an HDF5 file (ewa, cosmo or classification layout, real or generated), a
    directory of them, or a CIFAR-10 batch directory.

    \b
    Exit codes: 0 everything is in order; 4 a file is missing, corrupt, truncated,
    in the wrong layout, holds bad values, or differs from the manifest.
    """
    from repro500.data.check import check_path

    report = check_path(path, manifest=manifest, quick=quick, progress=sys.stderr.isatty())
    for line in report.lines():
        click.echo(line)
