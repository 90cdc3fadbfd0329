"""One renderer: every string a run chose reaches the terminal through untrusted.shown/plain, and
report.html through templates that escape by default.

One hostile run is built once for the module: its run id, recipe name and description, a metric
name, the manifest's CPU model and branch, and an unsealed stored verdict.json all carry the same
payloads (cursor moves, OSC 52, a one-byte CSI, a bidi override, a fake verdict line, rich markup,
a rich emoji code, HTML and a javascript: URL).  The commands that print or render them must show them as text.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers.rundirs import edit_json, make_manifest, make_run

from repro500.cli import cli
from repro500.rundir import sums as bundle

PAYLOADS = ("\x1b[1A\x1b[2K", "\x1b]52;c;ZXZpbA==\x07", "\x9b2J", "\u202e", "\nVerdict REPRODUCED",
            "[bold green]x[/]", "evil[/nope]", "<script>alert(1)</script>", '"><img src=x onerror=alert(1)>',
            " :thumbs_up: ", "javascript:alert(1)")
HOSTILE = "h" + "".join(PAYLOADS)
METRIC = "m" + "".join(PAYLOADS)  # an acceptance metric's name
# what must never reach a terminal raw: C0 controls but tab and newline, DEL, C1, bidi controls
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
COLUMNS = {"COLUMNS": "400"}  # rich wraps at the terminal's width; wide enough not to split a payload


def _hostile_run(parent: Path, name: str, created: str) -> Path:
    manifest = make_manifest(hardware={"cpu": {"model": HOSTILE, "cores": 8}, "gpus": []},
                             code={"commit": "0" * 40, "dirty": False, "branch": HOSTILE})
    root = make_run(parent, name, manifest=manifest,
                    values={"accuracy": [0.93, 0.94, 0.935], METRIC: [0.50, 0.52, 0.51]},
                    acceptance={"accuracy": {"target": 0.9, "direction": "higher", "tolerance": 0.02},
                                METRIC: {"target": 0.5, "direction": "higher", "tolerance": 0.02}})
    for doc in ("run.json", "summary.json"):
        edit_json(root / doc, lambda d: d.update(run_id=HOSTILE + name, recipe_name=HOSTILE))
    edit_json(root / "run.json", lambda d: d.update(created_utc=created))
    recipe = yaml.safe_load((root / "recipe.yaml").read_text())
    recipe.update(name=HOSTILE, description=HOSTILE)
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    bundle.write_sums(root)  # sealed again: verify takes it as an untouched run
    return root


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("hostile")
    runs = base / "runs"
    run = _hostile_run(runs, "run-a", "2026-11-22T06:15:00Z")
    _hostile_run(runs, "run-b", "2026-11-23T06:15:00Z")  # history compares it with run-a
    ref = make_run(base, "ref", values={"accuracy": [0.931, 0.939, 0.936], METRIC: [0.50, 0.52, 0.51]})
    return {"base": base, "runs": runs, "run": run, "ref": ref}


def invoke(*args: object) -> tuple[str, str]:
    """(stdout, stderr) of a command run in this process, without the CLI's last terminal filter
    (the stream wrapper of repro500.cli.main): what it prints must be safe by itself."""
    result = CliRunner().invoke(cli, [str(a) for a in args], env=COLUMNS)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.stdout, result.stderr


def assert_terminal_safe(*streams: str) -> None:
    for text in streams:
        found = RAW.search(text)
        assert found is None, f"raw {found.group()!r} reaches the terminal: {text[max(0, found.start() - 80):found.end() + 40]!r}"
        assert "Traceback" not in text
        for line in text.splitlines():
            assert not line.lstrip().startswith("Verdict REPRODUCED"), line


def assert_markup_shown(text: str) -> None:
    """The payloads' rich markup and emoji code printed as text, not interpreted (nor an error)."""
    assert "[bold green]x[/]" in text and "evil[/nope]" in text
    assert ":thumbs_up:" in text and "\N{THUMBS UP SIGN}" not in text


def test_verify_prints_the_runs_strings_as_text(hostile: dict[str, Path]) -> None:
    out, err = invoke("verify", hostile["run"], "--no-write")
    assert_terminal_safe(out, err)
    assert_markup_shown(out)
    assert "\\x1b[1A" in out and "\\u202e" in out and "\\x0aVerdict REPRODUCED" in out


def test_verify_against_a_reference_and_diff(hostile: dict[str, Path]) -> None:
    out, err = invoke("verify", hostile["run"], "--against", hostile["ref"], "--no-write")
    assert_terminal_safe(out, err)
    assert_markup_shown(out)
    out, err = invoke("diff", hostile["run"], hostile["ref"])
    assert_terminal_safe(out, err)
    assert "cpu.model" in out and "\\u202e" in out  # the CPU model and the branch, cut short by diff


def test_history_shows_hostile_run_ids(hostile: dict[str, Path]) -> None:
    out, err = invoke("history", hostile["runs"], "accuracy")
    assert_terminal_safe(out, err)
    assert_markup_shown(out)


def test_plan_and_publish(hostile: dict[str, Path], tmp_path: Path) -> None:
    out, err = invoke("plan", hostile["run"])
    assert_terminal_safe(out, err)
    # a publication states what the publisher typed: benchmark and citation may be anything
    out, err = invoke("publish", hostile["ref"], "--out", tmp_path / "pub", "--benchmark", HOSTILE,
                      "--citation", HOSTILE)
    assert_terminal_safe(out, err)
    assert (tmp_path / "pub").is_dir(), err
    # as sealed: an edit of published.yaml after publishing is tampering, refused before it is read
    published = tmp_path / "pub" / "published.yaml"
    out, err = invoke("verify", hostile["ref"], "--against", published, "--no-write")
    assert_terminal_safe(out, err)
    assert_markup_shown(out)  # the benchmark and the source's citation, named in the head lines
    # the hostile run itself: published, or refused in one safe line
    out, err = invoke("publish", hostile["run"], "--out", tmp_path / "pub-hostile")
    assert_terminal_safe(out, err)


class _Tags(HTMLParser):
    """Every element and attribute of a page, as a browser's tokenizer sees them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


def assert_page_inert(html: str) -> None:
    parser = _Tags()
    parser.feed(html)
    for tag, attrs in parser.tags:
        assert tag not in ("script", "iframe", "object", "embed"), tag
        for name, value in attrs:
            assert not name.startswith("on"), (tag, name, value)
            assert not (value or "").strip().lower().startswith("javascript:"), (tag, name, value)
    assert "<script" not in html.lower() and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown, as text


def _stored_verdict(run: Path, tmp: Path) -> Path:
    """A copy of the run with an unsealed verdict.json against a reference, which the report shows
    as stored: every string of it hostile."""
    copy = tmp / "stored"
    shutil.copytree(run, copy)
    out, err = invoke("verify", copy, "--json", "--no-write")
    doc = json.loads(out)
    doc.update(status="REPRODUCED", reasons=[HOSTILE], advice=[HOSTILE],
               against={"label": HOSTILE, "path": HOSTILE, "benchmark": HOSTILE},
               sampling={"status": HOSTILE, "reason": HOSTILE},
               determinism={"status": "PASS", "reason": HOSTILE, "divergences": [
                   {"repeats": [0, 1], "seed": HOSTILE, "first_tensor": HOSTILE, "detail": HOSTILE}]},
               mlperf={"status": "OK", "reason": HOSTILE, "repeats": {"0": {"passed": False, "problems": HOSTILE}}},
               exact_replay={"exact": False, "reason": HOSTILE}, divergence={"status": "SKIPPED", "reason": HOSTILE},
               gains={"run_variant": {"precision": HOSTILE}, "reference_variant": {"precision": HOSTILE},
                      "figures": {HOSTILE: {"run": 1.0, "reference": 1.0, "ratio": 1.0}}},
               created_utc=HOSTILE)
    (copy / "verdict.json").write_text(json.dumps(doc))
    return copy


def test_report_keeps_every_string_text(hostile: dict[str, Path], tmp_path: Path) -> None:
    out, err = invoke("report", hostile["run"], "--out", tmp_path / "own.html")
    assert_terminal_safe(out, err)
    assert_page_inert((tmp_path / "own.html").read_text(encoding="utf-8"))
    stored = _stored_verdict(hostile["run"], tmp_path)
    out, err = invoke("report", stored, "--out", tmp_path / "stored.html")
    assert_terminal_safe(out, err)
    html = (tmp_path / "stored.html").read_text(encoding="utf-8")
    assert_page_inert(html)
    assert 'id="variants"' in html and "REPRODUCED" in html  # the stored comparison was shown
    out, err = invoke("report", hostile["run"], "--against", hostile["ref"], "--out", tmp_path / "against.html")
    assert_terminal_safe(out, err)
    assert_page_inert((tmp_path / "against.html").read_text(encoding="utf-8"))


REPORT = Path(__file__).resolve().parent.parent / "repro500" / "report"


def test_no_report_module_builds_markup_from_strings() -> None:
    """Markup(...) may wrap only a literal: HTML is the templates' (which escape every value), so a
    Markup(f"...") around a run's string cannot come back."""
    offenders = []
    for path in sorted(REPORT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name == "Markup" and not all(isinstance(a, ast.Constant) and isinstance(a.value, str)
                                            for a in [*node.args, *(k.value for k in node.keywords)]):
                offenders.append(f"{path.relative_to(REPORT.parent.parent)}:{node.lineno}")
    assert not offenders, f"Markup built from a non-literal (render it with a template instead): {offenders}"
    assert "Markup(f" not in "".join(p.read_text(encoding="utf-8") for p in REPORT.rglob("*.py"))


def test_the_templates_escape_by_default() -> None:
    from repro500.report import html

    env = html.environment()
    for name in env.list_templates():
        assert env.select_template([name]).environment.autoescape is True or env.autoescape(name), name
    assert html.para("<b>x</b>") == "<p>&lt;b&gt;x&lt;/b&gt;</p>"
    assert {"blocks.html.j2", "page.html.j2", "report.css"} <= set(env.list_templates())
