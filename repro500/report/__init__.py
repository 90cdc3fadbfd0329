"""``repro500 report``: one self-contained ``report.html`` for a run directory.

The report reads files only (no torch, no training code): the run directory's records and
summaries, its manifest, an optional scaling model in ``derived/scaling.json``, and the
verdict (recomputed or re-checked, see ``verdict_source``).  Plots are matplotlib PNGs
embedded as base64; the page has no scripts and loads nothing from outside.

Modules: ``load`` (read the run), ``verdict_source`` (which verdict to show), ``series``
(numbers behind the plots), ``plots`` (figures), ``sections`` (HTML per section), ``divergence``
(where same-seed pairs part: |Δ loss| per step), ``html`` (the building blocks and the page, rendered
by the Jinja2 templates in ``templates/``, which escape every value from the run).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from repro500 import __version__, untrusted
from repro500.errors import EXIT_INVALID, EXIT_OK, InvalidInput, UsageError
from repro500.redact import redact_values
from repro500.report.load import check_run_dir, load_view
from repro500.rundir import archive as archives
from repro500.rundir import atomic, layout
from repro500.rundir.writable import writing
from repro500.verify.reference import load_reference

REPORT_NAME = layout.REPORT


@dataclass
class ReportResult:
    path: Path
    status: str  # the verdict's status (PASS, FAIL, ..., INVALID)
    exit_code: int  # 0 when the report was written for a valid run, 4 for an INVALID one
    sections: list[str] = field(default_factory=list)  # section ids, in page order
    images: int = 0
    render_time_s: float = 0.0
    warnings: list[str] = field(default_factory=list)


def default_output(run: Path, run_id: str) -> Path:
    """RUN/report.html for a directory; <run-id>.report.html next to an archive."""
    if archives.is_archive(run):
        return run.parent / f"{run_id}.{REPORT_NAME}"
    return run / REPORT_NAME


def _resolve_output(run: Path, root: Path, out: str | Path | None) -> Path:
    target = default_output(run, root.name) if out is None else Path(out)
    if target.is_dir():
        target = target / REPORT_NAME
    if run.is_dir():
        # Anything else written inside the run directory would be an extra file that makes
        # the next `repro500 verify` report the run as tampered.
        inside = target.resolve().is_relative_to(run.resolve())
        allowed = target.resolve() == (run / REPORT_NAME).resolve() or target.resolve().is_relative_to(
            (run / layout.DERIVED).resolve())
        if inside and not allowed:
            raise UsageError(f"{target} lies inside the run directory, where any file but report.html or derived/* "
                             "would fail verification: write the report elsewhere")
    if target.suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"{target} does not end in .html: give the report file a .html name")
    return target


def write_report(
    run: str | Path,
    *,
    out: str | Path | None = None,
    against: str | Path | None = None,
    alpha: float | None = None,
    margins: dict[str, float] | None = None,
    roofline: str | Path | None = None,
    across_benchmarks: bool = False,
) -> ReportResult:
    """Render the report of ``run`` (a run directory or a packed ``.tar.gz``) and write it;
    ``roofline`` is a ``repro500 roofline`` run whose ceilings the run is placed under.

    Raises InvalidInput (exit 4) when RUN or the reference is missing or unreadable and
    UsageError (exit 2) for arguments that do not fit.  A run that fails its integrity check
    still gets a report saying why, with ``exit_code`` 4.
    """
    started = time.perf_counter()
    run_path = Path(run)
    if archives.is_archive(run_path):
        with tempfile.TemporaryDirectory(prefix="repro500-report-") as tmp:
            root = archives.unpack(run_path, tmp)
            return _write(run_path, root, out, against, alpha, margins, started, roofline, across_benchmarks)

    check_run_dir(run_path)
    if roofline is not None:
        _check_roofline(Path(roofline))
    return _write(run_path, run_path, out, against, alpha, margins, started, roofline, across_benchmarks)


def _check_roofline(path: Path) -> None:
    from repro500.report.system import is_roofline

    check_run_dir(path)
    if not is_roofline(path):
        raise InvalidInput(f"{path} is not a repro500 roofline run (its recipe measures no roofline): "
                           "measure the ceilings with `repro500 roofline`")


def _write(run_path: Path, root: Path, out: str | Path | None, against: str | Path | None, alpha: float | None,
           margins: dict[str, float] | None, started: float, roofline: str | Path | None = None,
           across_benchmarks: bool = False) -> ReportResult:
    target = _resolve_output(run_path, root, out)
    html_text, verdict, sections, images = build_html(root, against=against, alpha=alpha, margins=margins,
                                                      shown_path=str(run_path), roofline=roofline,
                                                      across_benchmarks=across_benchmarks)

    html_text = redact_values(html_text)  # a secret value copied into the run (a recipe note) stays here
    html_text = untrusted.encodable(html_text)  # a file name that is not UTF-8, named by the verdict
    with writing("the report", target, "give --out a writable path, e.g. --out /tmp/report.html"):
        atomic.write_text(target, html_text)
    return ReportResult(path=target, status=verdict.status,
                        exit_code=EXIT_INVALID if verdict.invalid else EXIT_OK, sections=sections, images=images,
                        render_time_s=time.perf_counter() - started, warnings=list(verdict.warnings))


def build_html(
    root: Path,
    *,
    against: str | Path | None = None,
    alpha: float | None = None,
    margins: dict[str, float] | None = None,
    shown_path: str | None = None,
    roofline: str | Path | None = None,
    across_benchmarks: bool = False,
) -> tuple[str, object, list[str], int]:
    """(html, verdict view, section ids, number of plots) for the run directory ``root``."""
    from repro500.report import divergence, html, sections, variants, verdict_details
    from repro500.report.system import system_section
    from repro500.report.verdict_source import obtain_verdict

    verdict = obtain_verdict(root, against=against, alpha=alpha, margins=margins, across_benchmarks=across_benchmarks)
    if shown_path:
        verdict.doc["run_dir"] = shown_path
    view = load_view(root, readable=not verdict.invalid)
    body: list[tuple[str, str, html.Markup]] = []  # (id, title, html)
    if not verdict.invalid:
        reference = _reference(against)
        system = ("system", "System", system_section(view, Path(roofline) if roofline else None))
        if view.summary.get("workload") == "system":  # a measurement of the machine: no training to show
            body += [system, ("distributions", "Distributions", sections.distributions(view, verdict, reference))]
        else:
            body += [
                ("convergence", "Convergence", sections.convergence(view, verdict)),
                ("divergence", "Where the runs part", divergence.section_for(view, verdict, against)),
                ("distributions", "Distributions", sections.distributions(view, verdict, reference)),
                ("step-time", "Step time", sections.step_time(view)),
                ("wire", "Bytes on the wire", sections.wire(view)),
                ("scaling", "Scaling model", sections.scaling(view)),
                ("variants", "Variant and sampling", variants.variants_section(view, verdict.doc)),
                system,
            ]
        body.append(("provenance", "Provenance", sections.provenance(view, verdict, reference)))
    body.append(("verdict", "Verdict details", verdict_details.verdict_sections(verdict)))
    for text in view.notes:
        if "scaling" not in text:  # the scaling section says that one itself
            verdict.warnings.append(text)
    toc = [(ident, title) for ident, title, _ in body]
    head = sections.header(view, verdict, toc)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    footer = html.footer(__version__, now, shown_path or str(root))
    recipe = view.run_json.get("recipe_name") or view.summary.get("recipe_name") or root.name
    title = f"repro500 report: {recipe} ({verdict.status})"
    parts = [part for _, _, part in body]
    page = html.page(title, head, parts, footer)
    return page, verdict, [ident for ident, _ in toc], page.count('<img class="plot"')


def _reference(against: str | Path | None):  # noqa: ANN202 - ReferenceData | None, imported lazily
    if against is None:
        return None
    from repro500.report.sections import ReferenceData

    ref = load_reference(against)
    return ReferenceData(label=ref.label, values=ref.values, manifest=ref.manifest)
