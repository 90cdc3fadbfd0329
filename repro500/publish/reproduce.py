"""``repro500 reproduce``: rerun a published result and verify it against the publication.

1. **Source** (source.py): a publication directory, a git repository holding one (bare
   clone, no hooks or filters), or a packed run (published on the fly with
   :func:`repro500.publish.publication.publish`, margins from its acceptance tolerances, data
   specs from the run's own ``data-specs.json``, so its data need not be here).
2. **Copy and check**: the publication is copied into ``OUT/publication`` and checked
   (:func:`open_publication`): digest list, archive, and every published number, the recipe,
   the seed and the data digests against the packed run.  Nothing runs before this passes.
3. **Data** into ``OUT``: each input the publisher's command read is placed where the rerun's
   command (working directory ``OUT/source``) will open it (:mod:`repro500.capture.placing`: found
   under ``--data-root`` by its path relative to the experiment or by digest, or at its recorded
   path), one plan line each, and a missing one is refused before anything runs.  Each data path
   is kept when already there with the recorded md5; else regenerated from its generator
   parameters; else copied from ``--data-root`` when the md5 matches; else ``dvc pull``-ed from
   the git source's DVC remote.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from repro500 import recorded_paths, sandbox, untrusted
from repro500.capture import placing
from repro500.capture.source import INDEX as SOURCE_INDEX
from repro500.errors import (
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
    REPRODUCTION_ENV,
    InvalidInput,
    RunFailed,
    UsageError,
)
from repro500.publish import confine, opened, rebuild
from repro500.publish import publication as pubs
from repro500.publish import source as sources
from repro500.publish.datafiles import DataEntry, md5_matches, regenerate
from repro500.redact import redact_url
from repro500.rundir import atomic
from repro500.rundir import layout as rundir
from repro500.rundir import sums as bundle
from repro500.statuses import DEFAULT_ALPHA, INVALID, RUN_COMPLETED
from repro500.tracking import store as mlflow_store
from repro500.untrusted import record_console
from repro500.verify import from_mlflow
from repro500.verify.determinism import compare_with_reference
from repro500.verify.provenance import provenance_diff
from repro500.verify.published import load_published
from repro500.verify.rundir import load_run
from repro500.workloads.command.metric_sources import MetricDecl


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

        console = record_console()
    return console


def _make_room(src: Path, dest: Path) -> None:
    """Take away the snapshot an earlier reproduction of the same publication left in ``dest``
    (:func:`opened.snapshot` makes a fresh one); the reproduction of another publication there is
    a usage error."""
    if not (dest.exists() or dest.is_symlink()) or dest.resolve() == src.resolve():
        return
    index = opened.read_index(src)
    try:
        previous = opened.read_index(dest)
    except InvalidInput:
        previous = None
    if previous is None or (previous.get("archive") or {}).get("sha256") != (index.get("archive") or {}).get("sha256"):
        raise UsageError(f"{dest.parent} already holds the reproduction of another publication: choose another --out")
    opened.remove_snapshot(dest)


@dataclass(frozen=True)
class _Places:
    """Where the paths a publication names may land (repro500.recorded_paths): the reproduction's
    directory and the reproducer's data root, never the snapshot, and never the publication's own
    files where the data root holds them (the default ``.`` standing in the publication)."""

    workdir: Path
    data_root: Path
    never: tuple[Path, ...]
    experiment: Path  # where the experiment's source is placed, the command's working directory

    @classmethod
    def of(cls, pub: opened.Publication, src: sources.Source, workdir: Path, data_root: Path) -> _Places:
        own = [src.path / name for name in (*bundle.read_sums(pub.root), bundle.SUMS_NAME)] \
            if src.path.is_dir() else [src.path]
        return cls(workdir, data_root, (pub.root, *own), experiment_dir(pub, workdir))

    def out(self, text: Any, field: str, file: Any) -> Path:
        return recorded_paths.resolve(text, field=field, file=file, root=self.workdir, never=self.never)

    def local(self, text: Any, field: str, file: Any) -> Path:
        # a path under the data root by its text; the reproducer's own links there are followed
        # (a data directory on another disk), never onto the publication's files or a kernel file
        recorded_paths.relative(text, field=field, file=file)
        return recorded_paths.resolve(text, field=field, file=file, root=self.data_root, anywhere=True,
                                      never=self.never)


def _data(entry: DataEntry, places: _Places, src: sources.Source, tmp: Path, where: Path) -> tuple[str, str | None]:
    """Put one data path into the reproduction; (what was done, warning or None)."""
    target = places.out(entry.path, "data path", where)
    if md5_matches(target, entry.md5, entry.size_bytes):
        return f"{entry.path}: already in place (md5 {entry.md5[:12]} matches)", None
    if entry.generate:
        for spec in entry.generate:
            regenerate(spec, places.workdir, never=places.never)
        if md5_matches(target, entry.md5, entry.size_bytes):
            return f"{entry.path}: regenerated from its generator parameters (md5 {entry.md5[:12]} matches)", None
        return (f"{entry.path}: regenerated, but not byte-identical to the published data",
                f"{entry.path} regenerated with a different md5 than the published {entry.md5}: the generator "
                "differs here (the provenance diff shows it); the result may still reproduce")
    local = places.local(entry.path, "data path", where)
    if local.resolve() != target.resolve() and md5_matches(local, entry.md5, entry.size_bytes):
        sources.copy_data(local, target)
        return f"{entry.path}: copied from {local} (md5 {entry.md5[:12]} matches)", None
    if src.git is not None:
        rel = recorded_paths.relative(entry.path, field="data path", file=where)
        project = sources.dvc_pull(src.git, [rel.as_posix()], tmp)
        # the pulled copy lies in the extracted commit, whose files are the publisher's: only a
        # regular file or directory under it, never a link out of it, is taken
        pulled = recorded_paths.resolve(entry.path, field="data path", file=where, root=project)
        if not md5_matches(pulled, entry.md5, entry.size_bytes):
            raise InvalidInput(f"{entry.path} pulled with DVC does not have the published md5 {entry.md5}")
        sources.copy_data(pulled, target)
        return f"{entry.path}: pulled with DVC from {src.git.url} (md5 {entry.md5[:12]} matches)", None
    why = f" ({entry.note})" if entry.note else ""
    raise InvalidInput(f"data {entry.path} (md5 {entry.md5}) cannot be recreated{why}: put a copy at {local} "
                       "(or pass --data-root), or reproduce from a git repository whose DVC remote holds it")


def _recorded_inputs(pub: opened.Publication) -> list[dict[str, Any]]:
    """The inputs the publisher's command read: observed (inputs.json, each as the command addressed
    it) and declared in the manifest's data facet.  A declared input the command was also seen to
    open is that observed entry (which says how it was opened); one it was not is addressed as the
    recipe declares it (:func:`_as_opened`)."""
    manifest = rundir.read_optional_json(pub.reference / rundir.MANIFEST)
    observed = [e for e in rundir.read_inputs(pub.reference / rundir.INPUTS).get("observed") or []
                if isinstance(e, dict)]
    declared = [e for e in ((manifest.get("facets") or {}).get("data") or {}).get("inputs") or []
                if isinstance(e, dict)]
    seen = {e.get("path") for e in observed}
    root = rundir.read_optional_json(pub.reference / SOURCE_INDEX).get("root")
    fixed = rundir.read_optional_yaml(pub.reference / rundir.RECIPE).get("fixed") or {}
    return [_as_opened(e, root, fixed)
            for e in (*observed, *(e for e in declared if e.get("opened") or e.get("path") not in seen))]


def _as_opened(entry: dict[str, Any], root: Any, fixed: Any) -> dict[str, Any]:
    """*entry* with how the command addresses it, where the record does not say (a declared input,
    or a run recorded before inputs kept that): a relative ``fixed.inputs`` path naming it is
    opened as written from the command's working directory *root*, the directory its source was
    kept from (``../data/x``: ``OUT/data/x`` for a rerun in ``OUT/source``); else one inside *root*
    is at the same place in the rerun's copy of it (gitignored data beside the code); else it is
    read at its recorded path."""
    path = entry.get("path")
    if entry.get("opened") or not isinstance(root, str) or not isinstance(path, str) or not os.path.isabs(path) \
            or not os.path.isabs(root):
        return entry
    path, root = os.path.normpath(path), os.path.normpath(root)
    texts = fixed.get("inputs") if isinstance(fixed, dict) and isinstance(fixed.get("inputs"), list) else []
    for text in texts:  # placeholders ({mutable.KEY}) were filled by the run: only literal paths match
        if isinstance(text, str) and text and "{" not in text and not os.path.isabs(os.path.expanduser(text)) \
                and os.path.normpath(os.path.join(root, text)) == path:
            return {**entry, "opened": os.path.normpath(text), "experiment": os.path.relpath(path, root)}
    if not Path(path).is_relative_to(root):
        return entry
    return {**entry, "opened": os.path.relpath(path, root), "experiment": os.path.relpath(path, root)}


def _place_inputs(pub: opened.Publication, places: _Places, allow: bool,
                  console: Any) -> tuple[list[placing.Placed], list[str]]:
    """Each input the publisher's command read, put where the rerun's command (in ``OUT/source``)
    will read it, before anything runs: one plan line each.  One not there (or other bytes there)
    is refused, naming the path the command will open, unless ``--allow-data-differences``: then
    it is a warning and the verdict names the difference.  (the inputs as placed, the warnings)"""
    placed = placing.place_inputs(_recorded_inputs(pub), cwd=places.experiment, tree=places.workdir,
                                  data_root=places.data_root, protected=places.never)
    for item in placed:
        console.print(f"  {untrusted.shown(item.line(), untrusted.SENTENCE_CHARS)}", highlight=False, soft_wrap=True)
    error = placing.missing_error(placed)
    if error is not None and not allow:
        raise error
    warnings = [item.line() for item in placed if not item.ok]
    for line in warnings:
        console.print(f"[yellow]warning:[/] {untrusted.shown(line, untrusted.SENTENCE_CHARS)} (rerun anyway: "
                      "--allow-data-differences)", highlight=False, soft_wrap=True)
    if placed and not warnings:  # said only of the bytes at the places the command opens
        console.print(f"  {len(placed)} input(s) the command will read match the published digests", highlight=False)
    return placed, warnings


def _mlflow_metrics(pub: opened.Publication) -> list[str]:
    """The metrics the publication's command reads from its own MLflow runs (``NAME: mlflow``)."""
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


def experiment_dir(pub: opened.Publication, workdir: Path) -> Path:
    """Where the experiment's source goes: ``OUT/source``, the rerun's working directory, or below it
    at the recipe's ``fixed.workdir`` (a command run in ``sub`` keeps ``sub``'s files as its source, and
    its rerun runs ``OUT/source/sub``).  A working directory outside the experiment's own (absolute,
    or through ``..``) cannot be one inside ``OUT``: InvalidInput, before anything is placed."""
    fixed = rundir.read_optional_yaml(pub.root / pubs.RECIPE).get("fixed")
    text = fixed.get("workdir", ".") if isinstance(fixed, dict) and fixed.get("workload") == "command" else "."
    if not isinstance(text, str) or os.path.normpath(text) == ".":
        return workdir / "source"
    if os.path.isabs(text) or ".." in Path(os.path.normpath(text)).parts:
        raise InvalidInput(f"the publication's recipe runs its command in fixed.workdir {untrusted.plain(text)}, outside "
                           "the directory its source was kept from, which a reproduction cannot recreate inside OUT: "
                           "a publication reproduces when fixed.workdir is '.' or a directory below the experiment's")
    return recorded_paths.resolve(os.path.normpath(text), field="fixed.workdir", file=pubs.RECIPE,
                                  root=workdir / "source")


def _place_source(pub: opened.Publication, workdir: Path) -> Path | None:
    """Copy the reference run's ``source/`` (already checked against its SHA256SUMS when the
    publication was opened) to :func:`experiment_dir`: the directory the experiment runs from."""
    src = pub.reference / "source"
    if not src.is_dir():
        return None
    target = experiment_dir(pub, workdir)
    # Over what is there: data the reproducer put beside the code (inputs the publication does not
    # carry) stays; every published file is written anew.
    # by content, not mode: the snapshot's files are read-only, the experiment's copy is its own
    shutil.copytree(src, target, symlinks=False, dirs_exist_ok=True, copy_function=shutil.copyfile)
    for dirpath, _, _ in os.walk(target):
        os.chmod(dirpath, 0o755)
    # A packed run stores every file 0644: scripts the command runs directly get their bit back.
    for entry in rundir.read_optional_json(pub.reference / SOURCE_INDEX).get("files") or []:
        if entry.get("executable") and entry.get("copied"):
            path = recorded_paths.resolve(entry.get("path"), field="files[].path", file="the packed run's source.json",
                                          root=target)
            if path.is_file() and not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o111)
    return target


def _rerooted_pythonpath(pub: opened.Publication, placed: Path, env: dict[str, str]) -> dict[str, str]:
    """``PYTHONPATH`` for a command's rerun: the entries the original had inside its experiment
    directory (``src``), now inside ``OUT/source``, before the reproducer's own entries."""
    manifest = rundir.read_optional_json(pub.reference / rundir.MANIFEST)
    recorded = ((manifest.get("facets") or {}).get("experiment") or {}).get("pythonpath") or {}
    # "." is the experiment's directory itself, which is on the path as a whole
    inside = [str((placed if rel == "." else recorded_paths.resolve(
        rel, field="experiment.pythonpath.inside", file="the packed run's manifest", root=placed)).resolve())
        for rel in recorded.get("inside") or []]
    entries = [*inside, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    return {"PYTHONPATH": os.pathsep.join(entries)} if entries else {}


def _rerun(pub: opened.Publication, workdir: Path, repeats: int | None, tracking: bool, env: dict[str, str],
           code: tuple[str, list[str]] | None = None, placed: Path | None = None,
           sequential: list[str] | None = None, python: str | None = None, *, pending: Path | None = None,
           again: str | None = None, console: Any = None, launch: list[str] | None = None,
           confined: tuple[sandbox.Grants | None, dict[str, Any]] = (None, {"sandboxed": False})) -> Path:
    """The rerun's directory once it finished: a new rerun, or ``pending`` (one this reproduction
    left unfinished) continued with ``run --resume``, its finished repeats kept, or taken as it is
    when it finished them all."""
    console = _console(console)
    if pending is not None and _finished(pending):
        console.print(f"the rerun {pending} finished before the reproduction was stopped: verifying it",
                      highlight=False, soft_wrap=True)
        return pending
    rid = pending.name if pending is not None else _rerun_id(workdir)
    args = _rerun_args(pub, workdir, rid, repeats, tracking, sequential, pending, launch, console)
    if again:
        env = {**env, REPRODUCTION_ENV: again}
    if placed is not None and code and code[0] == "command":
        # The command runs from its source directory with the environment a run gives it, as on
        # the publisher's machine: -P and -E keep that directory and PYTHONPATH off repro500's own
        # sys.path without setting a variable the command would inherit (PYTHONSAFEPATH would
        # stop `import helpers` beside the script).
        env = {k: v for k, v in env.items() if k != "PYTHONSAFEPATH"}
        env.update(_rerooted_pythonpath(pub, placed, env))
        # the recipe's fixed.workdir, relative to OUT/source, is where the source was placed
        cmd, cwd = [python or sys.executable, "-E", "-P", *args], workdir / "source"
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
    # the publisher's code runs in the sandbox its grants make (confine.py), or as it is, recorded either way
    cmd, env = confine.command(cmd, cwd, env, *confined)
    rc = sandbox.wait_passing_signals(subprocess.Popen(cmd, cwd=cwd, env=env, process_group=0),
                               sandboxed=confined[0] is not None)
    rerun = workdir / "runs" / rid
    if rc == 130 or rc < 0:
        raise KeyboardInterrupt
    if rc not in (EXIT_OK, EXIT_FAIL, EXIT_INCONCLUSIVE) or not (rerun / bundle.SUMS_NAME).is_file():
        wrote = f"; what it wrote is in {rerun}" if rerun.exists() else "; it wrote no run directory"
        message = f"the rerun stopped with exit {rc} before it finished (its message is above){wrote}"
        # the rerun's own reason decides the code: invalid input stays 4, a usage error 2
        raise {EXIT_INVALID: InvalidInput, EXIT_USAGE: UsageError}.get(rc, RunFailed)(message)
    return rerun


def _rerun_args(pub: opened.Publication, workdir: Path, rid: str, repeats: int | None, tracking: bool,
                sequential: list[str] | None, pending: Path | None, launch: list[str] | None, console: Any) -> list[str]:
    """The `repro500 run` arguments of the rerun: a new one, or ``pending`` continued (its recorded
    seeds, design and MLflow parent: `run --resume` takes nothing else)."""
    if pending is not None:
        console.print(f"continuing the rerun {pending}: {_progress(pending)}; finished repeats are kept",
                      highlight=False, soft_wrap=True)
        return ["-m", "repro500.cli", "run", "--resume", str(pending.resolve()), *(launch or [])]
    root = pub.root.resolve()
    args = ["-m", "repro500.cli", "run", str(root / pubs.RECIPE),
            "--params", str(root / pubs.PARAMS), "--out", str((workdir / "runs").resolve()), "--run-id", rid,
            *pub.rerun_flags, "--tracking" if tracking else "--no-tracking"]
    if repeats is not None:
        args += ["--repeats", str(repeats)]
    args += [*(sequential or []), *(launch or [])]  # launch: --launcher/--parallel, the repeats side by side
    if pub.nnodes > 1:  # _check_options has refused a rerun that is not SLURM's: its tasks span as many nodes
        args += ["--nnodes", str(pub.nnodes)]
    # the child imports the workload and captures the environment before its first line
    console.print(f"starting the rerun {workdir / 'runs' / rid} (loading the workload and capturing "
                  "the environment)", highlight=False, soft_wrap=True)
    return args


def _finished(run: Path) -> bool:
    """Whether a rerun finished every repeat and sealed itself (only its verification is left)."""
    meta = rundir.read_optional_json(run / rundir.RUN_JSON)
    return meta.get("status") == RUN_COMPLETED and (run / bundle.SUMS_NAME).is_file()


def _progress(run: Path) -> str:
    meta = rundir.read_optional_json(run / rundir.RUN_JSON)
    planned = meta.get("repeats") if isinstance(meta.get("repeats"), int) else 0
    done = rundir.RunDir(run).summaries(planned, finished_only=True)
    return f"{len(done)} of {planned} repeats finished"


def _pending(workdir: Path) -> Path | None:
    """The rerun this reproduction started last, when its verdict against the publication was never
    written (interrupted, failed, or stopped after its repeats): the next ``reproduce`` into the
    same directory continues it rather than start another."""
    runs = workdir / "runs"
    found = []
    for path in runs.iterdir() if runs.is_dir() else []:
        if path.name.startswith("rerun-") and path.is_dir() and (path / rundir.RUN_JSON).is_file():
            created = rundir.read_optional_json(path / rundir.RUN_JSON).get("created_utc")
            found.append((str(created or ""), path.name, path))
    if not found:
        return None
    latest = max(found)[2]
    verified = rundir.read_optional_json(workdir / rundir.VERDICT).get("run_dir")
    return None if verified and Path(str(verified)).name == latest.name else latest


def _check_pending(pending: Path, pub: opened.Publication, repeats: int | None, until_decided: bool,
                   max_repeats: int | None) -> None:
    """An unfinished rerun is continued as it was started: other options would mix two designs."""
    meta = rundir.read_optional_json(pending / rundir.RUN_JSON)
    design = meta.get("design") if isinstance(meta.get("design"), dict) else {}
    sequential = design.get("kind") == "sequential"
    if sequential:
        differs = not until_decided or (max_repeats is not None and design.get("max_repeats") != max_repeats)
        was = f"--until-decided, at most {design.get('max_repeats')} repeats"
    else:
        differs = until_decided or meta.get("repeats") != (repeats if repeats is not None else pub.repeats)
        was = f"{meta.get('repeats')} repeats"
    if differs:
        raise UsageError(f"{pending.parent.parent} holds the unfinished rerun {pending.name} ({was}; "
                         f"{_progress(pending)}): give the options it was started with to continue it, or choose "
                         "another --out")


def reproduce(
    source: str,
    *,
    out: str | Path | None = None,
    repeats: int | None = None,
    rev: str | None = None,
    subpath: str | None = None,
    alpha: float = DEFAULT_ALPHA,
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
    indexes: list[str] | None = None,
    no_sandbox: bool = False,
    network: bool = False,
    sandbox_ro: list[str] | None = None,
    launch: list[str] | None = None,
) -> ReproduceResult:
    """Rerun the publication SOURCE and verify the rerun against it (see the module docstring)."""
    # the rerun gets the caller's environment as it was: libraries imported here while making the data
    # (threadpoolctl sets KMP_DUPLICATE_LIB_OK) must not show up as a provenance difference
    env = dict(os.environ)
    console = _console(console)
    asked_tracking = tracking  # as given: the command that continues this reproduction repeats it
    _check_design(repeats, until_decided, max_repeats)
    links = rebuild.check_mode(env_mode, list(find_links or []), run_code=run_code, indexes=indexes)
    choice = sandbox.choose(run_code, no_sandbox, network, sandbox_ro or [])
    with tempfile.TemporaryDirectory(prefix="repro500-reproduce-") as tmp_name:
        tmp = Path(tmp_name)
        src, (pub, pending), workdir = _open(
            source, tmp, out, rev, subpath, margins, data_root, console,
            lambda pub, workdir: _check_options(pub, workdir, repeats, until_decided, max_repeats, console, launch))
        code = _consent(pub, run_code, console)
        places = _Places.of(pub, src, workdir, Path(data_root))  # a workdir out of the experiment refused here
        tracking = _tracking(pub, tracking, workdir, env, console)
        placed = _place_source(pub, workdir) if code else None
        lines, warnings, inputs = _put_data(pub, places, src, tmp, allow_data_differences, console)
        sequential = _sequential_flags(workdir, max_repeats, margins) if until_decided else None
        env, python, used = _environment(env_mode, pub, placed, code, workdir, links, env, console, indexes,
                                         sandboxed=confine.installs(choice, workdir, placed, links))
        again = _again(source, workdir, repeats=repeats, rev=rev, subpath=subpath, alpha=alpha, margins=margins,
                       data_root=data_root, tracking=asked_tracking, run_code=run_code, until_decided=until_decided,
                       allow_data_differences=allow_data_differences, max_repeats=max_repeats,
                       env_mode=env_mode, find_links=find_links, indexes=indexes, choice=choice) + "".join(
                           f" {word}" for word in launch or [])
        reads = _reads(pub, places, inputs)
        confined = confine.rerun(choice, workdir, reads, env, used, console)
        rerun = _rerun(pub, workdir, repeats, tracking, env, code, placed, sequential, python,
                       pending=pending, again=again, console=console, launch=launch, confined=confined)
        verdict = _verdict(pub, rerun, workdir, alpha, margins, used, console, sandboxed=confined[1])
    return ReproduceResult(workdir=workdir, rerun=rerun, verdict=verdict, source=src.label, data=lines,
                           warnings=warnings)


def _again(source: str, workdir: Path, *, repeats: int | None, rev: str | None, subpath: str | None, alpha: float,
           margins: dict[str, float] | None, data_root: str | Path, tracking: bool | None, run_code: bool,
           allow_data_differences: bool, until_decided: bool, max_repeats: int | None, env_mode: str,
           find_links: list[str] | None, indexes: list[str] | None, choice: sandbox.Choice | None = None) -> str:
    """The command that continues this reproduction where it stopped: the same options, the same
    ``--out`` (what the rerun prints when it is interrupted or a repeat fails)."""
    import shlex

    words = ["repro500", "reproduce", source, "--out", str(workdir)]
    words += [*(["--path", subpath] if subpath else []), *(["--rev", rev] if rev else []),
              *(["--repeats", str(repeats)] if repeats is not None else []),
              *(["--until-decided"] if until_decided else []),
              *(["--max-repeats", str(max_repeats)] if max_repeats is not None else []),
              *(["--alpha", f"{alpha:g}"] if alpha != DEFAULT_ALPHA else []),
              *[f"--margin={name}={delta:g}" for name, delta in (margins or {}).items()],
              *(["--data-root", str(data_root)] if str(data_root) != "." else []),
              *([] if tracking is None else ["--tracking" if tracking else "--no-tracking"]),
              *(["--run-code"] if run_code else []),
              *(["--allow-data-differences"] if allow_data_differences else []),
              *(["--env", env_mode] if env_mode != "current" else []),
              *[w for folder in find_links or [] for w in ("--find-links", str(folder))],
              *[w for url in indexes or [] for w in ("--index", redact_url(url))]]
    if choice is not None:
        words += [*(["--no-sandbox"] if choice.consent else []), *(["--network"] if choice.network else []),
                  *[w for path in choice.extra for w in ("--sandbox-ro", str(path))]]
    return shlex.join(words)


def _check_design(repeats: int | None, until_decided: bool, max_repeats: int | None) -> None:
    if repeats is not None and repeats < 1:
        raise UsageError(f"--repeats {repeats}: give at least 1")
    if until_decided and repeats is not None:
        raise UsageError("--until-decided runs up to --max-repeats repeats; --repeats is for a fixed design")
    if max_repeats is not None and not until_decided:
        raise UsageError("--max-repeats goes with --until-decided (a fixed design takes --repeats)")


def _open(source: str, tmp: Path, out: str | Path | None, rev: str | None, subpath: str | None,
          margins: dict[str, float] | None, data_root: str | Path, console: Any,
          check: Callable[[opened.Publication, Path], Any]) -> tuple[sources.Source, tuple[opened.Publication, Any], Path]:
    """(where it came from, (the checked publication, what ``check`` said of it and the options), the
    reproduction's directory): found, copied into ``OUT/publication`` and checked before anything
    runs.  The margins are checked against the checked copy's published.yaml; a publication
    or an option refused after the copy takes the copy (and an ``OUT`` made for it) away again, and
    is reported under the path given, not the copy's."""
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
    opened.own_files(pub_dir, index)
    workdir = Path(out) if out is not None else Path("reproductions") / untrusted.path_name(index.get("run_id"), "run id")
    made = [d for d in (workdir, *workdir.parents) if not d.exists()]
    workdir.mkdir(parents=True, exist_ok=True)
    snapshot = workdir / "publication"
    made_snapshot = False
    try:
        _make_room(pub_dir, snapshot)
        made_snapshot = snapshot.resolve() != pub_dir.resolve()
        pub = opened.open_publication(pub_dir, tmp / "reference", snapshot)
        _check_margins(pub.published, margins)  # the copy that was checked, never the source's file again
        checked = check(pub, workdir)
    except (InvalidInput, UsageError) as err:
        if made_snapshot and snapshot.exists():
            with contextlib.suppress(OSError):
                opened.remove_snapshot(snapshot)
        for folder in made:  # deepest first: only what this command created, and only when empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        given = str(src.path) if src.kind == "publication" else src.label
        raise type(err)(str(err).replace(str(snapshot), given)) from None
    console.print(f"publication checked: run {untrusted.shown(pub.run_id)}, {untrusted.shown(pub.repeats)} repeats, "
                  f"seed {untrusted.shown(pub.seed)}; archive sha256 {untrusted.shown(str(pub.index['archive']['sha256'])[:16])}",
                  highlight=False, soft_wrap=True)
    if pub.not_carried:  # publish --exclude: sealed digests, files left out of the archive
        console.print(f"  {untrusted.shown(pub.integrity.notes[0], untrusted.SENTENCE_CHARS)}", highlight=False, soft_wrap=True)
    return src, (pub, checked), workdir


def _check_margins(published_yaml: Path, margins: dict[str, float] | None) -> None:
    """Each ``--margin`` names a metric *published_yaml* (the checked publication's) publishes, with
    a margin > 0: known before the rerun, not after it."""
    if not margins:
        return
    for name, value in margins.items():
        if not value > 0:
            raise UsageError(f"--margin {name}={value}: an equivalence margin must be > 0")
    published = load_published(published_yaml)
    unknown = sorted(set(margins) - set(published.metrics))
    if unknown:
        raise UsageError(f"--margin names {untrusted.shown(unknown[0])!r}, which {pubs.PUBLISHED} does not publish "
                         f"(it has: {', '.join(untrusted.shown(m) for m in published.metrics)})")


def _check_options(pub: opened.Publication, workdir: Path, repeats: int | None, until_decided: bool,
                   max_repeats: int | None, console: Any, launch: list[str] | None = None) -> Path | None:
    """The options against the publication's design and what ``OUT`` holds; the unfinished rerun of
    this reproduction to continue, or None."""
    words = list(launch or [])
    launcher = words[words.index("--launcher") + 1] if "--launcher" in words else None
    if pub.nnodes > 1 and launcher != "slurm":
        world = (pub.index.get("run") or {}).get("world_size")
        raise UsageError(f"the published run ran each repeat on {pub.nnodes} nodes (world size {world}), and its "
                         f"rerun needs as many: rerun it on a SLURM cluster with --launcher slurm, whose tasks span "
                         f"{pub.nnodes} nodes each")
    design = pub.design or {}
    if design.get("kind") == "factorial":
        given = [flag for flag, value in (("--repeats", repeats is not None), ("--until-decided", until_decided))
                 if value]
        if given:
            raise UsageError(f"this publication is a factorial run ({pubs.describe_design(design)}), and its rerun "
                             f"is one too: {given[0]} does not apply (leave it out)")
        console.print(f"the published run is a factorial ({pubs.describe_design(design)}): the rerun is the same "
                      "factorial", highlight=False, soft_wrap=True)
    elif design.get("kind") == "sequential" and not until_decided:
        ran = design.get("stopped_at") or pub.repeats
        console.print(f"the published run was sequential ({pubs.describe_design(design)}); this rerun is a fixed "
                      f"design of {repeats or pub.repeats} repeats, compared with its {ran} (--until-decided "
                      "reruns it sequentially)", highlight=False, soft_wrap=True)
    pending = _pending(workdir)
    if pending is not None:
        _check_pending(pending, pub, repeats, until_decided, max_repeats)
    return pending


def _consent(pub: opened.Publication, run_code: bool, console: Any) -> tuple[str, list[str]] | None:
    """The publisher's own code the rerun would run, refused without ``--run-code``."""
    code = rundir.own_code(pub.reference)
    runs = f"runs its own code ({rundir.own_code_said(code)})" if code else None
    if not untrusted.consent(run_code, runs, review="it (in the packed run's source/)"):
        return None
    if code:
        console.print(f"the publication's own code runs ({untrusted.shown(code[0])}, {len(code[1])} files, digests checked)",
                      highlight=False, soft_wrap=True)
    return code


def _reads(pub: opened.Publication, places: _Places, inputs: list[placing.Placed]) -> list[Path]:
    """What the rerun reads besides its source: every data path where it was put, and every input
    the publisher's command read where this reproduction placed it (the sandbox grants these; read
    only, also inside the writable ``OUT``: a linked input shares its bytes with the reproducer's copy)."""
    return [*(places.out(entry.path, "data path", pub.params) for entry in pub.data),
            *(item.target for item in inputs)]


def _put_data(pub: opened.Publication, places: _Places, src: sources.Source, tmp: Path,
              allow_data_differences: bool, console: Any) -> tuple[list[str], list[str], list[placing.Placed]]:
    """The command's inputs placed and every data path put in place: (one line each, warnings, the
    inputs as placed)."""
    lines: list[str] = []
    inputs, warnings = _place_inputs(pub, places, allow_data_differences, console)
    for entry in pub.data:
        line, warning = _data(entry, places, src, tmp, pub.params)
        lines.append(line)
        console.print(f"  {untrusted.shown(line, untrusted.SENTENCE_CHARS)}", highlight=False, soft_wrap=True)
        if warning:
            warnings.append(warning)
            console.print(f"[yellow]warning:[/] {untrusted.shown(warning, untrusted.SENTENCE_CHARS)}", highlight=False, soft_wrap=True)
    return lines, warnings, inputs


def _sequential_flags(workdir: Path, max_repeats: int | None, margins: dict[str, float] | None) -> list[str]:
    """The rerun's flags to stop once the equivalence test against the publication decides."""
    return ["--until-decided", "--against", str((workdir / "publication" / pubs.PUBLISHED).resolve()),
            *(["--max-repeats", str(max_repeats)] if max_repeats else []),
            *[f"--margin={name}={delta}" for name, delta in (margins or {}).items()]]


def _environment(env_mode: str, pub: opened.Publication, placed: Path | None, code: tuple[str, list[str]] | None,
                 workdir: Path, links: list[str], env: dict[str, str],
                 console: Any, indexes: list[str] | None = None,
                 sandboxed: Callable[[str], list[str]] | None = None) -> tuple[dict[str, str], str | None, dict[str, Any]]:
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
    env_python = rebuild.build(pins, workdir, with_tool=not is_command, find_links=links, console=console,
                               indexes=indexes, sandboxed=sandboxed).absolute()
    used = {"mode": "venv", "python": str(env_python), "installer": rebuild.installer(),
            "lock_sha256": pins.digest, "not_rebuilt": pins.unpinnable}
    return rebuild.activated(env_python, env), None if is_command else str(env_python), used


def _verdict(pub: opened.Publication, rerun: Path, workdir: Path, alpha: float, margins: dict[str, float] | None,
             used: dict[str, Any], console: Any, sandboxed: dict[str, Any] | None = None) -> Any:
    """The rerun verified against the publication, with the bitwise comparison and provenance diff
    against the packed run itself; written to ``OUT/verdict.json`` and shown."""
    from repro500.verify.render import render
    from repro500.verify.verdict import verify_run, write_verdict

    with contextlib.chdir(workdir):  # the rerun's manifest records data paths relative to workdir
        verdict = verify_run(rerun.relative_to(workdir), against=Path("publication") / pubs.PUBLISHED,
                             alpha=alpha, margins=margins)
    verdict.run_dir = str(rerun)
    verdict.reference_integrity = pub.integrity  # the packed run, with what publish left out named
    if verdict.status != INVALID and verdict.determinism is not None:
        mine, theirs = load_run(rerun), load_run(pub.reference)
        verdict.determinism.cross_run = compare_with_reference(mine, theirs)
        # against the packed run itself: what each side's command read is part of the diff
        verdict.provenance = provenance_diff(mine.provenance_manifest, theirs.provenance_manifest)
    write_verdict(verdict, workdir)
    # the rerun checked its own acceptance bands (its verdict.json): a section of this verdict, not a second one
    own = rundir.read_optional_json(rerun / rundir.VERDICT)
    rerun_own = {"status": own.get("status"), "verdict": str(rerun / rundir.VERDICT)} if own else None
    # which environment the rerun ran in, beside the verdict (its provenance diff says what differed)
    atomic.write_json(workdir / rundir.VERDICT, {**verdict.to_dict(), "environment": used, "rerun_own": rerun_own,
                                                 "sandbox": sandboxed or {"sandboxed": False}})
    console.rule("Verdict against the publication")
    render(verdict, console)
    if rerun_own:
        console.print(f"Rerun's own check  {untrusted.shown(rerun_own['status'])} against its recipe's acceptance "
                      f"bands ({untrusted.shown(rerun_own['verdict'])}); the verdict above is the reproduction's",
                      highlight=False, soft_wrap=True)
    if confine.said(sandboxed):  # how the rerun was confined, or that it was not (--no-sandbox)
        console.print(confine.said(sandboxed), highlight=False, soft_wrap=True)
    console.print(f"environment: {untrusted.shown(used['mode'])} ({untrusted.shown(used['python'])})\n"
                  f"rerun: {untrusted.shown(rerun)}\nverdict: {untrusted.shown(workdir / rundir.VERDICT)}",
                  highlight=False, soft_wrap=True)
    return verdict
