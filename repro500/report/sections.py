"""The report's sections, each a function from the loaded run (and verdict) to HTML.

Every value read from the run directory or the verdict document is escaped by the helpers
in ``repro500.report.html``; documents are accessed through :func:`as_dict` / :func:`as_list` so that a
malformed field shows as missing instead of breaking the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from repro500.capture.seeds import SEED_NAMES
from repro500.report import html, plots, plots_distributed, series
from repro500.report.html import (
    Markup,
    image,
    key_values,
    num,
    para,
    pct,
    section,
    size_bytes,
    subsection,
    table,
)
from repro500.report.load import RunView, finite
from repro500.report.verdict_source import VerdictView
from repro500.statuses import DEFAULT_ALPHA, REPEAT_COMPLETED
from repro500.verify import stats
from repro500.verify.compare import compare_manifests
from repro500.verify.diff import RELEVANT_IMPACT, is_result_relevant, short

MAX_EVAL_PANELS = 3
MAX_DIST_PANELS = 6
MAX_DIFF_ROWS = 25
EXTRA_DIST_METRICS = ("time_to_quality_s", "throughput_samples_per_s")


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def note(text: str) -> Markup:
    return para(text, "note")


def caption(text: str) -> Markup:
    return para(text, "caption")


@dataclass
class ReferenceData:
    """What the distribution plots need from a reference (``--against``), if any."""

    label: str
    values: dict[str, list[float]]
    manifest: dict[str, Any] | None


def _confidence(verdict: VerdictView) -> float:
    alpha = finite(verdict.doc.get("alpha"))
    return 1.0 - (alpha if alpha and 0 < alpha < 0.5 else DEFAULT_ALPHA)


# ------------------------------------------------------------------------------ header


def header(view: RunView, verdict: VerdictView, toc: list[tuple[str, str]]) -> Markup:
    run = view.run_json
    summary = view.summary
    doc = verdict.doc
    recipe = run.get("recipe_name") or summary.get("recipe_name") or "(unnamed recipe)"
    run_id = doc.get("run_id") or run.get("run_id") or summary.get("run_id") or view.root.name
    repeats = as_dict(summary.get("repeats"))
    completed = sum(1 for s in repeats.values() if s == REPEAT_COMPLETED)
    planned = summary.get("repeats_planned") or run.get("repeats") or len(repeats)
    unsuccessful = ", ".join(f"{k}: {s}" for k, s in repeats.items() if s != REPEAT_COMPLETED)
    division = run.get("open_division")
    manifest_tool = as_dict(as_dict(view.data.manifest if view.data else None).get("tool"))
    tool = as_dict(doc.get("tool"))
    against = as_dict(doc.get("against"))
    facts: list[tuple[str, Any]] = [
        ("run id", run_id), ("run status", run.get("status") or "-"),
        ("repeats completed", f"{completed} of {planned}" + (f" ({unsuccessful})" if unsuccessful else "")),
        ("alpha", num(doc.get("alpha"))),
        ("division", "-" if division is None else ("open (a fixed key was overridden)" if division else "closed")),
        ("engine", f"{run.get('engine') or '-'} × {run.get('world_size') or 1} process(es)"),
        ("started", run.get("created_utc") or "-"), ("finished", run.get("finished_utc") or "-"),
        ("recorded by", f"repro500 {manifest_tool.get('version') or '?'}"),
        ("verdict by", f"repro500 {tool.get('version') or '?'}, {doc.get('created_utc') or '?'}"),
    ]
    if against:
        facts.append(("compared with", against.get("label") or against.get("path") or "-"))
    facts.append(("verdict source", verdict.source))
    return html.header(recipe=recipe, status=verdict.status, exit_code=doc.get("exit_code"), facts=facts,
                       warnings=verdict.warnings, reasons=as_list(doc.get("reasons")),
                       advice=as_list(doc.get("advice")), toc=toc)


# ------------------------------------------------------------------------- convergence


def _criteria(view: RunView) -> dict[str, plots.Criterion]:
    if view.data is None:
        return {}
    return {c.metric: plots.Criterion(direction=c.direction, target=c.target, threshold=c.threshold)
            for c in view.data.acceptance}


def _eval_metrics(view: RunView, available: list[str]) -> list[str]:
    preferred = [c.metric for c in view.data.acceptance] if view.data else []
    for doc in (view.data.repeats.values() if view.data else []):
        target = as_dict(doc.get("target")).get("metric")
        if isinstance(target, str):
            preferred.append(target)
    ordered = [m for m in preferred if m in available] + available
    return list(dict.fromkeys(ordered))[:MAX_EVAL_PANELS]


def convergence(view: RunView, verdict: VerdictView) -> Markup:
    conf = _confidence(verdict)
    loss = series.loss_curves(view.records)
    loss_band = series.band(loss, conf, max_points=series.MAX_BAND_POINTS)
    names = _eval_metrics(view, series.eval_metric_names(view.records))
    criteria = _criteria(view)
    panels = []
    for name in names:
        curves = series.epoch_curves(view.records, name)
        panels.append(plots.EvalPanel(metric=name, curves=curves, band=series.band(curves, conf),
                                      criterion=criteria.get(name)))
    if not loss and not panels:
        return section("convergence", "Convergence", note("no step or epoch records in repeats/<k>/metrics.jsonl"))
    parts = [image(plots.convergence(loss, loss_band, panels, conf), "convergence curves per repeat")]
    text = (f"Each colour is one repeat. The grey band is the two-sided {conf:.0%} t-interval of the mean "
            "across repeats at each step or epoch where at least two repeats have a value (the verdict's own "
            "statistics); the dark line is the mean. A metric whose values span more than two decades is drawn on a "
            "log axis, where the band is cut at half the smallest value.")
    if loss_band.x and len(loss_band.x) < len({x for c in loss.values() for x in c.x}):
        text += f" The loss band is drawn at {len(loss_band.x)} evenly spaced steps."
    if criteria and any(p.criterion for p in panels):
        text += " The green dashed line is the acceptance threshold (target ∓ tolerance); the shaded side passes."
    parts.append(caption(text))
    return section("convergence", "Convergence", *parts)


# ------------------------------------------------------------------------ distributions


def _dist_metrics(view: RunView, verdict: VerdictView) -> list[str]:
    names = [c.metric for c in view.data.acceptance] if view.data else []
    names += [str(as_dict(e).get("metric")) for e in as_list(verdict.doc.get("equivalence"))]
    names += [m for m in EXTRA_DIST_METRICS if view.data and view.data.values(m)]
    return [m for m in dict.fromkeys(names) if view.data and view.data.values(m)][:MAX_DIST_PANELS]


def distributions(view: RunView, verdict: VerdictView, reference: ReferenceData | None) -> Markup:
    conf = _confidence(verdict)
    metrics = _dist_metrics(view, verdict)
    if not metrics:
        return section("distributions", "Distributions across repeats",
                       note("no completed repeat reported an acceptance metric"))
    criteria = _criteria(view)
    statistics = as_dict(verdict.doc.get("statistics"))
    equivalence = {str(as_dict(e).get("metric")): as_dict(e) for e in as_list(verdict.doc.get("equivalence"))}
    panels = []
    for name in metrics:
        s = as_dict(statistics.get(name))
        low, high = finite(s.get("ci_low")), finite(s.get("ci_high"))
        panel = plots.DistPanel(metric=name, values=view.data.indexed_values(name), mean=finite(s.get("mean")),
                                ci=(low, high) if low is not None and high is not None else None,
                                confidence=conf, criterion=criteria.get(name))
        e = equivalence.get(name, {})
        tost = as_dict(e.get("tost"))
        panel.margin = finite(e.get("margin"))
        if reference is not None and reference.values.get(name):
            values = reference.values[name]
            panel.reference_values = list(values)
            panel.reference_mean = sum(values) / len(values)
            panel.reference_ci = stats.t_interval(values, conf)
            panel.reference_label = "reference"
        elif finite(tost.get("mean_b")) is not None:
            panel.reference_mean = finite(tost.get("mean_b"))
            panel.reference_label = "reference" + (f" (n = {tost.get('n_b')})" if tost.get("n_b") else " value")
        panels.append(panel)
    text = (f"Dots are the completed repeats (one colour per repeat, as above); the black diamond is the mean "
            f"with its {conf:.0%} t-interval; a box appears from 5 repeats. Green: the acceptance band.")
    if any(p.reference_mean is not None for p in panels):
        text += (" Purple: the reference's values and mean (with its t-interval when its repeats are known) and the "
                 "equivalence margin around the reference mean.")
    return section("distributions", "Distributions across repeats",
                   image(plots.distributions(panels), "per-metric distributions"), caption(text))


# ---------------------------------------------------------------------------- step time


def _ms(seconds: Any) -> str:
    value = finite(seconds)
    return "-" if value is None else plots.fmt_ms(1000.0 * value)


def step_time(view: RunView) -> Markup:
    rows = series.step_time_breakdown(view.records)
    rows = [r for r in rows if r.get("step_time_s") is not None or any(r.get(k) for k, _ in series.PHASES)]
    if not rows:
        return section("step-time", "Step-time breakdown",
                       note("the step records carry no timings (time_*_s, step_time_s)"))
    overlapped = [(k, name) for k, name in series.OVERLAPPED if any(r.get(k) for r in rows)]
    headers = ["repeat", "steps", "step time (ms)"] + [f"{name} (ms)" for _, name in series.PHASES] + ["other (ms)"]
    headers += [f"{name} (ms)" for _, name in overlapped]
    body = [[r["repeat"], r["steps"], _ms(r["step_time_s"]), *(_ms(r[k]) for k, _ in series.PHASES),
             _ms(r["other_s"]), *(_ms(r[k]) for k, _ in overlapped)] for r in rows]
    text = ("Mean over every step of each repeat (the first steps include warm-up). Phases follow one another "
            "in a step; 'other' is step time no phase accounts for.")
    if overlapped:
        text += (" Communication and compression are measured inside the phases (DDP hooks run during backward, "
                 "Horovod in the optimizer step), so they are drawn in the hatched bar beside the phases, "
                 "not stacked on them.")
    else:
        text += " No communication or compression time was recorded (a single process, or no compressor)."
    return section("step-time", "Step-time breakdown", image(plots.step_time(rows), "step-time breakdown"),
                   caption(text), table(headers, body))


# ---------------------------------------------------------------------- bytes on the wire


def wire(view: RunView) -> Markup:
    totals = series.wire_totals(view.records)
    if not totals:
        return section("wire", "Bytes on the wire",
                       note("this run records no bytes_sent / bytes_received (a single process exchanges nothing)"))
    curves = series.wire_curves(view.records)
    body = [[t["repeat"], t["steps"], size_bytes(t["bytes_sent_per_step"]), size_bytes(t["bytes_received_per_step"]),
             size_bytes(t["bytes_sent_total"]),
             "-" if t["compression_ratio_mean"] is None else f"{t['compression_ratio_mean']:.3g}x"] for t in totals]
    return section(
        "wire", "Bytes on the wire", image(plots_distributed.wire(curves), "bytes on the wire per step"),
        caption("Per rank and step, as the communicator counts them (solid: sent, dashed: received). The "
                "compression ratio compares with a plain ring allreduce of the same tensors."),
        table(["repeat", "steps", "sent per step", "received per step", "sent in total", "compression ratio (mean)"],
              body))


# ------------------------------------------------------------------------------ scaling


def scaling(view: RunView) -> Markup:
    model = view.scaling
    if model is None:
        why = next((n for n in view.notes if "scaling" in n), "no scaling model")
        return section("scaling", "Scaling model", note(f"{why}; run `repro500 model` to add one"))
    doc = model.doc
    rows = [[num(p["p"]), _ms(p["step_time_s"]), pct(p.get("efficiency"), 1)] for p in model.predictions]
    measured = [[num(m["p"]), _ms(m["step_time_s"]), pct(m.get("efficiency"), 1)] for m in model.measured]
    params = [(str(k), num(v) if not isinstance(v, (dict, list)) else "…") for k, v in as_dict(doc.get("model")).items()]
    parts = [image(plots_distributed.scaling(model.predictions, model.measured), "scaling model prediction vs measurement"),
             caption("Lines: the alpha-beta model's prediction (derived/scaling.json, written by repro500 model; "
                     "derived/ is a view and not covered by SHA256SUMS). Crosses: measured step times."
                     + ("" if model.measured else " No measurement is recorded in the model file."))]
    if params:
        parts.append(subsection("Model parameters", key_values(params[:12])))
    parts.append(table(["processes", "predicted step time (ms)", "predicted efficiency"], rows))
    if measured:
        parts.append(table(["processes", "measured step time (ms)", "measured efficiency"], measured))
    return section("scaling", "Scaling model", *parts)


# --------------------------------------------------------------------------- provenance


def _short_hash(value: Any, n: int = 12) -> str:
    return str(value)[:n] if value else "-"


def provenance_summary(manifest: dict[str, Any] | None) -> list[tuple[str, Any]]:
    facets = as_dict(as_dict(manifest).get("facets"))
    code, env, hw = as_dict(facets.get("code")), as_dict(facets.get("environment")), as_dict(facets.get("hardware"))
    runtime = as_dict(facets.get("runtime"))
    rows: list[tuple[str, Any]] = []
    if code.get("in_repo") is False:
        rows.append(("code", f"not in a git work tree ({code.get('reason') or 'no reason recorded'})"))
    else:
        dirty = code.get("dirty")
        state = "uncommitted changes (code.diff)" if dirty else ("clean" if dirty is False else "unknown state")
        rows.append(("code commit", f"{_short_hash(code.get('commit'))} on {code.get('branch') or '?'}, {state}"))
    py = as_dict(env.get("python"))
    rows.append(("python", f"{py.get('version') or '-'} ({py.get('implementation') or '?'})"))
    torch_rt, build = as_dict(runtime.get("torch")), as_dict(env.get("torch_build"))
    torch_version = torch_rt.get("version") or build.get("version")
    rows.append(("torch", f"{torch_version or '-'}; CUDA {torch_rt.get('cuda') or build.get('cuda') or 'none'}; "
                          f"cuDNN {torch_rt.get('cudnn') or build.get('cudnn') or '-'}"))
    if torch_rt.get("num_threads") is not None:
        rows.append(("torch threads", torch_rt.get("num_threads")))
    det = as_dict(runtime.get("determinism"))
    if det:
        rows.append(("deterministic algorithms", det.get("deterministic_algorithms")))
    os_ = as_dict(env.get("os"))
    distro = as_dict(os_.get("distribution")).get("PRETTY_NAME") or os_.get("system") or "-"
    rows.append(("operating system", f"{distro}, kernel {os_.get('kernel') or '?'}"))
    cpu = as_dict(hw.get("cpu"))
    rows.append(("CPU", f"{cpu.get('model') or '-'} ({cpu.get('cores') or '?'} cores, "
                        f"{cpu.get('threads') or '?'} threads)"))
    gpus = [as_dict(g) for g in as_list(hw.get("gpus"))]
    if gpus:
        names = sorted({str(g.get("name") or "?") for g in gpus})
        rows.append(("GPU", f"{len(gpus)} × {', '.join(names)}"))
    else:
        rows.append(("GPU", f"none ({hw.get('gpu_reason') or 'no GPU recorded'})"))
    seeds = as_dict(facets.get("seeds"))
    if seeds:
        rows.append(("master seed", f"{seeds.get('master_seed', '-')}" + (", same seed for every repeat"
                                                                            if seeds.get("same_seed") else "")))
    digest = as_dict(as_dict(manifest).get("digest")).get("value")
    rows.append(("manifest digest", _short_hash(digest, 16)))
    return rows


def provenance(view: RunView, verdict: VerdictView, reference: ReferenceData | None) -> Markup:
    manifest = view.data.manifest if view.data else None
    if manifest is None:
        return section("provenance", "Provenance", note("the run directory has no manifest.json"))
    parts = [key_values(provenance_summary(manifest))]
    facets = as_dict(manifest.get("facets"))
    entries = [as_dict(e) for e in as_list(as_dict(facets.get("data")).get("entries"))]
    if entries:
        parts.append(subsection("Data digests (DVC-compatible md5)", table(
            ["path", "md5", "size", "files"],
            [[e.get("path"), e.get("md5"), size_bytes(e.get("size")), num(e.get("nfiles"))] for e in entries])))
    else:
        parts.append(note("no data files were digested (synthetic data generated in memory, or none recorded)"))
    seed_rows = []
    for k in sorted(view.data.repeats if view.data else {}):
        s = as_dict(view.data.repeats[k].get("seeds"))
        seed_rows.append([k, *(s.get(name) for name in SEED_NAMES)])
    if seed_rows:
        parts.append(subsection("Seeds per repeat (rank 0)", table(
            ["repeat", *SEED_NAMES], [["-" if x is None else str(x) for x in r] for r in seed_rows])))
    parts.append(_provenance_diff(manifest, verdict, reference))
    return section("provenance", "Provenance", *parts)


def _provenance_diff(manifest: dict[str, Any], verdict: VerdictView, reference: ReferenceData | None) -> Markup:
    title = "Differences from the reference (most result-relevant first)"
    stored = as_dict(verdict.doc.get("provenance"))
    if stored.get("available") and isinstance(stored.get("rows"), list):  # the comparison verify made, as it said it
        rows = [[as_dict(r).get("impact"), f"{as_dict(r).get('facet')}.{as_dict(r).get('key')}" if as_dict(r).get("key")
                 else as_dict(r).get("facet"), short(as_dict(r).get("run"), 60), short(as_dict(r).get("reference"), 60),
                 as_dict(r).get("reason")] for r in as_list(stored.get("rows"))]
        head = para(f"{num(stored.get('total'))} difference(s), {num(stored.get('result_relevant'))} result-relevant "
                    f"(impact ≥ {RELEVANT_IMPACT}); repro500 diff shows all.")
        if not rows:
            return subsection(title, para("No differences: the run and the reference recorded the same provenance."))
        return subsection(title, head, table(["impact", "key", "this run", "reference", "why it matters"], rows))
    if reference is not None and reference.manifest is not None:
        diffs = compare_manifests(manifest, reference.manifest).differences
        relevant = sum(1 for d in diffs if is_result_relevant(d))
        rows = [[d.impact, f"{d.facet}.{d.key}" if d.key else d.facet, short(d.a, 60), short(d.b, 60), d.reason]
                for d in diffs[:MAX_DIFF_ROWS]]
        more = f"; the first {MAX_DIFF_ROWS} are listed (repro500 diff shows all)" if len(diffs) > MAX_DIFF_ROWS else ""
        head = para(f"{len(diffs)} difference(s), {relevant} result-relevant (impact ≥ {RELEVANT_IMPACT}){more}.")
        if not diffs:
            return subsection(title, para("No differences: the run and the reference recorded the same provenance."))
        return subsection(title, head, table(["impact", "key", "this run", reference.label, "why it matters"], rows))
    p = as_dict(verdict.doc.get("provenance"))
    if not p:
        return subsection(title, note("no reference: pass --against REF to compare provenance"))
    if not p.get("available"):
        return subsection(title, note(str(p.get("note") or "no provenance diff available")))
    rows = [[as_dict(r).get("impact"), f"{as_dict(r).get('facet')}.{as_dict(r).get('key')}", str(as_dict(r).get("run")),
             str(as_dict(r).get("reference")), as_dict(r).get("reason")] for r in as_list(p.get("top"))]
    head = para(f"{num(p.get('total'))} difference(s), {num(p.get('result_relevant'))} result-relevant; the verdict "
                "keeps the top ones (pass --against REF for the full table).")
    return subsection(title, head, table(["impact", "key", "this run", "reference", "why it matters"], rows))
