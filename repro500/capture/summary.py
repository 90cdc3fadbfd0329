"""A short human summary of a manifest: one line per facet."""

from __future__ import annotations

from typing import Any

from repro500.capture.hardware import gpu_model
from repro500.untrusted import (  # a manifest may be somebody else's: its strings are data
    SENTENCE_CHARS,
    record_console,
    shown,
)


def _size(n_bytes: int | None) -> str:
    if n_bytes is None:
        return "? B"
    size = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n_bytes} B"


def _code(c: dict[str, Any]) -> str:
    if not c.get("in_repo"):
        return f"not a git work tree ({c.get('reason', 'unknown')})"
    commit = (c.get("commit") or "no commits")[:12]
    where = c.get("branch") or ("detached" if c.get("detached") else "?")
    state = "dirty" if c.get("dirty") else "clean"
    if c.get("diff"):
        state += f" (code.diff, {_size(c['diff']['bytes'])})"
    untracked = len(c.get("untracked") or []) + int(c.get("untracked_omitted") or 0)
    return f"{c.get('root')} @ {commit} ({where}), {state}, {untracked} untracked file(s)"


def _environment(e: dict[str, Any]) -> str:
    py, osi, tb = e.get("python", {}), e.get("os", {}), e.get("torch_build", {})
    parts = [f"Python {py.get('version')} ({py.get('implementation')})",
             f"{osi.get('system')} {osi.get('kernel')}"]
    if tb.get("installed"):
        extra = ", ".join(f"{k} {tb[k]}" for k in ("cuda", "cudnn", "nccl") if tb.get(k))
        parts.append(f"torch {tb.get('version')}" + (f" ({extra})" if extra else ""))
    else:
        parts.append("torch not installed")
    env = e.get("env", {})
    parts.append(f"{len(e.get('distributions', []))} packages, "
                 f"{len(env.get('values', {}))} env values + {len(env.get('names', []))} names")
    return " · ".join(parts)


def _toolchain(t: dict[str, Any]) -> str:
    cuda = t.get("cuda_toolkit") or {}
    parts = [f"CUDA toolkit {cuda.get('version') or '?'} ({cuda['home']})" if cuda.get("home")
             else "no CUDA toolkit"]
    for tool in t.get("tools", []):
        if tool.get("executable"):
            parts.append(f"{tool['name']} {tool.get('version') or '?'}")
    missing = [tool["name"] for tool in t.get("tools", []) if not tool.get("executable")]
    if missing:
        parts.append("not found: " + ", ".join(missing))
    return " · ".join(parts)


def _seeds(s: Any) -> str:
    if isinstance(s, dict):
        if s.get("master_seed") is None:
            return "no master seed (repro500 run records the seed plan; or pass --seed)"
        return (f"master {s['master_seed']}, {s.get('repeats')} repeat(s) x "
                f"{s.get('world_size')} rank(s)" + (", same seed" if s.get("same_seed") else ""))
    if isinstance(s, list):
        return f"{len(s)} repeat(s) planned"
    return str(s)


def _data(d: dict[str, Any]) -> str:
    entries = d.get("entries", [])
    if not entries:
        return "none (use --data PATH)"
    return "; ".join(
        f"{e['path']} md5 {e['md5']} ({_size(e['size'])}"
        + (f", {e['nfiles']} files)" if e.get("nfiles") is not None else ")")
        for e in entries
    )


def _hardware(h: dict[str, Any], manifest: dict[str, Any]) -> str:
    cpu, mem, cg = h.get("cpu", {}), h.get("memory", {}), h.get("cgroup", {})
    parts = [f"{cpu.get('model')} ({cpu.get('sockets') or '?'} socket(s), "
             f"{cpu.get('cores') or '?'} cores, {cpu.get('threads')} threads)",
             f"{_size(mem.get('total_bytes'))} RAM", f"{len(h.get('numa', []))} NUMA node(s)"]
    if cg.get("cpu_limit_cores") or cg.get("memory_limit_bytes"):
        parts.append(f"container limit {cg.get('cpu_limit_cores') or '-'} CPUs / "
                     f"{_size(cg.get('memory_limit_bytes')) if cg.get('memory_limit_bytes') else '-'}")
    count = h.get("gpu_count", 0)
    parts.append(f"GPUs: {count} x {gpu_model(manifest)}" if count else "GPUs: none")
    return " · ".join(parts)


def summary_lines(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """``[(facet, one-line description), ...]`` for the facets present."""
    facets = manifest.get("facets", {})
    describe = {
        "code": _code,
        "environment": _environment,
        "toolchain": _toolchain,
        "seeds": _seeds,
        "data": _data,
        "hardware": lambda h: _hardware(h, manifest),
    }
    order = ["code", "environment", "toolchain", "runtime", "seeds", "data", "hardware"]
    rows = []
    for name in sorted(facets, key=lambda n: (order.index(n) if n in order else len(order), n)):
        value = facets[name]
        func = describe.get(name)
        try:
            text = func(value) if func else f"{len(value) if hasattr(value, '__len__') else 1} item(s)"
        except (KeyError, TypeError, AttributeError):
            text = "recorded"
        rows.append((name, text))
    for name, reason in manifest.get("facet_errors", {}).items():
        rows.append((name, f"NOT CAPTURED: {reason}"))
    return rows


def render_summary(manifest: dict[str, Any], console: Any = None,
                   written: str | None = None) -> None:
    """Print the summary with rich (to ``console``, default stdout)."""
    from rich.table import Table

    console = console or record_console()
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for name, text in summary_lines(manifest):
        style = "red" if text.startswith("NOT CAPTURED") else None
        table.add_row(shown(name), shown(text, SENTENCE_CHARS), style=style)
    console.print(f"[bold]repro500 manifest[/bold] {shown(str(manifest['digest']['value'])[:16])}… "
                  f"({shown(manifest['schema'])}, {shown(manifest['created_utc'])})", highlight=False)
    console.print(table)
    if written:
        console.print(f"written: {shown(written)}", highlight=False)
