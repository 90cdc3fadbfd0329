"""``repro500 init``: put a user's own experiment under repro500 and DVC in their repository.

Writes three files next to the experiment (docs/command.md, "Your repository as a DVC
pipeline"):

- ``repro500.yaml``: a command recipe for the user's program, with the ``--metric`` and
  ``--accept`` declarations and the ``--set`` mutable values it was given;
- ``params.yaml``: the ``run`` section ``repro500 run --params`` applies (repeats, seed and
  the mutable values), which ``dvc exp run -S run.mutable.KEY=VALUE`` varies;
- ``dvc.yaml``: stages ``run`` (``repro500 run``, the experiment's source files as
  dependencies) and ``verify`` (the verdict as a DVC metric).

Nothing is written when any of the three exists (unless ``force``), and everything is
checked first: the recipe is validated exactly as ``repro500 run`` would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from repro500 import atomic
from repro500 import recipe as recipes
from repro500.errors import InvalidInput

FILES = ("repro500.yaml", "params.yaml", "dvc.yaml")
RUN_DIR = "runs/dvc/experiment"
METRICS = "metrics/verdict.json"
# A FAIL (1) or INCONCLUSIVE (3) verdict is a result: the stage succeeds and the verdict is the metric.
_RESULT_OK = "|| test $? -eq 1 -o $? -eq 3"


def _dvc_yaml(deps: list[str]) -> str:
    stages = {
        "run": {
            "desc": "Repeated runs of the experiment with full provenance (repro500 run)",
            "cmd": f"repro500 run repro500.yaml --params params.yaml --out runs/dvc --run-id experiment "
                   f"--no-tracking {_RESULT_OK}",
            "deps": ["repro500.yaml", *deps],
            "params": ["run"],
            "outs": [RUN_DIR],
        },
        "verify": {
            "desc": "Statistical verdict on the recipe's acceptance criteria, as DVC metrics",
            "cmd": f"repro500 verify {RUN_DIR} --no-write --metrics {METRICS} {_RESULT_OK}",
            "deps": [RUN_DIR],
            "metrics": [{METRICS: {"cache": False}}],
        },
    }
    head = ("# Written by repro500 init (docs/command.md). dvc repro runs the experiment through repro500;\n"
            "# dvc exp run -S run.mutable.KEY=VALUE varies a mutable value; dvc metrics show prints the verdict.\n")
    return head + yaml.safe_dump({"stages": stages}, sort_keys=False, width=110)


def init(directory: str | Path, recipe_data: dict[str, Any], *, force: bool = False) -> list[Path]:
    """Write the starter files into ``directory``; returns their paths."""
    from repro500.capture import source

    root = Path(directory)
    if not root.is_dir():
        raise InvalidInput(f"{root} is not a directory: give the experiment's directory (default: here)")
    import os

    if not os.access(root, os.W_OK):
        raise InvalidInput(f"cannot write into {root} (no write permission); nothing was written")
    existing = [name for name in FILES if (root / name).exists()]
    if existing and not force:
        raise InvalidInput(f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''} in {root}; "
                           "nothing was written (pass --force to replace them)")
    mutable = dict(recipe_data.get("mutable") or {})
    recipe = recipes.from_data(recipe_data, "repro500 init")  # the recipe repro500 run will read: checked now
    from repro500.workloads import command

    spec = command.CommandSpec.from_recipe(recipe.fixed, recipe.metrics, recipe.mutable, source="repro500 init",
                                           base=root.resolve())
    command.check(spec, tracking=False)  # the program is found, regexes compile: before anything is written
    deps = [f for f in source.candidates(root, exclude=[root / "runs", root / "metrics"])
            if f not in FILES and f != "dvc.lock"]
    params = {"run": {"repeats": recipe_data.get("repeats", 3), "seed": recipe_data.get("seed", 0), "mutable": mutable}}
    texts = {
        "repro500.yaml": "# Written by repro500 init: your experiment as a repro500 recipe (docs/command.md).\n"
                         + yaml.safe_dump(recipe_data, sort_keys=False, width=110),
        "params.yaml": "# Applied by repro500 run --params (docs/recipes.md); vary with dvc exp run -S run.mutable.KEY=V.\n"
                       + yaml.safe_dump(params, sort_keys=False, width=110),
        "dvc.yaml": _dvc_yaml(deps),
    }
    written = []
    try:
        for name, text in texts.items():
            atomic.write_text(root / name, text)
            written.append(root / name)
    except OSError as err:
        raise InvalidInput(f"cannot write {root / name} ({err.strerror or err}); give a directory you can write to") from None
    return written
