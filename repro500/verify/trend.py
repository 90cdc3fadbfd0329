"""``repro500 history``: one metric across the runs of a history, and what changed where it moved.

Each row is one run (oldest first): its mean and (1 - alpha) t-interval over repeats, the system
it ran on (hardware, engine and ranks; software updates stay in one series), the benchmark it
measured (its recipe's fixed keys, as verify/reference.py's ``benchmark_difference`` decides: a
run that set fixed keys in the open division measured another benchmark), and, against the
previous run *on the same system of the same benchmark*, whether the metric moved (Welch's t-test
at alpha, direction-aware: better or worse) and what changed between the two: the recipe's keys
first (an override is the likeliest cause), then the provenance differences between the two
manifests (``repro500 diff``'s ranking, most result-relevant first) — the package, driver, commit
or data digest that changed where the metric moved.  The first run of another benchmark on a
system is not compared with the runs before it; its changes say how it differs from the last one.
"""

from __future__ import annotations

import math
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500.digest import canonical_digest
from repro500.errors import InvalidInput, UsageError
from repro500.statuses import DEFAULT_ALPHA
from repro500.verify import compare, history, stats
from repro500.verify.diff import is_moved
from repro500.verify.reference import Benchmark, benchmark_difference, benchmark_of_run

MAX_CHANGES = 3  # differences shown per row; the JSON has them all (result-relevant ones)


@dataclass
class Row:
    run_id: str
    created: str
    system: str  # S1, S2, ...: see Trend.systems
    n: int
    mean: float | None
    ci_low: float | None
    ci_high: float | None
    previous: str | None = None  # the previous run on the same system, of the same benchmark
    p_value: float | None = None
    moved: str | None = None  # better | worse | None (not shown at alpha, or not testable)
    changes: list[dict[str, Any]] = field(default_factory=list)
    benchmark: str = "B1"  # B1, B2, ...: see Trend.benchmarks
    # the last run on the same system when it measured another benchmark: {run, difference}; the
    # metric is not compared with it, the changes say how the two differ
    other_benchmark: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Trend:
    source: str
    metric: str
    recipe: str
    direction: str
    alpha: float
    rows: list[Row]
    systems: dict[str, dict[str, Any]]  # label -> system key
    skipped: list[dict[str, str]]
    benchmarks: dict[str, str] = field(default_factory=dict)  # label -> what it is (B2+: how it differs from B1)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "repro500/history/v1", "source": self.source, "metric": self.metric,
                "recipe": self.recipe, "direction": self.direction, "alpha": self.alpha,
                "systems": self.systems, "benchmarks": self.benchmarks,
                "runs": [r.to_dict() for r in self.rows], "skipped": self.skipped}


def build(source: str, metric: str, alpha: float = DEFAULT_ALPHA, recipe: str | None = None) -> Trend:
    """The trend of METRIC across the runs SOURCE holds (see the module docstring)."""
    # an MLflow parent whose run directory is not here is read from the sealed run the store keeps,
    # unpacked for as long as the trend is built (the comparisons read its files)
    with tempfile.TemporaryDirectory(prefix="repro500-history-") as downloads:
        return _build(source, metric, alpha, recipe, *history.locate(source, Path(downloads)))


def _build(source: str, metric: str, alpha: float, recipe: str | None, paths: list[Path],
           skipped: list[dict[str, str]]) -> Trend:
    entries = history.load(paths, skipped)
    names = sorted({e.recipe_name for e in entries})
    if recipe is not None:
        entries = [e for e in entries if e.recipe_name == recipe]
        if not entries:
            raise InvalidInput(f"{source} holds no readable run of recipe {recipe!r} (recipes there: "
                               f"{', '.join(names) or 'none'})")
    elif len(names) > 1:
        raise UsageError(f"{source} holds runs of {len(names)} recipes ({', '.join(names)}): name one with --recipe")
    if not entries:
        why = f" ({skipped[0]['run']}: {skipped[0]['why']})" if skipped else ""
        raise InvalidInput(f"{source} holds no readable run{why}")
    readable, entries = entries, [e for e in entries if e.run.values(metric)]
    if not entries:
        reported = sorted({m for e in readable for m in e.run.metric_names()})
        raise UsageError(f"no run in {source} reports {metric!r} (metrics there: {', '.join(reported) or 'none'})")
    direction = history.direction_of(metric, entries[-1].run)
    systems: dict[str, dict[str, Any]] = {}
    labels: dict[str, str] = {}
    benchmarks: dict[str, str] = {}
    measured: dict[str, tuple[str, Benchmark]] = {}  # benchmark key -> (label, benchmark)
    last_on: dict[tuple[str, str], history.Entry] = {}  # (system, benchmark) -> its latest run
    last_system: dict[str, history.Entry] = {}  # system -> its latest run, of any benchmark
    rows = []
    for entry in entries:
        key = history.system_key(entry.run, environment=False)  # software changes are what it shows
        digest = canonical_digest({"system": key})
        label = labels.setdefault(digest, f"S{len(labels) + 1}")
        systems[label] = key
        bench = benchmark_of_run(entry.run)
        key = _series(bench, measured)
        if key not in measured:
            mark = f"B{len(measured) + 1}"
            measured[key] = (mark, bench)
            benchmarks[mark] = _described(bench, next(iter(measured.values()))[1])
        mark = measured[key][0]
        row = _row(entry, label, last_on.get((label, mark)), metric, direction, alpha)
        row.benchmark = mark
        before = last_system.get(label)
        if row.previous is None and before is not None:  # on this system, another benchmark came before
            row.other_benchmark = {"run": before.run_id,
                                   "difference": benchmark_difference(bench, benchmark_of_run(before.run)) or ""}
            row.changes = changes_between(before, entry)
        rows.append(row)
        last_on[(label, mark)] = entry
        last_system[label] = entry
    return Trend(source=source, metric=metric, recipe=entries[-1].recipe_name, direction=direction,
                 alpha=alpha, rows=rows, systems=systems, skipped=skipped, benchmarks=benchmarks)


def _series(bench: Benchmark, measured: dict[str, tuple[str, Benchmark]]) -> str:
    """The key of the benchmark series *bench* belongs to: its own, or that of a benchmark measured
    before that differs from it only in data paths holding the same bytes (moved data)."""
    key = bench.key()
    if key in measured or bench.fixed is None:
        return key
    return next((k for k, (_, other) in measured.items()
                 if other.fixed is not None and benchmark_difference(bench, other) is None), key)


def _described(bench: Benchmark, first: Benchmark) -> str:
    """What a benchmark of the history is: its recipe, the fixed keys it set in the open division,
    and (after the first) how it differs from the first."""
    text = str(bench.recipe or "?")
    if bench.overridden:  # what was set says how it differs
        return text + " with " + ", ".join(f"{k}={v}" for k, v in sorted(bench.overridden.items())) + \
            " set in the open division"
    difference = benchmark_difference(bench, first) if bench is not first else None
    return f"{text} (differs from B1: {difference})" if difference else text


def changes_between(before: history.Entry, after: history.Entry) -> list[dict[str, Any]]:
    """What changed from ``before`` to ``after``: the result-relevant differences of the one
    comparison of two runs (repro500.verify.compare), in its order and words, then the data that
    moved (the same bytes at another path: below the threshold, listed once, ``moved`` true)."""
    found = compare.compare_runs(before.run, after.run)
    out: list[dict[str, Any]] = [{"key": compare.key_of(d), "before": d.a, "after": d.b, "impact": d.impact,
                                  "reason": d.reason} for d in found.relevant]
    return out + [{"key": compare.key_of(d), "before": d.a["path"], "after": d.b["path"], "impact": d.impact,
                   "reason": d.reason, "moved": True} for d in found.differences if is_moved(d)]


def _row(entry: history.Entry, label: str, previous: history.Entry | None, metric: str, direction: str,
         alpha: float) -> Row:
    from scipy import stats as sps

    values = entry.run.values(metric)
    described = stats.describe(values, alpha)
    row = Row(run_id=entry.run_id, created=entry.created, system=label, n=len(values),
              mean=described["mean"], ci_low=described["ci_low"], ci_high=described["ci_high"])
    if previous is None:
        return row
    row.previous = previous.run_id
    before = previous.run.values(metric)
    if len(values) >= 2 and len(before) >= 2:
        with warnings.catch_warnings():  # nearly constant series: the p-value says it, not a warning
            warnings.simplefilter("ignore", RuntimeWarning)
            p = float(sps.ttest_ind(values, before, equal_var=False).pvalue)
        if math.isfinite(p):
            row.p_value = p
        elif values != before and min(values) == max(values) and min(before) == max(before):
            row.p_value = 0.0  # two constant series at different values: a move no spread explains
    if row.p_value is not None and row.p_value < alpha:
        up = sum(values) / len(values) > sum(before) / len(before)
        row.moved = "better" if up == (direction == "higher") else "worse"
    row.changes = changes_between(previous, entry)
    return row


def plot(trend: Trend, path: Path) -> Path:
    """The metric across runs with its intervals, one colour per system, moves marked (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(trend.rows) + 3), 4.0))
    series = list(dict.fromkeys((r.system, r.benchmark) for r in trend.rows))  # another benchmark: its own line
    for system, mark in series:
        label = f"{system} {mark}" if len(trend.benchmarks) > 1 else system
        idx = [i for i, r in enumerate(trend.rows) if (r.system, r.benchmark) == (system, mark) and r.mean is not None]
        means = [trend.rows[i].mean for i in idx]
        low = [trend.rows[i].mean - (trend.rows[i].ci_low if trend.rows[i].ci_low is not None else trend.rows[i].mean)
               for i in idx]
        high = [(trend.rows[i].ci_high if trend.rows[i].ci_high is not None else trend.rows[i].mean) - trend.rows[i].mean
                for i in idx]
        ax.errorbar(idx, means, yerr=[low, high], marker="o", capsize=3, label=label)
    for i, r in enumerate(trend.rows):
        if r.moved:
            first = next((c["key"] for c in r.changes if not c.get("moved")), "no recorded change")
            ax.annotate(f"{r.moved}: {first}", (i, r.mean), textcoords="offset points", xytext=(4, 8), fontsize=7,
                        color="green" if r.moved == "better" else "red")
    ax.set_xticks(range(len(trend.rows)), [r.run_id for r in trend.rows], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(f"{trend.metric} (mean, {1 - trend.alpha:.0%} CI)")
    ax.set_title(f"{trend.recipe}: {trend.metric} across {len(trend.rows)} run(s) of {trend.source}")
    if len(series) > 1:
        ax.legend(title="system" if len(trend.benchmarks) <= 1 else "system, benchmark")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
