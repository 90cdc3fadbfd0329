"""``repro500 locate`` from Python: open the runs, plan the pair, ask consent, replay, explain.

The records say at which step two runs part (:mod:`repro500.verify.divergence`); the replays
(:mod:`repro500.workloads.trainer.replay`) say at which operator.  Both runs' own code runs only
with consent (:func:`repro500.untrusted.consent`), asked for both before either replay starts.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro500 import sandbox
from repro500.errors import EXIT_INCONCLUSIVE, EXIT_OK
from repro500.locate import environment
from repro500.locate.plan import LocatePlan, open_run, plan_locate
from repro500.rundir import layout
from repro500.untrusted import CODE_ENV, OWN_RUN, PACKED_RUN, consent, plain
from repro500.verify.divergence import REL_TOL
from repro500.verify.rundir import RunData
from repro500.workloads.trainer import replay


@dataclass
class Located:
    """What ``repro500 locate`` answers.  ``answer`` is what ``--json`` prints (the runs and repeats,
    the records' answer, and where the replays ran, the first operator and its cause); ``plan`` is
    the pair the records compared (its runs' files, unpacked from an archive, are gone by now)."""

    answer: dict[str, Any]
    plan: LocatePlan

    @property
    def exit_code(self) -> int:
        """0 located, or nothing to locate; 3 the replays do not part where the records do."""
        finding = self.answer.get("operator")
        return EXIT_INCONCLUSIVE if finding is not None and not finding["found"] and self.plan.pair.diverged \
            else EXIT_OK


def locate(a: str | Path, b: str | Path | None = None, *, repeat: int | None = None,
           other_repeat: int | None = None, steps: int | None = None, rtol: float | None = None,
           python_a: str | None = None, python_b: str | None = None, run_code: bool = False,
           timeout_s: float = 600.0, progress: Callable[[str], None] = lambda _line: None,
           no_sandbox: bool = False, network: bool = False, sandbox_ro: list[str] | None = None) -> Located:
    """Where runs *a* and *b* (with *b* None: two same-seed repeats of *a*) part: the first step, the
    first operator, and the likely cause.  The options are ``repro500 locate``'s (docs/verify.md,
    "The first operator"); ``progress`` gets a line a step once no refusal can follow (the records'
    answer, then the replays it starts)."""
    a, b = Path(a), Path(b) if b is not None else None
    choice = sandbox.choose(run_code, no_sandbox, network, sandbox_ro or [])
    with contextlib.ExitStack() as stack:
        run_a, kind_a = open_run(a, stack, "A")
        same = b is None or (b.exists() and a.exists() and b.resolve() == a.resolve())
        run_b, kind_b = (run_a, kind_a) if same or b is None else open_run(b, stack, "B")
        plan = plan_locate(run_a, run_b, same_run=same, repeat=repeat, other_repeat=other_repeat,
                           steps=steps, rtol=rtol if rtol is not None else REL_TOL)
        answer: dict[str, Any] = {"a": {"run": str(a), "repeat": plan.k}, "b": {"run": str(b or a), "repeat": plan.j},
                                  "records": plan.pair.to_dict(), "steps": plan.steps}
        if plan.steps is None:
            answer.update(operator=None, cause=None, located=False, note=plan.reason)
            return Located(answer, plan)
        pairs = (("A", a, run_a, kind_a, plan.k, python_a), ("B", b or a, run_b, kind_b, plan.j, python_b))
        # both asked before either replay starts: a refusal leaves nothing run
        allowed = {label: _consent(run, kind, given, label, run_code) for label, given, run, kind, *_ in pairs}
        # the records are read in a moment, the replays take a minute or more: said a line a step,
        # once no refusal can follow, so the wait is not silence
        progress(f"records: {plan.pair.detail}")
        progress(f"replaying repeat {plan.k} of A and repeat {plan.j} of B up to step {plan.steps}, "
                 "each in a process of its own under the operator-hashing mode")
        sides = []
        for label, _, run, kind, k, python in pairs:
            env = environment.replay_environment(run, dict(os.environ))
            if not allowed[label]:
                env[CODE_ENV] = "refuse"  # nothing of the run's own may be imported, whatever its recipe says
            # a venv reproduce --env venv rebuilt runs its own replay: for a run of this machine's, or with
            # consent (a packed run's record could name one built for another publication)
            rebuilt = environment.own_interpreter(run) if kind == OWN_RUN or run_code else None
            side = replay.Side(run_dir=run.path, repeat=k, env=env, python=python or rebuilt or sys.executable,
                               label=label)
            # the run's own code, consented to, replays in the sandbox (an own run's needs no consent)
            side.grants = environment.replay_grants(run, side, choice) if allowed[label] and kind != OWN_RUN else None
            if allowed[label] and kind != OWN_RUN:
                progress(f"replay of {label}: {sandbox.plan_line(side.grants)}")
            sides.append(side)
        finding = replay.locate_operator(sides[0], sides[1], plan.steps, timeout_s=timeout_s).to_dict()
        answer["environments"] = {s.label: {k: v for k, v in s.env.items() if k != CODE_ENV} for s in sides}
        answer["sandbox"] = {s.label: sandbox.record(s.grants, os.environ, consent=choice.consent) for s in sides}
        answer["environments_not_set"] = {label: environment.replay_env_not_set(run)
                                          for label, _, run, *_ in pairs if environment.replay_env_not_set(run)}
        answer["interpreters"] = {}
        for side, run in zip(sides, (run_a, run_b), strict=True):
            recorded, version = environment.recorded_interpreter(run)
            answer["interpreters"][side.label] = {"recorded": recorded, "recorded_version": version,
                                                  "replayed": side.python}
        answer["operator"] = finding
        answer["cause"] = plan.explain(finding)
        answer["located"] = bool(finding["found"])
        return Located(answer, plan)


def _consent(run: RunData, kind: str, given: Path, label: str, run_code: bool) -> bool:
    """Whether the replay of *run* may import its own code (see repro500.untrusted.consent)."""
    try:
        code = layout.own_code(run.path)
    except FileNotFoundError:
        code = None  # no recipe: the replay refuses the run with a sentence of its own
    if code is None:
        return consent(run_code, None, origin=kind)
    where = f"repro500 unpack {plain(given)}: its source/" if kind == PACKED_RUN else "its source/"
    return consent(run_code, f"{plain(given)} ({label}) runs its own code in its replay ({layout.own_code_said(code)})",
                   origin=kind, review=f"it ({where})")
