"""The record fuzzer: one field of a genuine run, packed run or publication set to a hostile value,
re-sealed as a publisher can, and one command run on it under CPU-time, memory and wall limits.

The catalogue and the invariants are in tests/helpers/hostile.py.  Every case must keep them: no
planted module runs, nothing written outside the case's directory, the limits hold, an exit code
from the documented set and no traceback, no raw control character and no line a payload starts,
and a REPRODUCED/PASS line only as a verdict's first line with exit 0.

``make test`` runs a fixed-seed slice (REPRO500_FUZZ_EXAMPLES, default 6: about a minute here);
``make fuzz`` runs it longer with a random seed and prints every case it tried.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import hostile
from helpers.runs import repro500
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("REPRO500_FUZZ_EXAMPLES", "6"))
LONG = "REPRO500_FUZZ_EXAMPLES" in os.environ  # make fuzz: a random seed, every case printed
FUZZED = hostile.FIELDS + hostile.LINKS
ALL_VALUES = [v for values in hostile.KINDS.values() for v in values]
PLANTED = "from pathlib import Path\nPath({marker!r}).write_text('ran')\ndef build(*a, **k):\n    raise SystemExit(9)\n"
_counter = itertools.count()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A genuine command run (two same-seed repeats), its copy as the reference, its publication;
    a planted module beside each, and the marker it would write."""
    root = tmp_path_factory.mktemp("fuzz")
    (root / "train.py").write_text("print('acc 0.91')\n")
    done = repro500("run", "--command", "--metric", "accuracy=regex:acc ([0-9.]+)", "--accept", "accuracy>=0.5",
                    "--repeats", "2", "--same-seed", "--no-tracking", "--out", "runs", "--run-id", "run", "--",
                    sys.executable, "train.py", cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    done = repro500("publish", "runs/run", "--out", "pub", "--citation", "Fuzz 2026", "--margin", "accuracy=0.01",
                    cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    shutil.copytree(root / "runs" / "run", root / "ref")
    marker = root / hostile.MARKER
    for where in (root, root / "runs" / "run", root / "pub"):
        (where / "evil.py").write_text(PLANTED.format(marker=str(marker)))
    (root / "cases").mkdir()
    return {"root": root, "run": root / "runs" / "run", "ref": root / "ref", "pub": root / "pub", "marker": marker}


def _values(field: hostile.Field) -> st.SearchStrategy[Any]:
    if field.kind == "link":
        return st.none()
    return st.one_of(st.sampled_from(hostile.KINDS[field.kind]), st.sampled_from(ALL_VALUES))


@st.composite
def cases(draw: st.DrawFn) -> tuple[hostile.Field, Any, list[str]]:
    field = draw(st.sampled_from(FUZZED))
    return field, draw(_values(field)), draw(st.sampled_from(hostile.COMMANDS[field.form]))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check(base: dict[str, Path], field: hostile.Field, value: Any, argv: list[str]) -> None:
    """Build the case, run its command, and assert every invariant."""
    before = hostile.snapshot(base["root"] / "runs") | hostile.snapshot(base["pub"])
    case_dir = base["root"] / "cases" / str(next(_counter))
    case_dir.mkdir()
    (case_dir / "evil.py").write_text(PLANTED.format(marker=str(base["marker"])))
    names = hostile.build(case_dir, base, field, value)
    command = [part.format(**names) for part in argv]
    done = hostile.run_command(command, case_dir)
    problem = hostile.broken(done, base["marker"], verdict=argv[0] == "verify")
    if problem is None and done is not None and done.returncode == 0 and "--against" in argv \
            and field.file == "published.yaml" and field.keys[-1:] == ("values",):
        # no hostile value is the published [0.91, 0.91]: REPRODUCED would be read from nowhere
        problem = "REPRODUCED against published values that are not the run's numbers"
    outcome = "past the wall limit" if done is None else f"exit {done.returncode}"
    if LONG:
        print(f"fuzz: {field} = {_shown(value)} | repro500 {' '.join(argv)} -> {outcome}"
              + (f"  BROKEN: {problem}" if problem else ""), flush=True)
    after = hostile.snapshot(base["root"] / "runs") | hostile.snapshot(base["pub"])
    assert after == before, f"{field} = {_shown(value)}: repro500 {' '.join(argv)} wrote outside its directory"
    assert problem is None, f"{field} = {_shown(value)}: repro500 {' '.join(argv)}: {problem}"
    shutil.rmtree(case_dir, ignore_errors=True)


@settings(max_examples=EXAMPLES, derandomize=not LONG, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(case=cases())
def test_no_hostile_field_breaks_an_invariant(base: dict[str, Path], case: tuple[hostile.Field, Any, list[str]]) -> None:
    _check(base, *case)


# The known attacks, one case each, whatever the slice draws (test_record_bounds.py has the rest):
# a catastrophic pattern in a packed run, records of another shape (the fuzzer's finds: run.json's
# design, inputs.json's observed, a data entry's path), terminal escapes in a run id, a node count, a planted plug-in named by a
# publication's recipe, a forged verdict moved to a line's start by the console's wrapping (a find too).
KNOWN = [
    (hostile.Field("packed", "recipe.yaml", ("metrics", "accuracy", "regex"), "pattern"), hostile.PATTERNS[0],
     ["verify", "{packed}"]),
    (hostile.Field("run", "run.json", ("design",), "count"), 10**9, ["verify", "{run}", "--no-write"]),
    (hostile.Field("run", "inputs.json", ("*",), "path"), "/etc/hostname", ["diff", "{run}", "{ref}"]),
    (hostile.Field("packed", "manifest.json", ("facets", "data", "entries", 0, "path"), "path"),
     [sys.executable, "evil.py"], ["report", "{packed}"]),
    (hostile.Field("run", "run.json", ("run_id",), "string"), hostile.STRINGS[1], ["history", "{runs}", "accuracy"]),
    (hostile.Field("publication", "recipe.yaml", ("fixed", "model"), "string"), "evil:build",
     ["reproduce", "{pub}", "--out", "rerun"]),
    # a node count the rerun would ask SLURM for, from the packed run's run.json
    (hostile.Field("publication", "archive/run.json", ("nnodes",), "count"), 2**63,
     ["reproduce", "{pub}", "--out", "rerun"]),
    # a value whose words land the forged verdict where the terminal's width wrapped the line
    (hostile.Field("publication", "archive/recipe.yaml", ("fixed", "command"), "path"), hostile.STRINGS[0],
     ["verify", "{ref}", "--against", "{pub}/published.yaml", "--no-write"]),
]


@pytest.mark.parametrize("field,value,argv", KNOWN, ids=[f"{c[0]}" for c in KNOWN])
def test_the_known_attacks_keep_every_invariant(base: dict[str, Path], field: hostile.Field, value: Any,
                                               argv: list[str]) -> None:
    _check(base, field, value, argv)

