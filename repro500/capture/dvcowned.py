"""What DVC owns in an experiment's directory: never the experiment's code.

``dvc repro`` and ``dvc exp run -S`` write ``params.yaml`` (the parameters an experiment varies),
``dvc.lock`` and each stage's outputs, metrics and plots. Counted as source, every DVC experiment
looked like a code change: they were copied into the run's ``source/`` (so two runs' source trees
differed by the parameter file) and made the repository ``dirty``. The change they carry is named
where it is, in the run's parameters (the recipe), so the source digest and ``dirty`` leave them out.

A pipeline is found by its ``dvc.yaml`` in the experiment's directory and in each directory above
it up to the git work tree's root (a DVC project may sit anywhere in a repository). Read with
PyYAML, not DVC (importing DVC costs about a second on every run); what is read is only the
documented shape of ``dvc.yaml``: ``stages.<name>.{outs, metrics, plots, params, wdir}`` and the
top-level ``metrics``/``plots`` lists. A path written with DVC's ``${...}`` templates is not
resolved (its value lives in params.yaml): such an output stays source, as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from repro500.rundir import names

DVC_FILE = names.DVC_FILE
LOCK_FILE = "dvc.lock"
DEFAULT_PARAMS = names.PUBLICATION_PARAMS  # DVC's default params file, the name repro500 init writes


def _paths(entries: Any) -> Iterable[str]:
    """The paths of a ``outs``/``metrics``/``plots`` list: plain strings, or one-key mappings."""
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, str):
            yield entry
        elif isinstance(entry, dict):
            yield from (key for key in entry if isinstance(key, str))


def _params_files(entries: Any) -> Iterable[str]:
    """The parameter files a stage reads: ``params.yaml`` for a bare key, the file of ``{file: [...]}``."""
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, str):
            yield DEFAULT_PARAMS
        elif isinstance(entry, dict):
            yield from (key for key in entry if isinstance(key, str))


def _pipeline(dvc_yaml: Path) -> list[Path]:
    import yaml

    try:
        doc = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []  # a pipeline DVC itself could not read owns nothing we can name
    if not isinstance(doc, dict):
        return []
    base = dvc_yaml.parent
    owned = [base / LOCK_FILE]
    owned += [base / p for p in [*_paths(doc.get("metrics")), *_paths(doc.get("plots"))]]
    stages = doc.get("stages") if isinstance(doc.get("stages"), dict) else {}
    for stage in stages.values():
        if not isinstance(stage, dict):
            continue
        wdir = base / str(stage.get("wdir") or ".")
        outs = [*_paths(stage.get("outs")), *_paths(stage.get("metrics")), *_paths(stage.get("plots"))]
        owned += [wdir / p for p in [*outs, *_params_files(stage.get("params"))]]
    return [p for p in owned if "${" not in str(p)]


def owned(directory: Path, top: Path | None = None) -> list[Path]:
    """The files and directories DVC writes for the pipelines that cover *directory* (resolved,
    absolute): those of each ``dvc.yaml`` in it and above it, up to *top* (the work tree's root;
    default: *directory* alone)."""
    directory = directory.resolve()
    stop = (top or directory).resolve()
    found: list[Path] = []
    here = directory
    while True:
        if (here / DVC_FILE).is_file():
            found += [p.resolve() for p in _pipeline(here / DVC_FILE)]
        if here == stop or here.parent == here or not here.is_relative_to(stop):
            break
        here = here.parent
    return list(dict.fromkeys(found))
