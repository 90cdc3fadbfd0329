"""``repro500 publish``: a run packaged so that anyone can rerun and verify it.

A publication is a directory (docs/publish.md)::

    publication.json   repro500/publication/v1: what is here, digests, how the run was made,
                       what the archive leaves out (not_carried: publish --exclude)
    <run-id>.tar.gz    the packed run (repro500 pack): the reference, verifiable anywhere
    published.yaml     repro500/published/v1: the run's per-repeat values, margins from the
                       acceptance tolerances, epochs-to-quality, the reference manifest
    manifest.json      the run's manifest (provenance of the reference)
    recipe.yaml        the resolved recipe, runnable with `repro500 run`
    params.yaml        data: how to recreate each data file; run: repeats and seed
    dvc.yaml           generate -> run -> verify, for `dvc repro`
    README.md          the exact commands to reproduce and verify
    environment.hashes.json  the index's sha256 of every file of each pinned release, asked at
                       publish (reproduce --env venv installs only those bytes)
    SHA256SUMS         every file above (`sha256sum -c SHA256SUMS`)

:func:`repro500.publish.opened.open_publication` reads one back and checks it before anything runs: its digest
list, the archive against its recorded SHA-256 and its own ``SHA256SUMS``, and every number
of ``published.yaml``, the recipe, the seed and the data digests against the packed run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from repro500 import __version__, recorded_paths, untrusted
from repro500.digest import canonical_digest, file_digest
from repro500.errors import InvalidInput, UsageError
from repro500.progress import human_bytes
from repro500.publish import index as indexes
from repro500.publish import rebuild
from repro500.publish.datafiles import (
    DataEntry,
    describe,
    generate_command,
    read_specs,
)
from repro500.redact import redact_values
from repro500.rundir import archive as archives
from repro500.rundir import atomic, dvcfile, excluded
from repro500.rundir import layout as rundir
from repro500.rundir import sums as bundle
from repro500.rundir.names import PUBLISHED_SCHEMA
from repro500.rundir.writable import writing
from repro500.verify.integrity import require_intact
from repro500.verify.rundir import load_run

SCHEMA = "repro500/publication/v1"
INDEX = rundir.PUBLICATION_INDEX
PUBLISHED = "published.yaml"
MANIFEST = rundir.MANIFEST  # the run's manifest, under its own name
RECIPE = rundir.RECIPE  # the run's resolved recipe, under its own name
PARAMS = rundir.PUBLICATION_PARAMS
DVC_FILE = rundir.DVC_FILE
README = "README.md"
HASHES = "environment.hashes.json"  # the indexes' sha256 of every pinned release's files, asked at publish
RERUN_ID = "rerun"  # the run id dvc.yaml gives the rerun
# A publication's files besides its archive (whose name its index gives): reproduce takes nothing else.
OWN_FILES = (INDEX, bundle.SUMS_NAME, PUBLISHED, MANIFEST, RECIPE, PARAMS, DVC_FILE, README, HASHES)
# keys of a resolved recipe.yaml that `repro500 run` does not take back as a recipe
_RESOLVED_ONLY = ("open_division", "overrides")


@dataclass
class PublishResult:
    path: Path
    archive: Path
    archive_sha256: str
    sums_digest: str  # SHA-256 of the run's SHA256SUMS (repro500 verify --expect-sums)
    publication_digest: str  # SHA-256 of the publication's SHA256SUMS
    status: str  # the run's own verdict when it was published
    metrics: list[str]
    notes: list[str] = field(default_factory=list)
    readme: str = ""
    not_carried: list[excluded.LeftOut] = field(default_factory=list)  # left out of the archive (--exclude)
    runs_code: str | None = None  # "command" / "plug-in": a reproduction needs --run-code


def _utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def runnable_recipe(resolved: dict[str, Any]) -> dict[str, Any]:
    """A run directory's resolved ``recipe.yaml`` as a recipe that ``repro500 run`` accepts."""
    return {k: v for k, v in resolved.items() if k not in _RESOLVED_ONLY}


def published_metrics(run: Any, margins: dict[str, float] | None) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(metrics section of published.yaml, {metric: {margin, source}}, notes) for a loaded run."""
    margins = dict(margins or {})
    criteria = {c.metric: c for c in run.acceptance}
    unknown = sorted(set(margins) - set(criteria))
    if unknown:
        raise UsageError(f"--margin {unknown[0]}: not an acceptance metric of the run "
                         f"(its acceptance metrics are {', '.join(sorted(criteria)) or 'none'})")
    section: dict[str, Any] = {}
    used: dict[str, Any] = {}
    notes: list[str] = []
    for name, crit in criteria.items():
        margin = margins.get(name, crit.tolerance)
        source = "--margin" if name in margins else "acceptance tolerance"
        values = run.values(name)
        if margin <= 0:
            notes.append(f"{name} is not published: its acceptance tolerance is 0 (give --margin {name}=DELTA)")
            continue
        if not values:
            notes.append(f"{name} is not published: no completed repeat reported it")
            continue
        section[name] = {"values": [float(v) for v in values], "margin": float(margin), "direction": crit.direction,
                         "test": "equivalence", "note": f"per-repeat values of the packed run; margin: {source}"}
        used[name] = {"margin": float(margin), "source": source}
    if not section:
        raise UsageError("no acceptance metric of the run can be published: each needs a tolerance > 0 and "
                         "completed repeats (give --margin METRIC=DELTA)")
    return section, used, notes


def epochs_to_quality(run: Any) -> list[float]:
    return [float(run.repeats[k]["epochs_to_quality"]) for k in run.completed
            if run.repeats[k].get("epochs_to_quality") is not None]


def rerun_flags(run_meta: dict[str, Any]) -> list[str]:
    """The flags of ``repro500 run`` that rerun a run as it was made (run.json, or a publication's
    ``run``), its design included: a factorial run is rerun as the same factorial."""
    flags = []
    if run_meta.get("same_seed"):
        flags.append("--same-seed")
    if run_meta.get("deterministic"):
        flags.append("--deterministic")
    design = run_design(run_meta)
    if design and design["kind"] == "factorial":
        flags += ["--vary", ",".join(design["sources"]), "--repeats-per-cell", str(design["per_cell"])]
    return flags


def run_design(run_meta: dict[str, Any]) -> dict[str, Any] | None:
    """What a publication records of a run's design (run.json ``design``): a factorial run's sources
    and repeats per cell, a sequential run's most repeats and where it stopped; None for a fixed one."""
    design = run_meta.get("design")
    if not isinstance(design, dict):
        return None
    if design.get("kind") == "factorial":
        sources, per_cell = design.get("sources"), design.get("per_cell")
        if not (isinstance(sources, list) and sources and all(isinstance(s, str) for s in sources)
                and isinstance(per_cell, int) and not isinstance(per_cell, bool)):
            raise InvalidInput("the run's factorial design lacks its sources or repeats per cell: not rerunnable")
        return {"kind": "factorial", "sources": list(sources), "per_cell": per_cell}
    if design.get("kind") == "sequential":
        return {"kind": "sequential", "max_repeats": design.get("max_repeats"), "stopped_at": design.get("stopped_at")}
    return None


def describe_design(design: dict[str, Any]) -> str:
    """A design in words, for a line of output."""
    if design.get("kind") == "factorial":
        return (f"--vary {','.join(untrusted.plain(s) for s in design['sources'])}, {design['per_cell']} repeats "
                "per source")
    if design.get("kind") == "sequential":
        stopped = design.get("stopped_at")
        return f"at most {design.get('max_repeats')} repeats" + (f", stopped at {stopped}" if stopped else "")
    return "fixed"


def _dvc_yaml(entries: list[DataEntry], flags: list[str], headline: list[str], runs_code: str | None) -> str:
    if runs_code:
        return _dvc_yaml_reproduce(headline, runs_code)
    commands, outs, skipped = [], [], []
    for entry in entries:
        for spec in entry.generate or []:
            command = generate_command(spec)
            if command is None:
                skipped.append(spec["out"])
            else:
                commands.append(command)
                outs.append(spec["out"])
        if not entry.generate:
            skipped.append(entry.path)
    stages: dict[str, Any] = {}
    if commands:
        stages["generate"] = {"desc": "Recreate the run's synthetic data from its generator parameters",
                              "cmd": commands, "outs": outs}
    stages["run"] = {
        "desc": "Rerun the published recipe with the published seed and repeats",
        "cmd": " ".join(["repro500 run", RECIPE, "--params", PARAMS, "--out runs --run-id", RERUN_ID,
                         *flags, "--no-tracking", "--plots", dvcfile.PLOTS, dvcfile.RESULT_OK]),
        "deps": [RECIPE, *[e.path for e in entries]],
        "params": ["run"],
        "outs": [f"runs/{RERUN_ID}"],
        "plots": dvcfile.plots_entries(headline),
    }
    stages["verify"] = {
        "desc": "Verify the rerun against the published results",
        "cmd": f"repro500 verify runs/{RERUN_ID} --against {PUBLISHED} --no-write --metrics {dvcfile.VERDICT_METRICS} "
               + dvcfile.RESULT_OK,
        "deps": [f"runs/{RERUN_ID}", PUBLISHED, MANIFEST],
        "metrics": [dvcfile.metrics_entry()],
    }
    head = ["Written by repro500 publish (docs/publish.md). Inside a DVC project (or after",
            "`dvc init --no-scm` here): dvc repro. `repro500 reproduce` does the same without DVC.",
            "A FAIL (1) or INCONCLUSIVE (3) verdict is recorded in metrics/verdict.json, not an error."]
    if skipped:
        head.append(f"Not generated here (use repro500 reproduce, dvc pull or a copy): {', '.join(skipped)}")
    return dvcfile.render(head, stages)


REPRODUCTION = "reproduction"  # where a publication's own dvc.yaml reproduces it


def _dvc_yaml_reproduce(headline: list[str], runs_code: str) -> str:
    """The pipeline of a publication whose experiment runs its own code: its source travels only in
    the packed run, so the stage is ``repro500 reproduce`` of this directory, which places that source,
    the data (from ``REPRO500_DATA_ROOT``, default here) and the checked recipe, and reruns in the
    sandbox.  Running the stage is the reproducer's consent, so it says ``--run-code``."""
    stages = {"reproduce": {
        "desc": f"Rerun the publication's own code ({runs_code}) in repro500's sandbox and verify it against the "
                "published results",
        "cmd": f"repro500 reproduce . --run-code --out {REPRODUCTION} --metrics {dvcfile.VERDICT_METRICS} "
               f"--plots {dvcfile.PLOTS} {dvcfile.RESULT_OK}",
        "deps": [bundle.SUMS_NAME],
        "outs": [REPRODUCTION],
        "metrics": [dvcfile.metrics_entry()],
        "plots": dvcfile.plots_entries(headline, epochs=runs_code != "command"),
    }}
    head = ["Written by repro500 publish (docs/publish.md). Inside a DVC project (or after",
            "`dvc init --no-scm` here): dvc repro runs `repro500 reproduce . --run-code`: the experiment's",
            f"own code ({runs_code}, in the packed run's source/) runs in repro500's sandbox. Read it first.",
            "Data it cannot recreate is looked for under REPRO500_DATA_ROOT (default: this directory).",
            "A NOT REPRODUCED (1) or INCONCLUSIVE (3) verdict is recorded in metrics/verdict.json, not an error."]
    return dvcfile.render(head, stages)


def _readme(index: dict[str, Any], published: dict[str, Any], entries: list[DataEntry], flags: list[str],
            runs_code: str | None = None) -> str:
    run_id = index["run_id"]
    lines = [f"# Reproducing {published['benchmark']}", "",
             f"Run `{run_id}` of recipe `{index['recipe_name']}`: {index['run']['repeats']} repeats, master seed "
             f"{index['run']['seed']}, its own verdict {index['run']['verdict']}. Published with repro500 "
             f"{__version__} on {index['created_utc']}.", "",
             "| metric | per-repeat values | margin | direction |", "| --- | --- | --- | --- |"]
    for name, m in published["metrics"].items():
        shown = ", ".join(f"{v:.6g}" for v in m["values"])
        lines.append(f"| {name} | {shown} | ±{m['margin']:g} | {m['direction']} is better |")
    consent = " --run-code" if runs_code else ""
    lines += ["", "## Reproduce and verify", "", "```console",
              f"$ repro500 reproduce path/to/this/directory --out reproduction{consent}",
              f"$ repro500 reproduce https://example.org/repo.git --path path/in/repo --rev TAG{consent}   # from git",
              "```", "",
              *([f"The experiment runs its own code ({runs_code}): it travels in the packed run's `source/`; read it "
                 "(`repro500 unpack` the archive) before you pass `--run-code`.", ""] if runs_code else []),
              "It recreates the data, reruns the recipe with the published seed and repeats, verifies the",
              "rerun against `published.yaml` and prints the verdict with the provenance diff. Exit codes:",
              "0 REPRODUCED, 1 NOT REPRODUCED, 3 INCONCLUSIVE, 4 invalid or tampered input.", "",
              "Step by step, in this directory:", "", "```console"]
    for entry in entries:
        for spec in entry.generate or []:
            command = generate_command(spec)
            lines.append(f"$ {command}" if command else f"# {spec['out']}: only repro500 reproduce can recreate it")
        if not entry.generate:
            lines.append(f"# {entry.path} (md5 {entry.md5}): not generated; obtain it (dvc pull) and check the md5")
    if runs_code == "command":  # the command runs from the experiment's directory, which the archive carries
        unpack = f"$ repro500 unpack {index['archive']['name']} --dest reference   # the code is in its source/"
        run_cmd = " ".join([f"(cd reference/{index['run_id']}/source && repro500 run ../../../{RECIPE}",
                            f"--params ../../../{PARAMS} --out ../../../runs --run-id", RERUN_ID, *flags]) + ")"
        lines.append(unpack)
    else:
        run_cmd = " ".join(["repro500 run", RECIPE, "--params", PARAMS, "--out runs --run-id", RERUN_ID, *flags])
    lines += [f"$ {run_cmd}", f"$ repro500 verify runs/{RERUN_ID} --against {PUBLISHED}", "```", "",
              "With DVC (inside a DVC project, or after `dvc init --no-scm` here): `dvc repro`, then",
              "`dvc metrics show`. Read `dvc.yaml` before running it: DVC executes its commands.", "",
              "## Check the reference", "", "```console", "$ sha256sum -c SHA256SUMS"]
    left_out = index.get(excluded.INDEX_KEY) or []
    lines.append(f"$ repro500 verify {index['archive']['name']} --expect-sums {index['sums_digest']}")
    lines += ["```", "", f"Archive SHA-256: `{index['archive']['sha256']}`. Quote it (and the SHA-256 of this",
              "directory's SHA256SUMS) wherever the result is cited: a copy that matches them is this one.", ""]
    if left_out:
        # the archive alone cannot say what it lacks: only this directory's publication.json does
        lines += ["## Files left out of the packed run", "", left_out_note(left_out),
                  "`repro500 verify` (of this directory, or of the archive where it lies here) and `repro500",
                  "reproduce` read them from publication.json: not carried, digests recorded. Copied elsewhere on its",
                  f"own, {index['archive']['name']} has no such list: verify and unpack then report them missing "
                  "(exit 4)", "until they are put back into the unpacked run, where they are checked like any other "
                  "file.", "",
                  "| file | bytes | SHA-256 |", "| --- | --- | --- |",
                  *(f"| {e['path']} | {e['bytes']} | `{e['sha256']}` |" for e in left_out), ""]
    return "\n".join(lines)


def left_out_note(entries: Sequence[dict[str, Any]]) -> str:
    """The sentence publish prints, and the README says, about the files ``--exclude`` left out."""
    size = human_bytes(sum(e["bytes"] for e in entries))
    shown = ", ".join(e["path"] for e in entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
    return (f"{len(entries)} file(s) of the run ({size}) are left out of the archive (--exclude): {shown}; their "
            f"SHA-256 stay sealed in the run's SHA256SUMS and are listed in {INDEX} ({excluded.INDEX_KEY}).")


def _release_hashes(root: Path, out: Path) -> str | None:
    """Ask each pinned release's index for the sha256 of its files and write them to *out*, so that
    ``reproduce --env venv`` installs exactly what the index served when the result was published
    (a run records its lock offline, never waiting for the network; publishing is where the index
    is asked).  A note when some or all could not be asked; None when there is nothing to pin."""
    try:
        pins = rebuild.read(root, None)
    except InvalidInput:
        return None  # no lock, or one that applies to no Python environment: nothing to hash
    if not pins.released:
        return None
    found, unanswered = indexes.release_hashes(
        [(name, version, pins.indexes_for(own)) for name, version, own in pins.released])
    atomic.write_json(out, {"schema": rebuild.HASHES_SCHEMA, "lock_sha256": pins.digest, "asked_utc": _utc(),
                            "hashes": found, "not_answered": unanswered})
    if not unanswered:
        return None
    shown = ", ".join(unanswered[:5]) + (f" and {len(unanswered) - 5} more" if len(unanswered) > 5 else "")
    return (f"release hashes: {len(found)} of {len(pins.released)} pinned releases recorded; no index answered for "
            f"{shown} (offline, or an index without PEP 691 JSON pages), so a rebuild checks no file's hash")


def _write_clean(path: Path, text: str) -> None:
    """Write a publication's text file with any secret value of this environment removed."""
    atomic.write_text(path, redact_values(text))


def _stage_dir(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(staging, 0o777 & ~mask)  # mkdtemp makes it owner-only; a publication is meant to be shared
    return staging


def _commit(staging: Path, out: Path, force: bool) -> None:
    """Rename the finished staging directory to ``out``; an old ``out`` goes only afterwards."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
    os.replace(staging, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def publish(
    run: str | Path,
    out: str | Path,
    *,
    benchmark: str | None = None,
    citation: str | None = None,
    url: str | None = None,
    margins: dict[str, float] | None = None,
    data_root: str | Path = ".",
    force: bool = False,
    exclude: Sequence[str] = (),
) -> PublishResult:
    """Write the publication of ``run`` (a run directory or a packed run) into ``out``.

    How to recreate the data comes from the run's ``data-specs.json``; for a run recorded
    before that file existed, ``data_root`` is the directory the run ran in: its relative data
    paths are looked up there to read their generator parameters.  ``out`` must not exist (or be empty) unless
    ``force``; the publication is written next to it and renamed into place when complete.
    ``exclude`` globs name files of the run that the archive leaves out, their digests recorded
    (repro500.rundir.excluded; UsageError for one that matches nothing or a file repro500 needs).
    A run that ``repro500 verify`` would call INVALID for its own files is refused (InvalidInput,
    verify's sentence: repro500.verify.integrity.require_intact) before anything is written.
    """
    run_path, out = Path(run), Path(out)
    if archives.is_archive(run_path):
        with tempfile.TemporaryDirectory(prefix="repro500-publish-") as tmp:
            return _publish(archives.unpack(run_path, tmp), out, benchmark, citation, url, margins, data_root, force,
                            exclude, shown=run_path)
    if not run_path.is_dir():
        raise InvalidInput(f"{run_path} is not a run directory or a packed run: give runs/<run-id> or a .tar.gz")
    return _publish(run_path, out, benchmark, citation, url, margins, data_root, force, exclude)


def _check_data_paths(manifest: dict[str, Any], shown: Path, data_root: str | Path) -> None:
    """Every data path and declared input the manifest records is one a reproduction may look for
    (repro500.recorded_paths): a kernel file, a FIFO or the directory as a whole is refused before
    anything reads it or anything is written."""
    data = (manifest.get("facets") or {}).get("data") or {}
    for key in ("entries", "inputs"):
        for i, entry in enumerate(data.get(key) or []):
            recorded_paths.resolve(entry.get("path") if isinstance(entry, dict) else None,
                                   field=f"facets.data.{key}[{i}].path", file=shown / rundir.MANIFEST,
                                   root=data_root, anywhere=True)


def _publish(root: Path, out: Path, benchmark: str | None, citation: str | None, url: str | None,
             margins: dict[str, float] | None, data_root: str | Path, force: bool,
             exclude: Sequence[str], shown: Path | None = None) -> PublishResult:
    from repro500.verify.verdict import verify_run

    _check_destination(root, out, force)
    run, left_out = _publishable_run(root, exclude, shown)
    _check_data_paths(run.manifest or {}, shown or root, data_root)
    verdict = verify_run(root)
    metrics, used, notes = published_metrics(run, margins)
    plan = describe(run.manifest, data_root, recorded=read_specs(root, run.manifest))
    meta = run.run or {}
    recipe = runnable_recipe(run.recipe)
    flags = rerun_flags(meta)
    notes += _publication_notes(plan.entries, meta, left_out)

    with writing("the publication", out, "give --out a directory you can write to"):
        staging = _stage_dir(out)
    try:
        archive = archives.pack(root, staging / f"{run.run_id}.tar.gz", leave_out=[e.path for e in left_out])
        shutil.copyfile(root / rundir.MANIFEST, staging / MANIFEST)
        published = _published_doc(run, recipe, metrics, benchmark, citation, url)
        _write_clean(staging / PUBLISHED, "# Written by repro500 publish (docs/publish.md, docs/verify.md).\n"
                          + yaml.safe_dump(published, sort_keys=False, width=100))
        _write_clean(staging / RECIPE, f"# The resolved recipe of run {run.run_id} (repro500 publish).\n"
                          + yaml.safe_dump(recipe, sort_keys=False, width=100))
        rerun = _write_params(staging, run, plan.entries)
        code = rundir.own_code(root)
        _write_clean(staging / DVC_FILE, _dvc_yaml(plan.entries, flags, list(metrics), code[0] if code else None))
        index = _write_index(staging, root, run, recipe, archive, rerun, verdict.status, used, left_out, notes)
        notes = index["notes"]
        readme = _readme(index, published, plan.entries, flags, code[0] if code else None)
        _write_clean(staging / README, readme)
        bundle.write_sums(staging)
        publication_digest = file_digest(staging / bundle.SUMS_NAME)
        with writing("the publication", out, "give --out a directory you can write to"):
            _commit(staging, out, force)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return PublishResult(path=out, archive=out / archive.name, archive_sha256=index["archive"]["sha256"],
                         sums_digest=index["sums_digest"], publication_digest=publication_digest,
                         status=verdict.status, metrics=list(metrics), notes=notes, readme=readme,
                         not_carried=left_out, runs_code=code[0] if code else None)


def _check_destination(root: Path, out: Path, force: bool) -> None:
    """``out`` is free (absent, empty, or ``force``) and outside the run it publishes."""
    if out.exists() and not (out.is_dir() and not any(out.iterdir())) and not force:
        raise InvalidInput(f"{out} already exists: choose another --out or pass --force to replace it")
    if out.resolve().is_relative_to(root.resolve()):
        raise UsageError(f"{out} lies inside the run directory: write the publication somewhere else")


def _publishable_run(root: Path, exclude: Sequence[str], shown: Path | None) -> tuple[Any, list[Any]]:
    """The run, once it is known to be one a publication can vouch for, and the files ``exclude``
    leaves out of its archive."""
    # a publication vouches for the run: what verify would call INVALID (a replaced or dropped
    # repeat, files re-sealed after signing) is refused here, not published with its verdict
    require_intact(root, "only an untouched run is published", shown=shown)
    left_out = excluded.select(root, exclude)
    run = load_run(root)
    # the run id names the archive (and, in reproduce, the default work directory): a packed run from
    # elsewhere chose it, and "../../x" would put a file outside the publication
    untrusted.path_name(run.run_id, f"{shown or root}: run id")
    if run.recipe is None or run.manifest is None:
        raise InvalidInput(f"{root} has no recipe.yaml or manifest.json: it cannot be rerun from a publication")
    return run, left_out


def _publication_notes(entries: Sequence[DataEntry], meta: dict[str, Any], left_out: Sequence[Any]) -> list[str]:
    """What a reader of the publication should know beyond the metrics: the data files' own notes,
    an open-division run, and the files the archive leaves out."""
    notes = [e.note for e in entries if e.note]
    if meta.get("open_division"):
        notes.append("the run was in the open division (fixed keys overridden); recipe.yaml holds the values it used")
    if left_out:
        notes.append(left_out_note([e.to_dict() for e in left_out]))
    return notes


def _write_params(staging: Path, run: Any, entries: Sequence[DataEntry]) -> dict[str, int]:
    """params.yaml: how each data file and the run are recreated; returns its ``run`` part."""
    params = {"data": [e.to_dict() for e in entries],
              "run": {"repeats": int(run.recipe.get("repeats", len(run.repeats))),
                      "seed": int(run.recipe.get("seed", 0))}}
    _write_clean(staging / PARAMS, "# How this run is recreated (repro500 publish). data: each data file with "
                      "its md5 and generator parameters;\n# run: applied by `repro500 run --params`.\n"
                      + yaml.safe_dump(params, sort_keys=False, width=100))
    return params["run"]


def _write_index(staging: Path, root: Path, run: Any, recipe: dict[str, Any], archive: Path, rerun: dict[str, int],
                 status: str, margins: dict[str, Any], left_out: Sequence[Any], notes: list[str]) -> dict[str, Any]:
    """publication.json, and beside it the pinned releases' hashes where the index gave them; its
    ``notes`` are the publication's final notes."""
    index = _index_doc(root, run, recipe, archive, rerun, status, margins, left_out, notes)
    hashes_note = _release_hashes(root, staging / HASHES)
    if hashes_note:
        index["notes"] = [*notes, hashes_note]
    if (staging / HASHES).is_file():
        index["files"]["hashes"] = HASHES
    atomic.write_json(staging / INDEX, index)
    return index


def _published_doc(run: Any, recipe: dict[str, Any], metrics: dict[str, Any], benchmark: str | None,
                   citation: str | None, url: str | None) -> dict[str, Any]:
    """published.yaml: what the run claims, in the form ``repro500 verify --against`` reads."""
    published: dict[str, Any] = {
        "schema": PUBLISHED_SCHEMA,
        "benchmark": benchmark or f"repro500 {recipe.get('name', run.run_id)} (run {run.run_id})",
        "recipe": str(recipe.get("name", "")) or None,
        "source": {"citation": citation or f"repro500 run {run.run_id}, published {_utc()[:10]}"},
        "metrics": metrics,
    }
    if url:
        published["source"]["url"] = url
    epochs = epochs_to_quality(run)
    if epochs:
        published["epochs_to_quality"] = epochs
    published["manifest"] = MANIFEST
    published["notes"] = [f"generated by repro500 {__version__} publish from run {run.run_id}"]
    return {k: v for k, v in published.items() if v is not None}


def _index_doc(root: Path, run: Any, recipe: dict[str, Any], archive: Path, rerun: dict[str, int], status: str,
               margins: dict[str, Any], left_out: Sequence[Any], notes: list[str]) -> dict[str, Any]:
    """publication.json: the run's identity, the archive's digest and which file is which."""
    meta = run.run or {}
    return {
        "schema": SCHEMA, "tool": {"name": "repro500", "version": __version__}, "created_utc": _utc(),
        "run_id": run.run_id, "recipe_name": recipe.get("name"),
        "archive": {"name": archive.name, "sha256": file_digest(archive), "bytes": archive.stat().st_size},
        "sums_digest": file_digest(root / bundle.SUMS_NAME),
        "manifest_digest": canonical_digest({k: v for k, v in run.manifest.items() if k != "digest"}),
        "run": {"repeats": rerun["repeats"], "seed": rerun["seed"],
                "same_seed": bool(meta.get("same_seed")), "deterministic": bool(meta.get("deterministic")),
                "open_division": bool(meta.get("open_division")), "engine": meta.get("engine"),
                "world_size": meta.get("world_size"), "verdict": status, "design": run_design(meta)},
        "margins": margins,
        excluded.INDEX_KEY: [e.to_dict() for e in left_out],
        "files": {"published": PUBLISHED, "manifest": MANIFEST, "recipe": RECIPE, "params": PARAMS,
                  "dvc": DVC_FILE, "readme": README},
        "notes": notes,
    }


# Reading a publication back (and checking it) is repro500.publish.opened's.
__all__ = ["PublishResult", "publish", "runnable_recipe"]
