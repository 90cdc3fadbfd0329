"""The report's figures, drawn with matplotlib's Agg renderer and embedded as base64 PNG.

Figures are built with ``matplotlib.figure.Figure`` directly (no pyplot: no global state, no
GUI backend).  Text taken from a run directory (metric names) is drawn with mathtext off, so a
name containing ``$`` is shown as typed instead of failing to parse.  Each function returns a
``data:image/png;base64,...`` URI.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from repro500.report.series import OVERLAPPED, PHASES, Band, Curve, thin
from repro500.statuses import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED
from repro500.untrusted import plain

DPI = 100
WIDTH_IN = 11.0
MEAN_COLOR = "#1d232a"
BAND_COLOR = "#5c6670"
PASS_COLOR = "#1a7f37"
REF_COLOR = "#7b3fa0"
PHASE_COLORS = ("#8fb8de", "#2f6db5", "#e08a2e", "#6aa84f", "#c9c9c9")
OVERLAP_COLORS = ("#c0504d", "#f2a25c", "#f6d28b")
MAX_LABEL = 60

RC = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 8.5,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3,
    "text.parse_math": False, "svg.fonttype": "none", "figure.dpi": DPI,
}


def short_label(text: Any) -> str:
    """A name from the run as a plot's label: one line, its control and bidi characters as escapes
    (drawn as text, as the page and the terminal show them), cut to MAX_LABEL characters."""
    text = plain(" ".join(str(text).split()))
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "…"


def fmt_ms(value_ms: float) -> str:
    """Milliseconds without exponent notation: 0.0518, 3.7, 949, 2,320."""
    return f"{value_ms:,.0f}" if abs(value_ms) >= 100 else f"{value_ms:.3g}"


def _auto_log_y(ax: Any, values: Sequence[float]) -> bool:
    """Switch to a log y axis when positive values span more than two decades (an early loss of
    100 next to a final 0.2 would flatten everything else); returns True when it did."""
    if not values or min(values) <= 0 or max(values) / min(values) <= 100:
        return False
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_yscale("log")
    # plain numbers: the default log labels are math text, which is switched off here
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    return True


def repeat_color(k: int) -> str:
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
    return palette[k % len(palette)]


@contextmanager
def figure_panels(rows: int, cols: int, height_in: float) -> Iterator[tuple[Any, list[Any]]]:
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(WIDTH_IN, height_in), layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
        yield fig, axes


def to_data_uri(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _integer_x(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _draw_band(ax: Any, band: Band, confidence: float, *, dashed: bool = False, note: str = "") -> None:
    if band.empty:
        return
    ax.fill_between(band.x, band.low, band.high, color=BAND_COLOR, alpha=0.22, linewidth=0,
                    label=f"{confidence:.0%} t-interval of the mean{note}", zorder=1)
    ax.plot(band.x, band.mean, color=MEAN_COLOR, linewidth=1.4, linestyle="--" if dashed else "-",
            label="mean across repeats", zorder=3)


@dataclass
class Criterion:
    direction: str  # higher | lower
    target: float
    threshold: float


def _draw_criterion(ax: Any, c: Criterion, values: Sequence[float]) -> None:
    """Threshold and target lines, and the acceptable side shaded."""
    sign = ">=" if c.direction == "higher" else "<="
    lo = min([*values, c.threshold, c.target])
    hi = max([*values, c.threshold, c.target])
    pad = (hi - lo) * 0.08 or abs(hi) * 0.05 or 0.05
    ax.set_ylim(lo - pad, hi + pad)
    top = hi + pad if c.direction == "higher" else lo - pad
    ax.axhspan(min(c.threshold, top), max(c.threshold, top), color=PASS_COLOR, alpha=0.07, zorder=0)
    ax.axhline(c.threshold, color=PASS_COLOR, linestyle="--", linewidth=1.2,
               label=f"acceptance threshold {sign} {c.threshold:.4g}", zorder=2)
    if c.target != c.threshold:
        ax.axhline(c.target, color=PASS_COLOR, linestyle=":", linewidth=1.0, label=f"target {c.target:.4g}", zorder=2)


def add_legend(ax: Any, **kw: Any) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, frameon=False, **kw)


def _figure_legend(fig: Any, axes: list[Any]) -> None:
    """One legend under all panels (labels deduplicated), so no legend hides a curve."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncols=min(5, len(seen)),
                   frameon=False)


FRACTIONS = ("accuracy", "top5_accuracy", "map", "map_50", "map_75")


def range_clip(band: Band, metric: str) -> tuple[Band, bool]:
    """A fraction's t-interval clipped to [0, 1] (at n = 2 an accuracy band reached -0.1 to 1.55):
    the mean cannot leave the range, so the part of the interval outside it says nothing; the
    legend says the band was clipped.  (A logit interval would live in the range but is not the
    interval the verdict decides with.)"""
    if band.empty or not (metric in FRACTIONS or metric.startswith("ap_50_")):
        return band, False
    low, high = [max(0.0, v) for v in band.low], [min(1.0, v) for v in band.high]
    return Band(x=band.x, mean=band.mean, low=low, high=high, n=band.n), (low != band.low or high != band.high)


def _clip_band(band: Band, values: Sequence[float]) -> Band:
    """On a log axis an interval reaching below zero cannot be drawn: clip it to the data's range."""
    if not values or min(values) <= 0 or max(values) / min(values) <= 100:
        return band
    floor = min(values) / 2
    return Band(x=band.x, mean=band.mean, low=[max(v, floor) for v in band.low], high=band.high, n=band.n)


@dataclass
class EvalPanel:
    metric: str
    curves: dict[int, Curve]
    band: Band
    criterion: Criterion | None = None


def convergence(loss: dict[int, Curve], loss_band: Band, evals: list[EvalPanel], confidence: float) -> str:
    """Training loss per step and evaluation metrics per epoch, each repeat and the band across them."""
    panels = (1 if loss else 0) + len(evals)
    cols = 1 if panels == 1 else 2
    rows = (panels + cols - 1) // cols
    with figure_panels(rows, cols, 3.7 * rows) as (fig, axes):
        i = 0
        if loss:
            ax = axes[i]
            i += 1
            for k, curve in sorted(loss.items()):
                c = thin(curve)
                ax.plot(c.x, c.y, color=repeat_color(k), linewidth=0.8, alpha=0.75, label=f"repeat {k}", zorder=2)
            _draw_band(ax, _clip_band(loss_band, [v for c in loss.values() for v in c.y]), confidence)
            log = _auto_log_y(ax, [v for c in loss.values() for v in c.y])
            ax.set_title("training loss per step")
            ax.set_xlabel("step")
            ax.set_ylabel("loss (log scale)" if log else "loss")
        for panel in evals:
            ax = axes[i]
            i += 1
            values = []
            for k, curve in sorted(panel.curves.items()):
                ax.plot(curve.x, curve.y, color=repeat_color(k), marker="o", markersize=4, linewidth=1.0,
                        alpha=0.85, label=f"repeat {k}", zorder=2)
                values += curve.y
            log = panel.criterion is None and _auto_log_y(ax, values)
            band, clipped = range_clip(_clip_band(panel.band, values) if log else panel.band, panel.metric)
            _draw_band(ax, band, confidence, dashed=True, note=", clipped to [0, 1]" if clipped else "")
            values += band.low + band.high
            if panel.criterion is not None:
                _draw_criterion(ax, panel.criterion, values)
            ax.set_title(f"{short_label(panel.metric)} per epoch (evaluation)")
            ax.set_xlabel("epoch")
            ax.set_ylabel(short_label(panel.metric) + (" (log scale)" if log else ""))
            _integer_x(ax)
        for ax in axes[i:]:
            ax.set_visible(False)
        _figure_legend(fig, axes[:i])
        return to_data_uri(fig)


@dataclass
class DistPanel:
    metric: str
    values: list[tuple[int, float]]  # (repeat, value) of completed repeats
    mean: float | None = None
    ci: tuple[float, float] | None = None
    confidence: float = 0.95
    criterion: Criterion | None = None
    reference_values: list[float] = field(default_factory=list)
    reference_mean: float | None = None
    reference_ci: tuple[float, float] | None = None
    margin: float | None = None
    reference_label: str = "reference"


def _jitter(n: int) -> list[float]:
    # deterministic spread so the same run always draws the same picture
    if n <= 1:
        return [0.0] * n
    return [-0.12 + 0.24 * i / (n - 1) for i in range(n)]


def distributions(panels: list[DistPanel]) -> str:
    """Per metric: repeat values (strip, box from 5 values), mean ± t-interval, band, reference."""
    cols = min(3, len(panels))
    rows = (len(panels) + cols - 1) // cols
    with figure_panels(rows, cols, 3.5 * rows) as (fig, axes):
        for ax, p in zip(axes, panels, strict=False):
            ys = [v for _, v in p.values]
            has_ref = bool(p.reference_values) or p.reference_mean is not None
            if len(ys) >= 5:
                ax.boxplot([ys], positions=[0], widths=0.45, showfliers=False, patch_artist=True,
                           boxprops={"facecolor": "#eef2f6", "edgecolor": BAND_COLOR},
                           medianprops={"color": BAND_COLOR}, whiskerprops={"color": BAND_COLOR},
                           capprops={"color": BAND_COLOR})
            for (k, v), dx in zip(p.values, _jitter(len(p.values)), strict=True):
                ax.scatter([dx], [v], color=repeat_color(k), s=36, zorder=4, edgecolors="white", linewidths=0.6)
            all_values = list(ys)
            if p.mean is not None:
                low, high = p.ci if p.ci else (p.mean, p.mean)
                ax.errorbar([0.28], [p.mean], yerr=[[p.mean - low], [high - p.mean]], fmt="D", color=MEAN_COLOR,
                            markersize=5, capsize=4, label=f"mean, {p.confidence:.0%} t-interval", zorder=5)
                all_values += [low, high]
            if has_ref:
                rv = p.reference_values
                for v, dx in zip(rv, _jitter(len(rv)), strict=True):
                    ax.scatter([1 + dx], [v], color=REF_COLOR, marker="s", s=30, zorder=4, alpha=0.8)
                all_values += rv
                if p.reference_mean is not None:
                    m = p.reference_mean
                    low, high = p.reference_ci if p.reference_ci else (m, m)
                    ax.errorbar([1.28], [m], yerr=[[m - low], [high - m]], fmt="D", color=REF_COLOR, markersize=5,
                                capsize=4, label=f"{short_label(p.reference_label)} mean", zorder=5)
                    all_values += [low, high]
                    if p.margin:
                        ax.axhspan(m - p.margin, m + p.margin, color=REF_COLOR, alpha=0.09, zorder=0,
                                   label=f"reference ± margin {p.margin:.4g}")
                        all_values += [m - p.margin, m + p.margin]
            if p.criterion is not None:
                _draw_criterion(ax, p.criterion, all_values)
            ax.set_xticks([0, 1] if has_ref else [0])
            ax.set_xticklabels(["this run", "reference"] if has_ref else ["this run"])
            ax.set_xlim(-0.5, 1.6 if has_ref else 0.6)
            ax.set_title(f"{short_label(p.metric)} (n = {len(ys)})")
            ax.grid(axis="x", visible=False)
        for ax in axes[len(panels):]:
            ax.set_visible(False)
        _figure_legend(fig, axes[:len(panels)])
        return to_data_uri(fig)


def step_time(rows: list[dict[str, Any]]) -> str:
    """Stacked mean step phases per repeat, and the overlapped costs in a bar beside them."""
    overlapped = [(key, name) for key, name in OVERLAPPED if any(r.get(key) for r in rows)]
    width = 0.36 if overlapped else 0.55
    height = 3.6 if len(rows) <= 12 else 4.2
    with figure_panels(1, 1, height) as (fig, axes):
        ax = axes[0]
        xs = list(range(len(rows)))
        left = [x - width / 2 if overlapped else x for x in xs]
        bottom = [0.0] * len(rows)
        for (key, name), color in zip((*PHASES, ("other_s", "other (step time not in a phase)")), PHASE_COLORS,
                                      strict=True):
            heights = [1000.0 * (r.get(key) or 0.0) for r in rows]
            if any(heights):
                ax.bar(left, heights, width, bottom=bottom, color=color, label=name, edgecolor="white", linewidth=0.5)
                bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        for x, r in zip(left, rows, strict=True):
            if r.get("step_time_s") is not None:
                ax.annotate(f"{fmt_ms(1000.0 * r['step_time_s'])} ms", (x, 1000.0 * r["step_time_s"]),
                            textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8.5)
        if overlapped:
            bottom = [0.0] * len(rows)
            right = [x + width / 2 for x in xs]
            for (key, name), color in zip(overlapped, OVERLAP_COLORS, strict=False):
                heights = [1000.0 * (r.get(key) or 0.0) for r in rows]
                ax.bar(right, heights, width, bottom=bottom, color=color, hatch="//", edgecolor="white",
                       linewidth=0.5, label=f"{name} (overlaps the phases)")
                bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.set_xticks(xs)
        ax.set_xticklabels([f"repeat {r['repeat']}" for r in rows])
        ax.set_ylabel("mean time per step (ms)")
        ax.grid(axis="x", visible=False)
        ax.margins(y=0.12)
        ax.legend(frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        return to_data_uri(fig)


@dataclass
class EquivalenceRow:
    metric: str
    status: str
    diff: float | None
    ci: tuple[float, float] | None
    margin: float
    test: str  # equivalence | non_inferiority
    direction: str
    confidence: float


def equivalence(rows: list[EquivalenceRow]) -> str:
    """Each compared metric: the interval of (run − reference) against the margin."""
    colors = {REPRODUCED: PASS_COLOR, NOT_REPRODUCED: "#b42318", INCONCLUSIVE: "#b25e00"}
    with figure_panels(len(rows), 1, 0.5 + 1.05 * len(rows)) as (fig, axes):
        for ax, r in zip(axes, rows, strict=True):
            m = r.margin
            lo, hi = r.ci if r.ci else (r.diff, r.diff)
            if r.test == "equivalence":
                ax.axvspan(-m, m, color=PASS_COLOR, alpha=0.1)
            elif r.direction == "higher":
                ax.axvspan(-m, max(hi or 0.0, m, 0.0) + abs(m) + 1e-12, color=PASS_COLOR, alpha=0.1)
            else:
                ax.axvspan(min(lo or 0.0, -m, 0.0) - abs(m) - 1e-12, m, color=PASS_COLOR, alpha=0.1)
            for edge in ((-m, m) if r.test == "equivalence" else ((-m,) if r.direction == "higher" else (m,))):
                ax.axvline(edge, color=PASS_COLOR, linestyle="--", linewidth=1)
            ax.axvline(0.0, color=BAND_COLOR, linewidth=0.8)
            color = colors.get(r.status, BAND_COLOR)
            if r.diff is not None:
                ax.errorbar([r.diff], [0], xerr=[[r.diff - lo], [hi - r.diff]], fmt="o", color=color, capsize=5,
                            markersize=6, linewidth=2)
            span = max(abs(v) for v in (m, lo or 0.0, hi or 0.0)) or 1.0
            ax.set_xlim(-1.25 * span, 1.25 * span)
            ax.set_yticks([])
            ax.grid(axis="y", visible=False)
            ax.set_title(f"{short_label(r.metric)}: {r.status}   ({r.confidence:.0%} CI of run − reference; "
                         f"margin ±{m:.4g})", loc="left", fontsize=10)
        axes[-1].set_xlabel("difference run − reference (metric units)")
        return to_data_uri(fig)
