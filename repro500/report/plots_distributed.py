"""The report's figures of a distributed run: bytes on the wire per step and the scaling model
against measurements (same conventions as :mod:`repro500.report.plots`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from repro500.report.plots import add_legend, figure_panels, repeat_color, to_data_uri
from repro500.report.series import Curve, thin


def _log2_x(ax: Any, ps: Sequence[float]) -> None:
    """Base-2 log axis labelled with the process counts themselves (no mathtext)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(ps))))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def _byte_scale(values: Sequence[float]) -> tuple[float, str]:
    top = max(values, default=0.0)
    for factor, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if top >= factor:
            return float(factor), unit
    return 1.0, "B"


def wire(curves: dict[str, dict[int, Curve]]) -> str:
    """Bytes sent and received per step for each repeat, and the compression ratio."""
    ratio = curves.get("compression_ratio") or {}
    cols = 2 if ratio else 1
    with figure_panels(1, cols, 3.6) as (fig, axes):
        ax = axes[0]
        every = [v for key in ("bytes_sent", "bytes_received") for c in curves.get(key, {}).values() for v in c.y]
        factor, unit = _byte_scale(every)
        for key, style in (("bytes_sent", "-"), ("bytes_received", "--")):
            for k, curve in sorted(curves.get(key, {}).items()):
                c = thin(curve)
                ax.plot(c.x, [v / factor for v in c.y], linestyle=style, color=repeat_color(k), linewidth=1.0,
                        label=f"repeat {k} {key.replace('_', ' ')}")
        ax.set_title("bytes on the wire per step (one rank)")
        ax.set_xlabel("step")
        ax.set_ylabel(f"bytes per step ({unit})")
        ax.set_ylim(0, 1.25 * max(every, default=1.0) / factor)
        add_legend(ax, ncols=2, loc="lower right")
        if ratio:
            ax = axes[1]
            for k, curve in sorted(ratio.items()):
                c = thin(curve)
                ax.plot(c.x, c.y, color=repeat_color(k), linewidth=1.0, label=f"repeat {k}")
            ax.set_title("compression ratio (dense bytes / bytes sent)")
            ax.set_xlabel("step")
            ax.set_ylabel("ratio (x)")
            ax.set_ylim(0, 1.25 * max((v for c in ratio.values() for v in c.y), default=1.0))
            add_legend(ax, loc="lower right")
        return to_data_uri(fig)


def scaling(predictions: list[dict[str, float]], measured: list[dict[str, float]]) -> str:
    """The alpha-beta model's step time and efficiency over process counts, with measurements."""
    has_eff = any("efficiency" in p for p in predictions)
    with figure_panels(1, 2 if has_eff else 1, 3.6) as (fig, axes):
        ax = axes[0]
        ax.plot([p["p"] for p in predictions], [1000.0 * p["step_time_s"] for p in predictions], marker="o",
                color="#2f6db5", label="model prediction")
        if measured:
            ax.scatter([m["p"] for m in measured], [1000.0 * m["step_time_s"] for m in measured], marker="X", s=90,
                       color="#c0504d", zorder=5, label="measured")
        _log2_x(ax, [p["p"] for p in predictions] + [m["p"] for m in measured])
        ax.set_title("step time vs processes")
        ax.set_xlabel("processes (p)")
        ax.set_ylabel("step time (ms)")
        add_legend(ax)
        if has_eff:
            ax = axes[1]
            pts = [p for p in predictions if "efficiency" in p]
            ax.plot([p["p"] for p in pts], [100.0 * p["efficiency"] for p in pts], marker="o", color="#2f6db5",
                    label="model prediction")
            meas = [m for m in measured if "efficiency" in m]
            if meas:
                ax.scatter([m["p"] for m in meas], [100.0 * m["efficiency"] for m in meas], marker="X", s=90,
                           color="#c0504d", zorder=5, label="measured")
            _log2_x(ax, [p["p"] for p in pts] + [m["p"] for m in meas])
            ax.set_ylim(0, 105)
            ax.set_title("scaling efficiency vs processes")
            ax.set_xlabel("processes (p)")
            ax.set_ylabel("efficiency (%)")
            add_legend(ax)
        return to_data_uri(fig)
