"""The numbers behind the plots: curves per repeat, bands across repeats, time and byte totals.

Intervals across repeats come from ``repro500.verify.stats.t_interval`` (the verdict's own
statistics), computed per epoch for evaluation metrics and per step, on an evenly thinned
grid, for the training loss.  Nothing here draws.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from repro500.report.load import RepeatRecords, finite
from repro500.verify import stats

MAX_BAND_POINTS = 400  # per-step bands: one t-interval per grid point, so keep the grid bounded
MAX_LINE_POINTS = 5000  # per-repeat lines are thinned beyond this (a figure is ~1000 px wide)

# Phases of a step that follow one another in time: they add up to (most of) step_time_s.
PHASES = (
    ("time_data_s", "data loading"),
    ("time_forward_s", "forward"),
    ("time_backward_s", "backward"),
    ("time_optimizer_s", "optimizer"),
)
# Costs measured inside those phases (DDP hooks run during backward, Horovod inside the
# optimizer step), so they are drawn beside the phases, never stacked on top of them.
OVERLAPPED = (
    ("time_comm_s", "communication"),
    ("time_compress_s", "compression"),
    ("time_decompress_s", "decompression"),
)


@dataclass
class Curve:
    x: list[float]
    y: list[float]


@dataclass
class Band:
    """Mean across repeats with a two-sided t-interval, at each x where >= 2 repeats have a value."""

    x: list[float] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    low: list[float] = field(default_factory=list)
    high: list[float] = field(default_factory=list)
    n: list[int] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.x


def thin(curve: Curve, limit: int = MAX_LINE_POINTS) -> Curve:
    if len(curve.x) <= limit:
        return curve
    idx = np.linspace(0, len(curve.x) - 1, limit).round().astype(int)
    return Curve([curve.x[i] for i in idx], [curve.y[i] for i in idx])


def loss_curves(records: dict[int, RepeatRecords]) -> dict[int, Curve]:
    """Training loss per step for each repeat (x = the record's global step)."""
    out = {}
    for k, rec in records.items():
        xs, ys = [], []
        for i, step in enumerate(rec.steps):
            loss = finite(step.get("loss"))
            if loss is None:
                continue
            x = finite(step.get("step"))
            xs.append(x if x is not None else float(i + 1))
            ys.append(loss)
        if xs:
            out[k] = Curve(xs, ys)
    return out


def eval_metric_names(records: dict[int, RepeatRecords]) -> list[str]:
    """Every metric an epoch record reports as a number, in first-seen order."""
    names: list[str] = []
    for rec in records.values():
        for epoch in rec.epochs:
            metrics = epoch.get("metrics")
            for name, value in (metrics.items() if isinstance(metrics, dict) else ()):
                if finite(value) is not None and name not in names:
                    names.append(str(name))
    return names


def epoch_curves(records: dict[int, RepeatRecords], metric: str) -> dict[int, Curve]:
    """One evaluation metric per epoch for each repeat."""
    out = {}
    for k, rec in records.items():
        xs, ys = [], []
        for i, epoch in enumerate(rec.epochs):
            metrics = epoch.get("metrics") if isinstance(epoch.get("metrics"), dict) else {}
            value = finite(metrics.get(metric))
            if value is None:
                continue
            x = finite(epoch.get("epoch"))
            xs.append(x if x is not None else float(i + 1))
            ys.append(value)
        if xs:
            out[k] = Curve(xs, ys)
    return out


def band(curves: dict[int, Curve], confidence: float, max_points: int | None = None) -> Band:
    """Mean and t-interval across repeats at every shared x (thinned to ``max_points``)."""
    by_x: dict[float, list[float]] = {}
    for curve in curves.values():
        seen = {}
        for x, y in zip(curve.x, curve.y, strict=True):
            seen[x] = y  # a repeated x (e.g. a resumed repeat) keeps its last value
        for x, y in seen.items():
            by_x.setdefault(x, []).append(y)
    xs = sorted(x for x, ys in by_x.items() if len(ys) >= 2)
    if max_points and len(xs) > max_points:
        idx = np.linspace(0, len(xs) - 1, max_points).round().astype(int)
        xs = [xs[i] for i in sorted(set(idx))]
    out = Band()
    for x in xs:
        values = by_x[x]
        interval = stats.t_interval(values, confidence)
        if interval is None:
            continue
        out.x.append(x)
        out.mean.append(float(np.mean(values)))
        out.low.append(interval[0])
        out.high.append(interval[1])
        out.n.append(len(values))
    return out


def _mean_of(steps: list[dict[str, Any]], key: str) -> float | None:
    values = [v for v in (finite(s.get(key)) for s in steps) if v is not None]
    return float(np.mean(values)) if values else None


def step_time_breakdown(records: dict[int, RepeatRecords]) -> list[dict[str, Any]]:
    """Per repeat: mean seconds per step of each phase, of the overlapped costs, and in total.

    ``other_s`` is the part of ``step_time_s`` no phase accounts for (bookkeeping, syncs).
    """
    rows = []
    for k, rec in sorted(records.items()):
        if not rec.steps:
            continue
        row: dict[str, Any] = {"repeat": k, "steps": len(rec.steps), "step_time_s": _mean_of(rec.steps, "step_time_s")}
        for key, _ in PHASES + OVERLAPPED:
            row[key] = _mean_of(rec.steps, key)
        known = sum(row[key] or 0.0 for key, _ in PHASES)
        total = row["step_time_s"]
        row["other_s"] = max(0.0, total - known) if total is not None else None
        rows.append(row)
    return rows


def wire_curves(records: dict[int, RepeatRecords]) -> dict[str, dict[int, Curve]]:
    """bytes_sent, bytes_received and compression_ratio per step, for repeats that record them.

    The compression ratio is the record's own ``compression_ratio``, else
    ``dense_bytes_sent / bytes_sent`` (the definition in repro500.ext.communicator).
    """
    out: dict[str, dict[int, Curve]] = {"bytes_sent": {}, "bytes_received": {}, "compression_ratio": {}}
    for k, rec in sorted(records.items()):
        per_key: dict[str, Curve] = {name: Curve([], []) for name in out}
        for i, step in enumerate(rec.steps):
            x = finite(step.get("step"))
            x = x if x is not None else float(i + 1)
            sent = finite(step.get("bytes_sent"))
            ratio = finite(step.get("compression_ratio"))
            dense = finite(step.get("dense_bytes_sent"))
            if ratio is None and dense is not None and sent:
                ratio = dense / sent
            for name, value in (("bytes_sent", sent), ("bytes_received", finite(step.get("bytes_received"))),
                                ("compression_ratio", ratio)):
                if value is not None:
                    per_key[name].x.append(x)
                    per_key[name].y.append(value)
        for name, curve in per_key.items():
            if curve.x:
                out[name][k] = curve
    return out


def wire_totals(records: dict[int, RepeatRecords]) -> list[dict[str, Any]]:
    """Per repeat: steps with byte counts, bytes per step (mean), total bytes, mean ratio."""
    curves = wire_curves(records)
    rows = []
    for k in sorted(records):
        sent = curves["bytes_sent"].get(k)
        received = curves["bytes_received"].get(k)
        ratio = curves["compression_ratio"].get(k)
        if not (sent or received):
            continue
        rows.append({
            "repeat": k, "steps": len(sent.x) if sent else len(received.x),
            "bytes_sent_per_step": float(np.mean(sent.y)) if sent else None,
            "bytes_received_per_step": float(np.mean(received.y)) if received else None,
            "bytes_sent_total": float(np.sum(sent.y)) if sent else None,
            "compression_ratio_mean": float(np.mean(ratio.y)) if ratio else None,
        })
    return rows
