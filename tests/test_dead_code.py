"""No public function or class of the package is defined and then referenced nowhere.

A name nothing calls is code nobody runs or tests: it drifts from what the rest does until
someone reaches for it.  Names registered by a decorator (click commands, facet and workload
registries) are reached through the registry and are not counted here."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READERS = ("repro500", "tests", "bench", "scripts", "examples")


def _defined() -> list[tuple[str, str, int]]:
    found = []
    for path in sorted((ROOT / "repro500").rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            if isinstance(node, kinds) and not node.name.startswith("_") and not node.decorator_list:
                found.append((str(path.relative_to(ROOT)), node.name, node.lineno))
    return found


def _identifiers() -> Counter:
    seen: Counter = Counter()
    files = [p for top in READERS for p in (ROOT / top).rglob("*") if p.is_file() and p.suffix in (".py", ".sh", "")]
    for path in [*files, ROOT / "pyproject.toml", ROOT / "Makefile"]:
        seen.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", path.read_text(encoding="utf-8", errors="replace")))
    return seen


def test_every_public_name_of_the_package_is_used_somewhere():
    seen = _identifiers()
    unused = [f"{path}:{line} {name}" for path, name, line in _defined() if seen[name] <= 1]
    assert not unused, "defined and referenced nowhere (remove, or use):\n" + "\n".join(unused)
