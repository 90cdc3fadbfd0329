"""HTML building blocks for the report: escaping, number formatting, tables, the page.

Every string that may come from a run directory goes through :func:`esc` (a run directory
may come from someone else, so a recipe named ``<script>`` must stay text).  Helpers that
take ``Markup`` accept HTML that this package built itself; everything else is escaped.
The page is plain HTML and CSS: no scripts, no external resources.
"""

from __future__ import annotations

import html
import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

STATUS_CLASSES = {
    "PASS": "good", "REPRODUCED": "good", "FAIL": "bad", "NOT REPRODUCED": "bad",
    "INCONCLUSIVE": "warn", "INVALID": "invalid", "SKIPPED": "muted",
}


NOWRAP_CHARS = 26


class Markup(str):
    """HTML built by this package (already escaped); plain ``str`` is always escaped."""


def esc(value: Any) -> Markup:
    """Escape any value for HTML text or attribute context (quotes included)."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape(value if isinstance(value, str) else str(value), quote=True))


def num(value: Any, digits: int = 4) -> str:
    """A number as a short string ('-' for missing); other values via ``str``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        f = float(value)
        if not math.isfinite(f):
            return "-"
        return f"{f:.{digits}g}"
    return str(value)


def pct(value: Any, digits: int = 2) -> str:
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value)):
        return f"{float(value) * 100:.{digits}f}%"
    return "-"


def size_bytes(value: Any) -> str:
    """Bytes with a binary unit (KiB, MiB, ...)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return "-"
    v = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.3g} {unit}"
        v /= 1024
    return f"{v:.3g} TiB"  # pragma: no cover - loop always returns


def badge(status: Any) -> Markup:
    text = str(status) if status is not None else "UNKNOWN"
    cls = STATUS_CLASSES.get(text, "muted")
    return Markup(f'<span class="badge {cls}">{esc(text)}</span>')


def cell(value: Any) -> Markup:
    """A table cell's content: Markup as is, numbers formatted, anything else escaped."""
    if isinstance(value, Markup):
        return value
    if isinstance(value, (numbers.Real, type(None))):
        return esc(num(value))
    return esc(value)


def _td(value: Any) -> str:
    content = cell(value)
    # short cells (numbers, intervals, badges) never wrap; long text does
    short = isinstance(value, Markup) or len(html.unescape(content)) <= NOWRAP_CHARS
    return f'<td class="nw">{content}</td>' if short else f"<td>{content}</td>"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, cls: str = "") -> Markup:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_td(v) for v in row) + "</tr>" for row in rows)
    klass = f' class="{esc(cls)}"' if cls else ""
    return Markup(f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def key_values(pairs: Iterable[tuple[str, Any]]) -> Markup:
    """A two-column definition list."""
    items = "".join(f"<dt>{esc(k)}</dt><dd>{cell(v)}</dd>" for k, v in pairs)
    return Markup(f'<dl class="kv">{items}</dl>')


def para(text: Any, cls: str = "") -> Markup:
    klass = f' class="{esc(cls)}"' if cls else ""
    return Markup(f"<p{klass}>{esc(text)}</p>")


def bullet_list(items: Iterable[Any], cls: str = "") -> Markup:
    klass = f' class="{esc(cls)}"' if cls else ""
    inner = "".join(f"<li>{esc(i)}</li>" for i in items)
    return Markup(f"<ul{klass}>{inner}</ul>") if inner else Markup("")


def image(data_uri: str, alt: str, width_px: int | None = None) -> Markup:
    """An embedded plot; ``data_uri`` is a ``data:image/png;base64,...`` this package made."""
    if not data_uri.startswith("data:image/png;base64,"):
        raise ValueError("only embedded PNG data URIs are allowed in the report")
    size = f' width="{int(width_px)}"' if width_px else ""
    return Markup(f'<img class="plot" src="{esc(data_uri)}" alt="{esc(alt)}"{size}>')


def section(ident: str, title: str, *parts: Markup) -> Markup:
    return Markup(f'<section id="{esc(ident)}"><h2>{esc(title)}</h2>{"".join(parts)}</section>')


def subsection(title: str, *parts: Markup) -> Markup:
    return Markup(f'<div class="sub"><h3>{esc(title)}</h3>{"".join(parts)}</div>')


CSS = """
:root { --fg:#1d232a; --muted:#5c6670; --line:#d6dbe0; --bg:#ffffff; --panel:#f5f7f9; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif;
       color: var(--fg); background: var(--bg); }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 48px; }
header.top { border-bottom: 2px solid var(--line); padding-bottom: 14px; margin-bottom: 10px; }
h1 { font-size: 26px; margin: 0 12px 0 0; display: inline-block; vertical-align: middle; word-break: break-all; }
h2 { font-size: 20px; margin: 30px 0 8px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 16px; margin: 18px 0 6px; }
.badge { display: inline-block; vertical-align: middle; padding: 3px 12px; border-radius: 4px;
         font-weight: 700; letter-spacing: .04em; font-size: 15px; color: #fff; }
table .badge { font-size: 12px; padding: 1px 7px; }
.badge.good { background: #1a7f37; } .badge.bad { background: #b42318; }
.badge.warn { background: #b25e00; } .badge.invalid { background: #8e24aa; } .badge.muted { background: #6e7781; }
.subtitle { color: var(--muted); margin: 4px 0 10px; }
dl.kv { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 8px 0; }
header dl.kv { grid-template-columns: max-content 1fr max-content 1fr; }
dl.kv dt { color: var(--muted); } dl.kv dd { margin: 0; word-break: break-word; }
ul.reasons { margin: 6px 0; padding-left: 20px; } ul.reasons li { margin: 2px 0; }
ul.advice li { color: #0b5394; }
nav.toc { margin-top: 10px; font-size: 14px; } nav.toc a { margin-right: 14px; color: #0b5394; text-decoration: none; }
table { border-collapse: collapse; margin: 6px 0 10px; font-size: 13.5px; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 10px 4px 0; text-align: left; vertical-align: top; }
th { color: var(--muted); font-weight: 600; }
td { font-variant-numeric: tabular-nums; word-break: break-word; max-width: 460px; }
td.nw { white-space: nowrap; }
img.plot { display: block; max-width: 100%; height: auto; margin: 6px 0; border: 1px solid var(--line); }
.caption, .note { color: var(--muted); font-size: 13.5px; margin: 4px 0 8px; }
.note::before { content: "note: "; font-weight: 600; }
.warning { color: #8a4b00; background: #fff4e0; border-left: 3px solid #b25e00; padding: 6px 10px; margin: 8px 0; }
.sub { margin-left: 2px; }
code { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 13px; }
footer { margin-top: 36px; color: var(--muted); font-size: 12.5px; border-top: 1px solid var(--line); padding-top: 8px; }
"""


def page(title: str, header: Markup, body: Iterable[Markup], footer: Markup) -> str:
    """The whole document: inline CSS, no scripts, no external resources."""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        # a strict policy so that even a bug here cannot load or run anything from outside
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "img-src data:; style-src 'unsafe-inline'\">"
        f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body><main>\n"
        f"{header}\n{''.join(body)}\n{footer}\n</main></body></html>\n"
    )
