"""The verdict: every section of ``repro500 verify`` joined into one status and exit code.

Sections (docs/verify.md): integrity, bands, statistics, equivalence, time-to-train,
determinism, provenance diff, Valid FLOPS.  How they combine:

* any integrity problem (run or reference)  -> INVALID (exit 4); nothing else is decided;
* without a reference, the **bands** and **determinism** decide: any FAIL -> FAIL (1),
  else any INCONCLUSIVE -> INCONCLUSIVE (3), else PASS (0); a band cannot PASS while any
  repeat diverged, failed or was killed (docs/verify.md, "Bands");
* with a reference, **equivalence**, **determinism** and the **time-to-train**
  convergence check decide the same way, reported as REPRODUCED / NOT REPRODUCED /
  INCONCLUSIVE; the bands are still shown;
* against a history (``history:SOURCE``, verify/history.py) each compared metric is a
  regression (FAIL), inconclusive, equivalent or an improvement (PASS), reported as PASS / FAIL /
  INCONCLUSIVE: an improvement is no failure to reproduce;
* a run and a reference of different benchmarks (verify/reference.py, ``benchmark_difference``)
  are not compared: InvalidInput (exit 4) names both, unless ``across_benchmarks`` is given, when
  the verdict is decided as usual and its status line says "(different benchmark: X vs Y)";
* against a reference run (or a publication's packed run), an **exact replay** (every rerun
  repeat records the same metrics as the reference repeat of its seed, times and rates aside,
  and ends with the same final parameters, bit for bit, where both record a digest, and the same
  declared outputs where both declare some) is the strongest outcome: REPRODUCED (exact),
  whatever the number of repeats, unless something decided FAIL; the statistical outcome stays as
  the second reason; identical parameters with different metrics are named, and the statistics
  decide;
* where the rerun's repeats share seeds with the reference's, equivalence is tested on the
  per-seed differences (a paired design), else on the two samples (Welch); each equivalence
  result says which, and why (``tost.design``, ``tost.design_reason``);
* a run that stopped before every planned repeat ran (run.json says so) cannot PASS or be
  REPRODUCED: its missing repeats make it INCONCLUSIVE;
* determinism and time-to-train only count when they could run (SKIPPED is neutral;
  an inconclusive convergence check is a note, not a block);
* so a run with no acceptance criteria and no reference is decided by determinism alone
  when repeats share a seed: identical parameters -> PASS (0), a divergence -> FAIL (1);
  the advice then says that no result was checked against a band;
* nothing to decide (no acceptance criteria, no reference, determinism SKIPPED) -> INCONCLUSIVE.

Statistics, provenance, Valid FLOPS and where same-seed runs part (divergence) are information,
never a cause.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from repro500 import __version__
from repro500.errors import InvalidInput, UsageError
from repro500.mlperf.compliance import check_mlperf
from repro500.rundir import atomic, layout
from repro500.rundir.excluded import opened_run
from repro500.statuses import (
    DEFAULT_ALPHA,
    EXIT_CODES,
    FAIL,
    INCONCLUSIVE,
    INVALID,
    NOT_REPRODUCED,
    PASS,
    REPRODUCED,
    RUN_COMPLETED,
)
from repro500.verify import (
    check_comparison_options,
    divergence,
    equivalence,
    history,
    integrity,
    sequential,
    variance,
)
from repro500.verify.bands import BandResult, check_bands
from repro500.verify.determinism import (
    DeterminismResult,
    ExactReplay,
    check_determinism,
    compare_with_reference,
    replay_by_seed,
)
from repro500.verify.equivalence import EquivalenceResult
from repro500.verify.flops import FlopsResult, valid_flops
from repro500.verify.gains import compare_gains
from repro500.verify.integrity import IntegrityResult
from repro500.verify.provenance import ProvenanceResult, provenance_diff
from repro500.verify.reference import (
    Reference,
    benchmark_difference,
    benchmark_of_run,
    load_reference,
    refuse_across,
)
from repro500.verify.rundir import RunData
from repro500.verify.sampling import check_sampling
from repro500.verify.stats import describe
from repro500.verify.timing import TimingResult, check_time_to_train

SCHEMA = "repro500/verdict/v1"
VERDICT_NAME = layout.VERDICT


@dataclass
class Verdict:
    status: str
    alpha: float
    run_dir: str
    run_id: str | None = None
    reasons: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    against: dict[str, Any] | None = None
    margins: dict[str, float] = field(default_factory=dict)
    integrity: IntegrityResult | None = None
    reference_integrity: IntegrityResult | None = None
    statistics: dict[str, dict[str, Any]] = field(default_factory=dict)
    bands: list[BandResult] = field(default_factory=list)
    equivalence: list[EquivalenceResult] | None = None
    time_to_train: TimingResult | None = None
    determinism: DeterminismResult | None = None
    provenance: ProvenanceResult | None = None
    valid_flops: FlopsResult | None = None
    exact_replay: ExactReplay | None = None
    design: dict[str, Any] | None = None  # a sequential run's design and the look it stopped at
    variance: list[Any] | None = None  # a factorial run's decomposition (verify/variance.py)
    nodes: list[Any] | None = None  # the metrics split by the node each repeat ran on (verify/variance.py)
    sampling: Any = None  # sampling bias per repeat (verify/sampling.py): OK, WARN, or None when not recorded
    mlperf: Any = None  # the repeats' MLPerf logs under MLPerf's compliance checker (verify/mlperf.py)
    gains: dict[str, Any] | None = None  # throughput and Valid FLOPS against a reference run (verify/gains.py)
    different_benchmark: str | None = None  # "X vs Y" when compared across benchmarks (--across-benchmarks)
    divergence: Any = None  # where same-seed pairs part, step by step, and the likely cause (verify/divergence.py)
    created_utc: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    @property
    def exact(self) -> bool:
        """REPRODUCED by an exact replay (bitwise-identical parameters and identical recorded metrics,
        machine-dependent ones aside), not only statistically."""
        return self.status == REPRODUCED and self.exact_replay is not None and self.exact_replay.exact

    @property
    def headline(self) -> str:
        text = f"{self.status} (exact)" if self.exact else self.status
        if self.different_benchmark:
            text += f" (different benchmark: {self.different_benchmark})"
        return text

    def to_dict(self) -> dict[str, Any]:
        """The verdict.json document (schema ``repro500/verdict/v1``), NaN-free."""
        def section(obj: Any) -> Any:
            return None if obj is None else obj.to_dict()

        doc = {
            "schema": SCHEMA, "tool": {"name": "repro500", "version": __version__},
            "created_utc": self.created_utc, "run_dir": self.run_dir, "run_id": self.run_id,
            "status": self.status, "exact": self.exact, "exit_code": self.exit_code, "alpha": self.alpha,
            "margins": self.margins, "reasons": self.reasons, "advice": self.advice,
            "against": self.against, "integrity": section(self.integrity),
            "reference_integrity": section(self.reference_integrity),
            "statistics": self.statistics, "bands": [b.to_dict() for b in self.bands],
            "equivalence": None if self.equivalence is None else [e.to_dict() for e in self.equivalence],
            "time_to_train": section(self.time_to_train), "determinism": section(self.determinism),
            "provenance": section(self.provenance), "valid_flops": section(self.valid_flops),
            "exact_replay": section(self.exact_replay), "design": self.design,
            "variance": None if self.variance is None else [v.to_dict() for v in self.variance],
            "nodes": None if self.nodes is None else [n.to_dict() for n in self.nodes],
            "sampling": section(self.sampling), "mlperf": section(self.mlperf), "gains": self.gains,
            "different_benchmark": self.different_benchmark, "divergence": section(self.divergence),
        }
        return _clean(doc)


def _clean(value: Any) -> Any:
    """Plain JSON types only; any non-finite float becomes None (verdict.json is NaN-free)."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):  # numpy integers included
        return int(value)
    if isinstance(value, float) or hasattr(value, "__float__"):
        f = float(value)
        return f if math.isfinite(f) else None
    return str(value)


def write_verdict(verdict: Verdict, run_dir: str | Path) -> Path:
    """Write ``verdict.json`` into the run directory, atomically (not covered by SHA256SUMS)."""
    target = Path(run_dir) / VERDICT_NAME
    atomic.write_json(target, verdict.to_dict())
    return target


def verify_run(
    run_dir: str | Path,
    *,
    against: str | Path | None = None,
    alpha: float = DEFAULT_ALPHA,
    margins: dict[str, float] | None = None,
    expect_sums_digest: str | None = None,
    across_benchmarks: bool = False,
) -> Verdict:
    """Verify a run directory (or a packed run) on its own criteria or against a reference.

    Raises InvalidInput for input that cannot be read at all (missing directory, no
    SHA256SUMS, corrupt JSON) and for a reference of another benchmark than the run's (unless
    ``across_benchmarks``: the verdict then says so), and UsageError for arguments that do not
    fit together; tampering is reported as a Verdict with status INVALID.
    """
    if not (isinstance(alpha, (int, float)) and 0.0 < alpha < 0.5):
        raise UsageError(f"alpha {alpha!r} is outside (0, 0.5): use e.g. 0.05")
    check_comparison_options(margins, against, across_benchmarks)
    path = Path(run_dir)
    # a publication (its directory, or its archive where it lies): what it left out is not carried
    try:
        with opened_run(path, _SCRATCH_PREFIX) as opened:
            if opened.kind == "run":
                return _verify_dir(path, against, alpha, margins, expect_sums_digest,
                                   across_benchmarks=across_benchmarks)
            not_carried = opened.packed.not_carried(opened.root) if opened.packed is not None else []
            verdict = _verify_dir(opened.root, against, alpha, margins, expect_sums_digest, not_carried,
                                  across_benchmarks)
    except InvalidInput as err:
        # a file of the unpacked archive is named as the archive's, not by a directory that is gone
        said = _SCRATCH.sub("<archive>", str(err))
        if said == str(err):
            raise
        raise InvalidInput(f"{path}: {said}") from None
    verdict.run_dir = str(path)
    return verdict


_SCRATCH_PREFIX = "repro500-verify-"
_SCRATCH = re.compile(re.escape(os.path.join(tempfile.gettempdir(), _SCRATCH_PREFIX)) + r"[^/\s'\"]+")


def _verify_dir(root: Path, against: str | Path | None, alpha: float, margins: dict[str, float] | None,
                expect_sums_digest: str | None, not_carried: list[dict[str, Any]] | None = None,
                across_benchmarks: bool = False) -> Verdict:
    verdict = Verdict(status=INCONCLUSIVE, alpha=float(alpha), run_dir=str(root), margins=dict(margins or {}))
    check, run = integrity.check_run(root, expect_sums_digest=expect_sums_digest, not_carried=not_carried or ())
    verdict.integrity = check
    if run is not None:
        verdict.run_id = run.run_id
    if run is None or not check.ok:
        return _invalid(verdict, check.problems)

    in_history = history.is_history(against)
    ref, problems = _load_against(verdict, against, run, alpha, across_benchmarks)
    if problems:
        return _invalid(verdict, problems)
    for name in run.metric_names():
        values = run.values(name)
        if values:
            verdict.statistics[name] = describe(values, alpha)
    decide_at, problems = _decision_level(verdict, run, None if in_history else ref, alpha)
    if problems:
        return _invalid(verdict, problems)
    verdict.bands = check_bands(run, decide_at)
    verdict.variance = variance.decompose(run, alpha)
    verdict.nodes = variance.by_node(run, alpha)
    verdict.advice += [split.sentence() for split in verdict.nodes or [] if split.differs]
    verdict.determinism = check_determinism(run)
    verdict.valid_flops = valid_flops(run, alpha)
    verdict.sampling = check_sampling(run.repeats)
    verdict.mlperf = check_mlperf(run)
    repeat_docs = [run.repeats[k] for k in sorted(run.repeats)]
    if ref is not None:
        compare = history.compare if in_history else equivalence.compare
        verdict.equivalence = compare(run, ref, decide_at, margins)
        verdict.time_to_train = check_time_to_train(
            repeat_docs, alpha, reference_epochs=ref.epochs_to_quality, reference_times_s=ref.time_to_quality_s)
        verdict.provenance = provenance_diff(run.provenance_manifest, ref.manifest, run=run, against=ref)
        if ref.run is not None:
            verdict.determinism.cross_run = compare_with_reference(run, ref.run)
            verdict.gains = compare_gains(run.repeats, ref.run.repeats)
        if ref.seeded is not None:  # a run, or the packed run a published file lies beside
            verdict.exact_replay = replay_by_seed(run, ref.seeded)
    else:
        verdict.time_to_train = check_time_to_train(repeat_docs, alpha)
    # information, never a cause: where the pairs determinism and the exact replay compare part
    verdict.divergence = divergence.check(run, ref if ref is not None and ref.run is not None else None)
    _decide(verdict, ref is not None, run)
    if verdict.different_benchmark:  # the first thing a reader of verdict.json sees, as on the terminal
        verdict.reasons.insert(0, f"different benchmark: {verdict.different_benchmark}; compared anyway "
                                  "(--across-benchmarks): the status says how the numbers compare, not that "
                                  "the reference's result was reproduced")
    _collect_advice(verdict, run)
    return verdict


def _load_against(verdict: Verdict, against: str | Path | None, run: RunData, alpha: float,
                  across_benchmarks: bool) -> tuple[Reference | None, list[str]]:
    """(the reference ``against`` names, problems that make the verdict INVALID), with what it is
    recorded in ``verdict``; a reference of another benchmark is refused unless ``across_benchmarks``."""
    if history.is_history(against):  # earlier runs of the same recipe on this system (verify/history.py)
        ref = history.reference(str(against)[len(history.PREFIX):], run, alpha)
        verdict.against = ref.describe()
        return ref, []
    if against is None:
        return None, []
    ref = load_reference(against)
    verdict.against = ref.describe()
    verdict.reference_integrity = ref.integrity
    if ref.integrity is not None and not ref.integrity.ok:
        return ref, [f"reference: {p}" for p in ref.integrity.problems]
    if ref.benchmark is not None:  # a history's runs are chosen by the same rule (verify/history.py)
        difference = benchmark_difference(benchmark_of_run(run), ref.benchmark)
        if difference and not across_benchmarks:
            raise refuse_across(difference, str(against))
        verdict.different_benchmark = difference
        if difference:
            verdict.against["different_benchmark"] = difference
    return ref, []


def _decision_level(verdict: Verdict, run: RunData, given: Reference | None, alpha: float) -> tuple[float, list[str]]:
    """(the level decisions are made at, problems): ``alpha``, or for a sequential run the nominal
    level of the look it stopped at, once its stopping point is re-derived (``verdict.design``)."""
    design = sequential.recorded(run.run)
    if design is None:
        return alpha, []
    try:  # its counts, before a look or a level is computed from them
        sequential.bounds(design)
    except InvalidInput as err:
        return alpha, [str(err)]
    problems, checked = _check_stop(run, design, given)
    if problems:
        return alpha, problems
    n = len(run.completed)
    level = sequential.level_of(design, n, alpha)
    verdict.design = {**design, "look": n, "nominal_level": level, "stop_check": checked}
    if checked.startswith("not re-derived"):
        verdict.advice.append(f"the sequential stopping point was {checked}")
    return (level if level is not None else alpha), []


def _check_stop(run: RunData, design: dict[str, Any], given: Reference | None) -> tuple[list[str], str]:
    """(problems, what was checked) of a sequential run's stopping point, re-derived from its
    repeats in order against what it decided on: its bands, or the reference run.json records
    (the one given with --against when it is that one; else read again, if it is still here)."""
    alpha = float(design.get("alpha", DEFAULT_ALPHA))
    if design.get("stopped_at") is None:
        return [], "nothing to re-derive: no look decided the run"
    if design.get("decided_on") != "against":
        return sequential.stop_check(run, design, alpha), "re-derived from the repeats and the bands"
    record = (run.run or {}).get("reference") or {}
    where = str(record.get("against") or "")
    if not where:
        return [], "not re-derived: run.json names no reference it decided against"
    ref = given
    if ref is None or Path(ref.path).resolve() != Path(where).resolve():
        try:
            ref = load_reference(where)
        except (InvalidInput, UsageError) as err:
            return [], f"not re-derived: the reference it decided against is not readable here ({err})"
    if ref.integrity is not None and not ref.integrity.ok:
        return [], f"not re-derived: the reference it decided against ({where}) fails its integrity check"
    try:
        problems = sequential.stop_check(run, design, alpha, ref, record.get("margins") or None)
    except (InvalidInput, UsageError) as err:
        return [], f"not re-derived: the run's looks cannot be repeated against {where} ({err})"
    return problems, f"re-derived from the repeats and the reference {where}"


def _invalid(verdict: Verdict, problems: list[str]) -> Verdict:
    verdict.status = INVALID
    verdict.reasons = list(problems)
    verdict.advice.append("the bundle is not what the run wrote: obtain an untouched copy (or rerun) and verify again")
    return verdict


def _decide(verdict: Verdict, with_reference: bool, run: RunData) -> None:
    items: list[tuple[str, str]] = []  # (PASS|FAIL|INCONCLUSIVE, reason)
    if run.not_run:
        # what did not run cannot have reproduced: an incomplete run never passes on the rest
        items.append((INCONCLUSIVE, f"the run is incomplete: repeat(s) {', '.join(map(str, run.not_run))} of "
                                      f"{run.planned} have not run"))
    if with_reference:
        mapping = {REPRODUCED: PASS, NOT_REPRODUCED: FAIL, INCONCLUSIVE: INCONCLUSIVE}
        items += [(history.CHANGE_OUTCOME[e.change] if e.change else mapping[e.status], f"{e.metric}: {e.reason}")
                  for e in verdict.equivalence or []]
        t = verdict.time_to_train
        if t is not None and t.status in (PASS, FAIL):
            items.append((t.status, f"time-to-train: {t.reason}"))
    else:
        items += [(b.status, f"{b.metric}: {b.reason}") for b in verdict.bands]
    d = verdict.determinism
    if d is not None and d.status in (PASS, FAIL):
        items.append((d.status, f"determinism: {d.reason}"))
    if not items:
        verdict.status = INCONCLUSIVE
        verdict.reasons = ["nothing to decide: the run has no acceptance criteria and no reference was given "
                           "(add acceptance to the recipe or pass --against)"]
        return
    if not with_reference and not verdict.bands:
        verdict.advice.append("only determinism was decided: the run has no acceptance criteria, so its results "
                              "were not checked against a band (add acceptance to the recipe or pass --against)")
    for outcome in (FAIL, INCONCLUSIVE, PASS):
        chosen = [reason for status, reason in items if status == outcome]
        if chosen:
            break
    if with_reference and (verdict.against or {}).get("kind") != "history":
        verdict.status = {PASS: REPRODUCED, FAIL: NOT_REPRODUCED}.get(outcome, outcome)
    else:
        verdict.status = outcome
    verdict.reasons = chosen
    replay = verdict.exact_replay
    if replay is None:
        return
    if replay.exact:
        if outcome == FAIL:  # parameters and scores identical, yet something failed: say both
            verdict.reasons = chosen + [f"exact replay: {replay.reason}; it does not override the failure above"]
        else:
            verdict.status = REPRODUCED
            statistical = [f"statistically {REPRODUCED if outcome == PASS else outcome}: {reason}"
                           for reason in chosen]
            verdict.reasons = [f"exact replay: {replay.reason}", *statistical]
    elif replay.metric_differences:
        # identical parameters that scored differently are no replay: the statistics decide, and
        # the verdict names the difference, since it points at the evaluation, not the training
        verdict.reasons = chosen + [f"not an exact replay: {replay.reason}"]
        verdict.advice.append("identical final parameters scored differently: evaluate the same checkpoint twice "
                              "to see whether the evaluation is deterministic, and compare the evaluation data "
                              "(the provenance diff lists data digests that differ)")


def _collect_advice(verdict: Verdict, run: Any) -> None:
    advice: list[str] = []
    for b in verdict.bands:
        advice += b.advice
    for e in verdict.equivalence or []:
        advice += e.advice
    state = (run.run or {}).get("status")
    if state and state != RUN_COMPLETED:
        advice.append(f"run.json says the run is {state!r}: `repro500 run --resume {run.path}` completes it")
    unsuccessful = run.unsuccessful
    if unsuccessful:
        shown = ", ".join(f"{k}: {s}" for k, s in unsuccessful.items())
        advice.append(f"repeats not completed ({shown}) are excluded from every statistic, "
                      "and no band can pass until they complete")
    seen = set()
    verdict.advice += [a for a in advice if not (a in seen or seen.add(a))]
