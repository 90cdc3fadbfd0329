"""``repro500 history``: one metric across the runs of a history, and what changed where it moved.

Each row is one run (oldest first): its mean and (1 - alpha) t-interval over repeats, the system
it ran on (hardware, engine and ranks; software updates stay in one series), and, against the previous run *on the same system*, whether the metric moved (Welch's
t-test at alpha, direction-aware: better or worse) and the provenance differences between the two
manifests (``repro500 diff``'s ranking, most result-relevant first) — the package, driver, commit
or data digest that changed where the metric moved.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500.digest import canonical_digest
from repro500.errors import InvalidInput, UsageError
from repro500.verify import history, stats

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
    previous: str | None = None  # the previous run on the same system
    p_value: float | None = None
    moved: str | None = None  # better | worse | None (not shown at alpha, or not testable)
    changes: list[dict[str, Any]] = field(default_factory=list)

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

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "repro500/history/v1", "source": self.source, "metric": self.metric,
                "recipe": self.recipe, "direction": self.direction, "alpha": self.alpha,
                "systems": self.systems, "runs": [r.to_dict() for r in self.rows], "skipped": self.skipped}


def build(source: str, metric: str, alpha: float = 0.05, recipe: str | None = None) -> Trend:
    """The trend of METRIC across the runs SOURCE holds (see the module docstring)."""
    paths, skipped = history.locate(source)
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
    last_on: dict[str, history.Entry] = {}
    rows = []
    for entry in entries:
        key = history.system_key(entry.run, environment=False)  # software changes are what it shows
        digest = canonical_digest({"system": key})
        label = labels.setdefault(digest, f"S{len(labels) + 1}")
        systems[label] = key
        rows.append(_row(entry, label, last_on.get(label), metric, direction, alpha))
        last_on[label] = entry
    return Trend(source=source, metric=metric, recipe=entries[-1].recipe_name, direction=direction,
                 alpha=alpha, rows=rows, systems=systems, skipped=skipped)


def _row(entry: history.Entry, label: str, previous: history.Entry | None, metric: str, direction: str,
         alpha: float) -> Row:
    from scipy import stats as sps

    from repro500.verify.diff import diff_manifests, is_result_relevant

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
    diffs = diff_manifests(previous.run.provenance_manifest or {}, entry.run.provenance_manifest or {})
    row.changes = [{"key": f"{d.facet}.{d.key}", "before": d.a, "after": d.b, "impact": d.impact, "reason": d.reason}
                   for d in sorted(diffs, key=lambda d: -d.impact) if is_result_relevant(d)]
    return row


def plot(trend: Trend, path: Path) -> Path:
    """The metric across runs with its intervals, one colour per system, moves marked (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(trend.rows) + 3), 4.0))
    for label in trend.systems:
        idx = [i for i, r in enumerate(trend.rows) if r.system == label and r.mean is not None]
        means = [trend.rows[i].mean for i in idx]
        low = [trend.rows[i].mean - (trend.rows[i].ci_low if trend.rows[i].ci_low is not None else trend.rows[i].mean)
               for i in idx]
        high = [(trend.rows[i].ci_high if trend.rows[i].ci_high is not None else trend.rows[i].mean) - trend.rows[i].mean
                for i in idx]
        ax.errorbar(idx, means, yerr=[low, high], marker="o", capsize=3, label=label)
    for i, r in enumerate(trend.rows):
        if r.moved:
            first = r.changes[0]["key"] if r.changes else "no recorded change"
            ax.annotate(f"{r.moved}: {first}", (i, r.mean), textcoords="offset points", xytext=(4, 8), fontsize=7,
                        color="green" if r.moved == "better" else "red")
    ax.set_xticks(range(len(trend.rows)), [r.run_id for r in trend.rows], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(f"{trend.metric} (mean, {1 - trend.alpha:.0%} CI)")
    ax.set_title(f"{trend.recipe}: {trend.metric} across {len(trend.rows)} run(s) of {trend.source}")
    if len(trend.systems) > 1:
        ax.legend(title="system")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
