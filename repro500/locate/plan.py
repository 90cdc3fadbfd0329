"""What ``repro500 locate`` replays: the runs it opens, the pair of repeats, and the step the replays
stop at (the first step the records part at, :mod:`repro500.verify.divergence`)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro500.capture.seeds import pair_repeats
from repro500.errors import InvalidInput, UsageError
from repro500.rundir import ownership
from repro500.rundir.excluded import opened_run
from repro500.verify import integrity
from repro500.verify.divergence import (
    REL_TOL,
    PairDivergence,
    compare_pair,
    explain_operator,
    pairs_within,
    read_records,
)
from repro500.verify.rundir import RunData


@dataclass
class LocatePlan:
    """What ``repro500 locate`` replays: one repeat of each run, up to the step the records part at."""

    a: RunData
    b: RunData
    k: int
    j: int
    same_run: bool
    pair: PairDivergence
    steps: int | None  # the bound of the replays; None: nothing to replay (see reason)
    reason: str

    def explain(self, finding: dict[str, Any]) -> dict[str, Any]:
        """What the first operator the replays part at points at, and the recorded difference that
        fits (:func:`repro500.verify.divergence.explain_operator`)."""
        return explain_operator(finding, self.a, self.k, None if self.same_run else self.b, self.j)


def choose_pair(a: RunData, b: RunData, same_run: bool, repeat: int | None, other_repeat: int | None) -> tuple[int, int]:
    """The repeats to compare: as given, else the first pair that received the same seeds
    (:func:`~repro500.capture.seeds.pair_repeats`; a same-seed pair of one run when A and B are one run)."""
    for name, value, run in (("--repeat", repeat, a), ("--other-repeat", other_repeat, b)):
        if value is not None and value not in run.completed:
            raise UsageError(f"{name} {value}: {run.path} has no completed repeat {value} (completed: "
                             f"{', '.join(map(str, run.completed)) or 'none'})")
    if repeat is not None and other_repeat is not None:
        if same_run and repeat == other_repeat:
            raise UsageError("--repeat and --other-repeat name the same repeat of one run: give two repeats")
        return repeat, other_repeat
    pairs = pairs_within(a) if same_run else pair_repeats(a, b)[0]
    pairs = [(k, j) for k, j in pairs if (repeat is None or k == repeat) and (other_repeat is None or j == other_repeat)]
    if not pairs:
        which = "two of its repeats" if same_run else "a repeat of each"
        raise InvalidInput(f"no {which} share a seed: a replay from a common seed needs one (repro500 run "
                           "--same-seed; or name the repeats with --repeat and --other-repeat)")
    return pairs[0]


def plan_locate(a: RunData, b: RunData, *, same_run: bool, repeat: int | None = None, other_repeat: int | None = None,
                steps: int | None = None, rtol: float = REL_TOL) -> LocatePlan:
    """The pair, and the step the replays stop at: the first step the records part at (the epoch's
    last step when they part in its last update); nothing to replay when they do not part, or part
    only in the evaluation (unless *steps* is given)."""
    k, j = choose_pair(a, b, same_run, repeat, other_repeat)
    other = None if same_run else b
    pair = compare_pair(a, k, other, j, read_records(a.path, k, a.recipe), read_records(b.path, j, b.recipe or a.recipe),
                        reference_manifest=None if same_run else b.provenance_manifest, rtol=rtol)
    bound: int | None
    if pair.shape in ("first step", "epoch boundary", "within training", "length"):
        bound, reason = pair.first_step, pair.detail
    elif pair.shape == "last update":
        records = read_records(a.path, k, a.recipe)
        ends = [s["step"] for s in records.steps if s["epoch"] == pair.params_epoch] if isinstance(
            pair.params_epoch, int) else [s["step"] for s in records.steps]
        bound, reason = (max(ends) if ends else None), pair.detail
    else:
        bound, reason = None, pair.detail
    if steps is not None:
        bound = steps
    return LocatePlan(a=a, b=b, k=k, j=j, same_run=same_run, pair=pair, steps=bound, reason=reason)


def open_run(path: str | Path, stack: contextlib.ExitStack, what: str) -> tuple[RunData, str]:
    """A run to locate in: a run directory, a packed run or a publication (unpacked for as long as
    *stack* lasts), checked as verify checks its own files; (its data, "run" | "bundle" | "publication")."""
    given = Path(path)
    if not given.exists():
        raise InvalidInput(f"{what} {given} does not exist: give a run directory, a packed run or a publication")
    opened = stack.enter_context(opened_run(given, "repro500-locate-run-"))
    kind, root = opened.kind, opened.root
    if kind == "run" and not given.is_dir():
        raise InvalidInput(f"{what} {given} is not a run directory, a packed run or a publication")
    check, run = integrity.check_run(root, label=what, deep=False)
    if run is None or not check.ok:
        shown = "; ".join(check.problems[:2]).replace(str(root), str(given))
        raise InvalidInput(f"{what} {given} is not what its run wrote: {shown}")
    # a run directory is one's own only when this machine's repro500 sealed it: one unpacked from
    # an archive (repro500 unpack), extracted or downloaded stays somebody else's
    return run, ownership.origin_of(root) if kind == "run" else kind
