"""A publication read back and checked before anything runs (``repro500 reproduce``): its digest
list, the archive against its recorded SHA-256 and its own ``SHA256SUMS`` (the files the index
says it left out accounted for, repro500.rundir.excluded), and every number of
``published.yaml``, the recipe, the seed and the data digests against the packed run.

:mod:`repro500.publish.publication` writes publications; this module reads them.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500 import recorded_paths, untrusted
from repro500.digest import file_digest
from repro500.errors import InvalidInput
from repro500.publish.datafiles import DataEntry, check_entries
from repro500.publish.publication import (
    INDEX,
    MANIFEST,
    OWN_FILES,
    PARAMS,
    PUBLISHED,
    RECIPE,
    SCHEMA,
    epochs_to_quality,
    rerun_flags,
    run_design,
    runnable_recipe,
)
from repro500.rundir import archive as archives
from repro500.rundir import excluded
from repro500.rundir import sums as bundle
from repro500.verify import integrity
from repro500.verify.published import load_published
from repro500.verify.rundir import load_run


@dataclass
class Publication:
    """A checked publication: its files, and the packed run unpacked for comparison."""

    root: Path
    index: dict[str, Any]
    reference: Path  # the unpacked run directory
    data: list[DataEntry]
    repeats: int
    seed: int
    # the packed run's integrity, with what the publication left out of it (publish --exclude)
    integrity: Any = None  # repro500.verify.integrity.IntegrityResult
    not_carried: list[excluded.LeftOut] = field(default_factory=list)
    # the packed run's design (publication.run_design): a factorial is rerun as a factorial
    design: dict[str, Any] | None = None
    nnodes: int = 1  # the packed run's nodes a repeat: its rerun needs as many (SLURM tasks of them)

    @property
    def run_id(self) -> str:
        return str(self.index["run_id"])

    @property
    def published(self) -> Path:
        return self.root / PUBLISHED

    @property
    def recipe(self) -> Path:
        return self.root / RECIPE

    @property
    def params(self) -> Path:
        return self.root / PARAMS

    @property
    def rerun_flags(self) -> list[str]:
        # the design from the packed run itself: a publication made before publications recorded
        # it is rerun with its design all the same
        return rerun_flags({**(self.index.get("run") or {}), "design": self.design})


def _load_yaml(path: Path) -> Any:
    try:
        return untrusted.load_yaml(untrusted.read_text(path, f"the publication's {path.name}"), str(path))
    except FileNotFoundError:
        raise InvalidInput(f"{path} is missing: obtain a complete copy of the publication") from None


def read_index(root: Path) -> dict[str, Any]:
    path = root / INDEX
    try:
        index = untrusted.load_json(untrusted.read_bytes(path, f"the publication's {INDEX}"), str(path))
    except FileNotFoundError:
        raise InvalidInput(f"{root} has no {INDEX}: not a publication (make one with repro500 publish)") from None
    if not isinstance(index, dict) or index.get("schema") != SCHEMA:
        raise InvalidInput(f"{path} is not a {SCHEMA} document")
    # the run id becomes a directory name (reproduce's default --out): refused here, before any copy
    untrusted.path_name(index.get("run_id"), f"{path}: run_id")
    return index


def own_files(root: Path, index: dict[str, Any]) -> list[str]:
    """The files of the publication at ``root`` that reproduce reads: those ``repro500 publish``
    writes, as its SHA256SUMS lists them.  A listed file of another name (a module, a script) or
    one that is not a regular file is refused, before anything is copied or read."""
    try:
        archive = str(recorded_paths.relative(index["archive"]["name"], field="archive.name", file=root / INDEX))
    except (KeyError, TypeError):
        raise InvalidInput(f"{root / INDEX} lacks archive.name: not a complete publication") from None
    own = {*OWN_FILES, archive}
    listed = [*bundle.read_sums(root), bundle.SUMS_NAME]
    foreign = sorted(set(listed) - own)
    if foreign:
        shown = ", ".join(untrusted.plain(name) for name in foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise InvalidInput(f"publication {root} lists files repro500 publish never writes ({shown}): refused, "
                           "nothing of a publication but its own files is taken")
    for name in listed:
        path = root / name
        if (path.is_symlink() or path.exists()) and not untrusted.regular_file(path):
            raise InvalidInput(f"{path} is not a regular file (a link or a device): the publication is refused")
    return listed


def snapshot(src: Path, dest: Path) -> bool:
    """Copy the publication at ``src`` into ``dest``, its private snapshot: each of its own files
    (:func:`own_files`) read once through a descriptor that follows no link and is a regular file
    under its cap, written anew and made read-only, then the directory too.  Everything after reads
    the snapshot only (check = use): what ``src`` holds later, or holds beside its own files, is
    never seen.  Whether a copy was made (not when ``dest`` is ``src`` itself)."""
    index = read_index(src)
    names = own_files(src, index)
    if dest.resolve() == src.resolve():
        return False  # reproducing into the directory that already holds this snapshot
    if dest.exists() or dest.is_symlink():
        remove_snapshot(dest)
    dest.mkdir(parents=True)
    archive = str(index["archive"]["name"])
    for name in names:
        cap = untrusted.unpack_cap() if name == archive else untrusted.MAX_DOCUMENT_BYTES
        try:
            handle = untrusted.open_regular(src / name, f"the publication's {name}", cap, follow=False)
        except FileNotFoundError:
            continue  # reported as missing when the snapshot is checked
        with handle, open(dest / name, "xb") as out:
            shutil.copyfileobj(handle, out, 1 << 20)
    read_only(dest)
    return True


def read_only(root: Path) -> None:
    """Make every file and directory under ``root`` read-only (what was checked stays as checked:
    no later step of this repro500 can write into it by mistake)."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, 0o444)
    for dirpath, _, _ in sorted(os.walk(root), key=lambda entry: -len(entry[0])):
        os.chmod(dirpath, 0o555)


def remove_snapshot(path: Path) -> None:
    """Remove a snapshot made by :func:`snapshot` (its directories are read-only)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return
    for dirpath, _, _ in os.walk(path):
        os.chmod(dirpath, 0o755)
    shutil.rmtree(path)


def open_publication(root: str | Path, workdir: str | Path, snapshot_dir: str | Path | None = None) -> Publication:
    """Check the publication at ``root`` and unpack its run into ``workdir``; InvalidInput on any mismatch.

    The publication is first copied into ``snapshot_dir`` (default ``workdir/publication``) by
    :func:`snapshot`, and only the snapshot is checked and read from then on; the packed run is
    unpacked from the snapshot's archive and made read-only too.  Nothing in the publication is
    executed: YAML is read with ``yaml.safe_load``, the archive is unpacked with
    :func:`repro500.archives.unpack` (which refuses path escapes and links).
    """
    target = Path(snapshot_dir) if snapshot_dir is not None else Path(workdir) / "publication"
    snapshot(Path(root), target)
    root = target
    index = read_index(root)
    own_files(root, index)
    sums = bundle.check_sums(root)
    if not sums.ok:  # the snapshot holds its own files only: anything else is a change
        raise InvalidInput(f"publication {root} was changed after repro500 publish wrote it ({sums.describe()}): "
                           "obtain an untouched copy")
    try:
        run_meta = index["run"]
    except (KeyError, TypeError):
        raise InvalidInput(f"{root / INDEX} lacks archive.name, archive.sha256 or run: not a complete publication") from None
    reference, check, not_carried = _unpack_run(root, index, workdir)
    run = load_run(reference)
    _check_published(root, index, run)
    manifest = untrusted.load_json(untrusted.read_bytes(root / MANIFEST, "the publication's manifest"), str(root / MANIFEST))
    if manifest != run.manifest:
        raise InvalidInput(f"{root / MANIFEST} differs from the packed run's manifest")
    recipe = _load_yaml(root / RECIPE)
    if recipe != runnable_recipe(run.recipe or {}):
        raise InvalidInput(f"{root / RECIPE} differs from the packed run's recipe")
    _check_recipe_paths(recipe, root / RECIPE)
    data, repeats, seed = _check_params(root / PARAMS, run_meta, run)
    design = run_design(run.run or {})
    if "design" in run_meta and run_meta["design"] != design:
        raise InvalidInput(f"{root / INDEX}: run.design differs from the packed run's design")
    # a count from the record, bounded here: the rerun's --nnodes is built from it
    nnodes = untrusted.count((run.run or {}).get("nnodes") or 1, f"{reference}/run.json: nnodes",
                             cap=untrusted.MAX_RUN_NODES, least=1)
    read_only(reference)
    return Publication(root=root, index=index, reference=reference, data=data, repeats=repeats, seed=seed,
                       integrity=check, not_carried=not_carried, design=design, nnodes=nnodes)


def _unpack_run(root: Path, index: dict[str, Any], workdir: str | Path) -> tuple[Path, Any, list[Any]]:
    """(the packed run unpacked into ``workdir``, its integrity check, the files it left out), after
    the archive's digest, its SHA256SUMS' digest and the gate publish ran are all checked."""
    try:
        archive_name = str(recorded_paths.relative(index["archive"]["name"], field="archive.name", file=root / INDEX))
        archive_sha = index["archive"]["sha256"]
    except (KeyError, TypeError):
        raise InvalidInput(f"{root / INDEX} lacks archive.name, archive.sha256 or run: not a complete publication") from None
    archive = root / archive_name
    if not archive.is_file() or file_digest(archive) != archive_sha:
        raise InvalidInput(f"{archive} is missing or its SHA-256 differs from {INDEX}: the packed run was replaced")
    reference = archives.unpack(archive, workdir)
    recorded = bundle.read_sums(reference)  # InvalidInput when SHA256SUMS is missing or malformed
    if file_digest(reference / bundle.SUMS_NAME) != index.get("sums_digest"):
        raise InvalidInput(f"the packed run's SHA256SUMS differs from the digest in {INDEX}")
    # the publication index says what the archive left out; the run's SHA256SUMS, anchored just
    # above, says what each of those files was
    not_carried = excluded.read_list(index, recorded, root / INDEX)
    check = integrity.check_files(reference, label=f"packed run {archive.name}",
                                  not_carried=[e.to_dict() for e in not_carried])
    if not check.ok:
        raise InvalidInput(f"the packed run {archive.name} is not what the run wrote: {'; '.join(check.problems)}")
    # the same gate publish ran: the repeat chain and the attestation too, as verify checks them
    integrity.require_intact(reference, "it is not reproduced", shown=f"the packed run {archive.name}",
                             not_carried=[e.to_dict() for e in not_carried])
    return reference, check, not_carried


def _check_published(root: Path, index: dict[str, Any], run: Any) -> None:
    """published.yaml's values, margins, directions and epochs are the packed run's."""
    published = load_published(root / PUBLISHED)
    margins = index.get("margins") or {}
    criteria = {c.metric: c for c in run.acceptance}
    for name, metric in published.metrics.items():
        where = f"{root / PUBLISHED}: metrics.{name}"
        if name not in criteria or name not in margins:
            raise InvalidInput(f"{where} is not an acceptance metric recorded by the publication")
        if metric.values != run.values(name):
            raise InvalidInput(f"{where}.values {metric.values} differ from the packed run's {run.values(name)}")
        if metric.margin != margins[name].get("margin") or metric.direction != criteria[name].direction:
            raise InvalidInput(f"{where}: margin or direction differs from {INDEX} and the run's acceptance")
        if margins[name].get("source") == "acceptance tolerance" and metric.margin != criteria[name].tolerance:
            raise InvalidInput(f"{where}.margin {metric.margin} is not the run's acceptance tolerance")
    if published.epochs_to_quality is not None and published.epochs_to_quality != epochs_to_quality(run):
        raise InvalidInput(f"{root / PUBLISHED}: epochs_to_quality differ from the packed run's")


def _check_params(path: Path, run_meta: dict[str, Any], run: Any) -> tuple[list[Any], int, int]:
    """(the data entries, repeats, seed) of params.yaml, which must be the packed run's."""
    params = _load_yaml(path)
    if not isinstance(params, dict) or not isinstance(params.get("run"), dict) or not isinstance(params.get("data"), list):
        raise InvalidInput(f"{path} must hold a 'data' list and a 'run' mapping")
    repeats, seed = params["run"].get("repeats"), params["run"].get("seed")
    if repeats != run_meta.get("repeats") or seed != run_meta.get("seed") or seed != (run.recipe or {}).get("seed"):
        raise InvalidInput(f"{path}: run.repeats/run.seed differ from the packed run's")
    if set(params["run"]) - {"repeats", "seed"}:
        raise InvalidInput(f"{path}: run may only hold repeats and seed")
    entries = check_entries(params["data"], run.manifest or {}, path)
    # where the reproduction puts each data path: under OUT (the snapshot's parent), never on the
    # snapshot itself, never the whole of OUT or of the working directory
    for i, entry in enumerate(entries):
        recorded_paths.resolve(entry.path, field=f"data[{i}].path", file=path, root=path.parent.parent,
                               never=[path.parent])
        for j, spec in enumerate(entry.generate or []):
            recorded_paths.resolve(spec["out"], field=f"data[{i}].generate[{j}].out", file=path,
                                   root=path.parent.parent, never=[path.parent])
    return entries, int(repeats), int(seed)


def _check_recipe_paths(recipe: dict[str, Any], where: Path) -> None:
    dataset = ((recipe.get("fixed") or {}).get("dataset") or {})
    for key in ("path", "eval_path"):
        value = dataset.get(key)
        for item in value if isinstance(value, list) else [value]:
            if item is not None:
                recorded_paths.resolve(item, field=f"fixed.dataset.{key}", file=where, root=where.parent.parent,
                                       never=[where.parent])
