"""What a run is verified against, and a sequential run's looks (``--until-decided``).

The verifier's modules (scipy) are imported only when a run has something to decide here: a
wrapped command's run must not wait for them (docs/command.md, "What wrapping costs").

Checked before anything is written: the reference is readable, there is something to decide
(an acceptance band, or a margin for the reference), and the design fits.  run.json records the
design (``design``) and the reference (``reference``), so a resume goes on deciding the same
question and ``verify`` re-derives where the run stopped (docs/verify.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repro500.errors import UsageError

DEFAULT_MAX_REPEATS = 10


def prepare(options: Any, recipe: Any) -> tuple[dict[str, Any] | None, dict[str, Any] | None, Any]:
    """(design, reference record, loaded reference) for a new run; UsageError / InvalidInput."""
    reference = loaded = None
    if options.against:
        from repro500.verify.reference import load_reference

        loaded = load_reference(options.against)
        reference = {"against": str(Path(options.against).resolve()), "margins": dict(options.margins)}
    if not options.until_decided:
        return None, reference, loaded
    from repro500.verify import sequential
    from repro500.verify.rundir import parse_acceptance

    criteria = parse_acceptance(recipe.acceptance, f"{recipe.source}: acceptance")
    # every recipe has an acceptance band (recipe.py): without a reference, the bands decide
    published_margins = loaded is not None and loaded.published is not None  # the file states its margins
    if loaded is not None and not published_margins and not options.margins \
            and not any(c.tolerance > 0 for c in criteria):
        raise UsageError("--until-decided --against REF needs an equivalence margin: pass --margin METRIC=DELTA "
                         "(or give the recipe's acceptance a tolerance)")
    # the reference's own repeats bound what more run repeats can learn (sequential.nominal_levels)
    counts = [len(v) for v in (loaded.values if loaded is not None else {}).values() if len(v) > 1]
    design = sequential.design(recipe.repeats, 0.05, options.spending, min(counts) if counts else None)
    design["decided_on"] = "against" if loaded is not None else "bands"
    return design, reference, loaded


def reload(meta: dict[str, Any]) -> Any:
    """The reference a resumed run was verified against (None when it had none)."""
    record = meta.get("reference") or {}
    if not record.get("against"):
        return None
    from repro500.verify.reference import load_reference

    return load_reference(record["against"])


def look(session: Any, summaries: dict[int, dict[str, Any]]) -> bool:
    """After a repeat of a sequential run: test at this look's nominal level; True (and the
    stopping point recorded in run.json) when every decision is taken."""
    if (session.meta.get("design") or {}).get("kind") != "sequential":
        return False  # a fixed design: nothing to import
    from repro500.verify import sequential
    from repro500.verify.rundir import RunData, parse_acceptance

    design = session.meta["design"]

    done = {k: s for k, s in sorted(summaries.items()) if s.get("status") == "completed"}
    level = sequential.level_of(design, len(done))
    if level is None:
        return False
    run = RunData(path=session.run.path, summary={}, repeats=done,
                  acceptance=parse_acceptance(session.recipe.acceptance, "the recipe's acceptance"))
    margins = (session.meta.get("reference") or {}).get("margins") or None
    statuses = sequential.look(run, level, session.reference, margins)
    shown = ", ".join(f"{metric} {status}" for metric, status in statuses.items())
    session.console.print(f"look after {len(done)} repeats (nominal level {level:.3g}): {shown}")
    if not sequential.decided(statuses):
        return False
    design.update(stopped_at=len(done), decision=statuses)
    session.run.write_meta(session.meta)
    session.console.print(f"[bold]Decided[/] after {len(done)} of up to {design['max_repeats']} repeats.")
    return True
