"""What a run is verified against, and a sequential run's looks (``--until-decided``).

The verifier's modules (scipy; the reference and history readers) are imported only when a run
has something to decide here: a wrapped command's run must not wait for them (docs/command.md,
"What it costs").

Checked before anything is written: the reference is readable, there is something to decide
(an acceptance band, or a margin for the reference), and the design fits.  run.json records the
design (``design``) and the reference (``reference``), so a resume goes on deciding the same
question and ``verify`` re-derives where the run stopped (docs/verify.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repro500.errors import UsageError
from repro500.runner.plan import DEFAULT_MAX_REPEATS
from repro500.statuses import DEFAULT_ALPHA, REPEAT_COMPLETED


def _same_benchmark(recipe: Any, loaded: Any, against: str) -> None:
    """Refuse, before anything runs, a reference of another benchmark than the recipe as it will
    run (the verdict at the end would refuse it: verify's rule, verify/reference.py)."""
    if getattr(loaded, "benchmark", None) is None:
        return
    from repro500.verify.reference import Benchmark, benchmark_difference, refuse_across

    overridden = {str(k): v for k, v in (recipe.overrides or {}).items() if str(k).startswith("fixed.")}
    mine = Benchmark(recipe=recipe.name, fixed=recipe.fixed, overridden=overridden)
    difference = benchmark_difference(mine, loaded.benchmark)
    if difference and loaded.benchmark.data:  # a data path renamed: its bytes decide, as verify's will
        mine.data.update(_digests(recipe.fixed))
        difference = benchmark_difference(mine, loaded.benchmark)
    if difference:
        refused = refuse_across(difference, against)
        raise type(refused)(str(refused).replace("pass --across-benchmarks to compare anyway",
                                                 "run without --against and verify with --across-benchmarks"))


def _digests(fixed: Any) -> dict[str, str]:
    """path -> md5 of the files the recipe's fixed part names that exist here (the digest cache
    makes the data facet's hashing of them later a lookup)."""
    import posixpath

    from repro500.capture.data import digest_paths

    def strings(value: Any) -> list[str]:
        if isinstance(value, dict):
            return [s for item in value.values() for s in strings(item)]
        return [value] if isinstance(value, str) else []

    paths = [p for p in dict.fromkeys(strings(fixed)) if Path(p).is_file()]
    return {posixpath.normpath(e["path"]): e["md5"] for e in digest_paths(paths) if e.get("md5")} if paths else {}


def prepare(options: Any, recipe: Any) -> tuple[dict[str, Any] | None, dict[str, Any] | None, Any]:
    """(design, reference record, loaded reference) for a new run; UsageError / InvalidInput."""
    reference = loaded = None
    if options.against and str(options.against).startswith("history:"):
        return None, history_reference(options), None
    if options.against:
        from repro500.verify.reference import load_reference

        loaded = load_reference(options.against)
        reference = {"against": str(Path(options.against).resolve()), "margins": dict(options.margins)}
    if not options.until_decided:
        _same_benchmark(recipe, loaded, str(options.against))
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
    if options.max_repeats is None:  # as many as the requested power needs, when the reference says
        planned, how = planned_max(loaded, criteria, options.margins, options.spending)
        if planned is not None:
            recipe.repeats = planned
            recipe.overrides["repeats"] = planned
    else:
        how = {"from": "--max-repeats"}
    # the reference's own repeats bound what more run repeats can learn (sequential.nominal_levels)
    counts = [len(v) for v in (loaded.values if loaded is not None else {}).values() if len(v) > 1]
    design = sequential.design(recipe.repeats, DEFAULT_ALPHA, options.spending, min(counts) if counts else None)
    design["decided_on"] = "against" if loaded is not None else "bands"
    design["max_repeats_from"] = how
    if loaded is not None:  # after the usage errors above: a wrong option is said first
        _same_benchmark(recipe, loaded, str(options.against))
    return design, reference, loaded


def history_reference(options: Any) -> dict[str, Any]:
    """``--against history:SOURCE``: the run is verified against its history once it ends (which
    earlier runs count depends on this run's own system and recipe, known only then).  The source
    must exist now; a directory is recorded by its absolute path, so a resume finds it."""
    from repro500.verify import history

    spec = str(options.against)[len(history.PREFIX):]
    if options.until_decided:
        raise UsageError(f"--until-decided looks at a fixed reference (a run, a packed run or a published file), but "
                         f"the earlier runs {options.against} holds are chosen by this run's system and recipe, "
                         f"known only once it has run: drop --until-decided (the run is then verified against the "
                         f"history at its end), or give one earlier run as --against")
    if not spec:
        raise UsageError("--against history: names no history: give history:DIR (a directory of runs), "
                         "history:EXPERIMENT (an MLflow experiment) or history:mlflow:FILTER")
    history.locate(spec)  # InvalidInput / UsageError now, before anything is written
    where = str(Path(spec).resolve()) if not spec.startswith(history.MLFLOW_FILTER) and Path(spec).is_dir() else spec
    return {"against": history.PREFIX + where, "margins": dict(options.margins)}


def planned_max(loaded: Any, criteria: list[Any], margins: dict[str, float],
                spending: str) -> tuple[int | None, dict[str, Any]]:
    """``--max-repeats`` for a sequential run that gave none: the most any compared metric needs
    for the default power to decide, if the rerun truly matches the reference, with the
    reference's spread as the truth (verify/sequential_plan.py, as ``repro500 plan``); None (and
    why, for the default) when the reference gives no spread to plan from."""
    from repro500.verify import sequential, sequential_plan, stats

    default = {"from": "default", "max_repeats": DEFAULT_MAX_REPEATS}
    if loaded is None:
        return None, {**default, "why": "the bands decide, and before the first repeat no spread is known"}
    wanted: dict[str, tuple[float, str]] = {}  # metric -> (margin, test), as equivalence.compare chooses them
    if loaded.published is not None:
        for name, metric in loaded.published.metrics.items():
            wanted[name] = (margins.get(name, metric.margin), metric.test)
    else:
        wanted.update({c.metric: (c.tolerance, "equivalence") for c in criteria if c.tolerance > 0})
        wanted.update({name: (m, "equivalence") for name, m in margins.items()})
    needs: dict[str, Any] = {}
    for name, (margin, test) in wanted.items():
        values = [float(v) for v in loaded.values.get(name) or []]
        if len(values) < 2:
            return None, {**default, "why": f"the reference gives one value of {name}, no spread to plan from"}
        sd = float(stats.describe(values, DEFAULT_ALPHA)["std"])
        if sd == 0.0:  # zero spread: decided exactly at the first look
            needs[name] = {"max_repeats": sequential.MIN_REPEATS, "sd": 0.0, "reference_repeats": len(values)}
            continue
        question, effect = ("equivalence", 0.0) if test == "equivalence" else ("one-sided", margin / sd)
        plan = sequential_plan.plan(effect, margin / sd, len(values), stats.DEFAULT_POWER, 0.05, spending, question)
        if plan.max_repeats is None:
            return None, {**default, "why": f"{name}: {plan.reason}"}
        needs[name] = {"max_repeats": plan.max_repeats, "sd": sd, "reference_repeats": len(values),
                       "expected_repeats": plan.expected_repeats}
    if not needs:
        return None, {**default, "why": "no compared metric"}
    top = max(v["max_repeats"] for v in needs.values())
    return top, {"from": "planned", "max_repeats": top, "power": stats.DEFAULT_POWER, "metrics": needs}


def describe_max(design: dict[str, Any]) -> str:
    """The line a sequential run prints about where its maximum came from."""
    how = design.get("max_repeats_from") or {}
    if how.get("from") == "planned":
        per = ", ".join(f"{name} needs {v['max_repeats']} (reference sd {v['sd']:.4g} over {v['reference_repeats']} "
                        f"repeats)" for name, v in how["metrics"].items())
        return (f"--max-repeats not given: up to {design['max_repeats']} repeats, planned for {how['power']:.0%} power "
                f"to decide if the rerun matches the reference ({per}; repro500 plan)")
    if how.get("from") == "default":
        return (f"--max-repeats not given: up to {design['max_repeats']} repeats, the default, since no plan could "
                f"be made ({how.get('why')}); `repro500 plan` says how many a decision needs")
    return f"up to {design['max_repeats']} repeats (--max-repeats)"


def reload(meta: dict[str, Any]) -> Any:
    """The reference a resumed run was verified against (None when it had none)."""
    record = meta.get("reference") or {}
    if not record.get("against") or str(record["against"]).startswith("history:"):
        return None  # a history is read once the run ends (verify_run), never at a look
    from repro500.verify.reference import load_reference

    return load_reference(record["against"])


def in_batches(design: dict[str, Any], batch: int) -> dict[str, Any]:
    """A sequential design whose repeats run *batch* at a time: looked at after each batch, its
    nominal levels calibrated for those looks (verify/sequential.py)."""
    from repro500.verify import sequential

    return sequential.in_batches(design, batch)


def next_look(session: Any, done: int) -> int | None:
    """How many repeats a sequential run may have finished or running before its next look
    (None: a fixed design runs them all)."""
    design = session.meta.get("design") or {}
    if design.get("kind") != "sequential":
        return None
    from repro500.verify import sequential

    return sequential.next_look(design, done)


def look(session: Any, summaries: dict[int, dict[str, Any]]) -> bool:
    """After a repeat of a sequential run: test at this look's nominal level; True (and the
    stopping point recorded in run.json) when every decision is taken."""
    if (session.meta.get("design") or {}).get("kind") != "sequential":
        return False  # a fixed design: nothing to import
    from repro500.verify import sequential
    from repro500.verify.rundir import RunData, parse_acceptance

    design = session.meta["design"]

    done = {k: s for k, s in sorted(summaries.items()) if s.get("status") == REPEAT_COMPLETED}
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
