"""The same bytes are the same data: the one comparison of two runs knows data by content.

A data record (a data set the recipe names, an input a command read) whose bytes the other run has
at another path is listed once, as moved, below the result-relevant threshold, in verify, diff,
history and the report; a recipe data path renamed over the same bytes is the same benchmark; a
path with other bytes stays a result-relevant difference.  No output shows a recorded value as a
Python repr.  And "Where the runs part" says so when the rerun and its reference share no seed.

Real runs of the quickstart recipe (one epoch on 128 samples) are made once for the module.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from helpers.runs import repro500

from repro500.errors import InvalidInput
from repro500.verify import compare, diff
from repro500.verify.divergence import SEEDS_DIFFER
from repro500.verify.reference import Benchmark, benchmark_difference

# A module of real runs moved, renamed and rerun (about 80 s of make test on 2 cores): make test-slow
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
WIDE = {"COLUMNS": "250"}
PY = sys.executable
REPR = ("{'", "['", "': ")  # what Python's repr of a dict or list of strings looks like


def _ok(done, *codes: int) -> None:
    assert done.returncode in codes, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """ref (the recipe as it is), moved (data/quickstart-train.h5 copied to data/renamed.h5 and the
    recipe pointed at it, in the open division) and s501 (another master seed, two same-seed repeats)."""
    cwd = tmp_path_factory.mktemp("moved")
    recipe = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())
    recipe["fixed"]["epochs"] = 1
    (cwd / "quickstart.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    env = {"REPRO500_CACHE_DIR": str(cwd / "cache")}
    for split, samples in (("train", "128"), ("eval", "64")):  # as make demo generates them, smaller
        _ok(repro500("data", "generate", "classification", "--out", f"data/quickstart-{split}.h5", "--samples", samples,
                     "--seed", "500", "--noise", "0.04", "--split", split, cwd=cwd, env=env), 0)
    shutil.copyfile(cwd / "data" / "quickstart-train.h5", cwd / "data" / "renamed.h5")
    for run_id, extra in (("ref", ["-n", "1", "--same-seed"]),
                          ("moved", ["-n", "1", "--same-seed", "--set", "fixed.dataset.path=data/renamed.h5",
                                     "--open-division"]),
                          ("s501", ["-n", "2", "--same-seed", "--set", "seed=501"])):
        _ok(repro500("run", "quickstart.yaml", "--no-tracking", "--out", "runs", *extra, "--run-id", run_id,
                     cwd=cwd, env=env), 0, 1, 3)
    return cwd


def _moved_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if str(r.get("reason") or r.get("why") or "").startswith("moved")]


def test_a_renamed_data_file_reproduces_exactly_with_one_moved_row(runs):
    done = repro500("verify", "runs/moved", "--against", "runs/ref", "--no-write", cwd=runs, env=WIDE)
    _ok(done, 0)
    assert "REPRODUCED (exact)" in done.stdout and "different benchmarks" not in done.stdout + done.stderr
    assert not any(r in done.stdout for r in REPR), done.stdout
    doc = json.loads(repro500("verify", "runs/moved", "--against", "runs/ref", "--json", "--no-write", cwd=runs).stdout)
    assert doc["exact_replay"]["exact"] and doc["provenance"]["result_relevant"] == 0
    moved = _moved_rows(doc["provenance"]["rows"])
    assert len(moved) == 1, doc["provenance"]["rows"]
    assert moved[0]["key"] == "entries.data/renamed.h5" and "fixed.dataset.path" in moved[0]["reason"]
    assert moved[0]["run"].startswith("md5 ") and moved[0]["run"].endswith("data/renamed.h5")
    assert moved[0]["reference"].endswith("data/quickstart-train.h5")
    assert moved[0]["impact"] < diff.RELEVANT_IMPACT
    assert not [r for r in doc["provenance"]["rows"] if r["facet"] == "recipe" and "dataset" in r["key"]]


def test_diff_history_and_the_report_list_the_move_once(runs):
    shown = repro500("diff", "runs/moved", "runs/ref", "--json", cwd=runs)
    _ok(shown, 0)
    differences = json.loads(shown.stdout)["differences"]
    assert not [d for d in differences if d["result_relevant"]]
    assert len([d for d in differences if d["reason"].startswith("moved")]) == 1
    table = repro500("diff", "runs/moved", "runs/ref", cwd=runs, env=WIDE)
    assert "moved" in table.stdout and not any(r in table.stdout for r in REPR), table.stdout

    history = repro500("history", "runs", "accuracy", "--json", cwd=runs)
    _ok(history, 0)
    rows = {r["run_id"]: r for r in json.loads(history.stdout)["runs"]}
    assert rows["moved"]["benchmark"] == rows["ref"]["benchmark"]  # one benchmark, one series
    assert [(c["before"], c["after"]) for c in rows["moved"]["changes"] if c.get("moved")] == [
        ("data/quickstart-train.h5", "data/renamed.h5")]
    printed = repro500("history", "runs", "accuracy", cwd=runs, env=WIDE)
    assert "moved: the same bytes" in printed.stdout and not any(r in printed.stdout for r in REPR)

    report = repro500("report", "runs/moved", "--against", "runs/ref", cwd=runs)
    _ok(report, 0)
    html = (runs / "runs" / "moved" / "report.html").read_text()
    assert "moved: the same bytes" in html and "{&#39;hash" not in html and "{'hash" not in html


def test_other_seeds_part_from_the_first_step_by_design(runs):
    done = repro500("verify", "runs/s501", "--against", "runs/ref", "--no-write", cwd=runs, env=WIDE)
    _ok(done, 0, 1, 3)
    line = next(x for x in done.stdout.splitlines() if x.startswith("Where the runs part"))
    assert line.startswith(f"Where the runs part  {SEEDS_DIFFER}; within the rerun, "), line
    doc = json.loads(repro500("verify", "runs/s501", "--against", "runs/ref", "--json", "--no-write", cwd=runs).stdout)
    assert doc["divergence"]["seeds_differ"] and doc["divergence"]["reason"].startswith(SEEDS_DIFFER)
    assert "within the rerun, 1 pair(s) of same-seed repeats agree bitwise" in line
    # alone, the rerun's same-seed pair is what is said, with no word of other seeds
    own = repro500("verify", "runs/s501", "--no-write", cwd=runs, env=WIDE)
    assert SEEDS_DIFFER not in own.stdout and "1 pair(s) of same-seed repeats agree bitwise" in own.stdout


# ----- the rule, on records -------------------------------------------------------------------------
def _entry(path: str, md5: str, size: int = 6) -> dict:
    return {"hash": "md5", "kind": "file", "md5": md5, "nfiles": None, "path": path, "size": size}


def _manifest(*entries: dict, observed: tuple[dict, ...] = ()) -> dict:
    return {"facets": {"data": {"entries": list(entries), **({"observed": list(observed)} if observed else {})}}}


def test_same_bytes_elsewhere_are_moved_other_bytes_stay_a_difference():
    a = _manifest(_entry("data/new.h5", "aa"), _entry("data/eval.h5", "cc"), _entry("data/only.h5", "dd"))
    b = _manifest(_entry("data/old.h5", "aa"), _entry("data/eval.h5", "ee"))
    found = compare.compare_manifests(a, b)
    rows = {d.key: d for d in found.differences}
    assert diff.is_moved(rows["entries.data/new.h5"])
    assert "entries.data/old.h5" not in rows  # listed once
    assert rows["entries.data/eval.h5.md5"].impact >= diff.RELEVANT_IMPACT  # same path, other bytes
    assert rows["entries.data/only.h5"].impact >= diff.RELEVANT_IMPACT  # bytes the other side lacks
    assert [compare.key_of(d) for d in found.relevant] == ["data.entries.data/eval.h5.md5", "data.entries.data/only.h5"]


def test_an_input_read_at_another_absolute_path_is_moved():
    a = _manifest(observed=(_entry("/home/a/data/values.csv", "aa"),))
    b = _manifest(observed=(_entry("/home/b/data/values.csv", "aa"),))
    found = compare.compare_manifests(a, b)
    assert found.counted() == "1 difference(s), 0 result-relevant"
    line = compare.line(found.differences[0], width=80)
    assert "md5 aa 6 bytes /home/a/data/values.csv vs md5 aa 6 bytes /home/b/data/values.csv" in line
    assert not any(r in line for r in REPR)


def test_a_renamed_data_path_is_the_same_benchmark_and_other_bytes_are_not():
    def bench(path: str, md5: str) -> Benchmark:
        return Benchmark(recipe="q", fixed={"dataset": {"path": path}, "epochs": 1}, data={path: md5})

    assert benchmark_difference(bench("data/renamed.h5", "aa"), bench("data/train.h5", "aa")) is None
    assert benchmark_difference(bench("data/other.h5", "bb"), bench("data/train.h5", "aa")) == (
        "fixed.dataset.path data/other.h5 vs data/train.h5")
    # a path the run did not digest is what it says
    assert benchmark_difference(Benchmark(recipe="q", fixed={"dataset": {"path": "data/renamed.h5"}, "epochs": 1}),
                                bench("data/train.h5", "aa")) is not None


@pytest.mark.parametrize("value, text", [
    ({"hash": "md5", "kind": "file", "md5": "0123456789abcdef", "path": "data/x.h5", "size": 2048},
     "md5 0123456789ab 2.0 kB data/x.h5"),
    ({"md5": "aa", "size": 3}, "md5=aa, size=3"),
    (["avx2", "fma"], "avx2, fma"),
    ({"a": [1, {"b": None}]}, "a=1, b=None"),
    ({}, "(empty)"),
    ("two\nlines\x1b[31m", "two lines\\x1b[31m"),
])
def test_one_formatter_shows_values_without_a_repr(value, text):
    assert diff.short(value, 60) == text


def test_a_long_record_keeps_the_end_of_its_path():
    text = diff.short(_entry("/very/long/" + "d" * 80 + "/values.csv", "ab" * 16, 10), 48)
    assert len(text) <= 48 and text.endswith("/values.csv") and text.startswith("md5 abababababab 10 bytes …")


# ----- a wrapped command whose data moved -------------------------------------------------------------
def _layout(root: Path) -> Path:
    """An experiment next to its data, as many public examples lie: main.py reads ../data/values.csv."""
    proj = root / "proj"
    proj.mkdir(parents=True)
    (proj / "main.py").write_text(textwrap.dedent("""
        xs = [float(x) for x in open("../data/values.csv") if x.strip()]
        print(f"Acc {sum(xs) / len(xs) / 10:.3f}")
    """))
    (root / "data").mkdir()
    (root / "data" / "values.csv").write_text("6\n7\n8\n")
    return proj


def test_a_command_whose_inputs_moved_has_no_result_relevant_difference(tmp_path):
    argv = ["run", "--command", "--metric", "accuracy=regex:Acc ([0-9.]+)", "--accept", "accuracy>=0.5", "-n", "2",
            "--no-tracking", "--out", str(tmp_path / "runs")]
    for side in ("a", "b"):
        proj = _layout(tmp_path / side)
        _ok(repro500(*argv, "--run-id", side, "--", PY, "main.py", cwd=proj), 0)
    inputs = json.loads((tmp_path / "runs" / "b" / "inputs.json").read_text())
    assert [e["path"] for e in inputs["observed"]] == [str(tmp_path / "b" / "data" / "values.csv")]

    margin = ["--margin", "accuracy=0.01"]
    done = repro500("verify", "runs/b", "--against", "runs/a", *margin, "--json", "--no-write", cwd=tmp_path)
    _ok(done, 0)
    doc = json.loads(done.stdout)
    assert doc["provenance"]["result_relevant"] == 0, doc["provenance"]["rows"]
    assert len(_moved_rows(doc["provenance"]["rows"])) == 1
    printed = repro500("verify", "runs/b", "--against", "runs/a", *margin, "--no-write", cwd=tmp_path, env=WIDE)
    assert "<absent> vs" not in printed.stdout and not any(r in printed.stdout for r in REPR), printed.stdout
    assert "0 result-relevant" in printed.stdout


def test_run_against_a_reference_takes_a_renamed_file_for_the_same_benchmark(runs, monkeypatch):
    """``run --against`` refuses another benchmark before it trains: a renamed file of the same bytes
    is none, a file of other bytes at the new name is."""
    from types import SimpleNamespace

    from repro500.runner.decide import _same_benchmark
    from repro500.verify.reference import load_reference

    monkeypatch.chdir(runs)
    loaded = load_reference("runs/ref")
    fixed = yaml.safe_load((runs / "runs" / "ref" / "recipe.yaml").read_text())["fixed"]

    def recipe(path: str) -> SimpleNamespace:
        return SimpleNamespace(name="quickstart", fixed={**fixed, "dataset": {**fixed["dataset"], "path": path}},
                               overrides={"fixed.dataset.path": path})

    _same_benchmark(recipe("data/renamed.h5"), loaded, "runs/ref")  # no refusal
    (runs / "data" / "other.h5").write_bytes((runs / "data" / "quickstart-eval.h5").read_bytes())
    with pytest.raises(InvalidInput, match=r"different benchmarks \(fixed.dataset.path data/other.h5"):
        _same_benchmark(recipe("data/other.h5"), loaded, "runs/ref")
