"""The report's "Where the runs part" section: |Δ loss| per step of each pair the verdict
compares step by step (repro500.verify.divergence), on a log scale, the first divergence marked.

Only the verdict's pairs are drawn (at most :data:`MAX_PAIRS`, those that part first); a pair
whose steps agree bitwise has no |Δ| above zero to draw and is listed instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repro500.errors import ReproError
from repro500.report import plots
from repro500.report.html import Markup, bullet_list, image, para, section
from repro500.report.load import RunView
from repro500.report.verdict_source import VerdictView
from repro500.statuses import SKIPPED
from repro500.verify.divergence import read_records, readable_root
from repro500.verify.reference import load_reference

MAX_PAIRS = 4
TITLE = "Where the runs part"


def _records(view: RunView, reference_root: Path | None, pair: dict[str, Any]) -> tuple[Any, Any] | None:
    if view.data is None:
        return None
    mine = read_records(view.root, int(pair["repeat"]), view.data.recipe)
    if pair.get("other") == "reference":
        if reference_root is None:
            return None
        return mine, read_records(reference_root, int(pair["other_repeat"]), view.data.recipe)
    return mine, read_records(view.root, int(pair["other_repeat"]), view.data.recipe)


def plot(curves: list[tuple[str, list[tuple[int, float]], int | None]]) -> str:
    """|Δ| per step of each pair on a log y axis; a dashed line at each pair's first divergence."""
    from matplotlib.ticker import FuncFormatter


    with plots.figure_panels(1, 1, 3.6) as (fig, axes):
        ax = axes[0]
        for i, (label, points, first) in enumerate(curves):
            color = plots.repeat_color(i)
            shown = [(s, d) for s, d in points if d > 0]  # zero has no place on a log axis: identical steps
            same = [s for s, d in points if d == 0]
            if same:  # ticks along the bottom: the steps the pair agrees at bitwise
                ax.scatter(same, [0.02 + 0.03 * i] * len(same), marker="|", s=30, color=color,
                           transform=ax.get_xaxis_transform(), label=plots.short_label(f"{label}: identical"))
            if shown:
                ax.plot([s for s, _ in shown], [d for _, d in shown], marker=".", markersize=3, linewidth=1,
                        color=color, label=plots.short_label(label))
            if first is not None:
                ax.axvline(first, color=color, linestyle="--", linewidth=1)
                ax.annotate(f"first divergence: step {first}", xy=(first, 1), xycoords=("data", "axes fraction"),
                            xytext=(4, -12 - 12 * i), textcoords="offset points", fontsize=8.5, color=color)
        steps = [s for _, points, _ in curves for s, _ in points]
        if steps:
            ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("step")
        ax.set_ylabel("|Δ loss|")
        plots.add_legend(ax, loc="lower right")
        return plots.to_data_uri(fig)


def divergence_section(view: RunView, verdict: VerdictView, reference_root: Path | None = None) -> Markup:
    doc = verdict.doc.get("divergence") if isinstance(verdict.doc.get("divergence"), dict) else None
    if not doc or doc.get("status") == SKIPPED:
        why = (doc or {}).get("reason") or "the verdict compared no pair step by step"
        return section("divergence", TITLE, para(why, "note"))
    pairs = [p for p in doc.get("pairs") or [] if isinstance(p, dict)]
    parted = sorted((p for p in pairs if p.get("shape") not in ("none", "unrecorded")),
                    key=lambda p: (p.get("first_step") or 10**12, str(p.get("label"))))
    curves, agree = [], []
    for pair in parted[:MAX_PAIRS]:
        found = _records(view, reference_root, pair)
        if found is None:
            continue
        from repro500.verify.divergence import deltas

        curves.append((str(pair.get("label")), deltas(*found), pair.get("first_step")))
    agree = [str(p.get("detail")) for p in pairs if p.get("shape") == "none"]
    parts: list[Markup] = [para(str(doc.get("reason") or ""))]
    if curves and any(d > 0 for _, points, _ in curves for _, d in points):
        parts.append(image(plot(curves), "absolute loss difference per step of each pair, log scale"))
        parts.append(para("|Δ loss| between the two repeats of each pair at every step both recorded, on a log "
                          "scale; the steps where it agrees bitwise (|Δ| = 0) are the ticks along the bottom. The dashed line is where the pair first "
                          "parts; after it everything may differ, and nothing is claimed there. repro500 locate "
                          "names the first operator.", "caption"))
    elif parted:
        parts.append(para("the pairs part in their evaluation or final parameters, not in a step's loss: no |Δ| per "
                          "step to draw", "note"))
    if agree:
        parts.append(bullet_list(agree[:MAX_PAIRS]))
    return section("divergence", TITLE, *parts)


def section_for(view: RunView, verdict: VerdictView, against: str | Path | None) -> Markup:
    """The section, with a reference run's records read where they lie (a packed reference unpacked
    again for as long as the section takes)."""
    reference_pairs = any(isinstance(p, dict) and p.get("other") == "reference"
                          for p in ((verdict.doc.get("divergence") or {}).get("pairs") or []))
    if against is None or not reference_pairs:
        return divergence_section(view, verdict)

    try:
        reference = load_reference(against)
    except ReproError:
        return divergence_section(view, verdict)
    with readable_root(reference) as root:
        return divergence_section(view, verdict, root)
