"""``repro500 reproduce``: rerun a published result and verify it against the publication.

1. **Source** (source.py): a publication directory, a git repository holding one (bare
   clone, no hooks or filters), or a packed run (published on the fly with
   :func:`repro500.publish.publication.publish`, margins from its acceptance tolerances, data
   specs from the run's own ``data-specs.json``, so its data need not be here).
2. **Copy and check**: the publication is copied into ``OUT/publication`` and checked
   (:func:`open_publication`): digest list, archive, and every published number, the recipe,
   the seed and the data digests against the packed run.  Nothing runs before this passes.
3. **Data** into ``OUT``: kept when already there with the recorded md5; else regenerated
   from its generator parameters; else copied from ``--data-root`` when the md5 matches;
   else ``dvc pull``-ed from the git source's DVC remote.
4. **Rerun**: ``repro500 run publication/recipe.yaml --params publication/params.yaml`` in
   ``OUT`` (a child process), with the published seed and repeats (or ``--repeats``).
5. **Verify** the rerun against ``published.yaml`` (its manifest is the packed run's, so the
   provenance diff is against the reference) and compare final parameters bitwise with the
   packed run's repeats of the same seed.  ``OUT/verdict.json`` holds the verdict.

For a built-in workload, the only thing taken from the source and executed is the recipe, by
repro500 itself; YAML is read with ``yaml.safe_load``, nothing is unpickled, archives go through
:func:`repro500.archives.unpack`.  A publication of a user's own experiment (a wrapped command,
or plug-ins imported from the experiment's files) carries that code in its run's ``source/``:
it is copied to ``OUT/source`` (every file checked against the sealed digests) and runs only
with ``--run-code``, the user's explicit consent to execute someone else's code.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from repro500 import untrusted
from repro500.capture.source import INDEX as SOURCE_INDEX
from repro500.errors import (
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
    InvalidInput,
    RunFailed,
    UsageError,
)
from repro500.publish import opened, rebuild
from repro500.publish import publication as pubs
from repro500.publish import source as sources
from repro500.publish.datafiles import DataEntry, md5_matches, regenerate, safe_relpath
from repro500.redact import redact_url
from repro500.rundir import layout as rundir
from repro500.rundir import sums as bundle
from repro500.tracking import store as mlflow_store
from repro500.verify import from_mlflow


@dataclass
class ReproduceResult:
    workdir: Path
    rerun: Path
    verdict: Any  # repro500.verify.verdict.Verdict
    source: str
    data: list[str] = field(default_factory=list)  # one line per data path: where it came from
    warnings: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return int(self.verdict.exit_code)


def _console(console: Any) -> Any:
    if console is None:
        from rich.console import Console

        console = Console()
    return console


def _copy_publication(src: Path, dest: Path) -> None:
    """Copy the publication's own files (those ``repro500 publish`` writes, each listed in its
    SHA256SUMS and a regular file) into ``dest``; a listed file of any other name is refused: a
    publication carries no module, script or data of its own beside the packed run."""
    index = opened.read_index(src)
    names = opened.own_files(src, index)
    if dest.resolve() == src.resolve():
        return  # reproducing into the directory that already holds this copy
    if dest.exists():
        try:
            previous = opened.read_index(dest)
        except InvalidInput:
            previous = None
        if previous is None or (previous.get("archive") or {}).get("sha256") != (index.get("archive") or {}).get("sha256"):
            raise UsageError(f"{dest.parent} already holds the reproduction of another publication: choose another --out")
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name in names:
        if (src / name).is_file():  # a missing one is reported by open_publication
            shutil.copyfile(src / name, dest / name, follow_symlinks=False)


def _data(entry: DataEntry, workdir: Path, src: sources.Source, data_root: Path, tmp: Path) -> tuple[str, str | None]:
    """Put one data path into the reproduction; (what was done, warning or None)."""
    rel = safe_relpath(entry.path, "data path")
    target = workdir / rel
    if md5_matches(target, entry.md5):
        return f"{entry.path}: already in place (md5 {entry.md5[:12]} matches)", None
    if entry.generate:
        for spec in entry.generate:
            regenerate(spec, workdir)
        if md5_matches(target, entry.md5):
            return f"{entry.path}: regenerated from its generator parameters (md5 {entry.md5[:12]} matches)", None
        return (f"{entry.path}: regenerated, but not byte-identical to the published data",
                f"{entry.path} regenerated with a different md5 than the published {entry.md5}: the generator "
                "differs here (the provenance diff shows it); the result may still reproduce")
    local = data_root / rel
    if local.resolve() != target.resolve() and md5_matches(local, entry.md5):
        sources.copy_data(local, target)
        return f"{entry.path}: copied from {local} (md5 {entry.md5[:12]} matches)", None
    if src.git is not None:
        project = sources.dvc_pull(src.git, [rel.as_posix()], tmp)
        if not md5_matches(project / rel, entry.md5):
            raise InvalidInput(f"{entry.path} pulled with DVC does not have the published md5 {entry.md5}")
        sources.copy_data(project / rel, target)
        return f"{entry.path}: pulled with DVC from {src.git.url} (md5 {entry.md5[:12]} matches)", None
    why = f" ({entry.note})" if entry.note else ""
    raise InvalidInput(f"data {entry.path} (md5 {entry.md5}) cannot be recreated{why}: put a copy at {local} "
                       "(or pass --data-root), or reproduce from a git repository whose DVC remote holds it")


def _recorded_inputs(pub: opened.Publication, workdir: Path) -> list[tuple[dict[str, Any], PurePosixPath | None]]:
    """The inputs the publisher's command read (declared in the manifest's data facet, observed
    in inputs.json), each where this reproduction will read it, with its path inside the
    experiment's directory (then it is read from ``OUT/source``; anywhere else, the same path)."""
    manifest = rundir.read_optional_json(pub.reference / rundir.MANIFEST)
    observed = rundir.read_optional_json(pub.reference / rundir.INPUTS)
    root = rundir.read_optional_json(pub.reference / SOURCE_INDEX).get("root")
    entries = [*(((manifest.get("facets") or {}).get("data") or {}).get("inputs") or []),
               *(observed.get("observed") or [])]
    placed = []
    for entry in entries:
        path, rel = Path(str(entry.get("path"))), None
        if root and path.is_absolute() and path.is_relative_to(root):
            rel = safe_relpath(path.relative_to(root).as_posix(), "input path")
            path = workdir / "source" / rel
        placed.append(({**entry, "path": str(path)}, rel))
    return placed


def _check_inputs(pub: opened.Publication, workdir: Path, data_root: Path, allow: bool, console: Any) -> list[str]:
    """The reproducer's copies of the command's inputs against the published digests, before
    anything runs; one line each that differs or is missing.  An input the publisher kept inside
    the experiment's directory (gitignored data, say) but that the publication does not carry is
    copied into ``OUT/source`` from ``--data-root`` when a copy there has the published md5."""
    from repro500.capture.data import compare

    recorded = _recorded_inputs(pub, workdir)
    for entry, rel in recorded:
        target, local = Path(entry["path"]), data_root / rel if rel is not None else None
        if local is not None and local.resolve() != target.resolve() and not md5_matches(target, entry.get("md5", "")) \
                and md5_matches(local, entry.get("md5", "")):
            sources.copy_data(local, target)
            console.print(f"  {untrusted.shown(rel)}: copied from {untrusted.shown(local)} into the experiment's directory (md5 matches)", highlight=False)
    problems = compare([entry for entry, _ in recorded])
    if problems and not allow:
        raise InvalidInput("the data this experiment read is not the same here:\n  " + "\n  ".join(problems)
                           + "\nput the published data in place (an input of the experiment's own directory goes "
                             "under OUT/source, or give --data-root holding a copy), or rerun anyway with "
                             "--allow-data-differences (the verdict then names each difference)")
    for line in problems:
        console.print(f"[yellow]warning:[/] {untrusted.shown(line)}", highlight=False, soft_wrap=True)
    if recorded and not problems:
        console.print(f"  {len(recorded)} input(s) the command read match the published digests", highlight=False)
    return problems


def _mlflow_metrics(pub: opened.Publication) -> list[str]:
    """The metrics the publication's command reads from its own MLflow runs (``NAME: mlflow``)."""
    from repro500.workloads.command.metric_sources import MetricDecl

    recipe = rundir.read_optional_yaml(pub.reference / rundir.RECIPE)
    if (recipe.get("fixed") or {}).get("workload") != "command" or not isinstance(recipe.get("metrics"), dict):
        return []
    names = []
    for name, raw in recipe["metrics"].items():
        try:
            if MetricDecl.parse(str(name), raw, where="metrics").source == "mlflow":
                names.append(str(name))
        except InvalidInput:
            continue  # the rerun names what is wrong with the declaration
    return names


def _tracking(pub: opened.Publication, asked: bool | None, workdir: Path, env: dict[str, str], console: Any) -> bool:
    """Whether the rerun logs to MLflow: as asked, and always when a metric is read from MLflow
    (the rerun cannot measure it otherwise).  A tracked rerun's store is ``OUT/mlflow.db`` unless
    MLFLOW_TRACKING_URI names one (the command runs in ``OUT/source``: not there)."""
    needs = _mlflow_metrics(pub)
    if needs and asked is False:
        raise UsageError(f"the publication reads {', '.join(needs)} from MLflow: its rerun must be tracked "
                         "(leave out --no-tracking)")
    tracking = bool(asked) or bool(needs)
    if tracking and not env.get("MLFLOW_TRACKING_URI"):
        env["MLFLOW_TRACKING_URI"] = f"sqlite:///{(workdir / 'mlflow.db').resolve()}"
    if tracking:
        why = f" ({', '.join(needs)} read from MLflow)" if needs and not asked else ""
        console.print(f"the rerun is logged to MLflow{why}: {redact_url(env['MLFLOW_TRACKING_URI'])} "
                      f"(repro500 ui --backend-store-uri {redact_url(env['MLFLOW_TRACKING_URI'])})",
                      highlight=False, soft_wrap=True)
    return tracking


def _rerun_id(workdir: Path) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    rid, n = f"rerun-{stamp}", 1
    while (workdir / "runs" / rid).exists():
        n += 1
        rid = f"rerun-{stamp}-{n}"
    return rid


def _place_source(pub: opened.Publication, workdir: Path) -> Path | None:
    """Copy the reference run's ``source/`` (already checked against its SHA256SUMS when the
    publication was opened) to ``OUT/source``: the directory the experiment runs from."""
    src = pub.reference / "source"
    if not src.is_dir():
        return None
    target = workdir / "source"
    # Over what is there: data the reproducer put beside the code (inputs the publication does not
    # carry) stays; every published file is written anew.
    shutil.copytree(src, target, symlinks=False, dirs_exist_ok=True)
    # A packed run stores every file 0644: scripts the command runs directly get their bit back.
    for entry in rundir.read_optional_json(pub.reference / SOURCE_INDEX).get("files") or []:
        if entry.get("executable") and entry.get("copied"):
            path = target / safe_relpath(entry.get("path"), "source.json path")
            if path.is_file() and not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o111)
    return target


def _rerooted_pythonpath(pub: opened.Publication, placed: Path, env: dict[str, str]) -> dict[str, str]:
    """``PYTHONPATH`` for a command's rerun: the entries the original had inside its experiment
    directory (``src``), now inside ``OUT/source``, before the reproducer's own entries."""
    manifest = rundir.read_optional_json(pub.reference / rundir.MANIFEST)
    recorded = ((manifest.get("facets") or {}).get("experiment") or {}).get("pythonpath") or {}
    inside = [str((placed / rel).resolve()) for rel in recorded.get("inside") or []
              if (placed / safe_relpath(rel, "experiment.pythonpath")).resolve().is_relative_to(placed.resolve())]
    entries = [*inside, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    return {"PYTHONPATH": os.pathsep.join(entries)} if entries else {}


def _rerun(pub: opened.Publication, workdir: Path, repeats: int | None, tracking: bool, env: dict[str, str],
           code: tuple[str, list[str]] | None = None, placed: Path | None = None,
           sequential: list[str] | None = None, python: str | None = None) -> Path:
    rid = _rerun_id(workdir)
    root = pub.root.resolve()
    args = ["-m", "repro500.cli", "run", str(root / pubs.RECIPE),
            "--params", str(root / pubs.PARAMS), "--out", str((workdir / "runs").resolve()), "--run-id", rid,
            *pub.rerun_flags, "--tracking" if tracking else "--no-tracking"]
    if repeats is not None:
        args += ["--repeats", str(repeats)]
    args += sequential or []
    if placed is not None and code and code[0] == "command":
        # The command runs from its source directory with the environment a run gives it, as on
        # the publisher's machine: -P and -E keep that directory and PYTHONPATH off repro500's own
        # sys.path without setting a variable the command would inherit (PYTHONSAFEPATH would
        # stop `import helpers` beside the script).
        env = {k: v for k, v in env.items() if k != "PYTHONSAFEPATH"}
        env.update(_rerooted_pythonpath(pub, placed, env))
        cmd, cwd = [python or sys.executable, "-E", "-P", *args], placed
    else:
        # PYTHONSAFEPATH keeps the working directory (publication files, pulled data) off sys.path
        # of the rerun and of every process it starts (torchrun's workers), so no file there is
        # imported unless the user allowed the publication's plug-ins (--run-code): they import
        # from the source directory.
        env = {**env, "PYTHONSAFEPATH": "1"}
        if code is None:  # nothing of the publisher's may run: no module:callable, no search path
            env[untrusted.CODE_ENV] = "refuse"
        else:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(placed.resolve()), env.get("PYTHONPATH")) if p)
        cmd, cwd = [python or sys.executable, *args], workdir
    rc = subprocess.run(cmd, cwd=cwd, env=env, check=False).returncode
    rerun = workdir / "runs" / rid
    if rc == 130 or rc < 0:
        raise KeyboardInterrupt
    if rc not in (EXIT_OK, EXIT_FAIL, EXIT_INCONCLUSIVE) or not (rerun / bundle.SUMS_NAME).is_file():
        wrote = f"; what it wrote is in {rerun}" if rerun.exists() else "; it wrote no run directory"
        message = f"the rerun stopped with exit {rc} before it finished (its message is above){wrote}"
        # the rerun's own reason decides the code: invalid input stays 4, a usage error 2
        raise {EXIT_INVALID: InvalidInput, EXIT_USAGE: UsageError}.get(rc, RunFailed)(message)
    return rerun


def reproduce(
    source: str,
    *,
    out: str | Path | None = None,
    repeats: int | None = None,
    rev: str | None = None,
    subpath: str | None = None,
    alpha: float = 0.05,
    margins: dict[str, float] | None = None,
    data_root: str | Path = ".",
    tracking: bool | None = None,
    console: Any = None,
    run_code: bool = False,
    allow_data_differences: bool = False,
    until_decided: bool = False,
    max_repeats: int | None = None,
    env_mode: str = "current",
    find_links: list[str] | None = None,
) -> ReproduceResult:
    """Rerun the publication SOURCE and verify the rerun against it (see the module docstring)."""
    # the rerun gets the caller's environment as it was: libraries imported here while making the data
    # (threadpoolctl sets KMP_DUPLICATE_LIB_OK) must not show up as a provenance difference
    env = dict(os.environ)
    console = _console(console)
    _check_design(repeats, until_decided, max_repeats)
    links = rebuild.check_mode(env_mode, list(find_links or []))
    with tempfile.TemporaryDirectory(prefix="repro500-reproduce-") as tmp_name:
        tmp = Path(tmp_name)
        src, pub, workdir = _open(source, tmp, out, rev, subpath, margins, data_root, console)
        code = _consent(pub, run_code, console)
        tracking = _tracking(pub, tracking, workdir, env, console)
        placed = _place_source(pub, workdir) if code else None
        lines, warnings = _put_data(pub, workdir, src, Path(data_root), tmp, allow_data_differences, console)
        sequential = _sequential_flags(workdir, max_repeats, margins) if until_decided else None
        env, python, used = _environment(env_mode, pub, placed, code, workdir, links, env, console)
        rerun = _rerun(pub, workdir, repeats, tracking, env, code, placed, sequential, python)
        verdict = _verdict(pub, rerun, workdir, alpha, margins, used, console)
    return ReproduceResult(workdir=workdir, rerun=rerun, verdict=verdict, source=src.label, data=lines,
                           warnings=warnings)


def _check_design(repeats: int | None, until_decided: bool, max_repeats: int | None) -> None:
    if repeats is not None and repeats < 1:
        raise UsageError(f"--repeats {repeats}: give at least 1")
    if until_decided and repeats is not None:
        raise UsageError("--until-decided runs up to --max-repeats repeats; --repeats is for a fixed design")
    if max_repeats is not None and not until_decided:
        raise UsageError("--max-repeats goes with --until-decided (a fixed design takes --repeats)")


def _open(source: str, tmp: Path, out: str | Path | None, rev: str | None, subpath: str | None,
          margins: dict[str, float] | None, data_root: str | Path,
          console: Any) -> tuple[sources.Source, opened.Publication, Path]:
    """(where it came from, the checked publication, the reproduction's directory): found, copied
    into ``OUT/publication`` and checked before anything runs."""
    if from_mlflow.is_reference(source):  # a teammate's run by its MLflow id: the sealed run its parent holds
        console.print(f"fetching the sealed run of {untrusted.shown(source)} from {redact_url(mlflow_store.tracking_uri())}",
                      highlight=False, soft_wrap=True)
        source = str(from_mlflow.download(source, tmp / "mlflow"))
    src = sources.resolve(source, tmp, rev=rev, subpath=subpath)
    console.print(f"Reproducing {untrusted.shown(redact_url(src.label))}", highlight=False, soft_wrap=True)
    pub_dir = src.path
    if src.kind == "bundle":
        pub_dir = pubs.publish(src.path, tmp / "publication", margins=margins, data_root=data_root).path
    index = opened.read_index(pub_dir)
    workdir = Path(out) if out is not None else Path("reproductions") / untrusted.path_name(index.get("run_id"), "run id")
    workdir.mkdir(parents=True, exist_ok=True)
    _copy_publication(pub_dir, workdir / "publication")
    pub = opened.open_publication(workdir / "publication", tmp / "reference")
    console.print(f"publication checked: run {untrusted.shown(pub.run_id)}, {untrusted.shown(pub.repeats)} repeats, "
                  f"seed {untrusted.shown(pub.seed)}; archive sha256 {untrusted.shown(str(pub.index['archive']['sha256'])[:16])}",
                  highlight=False, soft_wrap=True)
    if pub.not_carried:  # publish --exclude: sealed digests, files left out of the archive
        console.print(f"  {untrusted.shown(pub.integrity.notes[0])}", highlight=False, soft_wrap=True)
    return src, pub, workdir


def _consent(pub: opened.Publication, run_code: bool, console: Any) -> tuple[str, list[str]] | None:
    """The publisher's own code the rerun would run, refused without ``--run-code``."""
    code = pubs.own_code(pub.reference)
    if code and not run_code:
        shown = ", ".join(code[1][:5]) + (f" and {len(code[1]) - 5} more" if len(code[1]) > 5 else "")
        raise UsageError(f"this publication runs its own code ({code[0]}{': ' + shown if shown else ''}); "
                         f"review it (in the packed run's source/) and pass --run-code to run it")
    if code:
        console.print(f"the publication's own code runs ({untrusted.shown(code[0])}, {len(code[1])} files, digests checked)",
                      highlight=False, soft_wrap=True)
    return code


def _put_data(pub: opened.Publication, workdir: Path, src: sources.Source, data_root: Path, tmp: Path,
              allow_data_differences: bool, console: Any) -> tuple[list[str], list[str]]:
    """The command's inputs checked and every data path put in place: (one line each, warnings)."""
    lines, warnings = [], []
    warnings += _check_inputs(pub, workdir, data_root, allow_data_differences, console)
    for entry in pub.data:
        line, warning = _data(entry, workdir, src, data_root, tmp)
        lines.append(line)
        console.print(f"  {untrusted.shown(line)}", highlight=False, soft_wrap=True)
        if warning:
            warnings.append(warning)
            console.print(f"[yellow]warning:[/] {untrusted.shown(warning)}", highlight=False, soft_wrap=True)
    return lines, warnings


def _sequential_flags(workdir: Path, max_repeats: int | None, margins: dict[str, float] | None) -> list[str]:
    """The rerun's flags to stop once the equivalence test against the publication decides."""
    return ["--until-decided", "--against", str((workdir / "publication" / pubs.PUBLISHED).resolve()),
            *(["--max-repeats", str(max_repeats)] if max_repeats else []),
            *[f"--margin={name}={delta}" for name, delta in (margins or {}).items()]]


def _environment(env_mode: str, pub: opened.Publication, placed: Path | None, code: tuple[str, list[str]] | None,
                 workdir: Path, links: list[str], env: dict[str, str],
                 console: Any) -> tuple[dict[str, str], str | None, dict[str, Any]]:
    """(the rerun's environment variables, the Python repro500 reruns with or None for this one,
    what the verdict records of it): the current environment, or the publication's lock rebuilt."""
    if env_mode != "venv":
        return env, None, {"mode": "current", "python": sys.executable}
    pins = rebuild.read(pub.reference, placed, pub.root / pubs.HASHES)
    is_command = bool(code and code[0] == "command")
    # A command's experiment runs in the venv (its python first on PATH), driven by this repro500,
    # so the venv holds exactly the lock; a built-in recipe runs inside repro500: it goes in too.
    # absolute, not resolved (that would follow the venv's python link out of it): the rerun runs
    # in another directory, and OUT (default reproductions/RUN_ID) may be relative
    env_python = rebuild.build(pins, workdir, with_tool=not is_command, find_links=links, console=console).absolute()
    used = {"mode": "venv", "python": str(env_python), "installer": rebuild.installer(),
            "lock_sha256": pins.digest, "not_rebuilt": pins.unpinnable}
    return rebuild.activated(env_python, env), None if is_command else str(env_python), used


def _verdict(pub: opened.Publication, rerun: Path, workdir: Path, alpha: float, margins: dict[str, float] | None,
             used: dict[str, Any], console: Any) -> Any:
    """The rerun verified against the publication, with the bitwise comparison and provenance diff
    against the packed run itself; written to ``OUT/verdict.json`` and shown."""
    from repro500.rundir import atomic
    from repro500.verify.determinism import compare_with_reference
    from repro500.verify.provenance import provenance_diff
    from repro500.verify.render import render
    from repro500.verify.rundir import load_run
    from repro500.verify.verdict import verify_run, write_verdict

    with contextlib.chdir(workdir):  # the rerun's manifest records data paths relative to workdir
        verdict = verify_run(rerun.relative_to(workdir), against=Path("publication") / pubs.PUBLISHED,
                             alpha=alpha, margins=margins)
    verdict.run_dir = str(rerun)
    verdict.reference_integrity = pub.integrity  # the packed run, with what publish left out named
    if verdict.status != "INVALID" and verdict.determinism is not None:
        mine, theirs = load_run(rerun), load_run(pub.reference)
        verdict.determinism.cross_run = compare_with_reference(mine, theirs)
        # against the packed run itself: what each side's command read is part of the diff
        verdict.provenance = provenance_diff(mine.provenance_manifest, theirs.provenance_manifest)
    write_verdict(verdict, workdir)
    # which environment the rerun ran in, beside the verdict (its provenance diff says what differed)
    atomic.write_json(workdir / rundir.VERDICT, {**verdict.to_dict(), "environment": used})
    console.rule("Verdict against the publication")
    render(verdict, console)
    console.print(f"environment: {untrusted.shown(used['mode'])} ({untrusted.shown(used['python'])})\n"
                  f"rerun: {untrusted.shown(rerun)}\nverdict: {untrusted.shown(workdir / 'verdict.json')}",
                  highlight=False, soft_wrap=True)
    return verdict
