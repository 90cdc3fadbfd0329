"""Where the variance comes from: the decomposition of a factorial run (``repro500 run --vary``),
and the split by node of a run whose repeats ran on several (``--launcher slurm``).

Each cell of the run varied one source of randomness with the others held (capture/seeds.py), so
a cell's sample variance estimates that source's variance component.  Per metric and source:
the variance with its chi-square confidence interval, the source's share of the single-source
components with a *generalised* confidence interval (Weerahandi's generalised pivotal quantities:
each component's pivot (n - 1) s^2 / U with U ~ chi^2_{n-1}, the share's pivot the ratio of
them, its quantiles by Monte Carlo with a fixed seed; there is no closed form for a share of
three or more components, and neither scipy nor statsmodels has one), which source dominates,
and how many repeats a decision at the recipe's margin would need if only that source were
randomised (the computation of ``repro500 plan``).  bench/variance_attribution.py checks the
share intervals' coverage on simulated data with known components.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from repro500 import untrusted
from repro500.tracking import names
from repro500.verify import distributions as dist
from repro500.verify import stats
from repro500.verify.rundir import RunData

PIVOT_DRAWS = 20_000
SEED = 20261124
SHARE_CONFIDENCE = 0.90
ALL_SOURCES = "seed"  # the cell that varies every seed: the total, not a component
NODE_CHARS = 64  # a node's name as a summary records it, cut for tables and sentences


@dataclass
class Component:
    source: str
    n: int
    variance: float | None
    sd: float | None
    ci: tuple[float, float] | None  # of the variance, at 1 - alpha
    share: float | None = None  # of the single-source components' sum
    share_ci: tuple[float, float] | None = None  # SHARE_CONFIDENCE generalised interval
    repeats_needed: int | None = None  # for a decision at the margin, were only this source random


@dataclass
class VarianceResult:
    metric: str
    components: list[Component]
    dominant: str | None
    margin: float | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def share_intervals(variances: list[float], counts: list[int], confidence: float = SHARE_CONFIDENCE,
                    draws: int = PIVOT_DRAWS, seed: int = SEED) -> list[tuple[float, float]]:
    """Generalised confidence intervals of each component's share of their sum."""
    rng = np.random.default_rng(seed)
    pivots = np.stack([(n - 1) * v / rng.chisquare(n - 1, draws) for v, n in zip(variances, counts, strict=True)])
    total = pivots.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = np.where(total > 0, pivots / total, np.nan)
    tail = (1.0 - confidence) / 2.0
    out = []
    for row in shares:
        row = row[np.isfinite(row)]
        out.append((float(np.quantile(row, tail)), float(np.quantile(row, 1.0 - tail))) if row.size else (0.0, 0.0))
    return out


def decompose(run: RunData, alpha: float) -> list[VarianceResult] | None:
    """The decomposition of every acceptance metric of a factorial run (None for other runs)."""
    design = (run.run or {}).get("design") or {}
    if design.get("kind") != "factorial":
        return None
    cells = list(design.get("cells") or [])
    results = []
    for criterion in run.acceptance:
        by_source: dict[str, list[float]] = {source: [] for source in design.get("sources") or []}
        for k, value in run.indexed_values(criterion.metric):
            if k < len(cells) and cells[k] in by_source:
                by_source[cells[k]].append(float(value))
        results.append(_one(criterion, by_source, alpha))
    return results


def _one(criterion: Any, by_source: dict[str, list[float]], alpha: float) -> VarianceResult:
    components = []
    for source, values in by_source.items():
        n = len(values)
        if n < 2:
            components.append(Component(source, n, None, None, None))
            continue
        var = float(np.var(values, ddof=1))
        ci = ((n - 1) * var / float(dist.chi2_ppf(1 - alpha / 2, n - 1)), (n - 1) * var / float(dist.chi2_ppf(alpha / 2, n - 1)))
        sd = var ** 0.5
        margin = criterion.tolerance if criterion.tolerance > 0 else None
        if margin is not None:
            needed = stats.equivalence_repeats(0.0, sd, margin, alpha, sd_ref=sd)[0]
        else:
            needed = stats.band_repeats(float(np.mean(values)), sd, criterion, alpha)
        components.append(Component(source, n, var, sd, ci, repeats_needed=needed))
    result = VarianceResult(criterion.metric, components, None, criterion.tolerance or None)
    single = [c for c in components if c.source != ALL_SOURCES and c.variance is not None]
    if single and sum(c.variance for c in single) > 0:
        intervals = share_intervals([c.variance for c in single], [c.n for c in single])
        total = sum(c.variance for c in single)
        for c, interval in zip(single, intervals, strict=True):
            c.share, c.share_ci = c.variance / total, interval
        result.dominant = max(single, key=lambda c: c.variance).source
    elif single:
        result.notes.append("every single-source cell gave identical values: no source varies this metric")
    together = next((c for c in components if c.source == ALL_SOURCES and c.variance is not None), None)
    if together is not None and single:
        summed = sum(c.variance for c in single)
        low, high = together.ci or (0.0, 0.0)
        where = "inside" if low <= summed <= high else "outside"
        result.notes.append(f"all seeds varied together: variance {together.variance:.3g}; the single sources sum "
                            f"to {summed:.3g}, {where} its {1 - alpha:.0%} interval"
                            + ("" if where == "inside" else " (the sources interact, or a source is not listed)"))
    missing = [c.source for c in components if c.variance is None]
    if missing:
        result.notes.append(f"cell(s) {', '.join(missing)} have fewer than 2 completed repeats: no variance")
    return result


@dataclass
class NodeGroup:
    node: str
    n: int
    mean: float
    sd: float | None  # None with one repeat on the node


@dataclass
class NodeSplit:
    """One metric's values grouped by the node each repeat ran on, and whether the nodes' means
    differ more than the repeats within a node do (one-way ANOVA, scipy.stats.f_oneway)."""

    metric: str
    groups: list[NodeGroup]
    p_value: float | None  # None where no two nodes have two repeats each, or nothing varies
    differs: bool = False  # p_value < alpha

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sentence(self) -> str:
        means = "; ".join(f"{g.node}: mean {g.mean:.4g} over {g.n}" for g in self.groups)
        return (f"{self.metric} differs by node (one-way ANOVA p = {self.p_value:.3g}; {means}): part of its spread is "
                "where the repeats ran, not their seeds")


def by_node(run: RunData, alpha: float) -> list[NodeSplit] | None:
    """Each acceptance metric split by the node its repeats ran on (a repeat's summary records it
    under ``placement.node``); None unless the completed repeats ran on two nodes or more."""
    import warnings

    from scipy import stats as sps

    nodes: dict[int, str] = {}
    for k in run.completed:
        place = run.repeats[k].get("placement")
        if isinstance(place, dict) and isinstance(place.get("node"), str) and place["node"]:
            # a record's text, in sentences and tables from here on: one line, escapes visible
            nodes[k] = untrusted.plain(place["node"], NODE_CHARS)
    if len(set(nodes.values())) < 2:
        return None
    out = []
    for criterion in run.acceptance:
        grouped: dict[str, list[float]] = {}
        for k, value in run.indexed_values(criterion.metric):
            if k in nodes:
                grouped.setdefault(nodes[k], []).append(float(value))
        groups = [NodeGroup(node, len(v), float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else None)
                  for node, v in sorted(grouped.items())]
        tested = [v for v in grouped.values() if len(v) > 1]
        p = None
        if len(tested) >= 2:
            with warnings.catch_warnings():  # identical values everywhere: no test (p stays None)
                warnings.simplefilter("ignore")
                p = float(sps.f_oneway(*tested).pvalue)
            p = p if np.isfinite(p) else None
        out.append(NodeSplit(criterion.metric, groups, p, p is not None and p < alpha))
    return out


def mlflow_metrics(results: list[VarianceResult] | None) -> dict[str, float]:
    """The decomposition as metrics of the MLflow parent run, so the runs table can sort by them:
    ``<metric>_variance_<source>`` with ``..._ci_low`` and ``..._ci_high`` (its 1 - alpha interval),
    ``<metric>_share_<source>`` with ``..._ci_low`` and ``..._ci_high`` (its 90% generalised
    interval), and ``<metric>_repeats_needed_<source>`` (a decision at the margin, were only that
    source random)."""
    out: dict[str, float] = {}
    for result in results or []:
        for c in result.components:
            for name, value, interval in (("variance", c.variance, c.ci), ("share", c.share, c.share_ci)):
                if value is None:
                    continue
                out[f"{result.metric}_{name}_{c.source}"] = value
                if interval is not None:
                    out[f"{result.metric}_{name}_{c.source}_ci_low"] = float(interval[0])
                    out[f"{result.metric}_{name}_{c.source}_ci_high"] = float(interval[1])
            if c.repeats_needed is not None:
                out[f"{result.metric}_repeats_needed_{c.source}"] = float(c.repeats_needed)
    return out


def mlflow_tags(results: list[VarianceResult] | None) -> dict[str, str]:
    """The dominant source of each metric, ``repro500.variance.<metric>.dominant`` (``none`` when
    no single source varied it)."""
    return {f"repro500.variance.{r.metric}.dominant": r.dominant or "none" for r in results or []}


def design_tags(design: dict[str, Any] | None) -> dict[str, str]:
    """A sequential or factorial design as tags of the MLflow parent run."""
    if not isinstance(design, dict) or not design.get("kind"):
        return {}
    tags = {names.DESIGN_TAG: str(design["kind"])}
    if design["kind"] == "sequential":
        tags.update({"repro500.design.max_repeats": str(design.get("max_repeats")),
                     "repro500.design.max_repeats_from": str((design.get("max_repeats_from") or {}).get("from")),
                     "repro500.design.spending": str(design.get("spending")),
                     "repro500.design.stopped_at": str(design.get("stopped_at"))})
    elif design["kind"] == "factorial":
        tags.update({"repro500.design.sources": ",".join(design.get("sources") or []),
                     "repro500.design.per_cell": str(design.get("per_cell"))})
    return tags
