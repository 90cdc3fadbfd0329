"""``repro500 init``: put a user's own experiment under repro500 and DVC in their repository.

Writes three files next to the experiment (docs/dvc.md, "Your own experiment"):

- ``repro500.yaml``: a command recipe for the user's program, with the ``--metric``,
  ``--accept`` and ``--input`` declarations and the ``--set`` mutable values it was given;
- ``params.yaml``: the ``run`` section ``repro500 run --params`` applies (repeats, seed,
  tracking and the mutable values), which ``dvc exp run -S run.mutable.KEY=VALUE`` varies;
- ``dvc.yaml``: stage ``run`` (``repro500 run``; the experiment's source files and its declared
  inputs as dependencies; each DVC experiment a run of its own under ``runs/dvc/``, the verdict
  as a DVC metric).

With tracking (the default) the runs log to MLflow, whose local store (``mlflow.db``) appears
beside them: it is neither source nor a DVC output, so the lines that keep it out of git are
appended to ``.gitignore`` (only the missing ones; the user's lines are never rewritten).

Nothing is written when any of the three files exists (unless ``force``), and everything is
checked first: the recipe is validated exactly as ``repro500 run`` would.
"""

from __future__ import annotations

import os
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from repro500.capture import source
from repro500.errors import InvalidInput
from repro500.recipe import load as recipes
from repro500.rundir import atomic, dvcfile, layout
from repro500.workloads.command import recipe as command

FILES = ("repro500.yaml", layout.PUBLICATION_PARAMS, layout.DVC_FILE)
# MLflow's default local store (repro500.tracking.client: sqlite:///mlflow.db in the working directory,
# which is the stage's directory under DVC), SQLite's files beside it while it is written,
# repro500's lock, the artifacts beside the store (repro500.tracking.store.default_artifacts) and
# MLflow's own default artifact root (a script's own experiments): results of runs, never source.
MLFLOW_IGNORES = ("mlflow.db", "mlflow.db-journal", "mlflow.db-wal", "mlflow.db-shm", "mlflow.db.lock", "mlartifacts/",
                  "mlruns/")
_IGNORE_HEAD = "# MLflow's local store, written by repro500 run (repro500 init appended these lines)"
# ``{mutable.KEY}`` whole placeholders DVC can fill from params.yaml as ``${run.mutable.KEY}``.
_DVC_KEY = re.compile(r"^mutable\.([A-Za-z_][A-Za-z0-9_-]*)$")


@dataclass
class Started:
    """What :func:`init` did, for the command to say."""

    written: list[Path]
    tracking: bool
    gitignore: Path | None = None  # the .gitignore lines were appended to, if any
    ignored: list[str] = field(default_factory=list)  # the lines appended
    inputs_as_deps: dict[str, str] = field(default_factory=dict)  # declared input -> its dvc.yaml dep
    inputs_not_deps: dict[str, str] = field(default_factory=dict)  # declared input -> why it is not one

    def lines(self) -> list[str]:
        out = [f"wrote {path}" for path in self.written]
        if self.ignored:
            out.append(f"appended {', '.join(self.ignored)} to {self.gitignore} (MLflow's local store is neither "
                       "source nor a DVC output)")
        for given, dep in self.inputs_as_deps.items():
            if dep != given:
                out.append(f"input {given} is a dependency of the run stage as {dep} (DVC fills it from params.yaml)")
        for given, why in self.inputs_not_deps.items():
            out.append(f"input {given} is not a dependency of the run stage ({why}); repro500 still hashes it "
                       "in every run")
        out.append("runs log to MLflow (params.yaml run.tracking: true; MLFLOW_TRACKING_URI, default ./mlflow.db)"
                   if self.tracking else "runs do not log to MLflow (params.yaml run.tracking: false)")
        return out


def _dvc_yaml(deps: list[str], headline: list[str]) -> str:
    stages = {
        "run": {
            "desc": "Repeated runs of the experiment with full provenance (repro500 run), and its verdict",
            # no --tracking flag: params.yaml's run.tracking decides, so dvc exp run -S can change it.
            # --run-id-from-dvc: each `dvc exp run` is a run of its own, named after the DVC experiment
            # (a plain `dvc repro` gets a new dated id), so none overwrites another.
            "cmd": f"repro500 run repro500.yaml --params params.yaml --out {dvcfile.RUNS} --run-id-from-dvc "
                   f"--metrics {dvcfile.VERDICT_METRICS} --plots {dvcfile.PLOTS} {dvcfile.RESULT_OK}",
            "deps": ["repro500.yaml", *deps],
            "params": ["run"],
            # DVC deletes a stage's outputs before running it: the runs directory persists, so the
            # runs of earlier experiments stay beside the new one (and DVC still caches them all).
            # The verdict is written by the same stage: a second stage could not tell which of the
            # runs side by side is this experiment's.
            "outs": [dvcfile.persistent(dvcfile.RUNS)],
            "metrics": [dvcfile.metrics_entry()],
            # a command records no epochs: its repeats' final values only
            "plots": dvcfile.plots_entries(headline, epochs=False),
        },
    }
    head = ["Written by repro500 init (docs/dvc.md). dvc repro runs the experiment through repro500;",
            "dvc exp run -S run.mutable.KEY=VALUE varies a mutable value (each experiment is a run of its own",
            f"in {dvcfile.RUNS}/); dvc metrics show prints the verdict, dvc plots show each repeat's values."]
    return dvcfile.render(head, stages)


def input_dep(raw: str, mutable: dict[str, Any]) -> tuple[str | None, str]:
    """An input path as a ``dvc.yaml`` dependency, or None and why it cannot be one.

    A path without placeholders is listed as given (``~`` expanded; DVC does not).  A
    ``{mutable.KEY}`` placeholder becomes DVC's ``${run.mutable.KEY}``, which DVC fills from
    params.yaml, so ``dvc exp run -S run.mutable.KEY=...`` changes the dependency with the value.
    Only where both fill it alike: a whole placeholder (no format spec) holding a string or an
    integer, in a path with no ``$`` (DVC's own template mark)."""
    try:
        parts = list(string.Formatter().parse(raw))
    except ValueError:
        return None, "it is not a valid template"
    if "$" in raw:
        return None, "DVC would read its '$' as the start of a template"
    if all(name is None for _, name, _, _ in parts):
        return os.path.expanduser("".join(literal for literal, _, _, _ in parts)), ""  # {{ and }} undone
    out = []
    for literal, name, spec, conversion in parts:
        out.append(literal)
        if name is None:
            continue
        key = _DVC_KEY.match(name)
        value = mutable.get(key.group(1)) if key else None
        if key is None or spec or conversion:
            return None, f"DVC cannot fill {{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}"
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            return None, f"mutable.{key.group(1)} is {value!r}, which DVC would write differently"
        out.append("${run.mutable." + key.group(1) + "}")
    return os.path.expanduser("".join(out)), ""


def _missing_ignores(path: Path) -> list[str]:
    """The lines of MLFLOW_IGNORES that ``path`` (a .gitignore) does not hold, with or without a leading '/'."""
    try:
        held = {line.strip().lstrip("/") for line in path.read_text(encoding="utf-8").splitlines()}
    except FileNotFoundError:
        held = set()
    except (OSError, UnicodeDecodeError) as err:
        raise InvalidInput(f"cannot read {path} ({err}); nothing was written") from None
    return [line for line in MLFLOW_IGNORES if line not in held]


def _append_ignores(path: Path, lines: list[str]) -> None:
    # appended, never rewritten: the user's lines stay as they are, byte for byte
    existing = path.read_bytes() if path.exists() else b""
    prefix = "" if not existing or existing.endswith(b"\n") else "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(prefix + "\n".join([_IGNORE_HEAD, *lines]) + "\n")


def init(directory: str | Path, recipe_data: dict[str, Any], *, force: bool = False,
         tracking: bool = True) -> Started:
    """Write the starter files into ``directory`` (and, with ``tracking``, the missing MLflow
    lines of its ``.gitignore``); returns what was done."""
    root = Path(directory)
    if not root.is_dir():
        raise InvalidInput(f"{root} is not a directory: give the experiment's directory (default: here)")
    if not os.access(root, os.W_OK):
        raise InvalidInput(f"cannot write into {root} (no write permission); nothing was written")
    existing = [name for name in FILES if (root / name).exists()]
    if existing and not force:
        raise InvalidInput(f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''} in {root}; "
                           "nothing was written (pass --force to replace them)")
    mutable = dict(recipe_data.get("mutable") or {})
    recipe = recipes.from_data(recipe_data, "repro500 init")  # the recipe repro500 run will read: checked now
    spec = command.CommandSpec.from_recipe(recipe.fixed, recipe.metrics, recipe.mutable, source="repro500 init",
                                           base=root.resolve())
    # the program is found, regexes compile, inputs exist; an MLflow metric needs tracking
    command.check(spec, tracking=tracking)
    result = Started(written=[], tracking=tracking)
    literal = []
    for raw in recipe.fixed.get("inputs") or []:
        dep, why = input_dep(raw, mutable)
        if dep is None:
            result.inputs_not_deps[raw] = why
        else:
            result.inputs_as_deps[raw] = dep
            if "${" not in dep:
                literal.append((root / dep).resolve())
    store = set(MLFLOW_IGNORES)
    deps = [f for f in source.candidates(root, exclude=[root / "runs", root / "metrics", root / dvcfile.PLOTS, *literal])
            if f not in FILES and f != "dvc.lock" and f not in store]
    deps = list(dict.fromkeys([*deps, *result.inputs_as_deps.values()]))
    params = {"run": {"repeats": recipe_data.get("repeats", 3), "seed": recipe_data.get("seed", 0),
                      "tracking": tracking, "mutable": mutable}}
    texts = {
        "repro500.yaml": "# Written by repro500 init: your experiment as a repro500 recipe (docs/command.md).\n"
                         + yaml.safe_dump(recipe_data, sort_keys=False, width=110),
        layout.PUBLICATION_PARAMS: "# Applied by repro500 run --params (docs/dvc.md); vary with dvc exp run -S run.mutable.KEY=V.\n"
                       + yaml.safe_dump(params, sort_keys=False, width=110),
        layout.DVC_FILE: _dvc_yaml(deps, list(recipe.acceptance) or list(recipe.metrics)),
    }
    gitignore = root / ".gitignore"
    missing = _missing_ignores(gitignore) if tracking else []
    if missing and gitignore.exists() and not os.access(gitignore, os.W_OK):
        raise InvalidInput(f"cannot append to {gitignore} (no write permission); nothing was written")
    name = FILES[0]
    try:
        for name, text in texts.items():
            atomic.write_text(root / name, text)
            result.written.append(root / name)
        if missing:
            name = ".gitignore"
            _append_ignores(gitignore, missing)
            result.gitignore, result.ignored = gitignore, missing
    except OSError as err:
        raise InvalidInput(f"cannot write {root / name} ({err.strerror or err}); give a directory you can write to") from None
    return result
