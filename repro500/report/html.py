"""HTML building blocks for the report: number formatting, and the page rendered by templates.

The page is rendered by the Jinja2 templates in ``templates/`` with autoescape on: every value
from a run directory is text, escaped where it is put into the page (a run directory may come
from someone else, so a recipe named ``<script>`` stays text).  ``Markup`` is only what a
template macro returned; no module of this package builds markup from strings itself (a test
checks that ``Markup(...)`` wraps nothing but a literal).  The page is plain HTML and CSS: no
scripts, no external resources.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

from markupsafe import Markup, escape

from repro500.statuses import FAIL, INCONCLUSIVE, INVALID, NOT_REPRODUCED, PASS, REPRODUCED, SKIPPED

STATUS_CLASSES = {
    PASS: "good", REPRODUCED: "good", FAIL: "bad", NOT_REPRODUCED: "bad",
    INCONCLUSIVE: "warn", INVALID: "invalid", SKIPPED: "muted",
}


NOWRAP_CHARS = 26
PNG_URI = "data:image/png;base64,"

__all__ = ["Markup", "badge", "bullet_list", "cell", "esc", "image", "key_values", "num", "page", "para", "pct",
           "section", "size_bytes", "subsection", "table"]


@cache
def environment():  # noqa: ANN201 - jinja2.Environment, imported here: only `report` pays for it
    """The templates' environment: autoescape on for every template, undefined names an error."""
    import jinja2

    return jinja2.Environment(loader=jinja2.PackageLoader("repro500.report", "templates"), autoescape=True,
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def _macro(name: str) -> Any:
    return getattr(environment().get_template("blocks.html.j2").module, name)


def esc(value: Any) -> Markup:
    """``value`` escaped for HTML text or attribute context (quotes included); Markup as is."""
    return escape(value if isinstance(value, str) else str(value))


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
    return _macro("badge")(text, STATUS_CLASSES.get(text, "muted"))


def _text(value: Any) -> Any:
    """A cell's content before escaping: Markup as is, numbers formatted, anything else as text."""
    if isinstance(value, Markup):
        return value
    if isinstance(value, (numbers.Real, type(None))):
        return num(value)
    return str(value)


def cell(value: Any) -> Markup:
    """A table cell's content, escaped (Markup as is)."""
    return escape(_text(value))


def _cells(row: Sequence[Any]) -> list[tuple[Any, bool]]:
    # short cells (numbers, intervals, badges) never wrap; long text does
    return [(text, isinstance(text, Markup) or len(text) <= NOWRAP_CHARS) for text in map(_text, row)]


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, cls: str = "") -> Markup:
    return _macro("table")([str(h) for h in headers], [_cells(row) for row in rows], cls)


def key_values(pairs: Iterable[tuple[str, Any]]) -> Markup:
    """A two-column definition list."""
    return _macro("key_values")([(str(k), _text(v)) for k, v in pairs])


def para(text: Any, cls: str = "") -> Markup:
    return _macro("para")(text if isinstance(text, Markup) else str(text), cls)


def status_line(status: Any, text: Any) -> Markup:
    """A paragraph: the status's badge, then ``text``."""
    return _macro("status_line")(badge(status), "" if text is None else str(text))


def strong_line(label: str, text: Any) -> Markup:
    return _macro("strong_line")(label, "" if text is None else str(text))


def integrity_line(status: Any, files_checked: Any, digest: Any) -> Markup:
    return _macro("integrity_line")(badge(status), num(files_checked), str(digest or "-"))


def bullet_list(items: Iterable[Any], cls: str = "") -> Markup:
    return _macro("bullet_list")([i if isinstance(i, Markup) else str(i) for i in items], cls)


def image(data_uri: str, alt: str, width_px: int | None = None) -> Markup:
    """An embedded plot: ``data_uri`` is a ``data:image/png;base64,...`` that plots.to_data_uri made
    from a matplotlib figure; anything else is refused (the template escapes it all the same)."""
    if not data_uri.startswith(PNG_URI):
        raise ValueError("only embedded PNG data URIs are allowed in the report")
    return _macro("image")(data_uri, str(alt), int(width_px) if width_px else None)


def section(ident: str, title: str, *parts: Markup) -> Markup:
    return _macro("section")(ident, title, list(parts))


def subsection(title: str, *parts: Markup) -> Markup:
    return _macro("subsection")(title, list(parts))


def join(parts: Iterable[Markup]) -> Markup:
    """Blocks one after the other (a plain string among them is escaped)."""
    return Markup("").join(parts)


def header(*, recipe: Any, status: Any, exit_code: Any, facts: Iterable[tuple[str, Any]], warnings: Iterable[Any],
           reasons: Iterable[Any], advice: Iterable[Any], toc: Iterable[tuple[str, str]]) -> Markup:
    """The page's top: recipe, verdict badge, the run's facts, warnings, reasons, advice, contents."""
    return _macro("header")(str(recipe), badge(status), num(exit_code), key_values(facts), [str(w) for w in warnings],
                            bullet_list(reasons, "reasons"), bullet_list(advice, "reasons advice"), list(toc))


def footer(version: str, now: str, where: str) -> Markup:
    return _macro("footer")(version, now, where)


def page(title: str, header: Markup, body: Iterable[Markup], footer: Markup) -> str:
    """The whole document: inline CSS, no scripts, no external resources."""
    return environment().get_template("page.html.j2").render(title=title, header=header, body=list(body),
                                                            footer=footer)
