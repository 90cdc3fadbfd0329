"""The report's study-design blocks: a sequential run's stopping point, a factorial run's
variance decomposition and the metrics split by node (verdict.json ``design``, ``variance`` and
``nodes``; docs/verify.md)."""

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
    for split in (as_dict(s) for s in as_list(doc.get("nodes"))):
        rows = [[g.get("node"), g.get("n"), num(g.get("mean")), num(g.get("sd")) if g.get("sd") is not None else "-"]
                for g in (as_dict(g) for g in as_list(split.get("groups")))]
        p = split.get("p_value")
        said = ("No test: two nodes with two repeats each are needed." if p is None else
                f"One-way ANOVA across the nodes: p = {num(p)}"
                + (", the nodes' means differ: part of the spread is where the repeats ran." if split.get("differs")
                   else ", no difference between the nodes shown."))
        out.append(subsection(f"{split.get('metric')} by node (repeats side by side on several nodes)",
                              table(["node", "n", "mean", "sd"], rows), caption(said)))
    return out
