"""The map matches the tree: README's development map names what exists and every package that
exists, every docs page named anywhere exists, every relative link resolves, and the docs index
lists every page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "repro500"


def _development_section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("## Development")
    following = text.find("\n## ", start + 1)
    return text[start:] if following == -1 else text[start:following]


def _bullets(section: str) -> list[str]:
    return ["- " + part for part in re.split(r"\n- ", section)[1:]]


def test_every_package_is_on_the_map():
    section = _development_section()
    packages = sorted(p.parent.relative_to(ROOT).as_posix() for p in PACKAGE.glob("*/__init__.py"))
    missing = [p for p in packages if f"`{p}/" not in section]
    assert not missing, f"README's development map omits {missing}"


def test_every_file_the_map_names_exists_where_it_says():
    wrong = []
    for bullet in _bullets(_development_section()):
        # each name belongs to the package named last before it (the package's root for a bullet that names none)
        context = PACKAGE
        for token in re.findall(r"`([^`]+)`", bullet):
            if token.startswith("repro500/"):
                context = ROOT / token.rstrip("/")
                if not context.exists():
                    wrong.append(token)
                continue
            if re.fullmatch(r"[a-z_]+\.py|[a-z_]+/", token):
                name = token.rstrip("/")
                if not any(p.name == name for p in context.rglob(name)):
                    wrong.append(f"{token} (under {context.relative_to(ROOT)})")
    assert not wrong, f"README's development map names what the tree does not have: {wrong}"


def _doc_mentions() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "docs").glob("*.md"), *(ROOT / "bench").glob("*.py"),
             ROOT / "README.md", ROOT / "pyproject.toml", ROOT / "Makefile"]
    for path in files:
        for page in re.findall(r"docs/[A-Za-z0-9_-]+\.md", path.read_text(encoding="utf-8")):
            found.setdefault(page, []).append(path.relative_to(ROOT).as_posix())
    return found


def test_every_docs_page_named_anywhere_exists():
    missing = {page: where for page, where in _doc_mentions().items() if not (ROOT / page).is_file()}
    assert not missing, f"pages named but absent: {missing}"


def test_every_relative_link_resolves():
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (page.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, f"links that lead nowhere: {broken}"


def test_the_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    missing = [p for p in pages if f"]({p})" not in index]
    assert not missing, f"docs/README.md does not say what {missing} answers"
