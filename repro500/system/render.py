"""The terminal table a system measurement prints after its verdict: one row per case, the
figures of the run's first completed repeat (``verify`` and the report show them all)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from repro500.rundir import layout
from repro500.scaling import ceilings


def _g(value: Any, scale: float = 1.0, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value * scale:.{digits}g}"


def ops_table(doc: dict[str, Any]) -> Table:
    table = Table(title="operators (repeat 0; times are medians with their 95% interval)", title_justify="left", box=None)
    for col in ("case", "time (us)", "interval (us)", "GFLOP/s", "GB/s", "max abs err", "max rel err", "err (eps)",
                "tolerance (eps)", "error"):
        table.add_column(col, overflow="fold")
    for rec in doc.get("cases", []):
        t, e = rec["time"], rec["error"]
        ok = rec.get("within_tolerance")
        table.add_row(rec["id"], _g(t["median_s"], 1e6), f"[{_g(t['ci_low_s'], 1e6)}, {_g(t['ci_high_s'], 1e6)}]",
                      _g(rec.get("flops_per_s"), 1e-9), _g(rec.get("bytes_per_s"), 1e-9), _g(e["max_abs_err"]),
                      _g(e["max_rel_err"]), _g(e["err_eps"]), _g(rec.get("tolerance_eps")),
                      "[green]ok[/]" if ok else "[bold red]FAIL[/]")
    return table


def rows_table(title: str, rows: list[dict[str, Any]], columns: list[tuple[str, str, float]]) -> Table:
    """A generic table: ``columns`` are (heading, key, scale)."""
    table = Table(title=title, title_justify="left", box=None)
    for heading, _, _ in columns:
        table.add_column(heading)
    for row in rows:
        table.add_row(*[str(row.get(key, "-")) if isinstance(row.get(key), str) else _g(row.get(key), scale)
                        for _, key, scale in columns])
    return table


def tables(doc: dict[str, Any]) -> list[Table]:
    measure = doc.get("measure")
    if measure == "ops":
        return [ops_table(doc)]
    if measure == "roofline":
        return [rows_table("ceilings (repeat 0) and the independent tools' figures", ceilings.rows(doc),
                           [("figure", "name", 1), ("repro500", "value", 1), ("independent tool", "tool_value", 1),
                            ("tool", "tool", 1), ("ratio", "ratio", 1), ("unit", "unit", 1)])]
    if measure == "inference":
        return [rows_table("latency (repeat 0; seconds, 95% order-statistic intervals)", doc.get("batches", []),
                           [("batch", "batch_size", 1), ("calls", "calls", 1), ("p50", "p50_s", 1),
                            ("p50 interval", "p50_ci", 1), ("p90", "p90_s", 1), ("p99", "p99_s", 1),
                            ("p99 interval", "p99_ci", 1), ("samples/s", "throughput_samples_per_s", 1)])]
    return [rows_table("read throughput (repeat 0)", doc.get("configs", []),
                       [("config", "id", 1), ("MB/s", "bytes_per_s", 1e-6), ("samples/s", "samples_per_s", 1),
                        ("of raw read", "of_raw", 1), ("mismatches", "mismatches", 1)])]


def after_run(run_dir: Path, console: Console | None = None) -> None:
    doc = layout.first_system_record(Path(run_dir))
    if doc is None:
        return
    if console is None:
        console = Console(emoji=False)
        if not console.is_terminal:  # a log or a pipe: whole rows, not columns cut at 80 characters
            console = Console(emoji=False, width=200)
    for table in tables(doc):
        console.print(table)
    for skipped in doc.get("skipped", [])[:12]:
        console.print(f"  [dim]not measured: {skipped['id']}: {skipped['reason']}[/]", highlight=False)
    for note in doc.get("notes", []):
        console.print(f"  [dim]{note}[/]", highlight=False)
