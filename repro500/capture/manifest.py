"""The manifest: every facet joined into one digested JSON document.

Shape (``repro500/manifest/v1``, docs/capture.md)::

    {"schema": "repro500/manifest/v1",
     "tool": {"name": "repro500", "version": "..."},
     "created_utc": "2026-11-22T06:15:00Z",
     "facets": {"code": ..., "environment": ..., "seeds": ..., "data": ..., "hardware": ...},
     "facet_errors": {"<facet>": "<why it could not be gathered>"},
     "artifacts": {"code.diff": {"sha256": "...", "bytes": 123}},
     "digest": {"algorithm": "sha256", "canonicalization": "repro500-c14n/v1", "value": "..."}}

The digest is :func:`repro500.digest.canonical_digest` of the document without its
``digest`` key.  Every facet passes through :func:`repro500.redact.scrub` before it is
digested, so nothing secret can reach the file.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from repro500 import __version__
from repro500.capture import code, data, env, hardware, registry, toolchain  # noqa: F401 - registers facets
from repro500.capture import seeds as seeds_mod
from repro500.capture.registry import CaptureContext, facet
from repro500.digest import CANONICALIZATION, canonical_digest
from repro500.errors import InvalidInput, UsageError
from repro500.redact import redact_text, scrub
from repro500.rundir import atomic, layout
from repro500.rundir.names import MANIFEST_SCHEMA

SCHEMA = MANIFEST_SCHEMA
MANIFEST_NAME = layout.MANIFEST


def seeds_facet(master_seed: int | None, repeats: int = 1, world_size: int = 1,
                same_seed: bool = False) -> dict[str, Any]:
    """The ``seeds`` facet: the formula and every derived seed of the run."""
    return {
        "formula": seeds_mod.FORMULA,
        "master_seed": master_seed,
        "repeats": repeats,
        "world_size": world_size,
        "same_seed": same_seed,
        "plan": ([] if master_seed is None
                 else seeds_mod.plan(master_seed, repeats, world_size, same_seed)),
    }


@facet("seeds")
def _seeds(ctx: CaptureContext) -> dict[str, Any]:
    return seeds_facet(ctx.seed, ctx.repeats, ctx.world_size, ctx.same_seed)


def jsonable(value: Any) -> Any:
    """Plain JSON data that survives a write/read round trip unchanged.

    Keys become strings, tuples lists, NaN/inf ``None`` (canonical JSON refuses them), and
    anything else its ``str``: the digest of what is written must equal the digest of what
    is read back.
    """
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [jsonable(v) for v in value]
        return sorted(items, key=str) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _validate_options(data_paths: Iterable[Any], seed: int | None, repeats: int,
                      world_size: int, repo_dir: str | Path | None = None) -> None:
    if repo_dir is not None and not Path(repo_dir).is_dir():
        what = "is not a directory" if Path(repo_dir).exists() else "does not exist"
        raise InvalidInput(f"--repo '{repo_dir}' {what}: give a directory inside the git work tree")
    if seed is not None and seed < 0:
        raise UsageError(f"--seed {seed} is negative: use a non-negative integer")
    if repeats < 1 or world_size < 1:
        raise UsageError("--repeats and --world-size must be at least 1")
    for p in data_paths:
        path = Path(p)
        if not path.exists() and not path.is_symlink():
            raise InvalidInput(f"data path '{p}' does not exist: check the path")


def build_manifest(
    data_paths: Iterable[str | Path] = (),
    *,
    extra_facets: dict[str, Any] | None = None,
    repo_dir: str | Path | None = None,
    progress: bool = False,
    runtime: bool = False,
    use_cache: bool = True,
    seed: int | None = None,
    repeats: int = 1,
    world_size: int = 1,
    same_seed: bool = False,
    input_paths: Iterable[str | Path] = (),
    environ: dict[str, str] | None = None,
    jobs: int | None = None,
    ahead: Ahead | None = None,
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Capture every registered facet: ``(manifest, artifacts)``.

    ``extra_facets`` are added (or replace a gathered facet of the same name), e.g. the
    ``runtime`` and ``distributed`` facets of ``repro500 run``.  ``runtime=True`` gathers
    :func:`repro500.capture.env.runtime_state` (imports torch).  ``artifacts`` maps file
    names (``code.diff``) to the bytes :func:`write_manifest` puts next to the manifest.
    Raises :class:`InvalidInput` for a missing or unreadable data path and for a
    ``repo_dir`` that is not a directory (outside a git work tree is recorded, not an error).
    ``input_paths`` are a wrapped command's declared inputs (the data facet's ``inputs``);
    ``environ`` is the environment the experiment runs with (default ``os.environ``); ``jobs``
    the threads hashing data (default every usable CPU); ``ahead`` facets already gathered
    (:func:`gather_ahead`), which are not gathered again.
    """
    paths = tuple(str(p) for p in data_paths)
    inputs = tuple(str(p) for p in input_paths)
    _validate_options((*paths, *inputs), seed, repeats, world_size, repo_dir)
    ctx = CaptureContext(
        data_paths=paths, repo_dir=Path(repo_dir) if repo_dir is not None else None,
        progress=progress, use_cache=use_cache, seed=seed, repeats=repeats,
        world_size=world_size, same_seed=same_seed, input_paths=inputs, environ=environ, jobs=jobs,
    )
    ahead = ahead or Ahead()
    wanted = [name for name, f in registry.registered().items()
              if (f.default or (runtime and name == "runtime")) and name not in ahead.facets and name not in ahead.errors]
    gathered, errors = registry.gather(ctx, only=wanted)
    gathered.update(ahead.facets)
    errors.update(ahead.errors)
    for name, value in (extra_facets or {}).items():
        gathered[name] = value
        errors.pop(name, None)
    artifacts = {**ahead.artifacts, **ctx.artifacts}
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "tool": {"name": "repro500", "version": __version__},
        "created_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "facets": {name: scrub(jsonable(value)) for name, value in gathered.items()},
        "facet_errors": {name: redact_text(reason) for name, reason in errors.items()},
        "artifacts": {
            name: {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)}
            for name, blob in sorted(artifacts.items())
        },
    }
    return seal(doc), artifacts


@dataclass
class Ahead:
    """Facets gathered before the rest of a capture (the code facet, before a command writes into
    its tree), with their errors and artifacts."""

    facets: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, bytes] = field(default_factory=dict)


def gather_ahead(names: Iterable[str]) -> Ahead:
    """Gather *names* now, for a :func:`build_manifest` later."""
    ctx = CaptureContext()
    facets, errors = registry.gather(ctx, only=list(names))
    return Ahead(facets, errors, dict(ctx.artifacts))


def seal(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with its ``digest`` (re)computed over everything else."""
    body = {k: v for k, v in jsonable(manifest).items() if k != "digest"}
    body["digest"] = {"algorithm": "sha256", "canonicalization": CANONICALIZATION,
                      "value": canonical_digest(body)}
    return body


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """Recompute a manifest's digest from its content (ignores the recorded one)."""
    return canonical_digest({k: v for k, v in manifest.items() if k != "digest"})


def _manifest_file(out: Path) -> Path:
    return out if out.suffix == ".json" else out / MANIFEST_NAME


def write_manifest(manifest: dict[str, Any], artifacts: Mapping[str, bytes],
                   out_dir: str | Path) -> Path:
    """Write ``manifest.json`` and its artifacts into ``out_dir``; return the manifest path.

    ``out_dir`` may also be the manifest's own file name (ending in ``.json``); artifacts
    then go into the same directory.  Artifacts are written first and the manifest last,
    each atomically, so a manifest on disk always has its artifacts beside it.  A place
    that cannot be written (no permission, a parent that is a file) raises InvalidInput.
    """
    target = _manifest_file(Path(out_dir))
    for name in artifacts:
        if Path(name).name != name:
            raise ValueError(f"artifact name {name!r} must be a plain file name")
    try:
        for name, blob in artifacts.items():
            atomic.write_bytes(target.parent / name, blob)
        atomic.write_json(target, manifest)
    except OSError as err:
        raise InvalidInput(f"cannot write the manifest to {target} ({_write_problem(target, err)}): "
                           "choose a writable directory") from None
    return target


def _write_problem(target: Path, err: OSError) -> str:
    # mkdir under a regular file says "File exists"; name the file that is in the way instead
    blocker = next((p for p in target.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        return f"{blocker} is not a directory"
    return err.strerror or type(err).__name__


def load_manifest(path: str | Path, *, check_artifacts: bool = False) -> dict[str, Any]:
    """Read and check a manifest file, or the ``manifest.json`` of a run directory.

    Raises :class:`InvalidInput` (one sentence) when it is missing, unreadable, not JSON,
    not a ``repro500/manifest/v1`` document, or edited after capture (digest mismatch);
    with ``check_artifacts`` also when an artifact beside it is missing or altered.
    """
    given = Path(path)
    target = given / MANIFEST_NAME if given.is_dir() else given
    if not target.exists():
        where = f"run directory {given} has no {MANIFEST_NAME}" if given.is_dir() else (
            f"manifest {given} does not exist")
        raise InvalidInput(f"{where}: check the path")
    try:
        text = target.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else "not UTF-8 text"
        raise InvalidInput(f"cannot read manifest {target} ({reason})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidInput(f"manifest {target} is not valid JSON (line {err.lineno}, column "
                           f"{err.colno}: {err.msg}); it is corrupt or truncated") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise InvalidInput(f"{target} is not a repro500 manifest (schema {found!r}, "
                           f"expected {SCHEMA!r})")
    recorded = doc.get("digest")
    if not isinstance(recorded, dict) or not isinstance(recorded.get("value"), str):
        raise InvalidInput(f"manifest {target} has no digest: it is incomplete or was edited")
    if recorded.get("canonicalization") != CANONICALIZATION:
        raise InvalidInput(f"manifest {target} uses canonicalization "
                           f"{recorded.get('canonicalization')!r}, which this repro500 cannot "
                           "check; upgrade repro500")
    try:
        actual = manifest_digest(doc)
    except ValueError:  # NaN/inf smuggled into the file
        actual = None
    if actual != recorded["value"]:
        raise InvalidInput(f"manifest {target} was edited after capture: its content does not "
                           "match its digest")
    problem = _structure_problem(doc)
    if problem:
        raise InvalidInput(f"manifest {target} is malformed: {problem}")
    if check_artifacts:
        problems = artifact_problems(doc, target.parent)
        if problems:
            raise InvalidInput(f"manifest {target}: {problems[0]}")
    return doc


def _structure_problem(doc: Mapping[str, Any]) -> str | None:
    """What is structurally wrong with a manifest whose digest matches, or None.

    A consistent digest only says nobody edited the file after sealing it; a hand-made or
    buggy document can still hold ``"facets": "oops"``, which every reader would trip on.
    """
    if not isinstance(doc.get("facets"), dict):
        return f"'facets' is {_json_type(doc.get('facets'))}, expected an object"
    for key in ("facet_errors", "artifacts"):
        if key in doc and not isinstance(doc[key], dict):
            return f"'{key}' is {_json_type(doc[key])}, expected an object"
    for name, info in (doc.get("artifacts") or {}).items():
        if not isinstance(info, dict):
            return f"artifact '{name}' is {_json_type(info)}, expected an object"
    return None


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
             int: "a number", float: "a number"}
    return "missing or null" if value is None else names.get(type(value), type(value).__name__)


def artifact_problems(manifest: Mapping[str, Any], directory: str | Path) -> list[str]:
    """One sentence per artifact that is missing beside the manifest or differs from it."""
    problems = []
    for name, info in (manifest.get("artifacts") or {}).items():
        path = Path(directory) / name
        if not path.is_file():
            problems.append(f"artifact {name} is missing from {directory}")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != info.get("sha256"):
            problems.append(f"artifact {name} was changed after capture")
    return problems
