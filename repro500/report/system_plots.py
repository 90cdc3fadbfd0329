"""The report's figures about the machine (repro500.system): the roofline with a run placed on
it, and horizontal bars for operator errors and read throughput.  Same conventions as
``plots.py`` (matplotlib's Agg, no pyplot, mathtext off, base64 PNG)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from repro500.report.plots import (
    MEAN_COLOR,
    PASS_COLOR,
    REF_COLOR,
    figure_panels,
    repeat_color,
    short_label,
    to_data_uri,
)

CEILING_COLORS = {"fp32": "#2f6db5", "bf16": "#e08a2e", "fp16": "#6aa84f"}


@dataclass
class Ceilings:
    """One device's measured ceilings: peak FLOP/s per dtype and the memory bandwidth."""

    device: str
    peaks_flops_per_s: dict[str, float]
    bandwidth_bytes_per_s: float
    source: str = ""


@dataclass
class RunPoint:
    label: str
    intensity: float  # FLOP / byte
    flops_per_s: float
    repeats: list[tuple[float, float]] = field(default_factory=list)  # (intensity, FLOP/s) per repeat


def roofline(ceilings: Ceilings, points: Sequence[RunPoint]) -> str:
    """Log-log roofline: the memory slope and a flat roof per dtype, the runs as markers."""
    import numpy as np

    peaks = ceilings.peaks_flops_per_s
    bw = ceilings.bandwidth_bytes_per_s
    ridge = [p / bw for p in peaks.values()] or [1.0]
    xs = [pt.intensity for pt in points] + ridge
    lo, hi = min(xs) / 8, max(xs) * 8
    x = np.logspace(np.log10(lo), np.log10(hi), 200)
    with figure_panels(1, 1, 4.6) as (fig, (ax,)):
        ax.set_xscale("log")
        ax.set_yscale("log")
        for dtype, peak in sorted(peaks.items(), key=lambda kv: -kv[1]):
            ax.plot(x, np.minimum(peak, bw * x), color=CEILING_COLORS.get(dtype, MEAN_COLOR), lw=2,
                    label=f"{dtype} peak {peak / 1e9:.3g} GFLOP/s (ridge at {peak / bw:.3g} FLOP/B)")
        ax.plot(x, bw * x, color=MEAN_COLOR, lw=0.8, ls=":", label=f"memory {bw / 1e9:.3g} GB/s (triad)")
        for i, pt in enumerate(points):
            color = REF_COLOR if i else PASS_COLOR
            ax.scatter([r[0] for r in pt.repeats], [r[1] for r in pt.repeats], s=14, color=color, alpha=0.5)
            ax.scatter([pt.intensity], [pt.flops_per_s], s=70, marker="D", color=color, zorder=5,
                       label=short_label(f"{pt.label}: {pt.flops_per_s / 1e9:.3g} GFLOP/s at {pt.intensity:.3g} FLOP/B"))
        top = max([*peaks.values(), *(pt.flops_per_s for pt in points), 1.0])
        ax.set_ylim(top=top * 3)
        from matplotlib.ticker import FuncFormatter, NullFormatter

        # plain numbers: the default log labels are math text, which the report switches off
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1e9:g}"))
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("arithmetic intensity (FLOP / byte)")
        ax.set_ylabel("GFLOP/s")
        ax.set_title(short_label(f"roofline of {ceilings.device}" + (f" ({ceilings.source})" if ceilings.source else "")))
        ax.legend(loc="lower right", fontsize=8)
        return to_data_uri(fig)


def bars(labels: Sequence[str], values: Sequence[float | None], *, xlabel: str, limits: Sequence[float | None] | None = None,
         limit_label: str = "limit", log: bool = False) -> str:
    """Horizontal bars (one per case), with a tick mark at each case's limit (a tolerance, a raw read)."""
    n = max(1, len(labels))
    with figure_panels(1, 1, min(0.28 * n + 1.2, 14.0)) as (fig, (ax,)):
        ys = list(range(n))
        shown = [v if v is not None else 0.0 for v in values]
        ax.barh(ys, shown, color=[repeat_color(0)] * n)
        if limits is not None:
            marks = [(y, lim) for y, lim in zip(ys, limits, strict=True) if lim is not None]
            ax.scatter([m[1] for m in marks], [m[0] for m in marks], marker="|", s=200, color=REF_COLOR, zorder=5,
                       label=limit_label)
            ax.legend(loc="lower right", fontsize=8)
        ax.set_yticks(ys, [short_label(t) for t in labels], fontsize=7)
        ax.invert_yaxis()
        if log and any(v > 0 for v in shown):
            from matplotlib.ticker import FuncFormatter, NullFormatter

            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(xlabel)
        return to_data_uri(fig)
