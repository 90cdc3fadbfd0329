"""One owner per name: a status or check word, a schema id and the digest list's file name are
spelt once, where they are defined (repro500/statuses.py, the module that owns the document,
repro500/rundir/names.py), and imported everywhere else; so is the default significance level
(``statuses.DEFAULT_ALPHA``).  `make lint` runs this file, so a second
spelling fails the lint before it can drift from the first."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from repro500 import statuses

ROOT = Path(__file__).resolve().parent.parent
WORDS = {statuses.PASS, statuses.FAIL, statuses.REPRODUCED, statuses.NOT_REPRODUCED, statuses.INCONCLUSIVE,
         statuses.INVALID, statuses.SKIPPED, statuses.OK, statuses.WARN, statuses.FOUND}
WORD_OWNER = "repro500/statuses.py"
SUMS = "SHA256SUMS"
SUMS_OWNER = "repro500/rundir/names.py"
SCHEMA_ID = re.compile(r"repro500/[a-z0-9-]+/v\d+")
# the same letters with another meaning: PASS is a secret-name word there (PASS=..., DB_PASS)
ELSEWHERE = {("repro500/redact.py", statuses.PASS)}


def _strings(tree: ast.AST):
    """Every string constant but docstrings (prose may name a status)."""
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            docstrings.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node


def _alpha_levels(tree: ast.AST):
    """Numbers written as a significance level (None, "the stored one", is no level): an ``alpha`` parameter's default, an ``*ALPHA*``
    constant, the default of an ``--alpha`` option."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
            yield from (d for a, d in pairs if a.arg == "alpha" and _number(d))
        elif isinstance(node, ast.Assign) and _number(node.value):
            if any(isinstance(t, ast.Name) and "ALPHA" in t.id for t in node.targets):
                yield node.value
        elif isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and a.value == "--alpha" for a in node.args):
            yield from (k.value for k in node.keywords if k.arg == "default" and _number(k.value))


def _number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, float)


def second_owners(package: Path) -> list[str]:
    found, schema_ids = [], {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if rel != WORD_OWNER:
            found += [f"{rel}:{n.lineno} writes the significance level {n.value!r} (import DEFAULT_ALPHA from "
                      f"{WORD_OWNER})" for n in _alpha_levels(tree)]
        for node in _strings(tree):
            text = node.value
            if text in WORDS and rel != WORD_OWNER and (rel, text) not in ELSEWHERE:
                found.append(f"{rel}:{node.lineno} spells the status {text!r} (import it from {WORD_OWNER})")
            if text == SUMS and rel != SUMS_OWNER:
                found.append(f"{rel}:{node.lineno} spells {SUMS!r} (import SUMS_NAME from {SUMS_OWNER})")
            if SCHEMA_ID.fullmatch(text):
                schema_ids.setdefault(text, []).append(f"{rel}:{node.lineno}")
    found += [f"schema id {sid!r} spelt in {len(where)} places: {', '.join(where)}"
              for sid, where in schema_ids.items() if len(where) > 1]
    return found


def test_every_name_has_one_owner():
    found = second_owners(ROOT / "repro500")
    assert not found, "names with a second owner:\n" + "\n".join(found)


def test_a_planted_second_owner_is_found(tmp_path):
    package = tmp_path / "repro500"
    (package / "verify").mkdir(parents=True)
    (package / "statuses.py").write_text('FAIL = "FAIL"\n')
    (package / "capture.py").write_text('SCHEMA = "repro500/manifest/v1"\n')
    (package / "verify" / "render.py").write_text(
        '"""A docstring may say FAIL."""\nSCHEMA = "repro500/manifest/v1"\n'
        'def color(status):\n    return "red" if status == "FAIL" else "green"\n'
        'def sums(run):\n    return run / "SHA256SUMS"\n'
        'def judge(values, alpha=0.05):\n    return values\n')
    found = "\n".join(second_owners(package))
    assert "repro500/verify/render.py:4 spells the status 'FAIL'" in found
    assert "repro500/verify/render.py:6 spells 'SHA256SUMS'" in found
    assert "schema id 'repro500/manifest/v1' spelt in 2 places" in found
    assert "repro500/verify/render.py:7 writes the significance level 0.05" in found
    assert "render.py:1 spells" not in found and "\nrepro500/statuses.py" not in "\n" + found  # not the docstring, not the owner
