"""What a record states cannot make a reader hang or allocate without end.

Each attack is built as a publisher can build it: a genuine run of a tiny wrapped command (two
same-seed repeats, so that verify replays its regex metric over every line of its output), edited,
and re-sealed (SHA256SUMS written again, the repeat chain's links recomputed).  A catastrophic
pattern runs in linear time (RE2); a pattern RE2 cannot compile and a count of 10^9 are one
sentence each, exit 4, under a memory limit that a MemoryError would break.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.runs import repro500

from repro500.digest import canonical_digest, canonical_json
from repro500.rundir import sums as bundle

TRAIN = "print('acc 0.91')\n"
CATASTROPHIC = "(?:acc )?([0-9.]+)|(?:a|a)*b"  # Python's re: 2^n paths over a line of n 'a'
MEMORY = 4 * 2**30  # address space of each command: set(range(10**9)) needs ten times this


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A repro500 command under the memory limit; TimeoutExpired fails the test (a hang)."""
    done = repro500(*args, cwd=cwd, timeout=timeout, preexec_fn=_limited)
    text = done.stdout + done.stderr
    assert "Traceback" not in text and "MemoryError" not in text, text
    return done


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bounds")
    (root / "train.py").write_text(TRAIN)
    done = repro500("run", "--command", "--metric", "accuracy=regex:acc ([0-9.]+)", "--accept", "accuracy>=0.5",
                    "--repeats", "2", "--same-seed", "--no-tracking", "--out", "runs", "--run-id", "ref", "--",
                    sys.executable, "train.py", cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def _copy(project: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(project / "runs" / "ref", run)
    return run


def _set_regex(run: Path, pattern: str) -> None:
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    recipe["metrics"]["accuracy"]["regex"] = pattern
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))


def _reseal_chain(run: Path, planned: int) -> None:
    """chain.jsonl starting from ``planned`` repeats, every link recomputed as a forger would."""
    records = [json.loads(line) for line in (run / "chain.jsonl").read_text().splitlines() if line.strip()]
    prev = None
    for i, record in enumerate(records):
        record.pop("link")
        if i == 0:
            record["planned"] = planned
        else:
            record["prev"] = prev
        record["link"] = prev = canonical_digest(record)
    (run / "chain.jsonl").write_bytes(b"".join(canonical_json(r) + b"\n" for r in records))


def _edit(run: Path, name: str, **changes: object) -> None:
    doc = json.loads((run / name).read_text())
    doc.update(changes)
    (run / name).write_text(json.dumps(doc))


@pytest.mark.slow
def test_a_catastrophic_regex_replayed_over_a_long_line_finishes(project: Path, tmp_path: Path) -> None:
    run = _copy(project, tmp_path)
    _set_regex(run, CATASTROPHIC)
    for k in (0, 1):
        (run / "repeats" / str(k) / "stdout.txt").write_text("acc 0.91\n" + "a" * 4000 + "\n")
    bundle.write_sums(run)
    done = _cli("publish", "run", "--out", "pub", "--citation", "Test 2026", "--margin", "accuracy=0.01", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    done = _cli("pack", "run", "--out", "x.tar.gz", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for args in (["verify", "run", "--no-write"], ["verify", "pub"], ["verify", "x.tar.gz"], ["report", "run"]):
        done = _cli(*args, cwd=tmp_path, timeout=90)  # Python's re: never ends
        assert done.returncode == 0, (args, done.stdout + done.stderr)
    assert "agree bitwise" in _cli("verify", "run", "--no-write", cwd=tmp_path).stdout  # the series was replayed


@pytest.mark.parametrize("pattern", [r"(acc) ([0-9.]+)\1", r"acc (?=[0-9])([0-9.]+)"])
def test_a_recorded_regex_re2_cannot_compile_is_one_sentence(project: Path, tmp_path: Path, pattern: str) -> None:
    run = _copy(project, tmp_path)
    _set_regex(run, pattern)
    bundle.write_sums(run)
    done = _cli("verify", "run", "--no-write", cwd=tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    line = " ".join(done.stderr.split())
    assert "recipe.yaml metrics.accuracy.regex" in line and "does not compile with RE2" in line, line


@pytest.mark.parametrize("where", [("chain.jsonl",), ("chain.jsonl", "run.json", "summary.json"), ("run.json",),
                                   ("summary.json",)])
@pytest.mark.slow
def test_a_planned_count_of_a_billion_is_a_sentence_not_a_memory_error(project: Path, tmp_path: Path,
                                                                       where: tuple[str, ...]) -> None:
    run = _copy(project, tmp_path)
    if "chain.jsonl" in where:
        _reseal_chain(run, 10**9)
    if "run.json" in where:
        _edit(run, "run.json", repeats=10**9)
    if "summary.json" in where:
        _edit(run, "summary.json", repeats_planned=10**9)
    bundle.write_sums(run)
    done = _cli("report", "run", cwd=tmp_path)
    assert done.returncode in (0, 4) and (run / "report.html").is_file(), done.stdout + done.stderr
    done = _cli("verify", "run", "--no-write", cwd=tmp_path)
    text = " ".join(done.stdout.split())
    assert done.returncode == 4 and "INVALID" in text and "is 1,000,000,000, over the 100,000 repro500 accepts from a record" in text, text


def test_a_plan_within_the_bound_lists_its_missing_repeats_in_one_short_sentence(project: Path, tmp_path: Path) -> None:
    run = _copy(project, tmp_path)
    _reseal_chain(run, 90_000)
    _edit(run, "run.json", repeats=90_000)
    _edit(run, "summary.json", repeats_planned=90_000)
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    recipe["repeats"] = 90_000
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    bundle.write_sums(run)
    done = _cli("verify", "run", "--no-write", cwd=tmp_path)
    text = " ".join(done.stdout.split())
    assert done.returncode == 4 and "repeats 2-89999 were planned but are not accounted for" in text, text
    assert len(done.stdout) < 10_000


def test_a_sequential_design_of_a_billion_repeats_is_a_sentence(project: Path, tmp_path: Path) -> None:
    run = _copy(project, tmp_path)
    _edit(run, "run.json", design={"kind": "sequential", "max_repeats": 10**9, "min_repeats": 2, "alpha": 0.07,
                                   "stopped_at": 2, "spending": "obrien-fleming"})
    bundle.write_sums(run)
    done = _cli("verify", "run", "--no-write", cwd=tmp_path)
    text = " ".join(done.stdout.split())
    assert done.returncode == 4 and "run.json design.max_repeats is 1,000,000,000, over the 1,000" in text, text


def test_a_recipe_planning_a_billion_repeats_is_refused_before_it_runs(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    recipe = {"schema": "repro500/recipe/v1", "name": "t", "fixed": {"workload": "command",
              "command": [sys.executable, "train.py"]}, "metrics": {"accuracy": {"regex": "acc ([0-9.]+)"}},
              "acceptance": {"accuracy": {"target": 0.5, "direction": "higher", "tolerance": 0.1}}, "repeats": 10**9}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    done = _cli("run", "r.yaml", "--no-tracking", "--out", "runs", cwd=tmp_path)
    assert done.returncode == 4 and "over the 100,000" in done.stderr, done.stdout + done.stderr
    assert not (tmp_path / "runs").exists()


PADDED = "quickstart" + " " * 400 + "REPRODUCED (exact)  (exit 0)" + " " * 400


@pytest.mark.parametrize("columns", ["50", "80", "400"])
@pytest.mark.slow
def test_a_padded_benchmark_cannot_place_a_verdict_at_the_start_of_a_line(project: Path, tmp_path: Path,
                                                                          columns: str) -> None:
    done = repro500("publish", "runs/ref", "--out", str(tmp_path / "pub"), "--citation", " \u3000Test" + " " * 300 + "2026",
                    "--margin", "accuracy=0.01", "--benchmark", PADDED, cwd=project, env={"COLUMNS": columns})
    assert done.returncode == 0, done.stdout + done.stderr
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "train.py").write_text("print('acc 0.55')\n")  # the same command, another result
    done = repro500("run", "--command", "--metric", "accuracy=regex:acc ([0-9.]+)", "--accept", "accuracy>=0.5",
                    "--repeats", "2", "--no-tracking", "--out", "runs", "--run-id", "mine", "--",
                    sys.executable, "train.py", cwd=mine)
    assert done.returncode == 0, done.stdout + done.stderr
    done = repro500("verify", "runs/mine", "--against", str(tmp_path / "pub" / "published.yaml"), "--no-write",
                    cwd=mine, env={"COLUMNS": columns})
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("NOT REPRODUCED  (exit 1)"), lines[:3]  # the verdict before any string of the record
    assert not [line for line in lines[1:] if line.lstrip().startswith(("REPRODUCED", "(exact)", "(exit"))], done.stdout
    assert "against quickstart" in lines[1] and lines[2].split() == ["source:", "Test", "2026"]  # collapsed
    assert all(len(line) <= max(int(columns), 80) for line in lines[:3]), lines[:3]


def test_a_field_is_one_line_of_bounded_width() -> None:
    from repro500 import untrusted

    text = "a\u00a0\u00a0 \t b" + " " * 500 + "c" * 1000
    assert untrusted.plain(text) == ("a \\x09 b " + "c" * 1000)[:untrusted.FIELD_CHARS - 1] + "…"
    assert len(untrusted.plain("x" * 5000, untrusted.SENTENCE_CHARS)) == untrusted.SENTENCE_CHARS
    assert untrusted.shown("[b]x[/b]   y") == "\\[b]x\\[/b] y"


# repro500's own patterns built from its own values (a /proc key, a rank, a pid, secrets escaped
# with re.escape, its character classes, its own temporary directory's name): every other pattern given to `re` is a string literal.
OWN_PATTERNS = {("repro500/capture/hardware.py", "f'^(?:Node"), ("repro500/redact.py", "'|'.join((re.escape(v)"),
                ("repro500/untrusted.py", "f'[\\\\x00-"), ("repro500/untrusted.py", "f'\\\\x1b(?!"),
                ("repro500/verify/verdict.py", "re.escape(os.path.join(tempfile.gettempdir(), _SCRATCH_PREFIX))"),
                ("repro500/workloads/engines/launch.py", "f'Process {rank}"),
                ("repro500/workloads/engines/wire.py", "f'\\\\bpid={pid}")}


def test_no_module_gives_python_re_a_pattern_it_did_not_write() -> None:
    """A pattern from a record is compiled by untrusted.pattern (RE2, linear time) and nowhere
    else: a call of re.compile/search/match/... whose pattern is not a literal fails here, unless
    it is one of repro500's own above."""
    import ast

    root = Path(__file__).resolve().parents[1]
    calls = ("compile", "search", "match", "fullmatch", "finditer", "findall", "sub", "subn", "split")
    found = []
    for path in sorted((root / "repro500").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in calls
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "re" and node.args):
                pattern = node.args[0]
                text = ast.unparse(pattern)
                literal = isinstance(pattern, ast.Constant) and isinstance(pattern.value, (str, bytes))
                if not literal and not any(rel == f and text.startswith(p) for f, p in OWN_PATTERNS):
                    found.append(f"{rel}:{node.lineno}: re.{node.func.attr}({text[:60]})")
    assert not found, "compile a pattern a record carries with repro500.untrusted.pattern (RE2): " + "; ".join(found)
