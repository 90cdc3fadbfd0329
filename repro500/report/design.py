"""The report's study-design blocks: a sequential run's stopping point and a factorial run's
variance decomposition (verdict.json ``design`` and ``variance``; docs/verify.md)."""

from __future__ import annotations

from typing import Any

from repro500.report.html import Markup, num, pct, subsection, table
from repro500.report.sections import as_dict, as_list, caption


def study_design(doc: dict[str, Any]) -> list[Markup]:
    out = []
    design = as_dict(doc.get("design"))
    if design:
        stopped = design.get("stopped_at")
        out.append(subsection("Sequential design (run --until-decided)", caption(
            f"{'Stopped when decided after ' + str(stopped) if stopped else 'Looked after ' + str(design.get('look'))} "
            f"of up to {design.get('max_repeats')} repeats; decisions at the nominal level "
            f"{num(design.get('nominal_level'))} of that look ({design.get('spending')} spending of alpha "
            f"{num(doc.get('alpha'))}, calibrated for t statistics).")))
    for result in (as_dict(r) for r in as_list(doc.get("variance"))):
        rows = []
        for c in (as_dict(c) for c in as_list(result.get("components"))):
            ci, share_ci = as_list(c.get("ci")), as_list(c.get("share_ci"))
            rows.append([c.get("source"), c.get("n"), num(c.get("sd")), num(c.get("variance")),
                         f"[{num(ci[0])}, {num(ci[1])}]" if len(ci) == 2 else "-",
                         pct(c.get("share"), 0) if c.get("share") is not None else "-",
                         f"[{pct(share_ci[0], 0)}, {pct(share_ci[1], 0)}]" if len(share_ci) == 2 else "-",
                         c.get("repeats_needed") if c.get("repeats_needed") is not None else "-"])
        notes = [f"Dominant source: {result.get('dominant')}."] if result.get("dominant") else []
        notes += [str(n) for n in as_list(result.get("notes"))]
        out.append(subsection(f"Where the variance of {result.get('metric')} comes from (run --vary)", table(
            ["source", "n", "sd", "variance", "95% CI", "share", "90% CI of the share", "repeats were only it random"],
            rows), caption(" ".join(notes))))
    return out
