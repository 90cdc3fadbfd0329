"""The data a run read, and how to recreate it byte for byte.

A run's manifest records each data path with its DVC-compatible md5 (capture/data.py) but
not how the data was made.  Files written by ``repro500 data generate`` describe themselves
in their HDF5 root attributes (kind, seed, split, parameters, sample count, shard), and the
same attributes give the same bytes, so :func:`describe` turns a recorded path into a
*generation spec* and :func:`regenerate` replays it.  Data without such attributes (real
data) has no spec; a reproduction then needs ``dvc pull`` or a copy of the files.

``repro500 run`` records the specs while the data is there (:func:`record_specs`, the run
directory's ``data-specs.json``, docs/contracts.md), so a packed run can be published and
reproduced on a machine without the data; :func:`describe` reads the files' attributes only
for runs recorded before that file existed.

A spec is plain JSON-able data, stored in ``data-specs.json`` and a publication's ``params.yaml``::

    {"out": "data/quickstart-train.h5", "kind": "classification", "seed": 500,
     "split": "train", "samples": 2048, "shard": "0/1", "size": "32x32",
     "compression": "none", "options": {"classes": 10, "channels": 3, "noise": 0.04}}

Someone else's specs are bounded by the size their run recorded for the path (the manifest's
``size``, the entry's ``bytes``): specs whose files cannot be that small are refused when they are
read (:func:`check_entries`), and :func:`regenerate` stops a file that grows past it.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500 import recorded_paths, untrusted
from repro500.capture.data import digest_path, size_of
from repro500.data.layout import GENERATOR_PREFIX
from repro500.errors import InvalidInput, ReproError
from repro500.rundir import atomic

SPECS_NAME = "data-specs.json"  # in the run directory, covered by SHA256SUMS
SPECS_SCHEMA = "repro500/data-specs/v1"
# options `repro500 data generate` accepts on its command line, by kind
CLI_OPTIONS = {"classification": ("classes", "channels", "noise"), "cosmo": ("channels",), "ewa": ()}
SPEC_KEYS = ("out", "kind", "seed", "split", "samples", "shard", "size", "compression", "options")
MAX_SEED = 2**63 - 1  # a file's root attribute holds the seed as a signed 64-bit integer


def _slack(recorded: int) -> int:
    """What a regenerated file may exceed its recorded size by: HDF5's metadata differs a little
    between library versions (the md5 then differs too, and reproduce says so)."""
    return 2**20 + recorded // 100


@dataclass
class Budget:
    """The bytes one data path was recorded with, shared by the specs that recreate it."""

    recorded: int | None  # None: an old entry without a size; each file is then bounded by its own parameters
    used: int = 0

    def max_bytes(self) -> int | None:
        return None if self.recorded is None else max(0, self.recorded - self.used) + _slack(self.recorded)


class CheckedSpec(dict):
    """A spec read from someone else's file and checked, carrying the :class:`Budget` of its data
    path, so that :func:`regenerate` bounds what it writes without its caller passing the entry
    (a dict, so that every reader of a spec keeps working; :meth:`DataEntry.to_dict` writes it plain)."""

    budget: Budget | None = None


@dataclass
class DataEntry:
    """One data path the run read: its recorded digest and how to recreate it."""

    path: str
    md5: str
    size_bytes: int | None = None
    nfiles: int | None = None
    generate: list[dict[str, Any]] | None = None  # None: cannot be regenerated
    note: str | None = None  # why not, when generate is None

    def to_dict(self) -> dict[str, Any]:
        generate = None if self.generate is None else [dict(spec) for spec in self.generate]  # plain, for YAML
        return {"path": self.path, "md5": self.md5, "bytes": self.size_bytes, "nfiles": self.nfiles,
                "generate": generate, "note": self.note}


@dataclass
class DataPlan:
    entries: list[DataEntry] = field(default_factory=list)

    @property
    def regenerable(self) -> bool:
        return all(e.generate for e in self.entries)


def _attr(h5: Any, name: str) -> Any:
    value = h5.attrs.get(name)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if hasattr(value, "item"):  # numpy scalar
        return value.item()
    return value


def _compression(h5: Any) -> str:
    for name in h5:
        filt = getattr(h5[name], "compression", None)
        return str(filt) if filt else "none"
    return "none"


def file_spec(path: str | Path, out: str) -> tuple[dict[str, Any] | None, str | None]:
    """(spec, None) for a file written by ``repro500 data generate``, else (None, why not)."""
    import h5py

    try:
        with h5py.File(path, "r") as h5:
            generator = _attr(h5, "generator")
            if not isinstance(generator, str) or not generator.startswith(GENERATOR_PREFIX):
                return None, f"{out} was not written by repro500 data generate (no generator attribute)"
            raw = {name: _attr(h5, name) for name in ("kind", "seed", "split", "params", "samples_total", "shard")}
            compression = _compression(h5)
    except OSError as err:
        return None, f"{out} is not a readable HDF5 file ({err.__class__.__name__})"
    try:
        params = untrusted.load_json(raw["params"], f"{out}'s params attribute")
        spec = {"out": out, "kind": str(raw["kind"]), "seed": int(raw["seed"]), "split": str(raw["split"]),
                "samples": int(raw["samples_total"]), "shard": str(raw["shard"])}
    except (TypeError, ValueError, InvalidInput):
        return None, f"{out} has incomplete generator attributes"
    if "height" in params and "width" in params:
        spec["size"] = f"{params.pop('height')}x{params.pop('width')}"
    elif "size" in params:
        spec["size"] = str(params.pop("size"))
    spec["compression"] = compression
    spec["options"] = params
    try:
        _build(spec)
    except ReproError as err:
        return None, f"{out}: its generator parameters are not accepted by this repro500 ({err})"
    return spec, None


def _build(spec: dict[str, Any]) -> Any:
    from repro500.data.generate import build_generator

    options = dict(spec.get("options") or {})
    return build_generator(spec["kind"], seed=spec["seed"], split=spec["split"], size=spec.get("size"), options=options)


def describe(manifest: dict[str, Any], data_root: str | Path, *, recorded: dict[str, DataEntry] | None = None,
             check_md5: bool = True) -> DataPlan:
    """The data plan of a run: every path of the manifest's data facet, with a spec where possible.

    ``recorded`` (from :func:`read_specs`) is what the run itself recorded: used as it is, no
    file is read.  Otherwise relative paths are looked up under ``data_root`` (the directory the
    run ran in); a file whose md5 differs from the manifest is not described, as it is no longer
    what the run read (``check_md5=False`` skips that re-hash right after the manifest's capture).
    """
    root = Path(data_root)
    plan = DataPlan()
    for raw in _manifest_entries(manifest):
        entry = DataEntry(path=str(raw.get("path")), md5=str(raw.get("md5")), size_bytes=raw.get("size"),
                          nfiles=raw.get("nfiles"))
        plan.entries.append(entry)
        if recorded is not None and entry.path in recorded:
            entry.generate, entry.note = recorded[entry.path].generate, recorded[entry.path].note
            continue
        try:
            # a path under the data root, as a reproduction places it; read where it is (a data
            # directory that links to another disk is the user's own), never a kernel file or a FIFO
            rel = recorded_paths.relative(entry.path, field="data path", file="the run's manifest")
            local = recorded_paths.resolve(entry.path, field="data path", file="the run's manifest", root=root,
                                           anywhere=True)
        except InvalidInput as err:
            entry.note = str(err)
            continue
        if not local.exists():
            entry.note = f"{entry.path} is not under {root}: its generator parameters could not be read"
            continue
        if check_md5 or entry.size_bytes is None:
            digest = digest_path(local)
            if check_md5 and digest["md5"] != entry.md5:
                entry.note = f"{local} changed since the run (md5 differs from the manifest)"
                continue
            if entry.size_bytes is None and digest["md5"] == entry.md5:
                entry.size_bytes = digest["size"]  # what bounds a reproduction's regeneration of it
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        specs = []
        for file in files:
            spec, why = file_spec(file, (rel / file.relative_to(local)).as_posix() if local.is_dir() else rel.as_posix())
            if spec is None:
                entry.note = why
                break
            specs.append(spec)
        else:
            entry.generate = specs
    return plan


def _manifest_entries(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return list(((manifest.get("facets") or {}).get("data") or {}).get("entries") or [])


def record_specs(manifest: dict[str, Any], run_dir: str | Path, data_root: str | Path = ".") -> Path:
    """Write ``data-specs.json`` into ``run_dir``: how each data path of the manifest can be recreated.

    Called by ``repro500 run`` right after the manifest's capture, while the data is there;
    reads only the files' HDF5 attributes (h5py, no torch).
    """
    plan = describe(manifest, data_root, check_md5=False)
    target = Path(run_dir) / SPECS_NAME
    atomic.write_json(target, {"schema": SPECS_SCHEMA, "data": [e.to_dict() for e in plan.entries]})
    return target


def read_specs(run_dir: str | Path, manifest: dict[str, Any]) -> dict[str, DataEntry] | None:
    """The run's recorded ``data-specs.json`` by data path, checked against its manifest.

    None for a run recorded before repro500 wrote that file.  The specs come from someone
    else's run: every one is checked as :func:`check_entries` checks a publication's.
    """
    path = Path(run_dir) / SPECS_NAME
    try:
        doc = untrusted.read_json(path, SPECS_NAME)  # regular, capped, bounded nesting
    except FileNotFoundError:
        return None
    if not isinstance(doc, dict) or doc.get("schema") != SPECS_SCHEMA or not isinstance(doc.get("data"), list):
        raise InvalidInput(f"{path} is not a {SPECS_SCHEMA} document with a 'data' list")
    return {e.path: e for e in check_entries(doc["data"], manifest, path)}


def check_entries(raw: list[Any], manifest: dict[str, Any], where: Path) -> list[DataEntry]:
    """Data entries read from a file (``data-specs.json``, a publication's ``params.yaml``), checked
    against the run's manifest: same paths, md5s and sizes, valid specs that write only inside their
    path, no more files than the path had, and files that can be as small as the recorded size
    (:func:`_check_size`); each entry's specs then carry its :class:`Budget`."""
    recorded = {str(e.get("path")): e for e in _manifest_entries(manifest)}
    entries = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("path"), str):
            raise InvalidInput(f"{where}: data[{i}] must be a mapping with a path")
        path = item["path"]
        if path not in recorded or item.get("md5") != recorded[path].get("md5"):
            raise InvalidInput(f"{where}: data[{i}] ({path}) is not what the run's manifest recorded")
        size = _recorded_size(item, recorded[path], f"{where}: data[{i}] ({path})")
        budget = Budget(size)
        specs = item.get("generate")
        if specs is not None:
            if not isinstance(specs, list) or not specs:
                raise InvalidInput(f"{where}: data[{i}].generate must be a list of generator specs or null")
            nfiles = recorded[path].get("nfiles")
            files = max(1, nfiles) if isinstance(nfiles, int) and not isinstance(nfiles, bool) else 1
            if len(specs) > files:
                raise InvalidInput(f"{where}: data[{i}].generate writes {len(specs)} files, more than the "
                                   f"{files} {path} was recorded with")
            specs = [check_spec(s, f"{where}: data[{i}].generate[{j}]") for j, s in enumerate(specs)]
            outs = [s["out"] for s in specs]
            inside = all(o == path or o.startswith(path.rstrip("/") + "/") for o in outs)
            if not inside:
                raise InvalidInput(f"{where}: data[{i}].generate writes outside {path}")
            _check_size(specs, size, f"{where}: data[{i}].generate ({path})")
            for spec in specs:
                spec.budget = budget
        note = item.get("note")
        entries.append(DataEntry(path=path, md5=str(item["md5"]), size_bytes=size,
                                 nfiles=item.get("nfiles"), generate=specs,
                                 note=str(note) if note is not None else None))
    if set(recorded) != {e.path for e in entries}:
        raise InvalidInput(f"{where}: data does not list every data path of the run's manifest")
    return entries


def _recorded_size(item: dict[str, Any], manifest_entry: dict[str, Any], where: str) -> int | None:
    """The bytes a data path was recorded with: the manifest's size (the run measured it); an entry
    may repeat it, never differ.  An old manifest without one leaves the entry's own ``bytes``."""
    def valid(value: Any) -> bool:
        return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)

    size, stated = manifest_entry.get("size"), item.get("bytes")
    if not valid(size) or not valid(stated):
        raise InvalidInput(f"{where}: its size ({stated!r}, manifest {size!r}) is not a number of bytes")
    if size is not None and stated is not None and stated != size:
        raise InvalidInput(f"{where}: bytes {stated:,} is not the {size:,} the run's manifest recorded")
    return size if size is not None else stated


def _check_size(specs: list[dict[str, Any]], size: int | None, where: str) -> None:
    """Refuse specs whose files cannot add up to as little as the recorded ``size`` (``samples:
    1000000000`` in a publication whose data had 200 kB), before anything is generated."""
    from repro500.data.generate import least_file_bytes, parse_shard

    if size is None:
        return
    least = sum(least_file_bytes(_build(s), s["samples"], parse_shard(s["shard"]), s["compression"]) for s in specs)
    if least > size + _slack(size):
        raise InvalidInput(f"{where} would write at least {least:,} bytes, more than the {size:,} bytes the run "
                           "recorded for that data: refused (its generator parameters do not describe it)")


def check_spec(spec: Any, where: str) -> dict[str, Any]:
    """Validate a spec read from a publication (it comes from someone else)."""
    if not isinstance(spec, dict) or set(spec) - set(SPEC_KEYS):
        raise InvalidInput(f"{where} must be a mapping with keys {', '.join(SPEC_KEYS)}")
    recorded_paths.relative(spec.get("out"), field="out", file=where)
    for key, kind in (("kind", str), ("seed", int), ("split", str), ("samples", int), ("shard", str),
                      ("compression", str)):
        if not isinstance(spec.get(key), kind) or isinstance(spec.get(key), bool):
            raise InvalidInput(f"{where}.{key} is {spec.get(key)!r}: expected a {kind.__name__}")
    if not 0 <= spec["seed"] <= MAX_SEED or spec["samples"] < 1:
        raise InvalidInput(f"{where}: seed {spec['seed']} or samples {spec['samples']} is out of range "
                           f"(seed 0..{MAX_SEED}, at least 1 sample)")
    if spec.get("size") is not None and not isinstance(spec["size"], str):
        raise InvalidInput(f"{where}.size is {spec['size']!r}: expected text such as 32x32")
    if not isinstance(spec.get("options") or {}, dict):
        raise InvalidInput(f"{where}.options must be a mapping")
    try:
        _build(spec)
        from repro500.data.generate import parse_shard

        parse_shard(spec["shard"])
    except ReproError as err:
        raise InvalidInput(f"{where}: {err}") from None
    return CheckedSpec(spec)


def regenerate(spec: dict[str, Any], root: str | Path, never: Sequence[Path] = ()) -> Path:
    """Write the file of ``spec`` under ``root`` (replacing one that is there), never into the
    places ``never`` names (a publication's snapshot); returns its path.

    A spec read from someone else's file (:class:`CheckedSpec`) writes at most what is left of the
    size recorded for its data path (InvalidInput before a sample is drawn when it cannot fit, or
    as soon as the file grows past it); any spec needs its file's room free before it starts."""
    from repro500.data.generate import generate, most_file_bytes, parse_shard

    out = recorded_paths.resolve(spec["out"], field="generate.out", file="a generation spec", root=root,
                                 never=never)
    shard = parse_shard(spec["shard"])
    budget = spec.budget if isinstance(spec, CheckedSpec) else None
    max_bytes = budget.max_bytes() if budget is not None else None
    if max_bytes is None:  # no recorded size: no more than these parameters can need
        max_bytes = most_file_bytes(_build(spec), spec["samples"], shard)
    generate(spec["kind"], out, samples=spec["samples"], seed=spec["seed"], split=spec["split"],
             size=spec.get("size"), shard=shard, compression=spec["compression"],
             force=True, options=dict(spec.get("options") or {}), max_bytes=max_bytes)
    if budget is not None:
        budget.used += out.stat().st_size
    return out


def generate_command(spec: dict[str, Any]) -> str | None:
    """The ``repro500 data generate`` command line of a spec, or None when the CLI cannot say it.

    The command line takes only some generator options; one it lacks is fine at its default
    value and makes the spec inexpressible otherwise (repro500 reproduce still replays it).
    """
    defaults = _build({**spec, "options": {}}).params.as_dict()
    args = ["repro500", "data", "generate", spec["kind"], "--out", spec["out"], "--split", spec["split"],
            "--samples", str(spec["samples"]), "--seed", str(spec["seed"])]
    if spec.get("size"):
        args += ["--size", spec["size"]]
    if spec["shard"] != "0/1":
        args += ["--shard", spec["shard"]]
    if spec["compression"] != "none":
        args += ["--compression", spec["compression"]]
    for name, value in sorted((spec.get("options") or {}).items()):
        if name in CLI_OPTIONS.get(spec["kind"], ()):
            args += [f"--{name}", str(value)]
        elif defaults.get(name) != value:
            return None
    return " ".join(shlex.quote(a) for a in args + ["--force"])


def md5_matches(path: Path, md5: str, size: Any = None) -> bool:
    """True when ``path`` exists and its DVC-compatible md5 is ``md5``; a path whose listed size is
    not the recorded ``size`` (when one is recorded) is not read at all."""
    if not os.path.exists(path):
        return False
    if isinstance(size, int) and not isinstance(size, bool) and size_of(path) != size:
        return False
    return digest_path(path)["md5"] == md5
