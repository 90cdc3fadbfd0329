"""The DVC experiment a run is, and the run id it gets (``repro500 run --run-id-from-dvc``).

``dvc exp run`` gives every stage command the experiment's name and the commit it varies
(``DVC_EXP_NAME``, ``DVC_EXP_BASELINE_REV``; DVC names an experiment itself when ``-n`` is not
given); a plain ``dvc repro`` gives neither.  The stage ``repro500 init`` writes names each run
after its experiment, so every ``dvc exp run`` is a run of its own beside the others in the
stage's ``--out`` directory, and ``repro500 history``/``diff`` read them all.

A run id is a directory name: a DVC name is git-ref-safe but may hold ``@``, non-ASCII letters
and the like, so it is normalised to ASCII letters, digits, ``.``, ``_`` and ``-``; the name as
DVC gave it is what ``run.json`` (``dvc.experiment``) and the MLflow tags record.  Two
experiments whose names normalise alike are refused (the second one), never overwritten.
"""

from __future__ import annotations

import os
import re
import unicodedata
from dataclasses import dataclass

from repro500.errors import InvalidInput
from repro500.tracking import names

NAME_ENV = "DVC_EXP_NAME"
BASELINE_ENV = "DVC_EXP_BASELINE_REV"
MAX_ID = 100  # a directory name well under any file system's 255 bytes, with room for what sits beside it
_OTHER = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Experiment:
    """A DVC experiment as its stage's environment names it."""

    name: str
    baseline_rev: str | None

    def record(self) -> dict[str, str | None]:
        """What ``run.json`` keeps under ``dvc``: the name as DVC gave it and the commit it varies."""
        return {"experiment": self.name, "baseline_rev": self.baseline_rev}

    def tags(self) -> dict[str, str]:
        """The MLflow parent's tags (docs/contracts.md)."""
        given = {names.DVC_EXPERIMENT_TAG: self.name, names.DVC_BASELINE_TAG: self.baseline_rev}
        return {key: value for key, value in given.items() if value}


def current() -> Experiment | None:
    """The DVC experiment this process runs in, or None outside ``dvc exp run``."""
    name = os.environ.get(NAME_ENV) or ""
    return Experiment(name=name, baseline_rev=os.environ.get(BASELINE_ENV) or None) if name else None


def run_id(experiment: Experiment) -> str:
    """The run id of *experiment*: its name with every run of other characters made one ``-``
    (accents dropped first: ``ü`` is ``u``), at most :data:`MAX_ID` characters, never starting
    with ``.`` or ``-`` (a hidden directory, an option)."""
    ascii_name = unicodedata.normalize("NFKD", experiment.name).encode("ascii", "ignore").decode("ascii")
    normal = _OTHER.sub("-", ascii_name).lstrip(".-")[:MAX_ID].rstrip(".-")
    if not normal:
        raise InvalidInput(f"DVC experiment {experiment.name!r} has no letter or digit a run id can hold; "
                           "name it with dvc exp run -n NAME (letters, digits, '.', '_', '-')")
    return normal


def taken(experiment: Experiment, run_dir: str, holder: str | None) -> InvalidInput:
    """The refusal when *experiment*'s run id is already a run directory (*holder*: the DVC
    experiment that run recorded, if any): the earlier run is kept as it is."""
    whose = f"the run of DVC experiment {holder!r}" if holder else "an earlier run"
    return InvalidInput(f"DVC experiment {experiment.name!r} would be run {run_id(experiment)}, but {run_dir} "
                        f"already holds {whose}, which is kept as it is; name this experiment otherwise "
                        "(dvc exp run -n NAME)")
