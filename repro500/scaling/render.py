"""The terminal view of a scaling document (rich): predictions, the fit, the check at P = 2."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from repro500.untrusted import record_console


def _ms(seconds: Any) -> str:
    return "-" if seconds is None else f"{1000.0 * float(seconds):.3f}"


def _bytes(value: Any) -> str:
    if value is None:
        return "-"
    v = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(v) < 1024 or unit == "GiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.2f} {unit}"
        v /= 1024
    return str(value)


def _pct(value: Any, signed: bool = False) -> str:
    return "-" if value is None else (f"{100 * float(value):+.1f}%" if signed else f"{100 * float(value):.1f}%")


def render(doc: Mapping[str, Any], console: Console | None = None) -> None:
    """Print the predictions table, the fitted model, the check against the run and the assumptions."""
    console = console or record_console()
    work = doc["workload"]
    compressor = work["compressor"]
    title = (f"{work['params']:,} parameters, compressor {compressor['name']}, "
             f"{work['collective']} per bucket")
    table = Table(title=title, title_justify="left")
    for header in ("P", "step time (ms)", "comm time (ms)", "compression (ms)", "efficiency", "bytes per rank"):
        table.add_column(header, justify="right")
    for p in doc["predictions"]:
        table.add_row(str(p["p"]), _ms(p["step_time_s"]), _ms(p["comm_time_s"]), _ms(p["compression_time_s"]),
                      _pct(p["efficiency"]), _bytes(p["bytes_per_rank"]))
    console.print(table)
    for name, fit in doc["collectives"].items():
        bandwidth = fit.get("bandwidth_bytes_per_s")
        console.print(f"{name}: {fit['formula']}; L = {1e6 * fit['latency_s']:.1f} us, "
                      f"gamma = {1e9 * fit['gamma_s_per_byte']:.4f} ns/B"
                      + (f" ({bandwidth / 1e9:.3f} GB/s)" if bandwidth else "")
                      + f"; R^2 {fit['r2']:.4f}, rms relative residual {_pct(fit['rms_rel_residual'])}, "
                        f"{fit['points']} points")
    measurement = doc["measurement"]
    console.print(f"timings: {measurement['host']}, torch {measurement['torch_version']}, measured "
                  f"{measurement['measured_utc']}" + (" (cached)" if measurement.get("cached") else ""))
    measured = doc.get("measured")
    if measured:
        console.print(f"check at P = {measured['p']}: measured {_ms(measured['step_time_s'])} ms per step "
                      f"(mean of {measured['steps']}), predicted {_ms(measured['predicted_step_time_s'])} ms: "
                      f"relative error {_pct(measured['relative_error'], signed=True)}; bytes per rank measured "
                      f"{_bytes(measured['bytes_per_rank'])}, predicted {_bytes(measured['predicted_bytes_per_rank'])}")
        if "within_tolerance" in measured:
            verdict = "within tolerance" if measured["within_tolerance"] else "OUTSIDE tolerance"
            console.print(f"communication per step at P = {measured['p']} (step time less data, compute and "
                          f"compression): measured {_ms(measured['comm_cost_s'])} ms, predicted "
                          f"{_ms(measured['predicted_comm_cost_s'])} ms: error "
                          f"{_pct(measured['comm_relative_error'], signed=True)}, tolerance "
                          f"±{_pct(measured['tolerance'])}: {verdict}", highlight=False)
    console.print("assumptions:")
    for line in doc["assumptions"]:
        console.print(f"  - {line}", highlight=False)
