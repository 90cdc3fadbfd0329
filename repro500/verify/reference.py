"""What a run is verified against: another run directory, a packed bundle, or published numbers.

A reference run (directory or bundle) is itself integrity-checked: comparing with a
tampered reference is as meaningless as verifying a tampered run.  A bundle is unpacked
into a temporary directory, read into memory and deleted.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500 import bundle
from repro500.errors import InvalidInput
from repro500.verify import integrity
from repro500.verify.published import Published, load_published
from repro500.verify.rundir import RunData

PUBLISHED_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass
class Reference:
    kind: str  # "run" | "bundle" | "publication" | "published" | "history"
    path: str
    label: str
    values: dict[str, list[float]]  # metric -> per-repeat values (or the one published value)
    run: RunData | None = None
    published: Published | None = None
    manifest: dict[str, Any] | None = None
    epochs_to_quality: list[float] | None = None
    time_to_quality_s: list[float] | None = None
    integrity: integrity.IntegrityResult | None = None
    notes: list[str] = field(default_factory=list)
    history: dict[str, Any] | None = None  # a history reference's runs and scope (verify/history.py)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "path": self.path, "label": self.label}
        if self.published is not None:
            out.update(benchmark=self.published.benchmark, source=self.published.source,
                       recipe=self.published.recipe)
        if self.run is not None:
            out.update(run_id=self.run.run_id, repeats=len(self.run.completed))
        if self.integrity is not None:
            out["sums_digest"] = self.integrity.sums_digest
        if self.history is not None:
            out["history"] = self.history
        return out


def load_reference(against: str | Path) -> Reference:
    """Resolve ``--against``; InvalidInput when it is missing, unreadable or tampered with."""
    path = Path(against)
    if not path.exists():
        raise InvalidInput(f"reference {path} does not exist: give a run directory, a packed .tar.gz or a published-results file")
    from repro500.publish.excluded import publication_of

    packed = publication_of(path)  # what a publication left out of its archive is not carried
    if packed is None and path.is_dir():
        return _from_run_dir(path, kind="run", shown=str(path))
    if packed is not None or bundle.is_archive(path):
        with tempfile.TemporaryDirectory(prefix="repro500-ref-") as tmp:
            unpacked = bundle.unpack(packed.archive if packed is not None else path, tmp)
            try:
                not_carried = packed.not_carried(unpacked) if packed is not None else []
            except InvalidInput as err:
                raise InvalidInput(f"reference {path}: {err}") from None
            return _from_run_dir(unpacked, kind="publication" if packed is not None else "bundle", shown=str(path),
                                 not_carried=not_carried)
    if path.suffix.lower() in PUBLISHED_SUFFIXES:
        return _from_published(load_published(path))
    raise InvalidInput(
        f"reference {path} is neither a run directory, a .tar.gz bundle nor a .yaml/.json published-results file"
    )


def _from_run_dir(path: Path, *, kind: str, shown: str, not_carried: list[dict[str, Any]] | None = None) -> Reference:
    try:
        check, run = integrity.check_run(path, label="reference", deep=False, not_carried=not_carried or ())
    except InvalidInput as err:  # name the reference the user gave, not a temporary directory
        raise InvalidInput(f"reference {shown}: {err}") from None
    ref = Reference(kind=kind, path=shown, label=shown, values={}, integrity=check)
    if run is None or not check.ok:
        return ref  # the verdict reports the problems as INVALID
    ref.run = run
    ref.label = f"run {run.run_id}"
    ref.values = {name: run.values(name) for name in run.metric_names()}
    ref.manifest = run.provenance_manifest  # compared, never re-sealed: with what its command read
    ref.epochs_to_quality = _repeat_field(run, "epochs_to_quality")
    ref.time_to_quality_s = _repeat_field(run, "time_to_quality_s")
    return ref


def _repeat_field(run: RunData, name: str) -> list[float]:
    out = []
    for k in run.completed:
        doc = run.repeats[k]
        value = doc.get(name, (doc.get("metrics") or {}).get(name))
        if isinstance(value, (int, float)) and not isinstance(value, bool) and doc.get("reached_target", True):
            out.append(float(value))
    return out


def _from_published(pub: Published) -> Reference:
    return Reference(
        kind="published", path=str(pub.path), label=f"{pub.benchmark} ({pub.citation})",
        values={name: list(m.values) for name, m in pub.metrics.items()}, published=pub,
        manifest=pub.manifest, epochs_to_quality=pub.epochs_to_quality,
    )
