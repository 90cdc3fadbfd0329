"""The report's "System" section (repro500.system, docs/system.md).

For a training run: energy and utilization per repeat (or why they were not measured), the
share of step time spent waiting for data (and whether that makes the run I/O-bound), and the
run on the roofline: its arithmetic intensity and achieved FLOP/s under the ceilings of a
``repro500 roofline`` run (``--roofline RUN``, else the newest completed roofline run beside
this one measured on the same CPU and GPU model).  For a system measurement: its results.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from repro500 import untrusted
from repro500.capture.hardware import gpu_model
from repro500.errors import InvalidInput
from repro500.report import system_plots
from repro500.report.html import Markup, image, num, para, pct, section, subsection, table
from repro500.report.load import RunView, finite
from repro500.rundir import layout
from repro500.scaling import ceilings as ceilings_of
from repro500.statuses import RUN_COMPLETED

IO_BOUND = 0.5


def note(text: str) -> Markup:
    return para(text, "note")


def _values(summary: dict[str, Any], name: str) -> list[float]:
    entry = (summary.get("metrics") or {}).get(name) or {}
    return [v for v in (finite(x) for x in entry.get("values") or []) if v is not None]


def _median(summary: dict[str, Any], name: str) -> float | None:
    values = _values(summary, name)
    return statistics.median(values) if values else None


def machine(manifest: dict[str, Any] | None) -> tuple[Any, ...]:
    """What must match for another run's ceilings to be this machine's: CPU model and cores, GPUs."""
    hw = ((manifest or {}).get("facets") or {}).get("hardware") or {}
    cpu = hw.get("cpu") or {}
    return cpu.get("model"), cpu.get("cores"), gpu_model(manifest or {})


def _manifest(root: Path) -> dict[str, Any] | None:
    try:
        manifest = untrusted.read_json(root / layout.MANIFEST, "the manifest")
    except (OSError, InvalidInput):
        return None
    return manifest if isinstance(manifest, dict) else None


def is_roofline(root: Path) -> bool:
    recipe = layout.read_optional_yaml(root / layout.RECIPE)
    return (recipe.get("fixed") or {}).get("measure") == "roofline"


def find_roofline(root: Path, manifest: dict[str, Any] | None) -> Path | None:
    """The newest completed roofline run beside ``root`` measured on the same machine model."""
    want, found = machine(manifest), []
    for candidate in root.resolve().parent.iterdir():
        try:
            if candidate == root.resolve() or not (candidate / layout.SUMMARY).is_file() or not is_roofline(candidate):
                continue
            meta = layout.read_optional_json(candidate / layout.RUN_JSON)
        except Exception:  # noqa: BLE001 - a neighbour that cannot be read is simply not a candidate
            continue
        if meta.get("status") == RUN_COMPLETED and machine(_manifest(candidate)) == want:
            found.append((str(meta.get("created_utc") or ""), candidate))
    return max(found)[1] if found else None


def ceilings(roofline_run: Path) -> dict[str, system_plots.Ceilings]:
    """Each device's ceilings from a roofline run: medians over its repeats."""
    summary = layout.read_json(roofline_run / layout.SUMMARY, "the roofline run's summary")
    out = {}
    for device in ("cpu", "cuda"):
        bw = _median(summary, f"bandwidth_bytes_per_s.{device}.triad")
        peaks = {dt: v for dt in ("fp32", "bf16", "fp16")
                 if (v := _median(summary, f"peak_flops_per_s.{device}.{dt}")) is not None}
        if bw and peaks:
            out[device] = system_plots.Ceilings(device, peaks, bw, source=roofline_run.name)
    return out


def _device(view: RunView) -> str:
    recipe = (view.data.recipe if view.data else None) or {}
    wanted = (recipe.get("mutable") or {}).get("device")
    gpus = ((((view.data.manifest if view.data else None) or {}).get("facets") or {}).get("hardware") or {}).get("gpu_count")
    return "cuda" if wanted in ("cuda", "auto") and gpus else "cpu"


def _roofline_part(view: RunView, roofline_run: Path | None) -> list[Markup]:
    summary = view.summary
    intensity, achieved = _median(summary, "arithmetic_intensity_flop_per_byte"), _median(summary, "achieved_flops_per_s")
    if intensity is None or achieved is None:
        return [note("this run records no arithmetic intensity or achieved FLOP/s (a run from before repro500 "
                     "measured them, or an estimate that failed: see the repeats' summary.json, system.intensity)")]
    chosen = roofline_run or find_roofline(view.root, view.data.manifest if view.data else None)
    where = "given with --roofline" if roofline_run else "found beside this run (same CPU and GPU model)"
    facts = [f"arithmetic intensity {intensity:.3g} FLOP/byte (estimate: {_method(view)})",
             f"achieved {achieved / 1e9:.3g} GFLOP/s (counted training FLOPs / training time)"]
    if chosen is None:
        return [note("; ".join(facts) + ". No ceilings to place it under: measure them with `repro500 roofline` "
                     "and pass `repro500 report RUN --roofline ROOFLINE_RUN`.")]
    device = _device(view)
    measured = ceilings(chosen).get(device)
    if measured is None:
        return [note(f"{chosen} holds no {device} ceilings; " + "; ".join(facts))]
    reps = list(zip(_values(summary, "arithmetic_intensity_flop_per_byte"), _values(summary, "achieved_flops_per_s"),
                    strict=False))
    point = system_plots.RunPoint(view.run_json.get("recipe_name") or view.root.name, intensity, achieved, reps)
    peak = measured.peaks_flops_per_s.get("fp32") or max(measured.peaks_flops_per_s.values())
    bound = min(peak, measured.bandwidth_bytes_per_s * intensity)
    kind = "memory-bound" if intensity < peak / measured.bandwidth_bytes_per_s else "compute-bound"
    text = (f"Ceilings from {chosen} ({where}). At its intensity the fp32 roof allows {bound / 1e9:.3g} GFLOP/s; the "
            f"run achieved {achieved / bound:.1%} of it: {kind} by the roofline (ridge at "
            f"{peak / measured.bandwidth_bytes_per_s:.3g} FLOP/byte).")
    return [image(system_plots.roofline(measured, [point]), "the run on the roofline"), note(text), note("; ".join(facts))]


def _method(view: RunView) -> str:
    for k in sorted(view.data.repeats if view.data else {}):
        method = ((view.data.repeats[k].get("system") or {}).get("intensity") or {}).get("method")
        if method:
            return method
    return "not recorded"


def _energy_part(view: RunView) -> list[Markup]:
    repeats = view.data.repeats if view.data else {}
    rows, reasons = [], {}
    for k in sorted(repeats):
        m = repeats[k].get("metrics") or {}
        system = repeats[k].get("system") or {}
        reasons.update((system.get("energy") or {}).get("not_measured") or {})
        waited = finite(m.get("data_wait_fraction"))
        rows.append([k, num(m.get("energy_j")), num(m.get("energy_j_per_sample")), num(m.get("flops_per_j")),
                     num(m.get("cpu_utilization_pct"), 3), num(m.get("gpu_utilization_pct"), 3), pct(waited, 1),
                     "-" if waited is None else ("yes" if waited >= IO_BOUND else "no")])
    parts = [table(["repeat", "energy (J)", "J per sample", "FLOP per J", "CPU util. (%)", "GPU util. (%)",
                    "waiting for data", "I/O-bound"], rows)]
    waited = _median(view.summary, "data_wait_fraction")
    if waited is not None:
        verdict = "I/O-bound" if waited >= IO_BOUND else "not I/O-bound"
        parts.append(note(f"The steps waited for data {waited:.1%} of their time (median over repeats): {verdict} "
                          f"(I/O-bound at {IO_BOUND:.0%} or more; `repro500 io` measures the data path alone)."))
    for part, why in sorted(reasons.items()):
        parts.append(note(f"{part.replace('_', ' ')}: {why}"))
    return parts


def trained(view: RunView, roofline_run: Path | None) -> Markup:
    return section("system", "System: energy, utilization, data wait, roofline",
                   subsection("Energy, utilization and data wait", *_energy_part(view)),
                   subsection("Roofline", *_roofline_part(view, roofline_run)))


def measurement(view: RunView) -> Markup:
    doc = layout.first_system_record(view.root) or {}
    kind = doc.get("measure")
    parts: list[Markup] = []
    if kind == "ops":
        cases = doc.get("cases") or []
        parts.append(image(system_plots.bars([c["id"] for c in cases], [c["error"]["err_eps"] for c in cases],
                                             xlabel="error against float64 (epsilons of the dtype)",
                                             limits=[c.get("tolerance_eps") for c in cases], limit_label="tolerance"),
                           "operator errors"))
        parts.append(table(["case", "median time (s)", "95% interval (s)", "GFLOP/s", "GB/s", "max abs err", "max rel err",
                            "err (eps)", "tolerance (eps)"],
                           [[c["id"], num(c["time"]["median_s"]), f"[{num(c['time']['ci_low_s'])}, {num(c['time']['ci_high_s'])}]",
                             num((c.get("flops_per_s") or 0) / 1e9 or None), num((c.get("bytes_per_s") or 0) / 1e9 or None),
                             num(c["error"]["max_abs_err"]), num(c["error"]["max_rel_err"]), num(c["error"]["err_eps"]),
                             num(c.get("tolerance_eps"))] for c in cases]))
    elif kind == "roofline":
        for device, measured in ceilings(view.root).items():
            parts.append(image(system_plots.roofline(measured, []), f"{device} roofline"))
        parts.append(table(["figure", "repro500", "independent tool", "tool", "ratio", "unit"],
                           [[r["name"], num(r.get("value")), num(r.get("tool_value")), r.get("tool", "-"),
                             num(r.get("ratio")), r["unit"]] for r in ceilings_of.rows(doc)]))
    elif kind == "inference":
        parts.append(table(["batch", "calls", "p50 (s)", "p50 interval", "p90 (s)", "p99 (s)", "p99 interval", "samples/s"],
                           [[b["batch_size"], b["calls"], num(b["p50_s"]), b["p50_ci"], num(b["p90_s"]), num(b["p99_s"]),
                             b["p99_ci"], num(b["throughput_samples_per_s"])] for b in doc.get("batches") or []]))
    elif kind == "io":
        configs = doc.get("configs") or []
        parts.append(image(system_plots.bars([c["id"] for c in configs], [c["bytes_per_s"] / 1e6 for c in configs],
                                             xlabel="MB/s delivered", log=True, limit_label="raw read of the same files",
                                             limits=[c["bytes_per_s"] / 1e6 / c["of_raw"] if c.get("of_raw") else None
                                                     for c in configs]), "read throughput"))
    for text in doc.get("notes") or []:
        parts.append(note(text))
    if not parts:
        parts.append(note("no system.json record in the repeats"))
    return section("system", f"System measurement: {kind or 'unknown'} (repeat 0)", *parts)


def system_section(view: RunView, roofline_run: Path | None) -> Markup:
    if view.summary.get("workload") == "system":
        return measurement(view)
    return trained(view, roofline_run)
