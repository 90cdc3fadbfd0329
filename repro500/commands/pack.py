"""``repro500 pack`` and ``repro500 unpack``: thin click commands over repro500.rundir.archive."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("run_dir", metavar="RUN", type=click.Path(path_type=Path))
@click.option("--out", "-o", type=click.Path(path_type=Path), default=None,
              help="Archive to write (default: <RUN>.tar.gz next to the run directory; a directory gets <run-id>.tar.gz).")
@click.option("--force", is_flag=True, help="Replace an existing archive.")
def pack(run_dir: Path, out: Path | None, force: bool) -> None:
    """Pack RUN into one .tar.gz that `repro500 verify` accepts anywhere.

    The run must pass what verify checks of its own files (SHA256SUMS, the repeat chain, an
    attestation it carries): exit 4 otherwise, with verify's sentence. Packing the same
    directory twice gives byte-identical archives; publish the printed digests so others can
    check their copy.
    """
    from repro500.digest import file_digest
    from repro500.rundir import archive as archives
    from repro500.rundir import sums as bundle
    from repro500.verify.integrity import require_intact

    # archives.pack checks only the digests; an archive vouches for the run as verify would
    require_intact(run_dir, "refusing to pack a run that would not verify")
    archive = archives.pack(run_dir, out, force=force)
    from repro500.untrusted import plain

    click.echo(f"packed {plain(run_dir)} -> {plain(archive)} ({archive.stat().st_size} bytes)")
    click.echo(f"archive sha256: {file_digest(archive)}")
    click.echo(f"SHA256SUMS sha256: {file_digest(run_dir / bundle.SUMS_NAME)} (repro500 verify --expect-sums)")


@click.command()
@click.argument("archive", type=click.Path(path_type=Path))
@click.option("--dest", "-d", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="Directory to unpack into; the run lands in DEST/<run-id>.")
@click.pass_context
def unpack(ctx: click.Context, archive: Path, dest: Path) -> None:
    """Unpack ARCHIVE safely and check its files against SHA256SUMS.

    Archives with absolute paths, '..' components, links pointing outside, or device files
    are refused before anything is written. Exit 4 when the archive is corrupt, unsafe, or
    its files do not match SHA256SUMS.
    """
    from repro500.errors import EXIT_INVALID
    from repro500.rundir import archive as archives
    from repro500.rundir import sums as bundle
    from repro500.untrusted import SENTENCE_CHARS, plain

    target = archives.unpack(archive, dest)  # DEST/<run id>: the id is the archive's
    report = bundle.check_sums(target)
    click.echo(f"unpacked {plain(archive)} -> {plain(target)}")
    if not report.ok:
        click.echo(f"repro500: error: {plain(target)} does not match its SHA256SUMS ({plain(report.describe(), SENTENCE_CHARS)})", err=True)
        ctx.exit(EXIT_INVALID)
    click.echo(f"all {len(bundle.read_sums(target))} files match SHA256SUMS; next: repro500 verify {plain(target)}")
