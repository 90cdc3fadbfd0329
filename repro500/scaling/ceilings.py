"""The machine's measured ceilings as ``repro500 roofline`` records them, read for display.

The roofline is the other half of the performance model this package fits: the compute and memory
ceilings a step runs under, beside the interconnect's latency and bandwidth (:mod:`.fit`).  The
terminal (repro500.system.render) and the HTML report (repro500.report.system) both show them; this
is the one reading of the record they share.
"""

from __future__ import annotations

from typing import Any


def rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A roofline record's figures (``repro500 roofline``'s system.json), one row each: every ceiling
    and, where one exists, the independent tool's figure beside it with their ratio; the terminal's
    table and the report's are drawn from these."""
    rows = []
    check = doc.get("cross_check") or {}
    for device, entry in (doc.get("devices") or {}).items():
        for dt, value in entry.get("peak_flops_per_s", {}).items():
            tool = check.get("numpy_gemm_fp32_flops_per_s") if (device, dt) == ("cpu", "fp32") else None
            rows.append({"name": f"peak {dt} GEMM ({device}, n={entry['gemm'][dt]['n']})", "value": value / 1e9,
                         "tool_value": tool / 1e9 if tool else None, "tool": "numpy matmul" if tool else "-",
                         "ratio": value / tool if tool else None, "unit": "GFLOP/s"})
        for kernel, rec in (entry.get("bandwidth") or {}).items():
            tool = check.get(f"sysbench_{kernel}_bytes_per_s") if device == "cpu" else None
            level = entry.get("bandwidth_level", "memory")
            rows.append({"name": f"{kernel} {level} bandwidth ({device})", "value": rec["bytes_per_s"] / 1e9,
                         "tool_value": tool / 1e9 if tool else None, "tool": "sysbench memory" if tool else "-",
                         "ratio": rec["bytes_per_s"] / tool if tool else None, "unit": "GB/s"})
    fit = (doc.get("interconnect") or {}).get("fit")
    if fit:
        rows.append({"name": "all-reduce latency L", "value": fit["latency_s"] * 1e6, "unit": "us", "tool": "-"})
        rows.append({"name": "all-reduce bandwidth 1/gamma", "value": (fit["bandwidth_bytes_per_s"] or 0) / 1e9,
                     "unit": "GB/s", "tool": "-"})
    return rows
