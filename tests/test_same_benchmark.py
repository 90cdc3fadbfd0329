"""A result is a result of a benchmark: verify and history compare only runs of the same one.

A reference names what it is a result of (a recipe; a run carries its fixed keys); a run that
measured another benchmark — another recipe the reference names, other fixed keys, fixed keys set
with --set in the open division — is refused by `verify` (exit 4, one sentence naming both) unless
--across-benchmarks is given, when the status line says so; `history` gives it a series of its own
and lists the override first among the changes.  The fabricated runs follow the run-directory
contract (helpers/rundirs.py: recipe "quickstart", ResNet-20); one test makes real runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers.rundirs import history_run, make_run
from helpers.runs import repro500, write_recipe

from repro500.rundir import sums as bundle

DEEP500 = Path(__file__).resolve().parent.parent / "experiments" / "published" / "deep500_cifar10_resnet44.yaml"
WIDE = {"COLUMNS": "250"}  # the status line whole, as a terminal this wide shows it


def with_recipe(root: Path, *, fixed: dict | None = None, overrides: dict | None = None, name: str | None = None,
                mutable: dict | None = None) -> Path:
    """Change a fabricated run's resolved recipe.yaml as `repro500 run` would have written it, and
    re-seal: ``overrides`` are recorded as --set records them (and make the run open division)."""
    path = root / "recipe.yaml"
    recipe = yaml.safe_load(path.read_text())
    recipe["fixed"].update(fixed or {})
    recipe["mutable"].update(mutable or {})
    if name:
        recipe["name"] = name
    if overrides:
        recipe["overrides"] = overrides
        recipe["open_division"] = any(k.startswith("fixed.") for k in overrides)
    path.write_text(yaml.safe_dump(recipe))
    bundle.write_sums(root)
    return root


def status_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if "(exit " in line)


def one_sentence(done) -> str:
    message = done.stderr.strip()
    assert message.startswith("repro500: error: ") and message.count("\n") == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    return message


@pytest.mark.slow
def test_a_quickstart_run_is_no_reproduction_of_the_resnet44_claim(tmp_path):
    make_run(tmp_path / "runs", "q1", values={"accuracy": [0.935, 0.938, 0.940]})
    done = repro500("verify", "runs/q1", "--against", str(DEEP500), "--no-write", cwd=tmp_path, env=WIDE)
    assert done.returncode == 4, done.stdout + done.stderr
    message = one_sentence(done)
    assert "different benchmarks (recipe 'quickstart' vs 'cifar10_resnet44')" in message, message
    assert "--across-benchmarks" in message and "REPRODUCED" not in done.stdout
    assert not (tmp_path / "runs" / "q1" / "verdict.json").exists()

    across = repro500("verify", "runs/q1", "--against", str(DEEP500), "--across-benchmarks", "--no-write",
                      cwd=tmp_path, env=WIDE)
    assert across.returncode == 0, across.stdout + across.stderr
    assert status_line(across.stdout).startswith(
        "REPRODUCED (different benchmark: recipe 'quickstart' vs 'cifar10_resnet44')  (exit 0)"), across.stdout
    doc = json.loads(repro500("verify", "runs/q1", "--against", str(DEEP500), "--across-benchmarks", "--json",
                              "--no-write", cwd=tmp_path).stdout)
    assert doc["different_benchmark"] == "recipe 'quickstart' vs 'cifar10_resnet44'"
    assert doc["against"]["different_benchmark"] == doc["different_benchmark"]
    assert doc["reasons"][0].startswith("different benchmark: recipe 'quickstart' vs 'cifar10_resnet44'")

    refused = repro500("report", "runs/q1", "--against", str(DEEP500), cwd=tmp_path)
    assert refused.returncode == 4 and "--across-benchmarks" in one_sentence(refused)
    report = repro500("report", "runs/q1", "--against", str(DEEP500), "--across-benchmarks", cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "different benchmark" in (tmp_path / "runs" / "q1" / "report.html").read_text()


def test_between_runs_the_fixed_keys_decide_not_the_recipe_names(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "theirs", values={"accuracy": [0.93, 0.94, 0.935]})
    with_recipe(make_run(runs, "short", values={"accuracy": [0.93, 0.94, 0.935]}),
                fixed={"epochs": 1}, overrides={"fixed.epochs": 1})
    # a variant of another name that kept every fixed key (a bf16 quickstart) is the same benchmark
    with_recipe(make_run(runs, "bf16", values={"accuracy": [0.93, 0.94, 0.935]}),
                name="quickstart-bf16", mutable={"precision": "amp-bf16"})
    done = repro500("verify", "runs/short", "--against", "runs/theirs", "--no-write", cwd=tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "different benchmarks (fixed.epochs 1 vs absent (1 set in the open division))" in one_sentence(done)
    variant = repro500("verify", "runs/bf16", "--against", "runs/theirs", "--json", "--no-write", cwd=tmp_path)
    assert variant.returncode == 0, variant.stdout + variant.stderr
    assert json.loads(variant.stdout)["different_benchmark"] is None


def test_a_claim_that_names_its_recipe_is_not_reproduced_by_a_run_that_changed_its_fixed_keys(tmp_path):
    claim = tmp_path / "claim"
    claim.mkdir()
    (claim / "published.yaml").write_text(yaml.safe_dump({
        "schema": "repro500/published/v1", "benchmark": "quickstart, as its recipe defines it", "recipe": "quickstart",
        "source": {"citation": "A. Author, 2026"},
        "metrics": {"accuracy": {"value": 0.935, "margin": 0.02, "direction": "higher"}}}))
    runs = tmp_path / "runs"
    make_run(runs, "closed", values={"accuracy": [0.93, 0.94, 0.935]})
    with_recipe(make_run(runs, "open", values={"accuracy": [0.93, 0.94, 0.935]}),
                fixed={"epochs": 1}, overrides={"fixed.epochs": 1})
    closed = repro500("verify", "runs/closed", "--against", "claim/published.yaml", "--no-write", cwd=tmp_path)
    assert closed.returncode == 0, closed.stdout + closed.stderr
    done = repro500("verify", "runs/open", "--against", "claim/published.yaml", "--no-write", cwd=tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    assert ("recipe 'quickstart' with fixed.epochs=1 set in the open division vs 'quickstart' as its recipe "
            "defines it") in one_sentence(done)
    # a publication carries the recipe beside its claim: its fixed keys are the benchmark's definition
    (claim / "recipe.yaml").write_text(yaml.safe_dump({"name": "quickstart", "fixed": {"model": "resnet20",
                                                                                        "epochs": 1}}))
    done = repro500("verify", "runs/closed", "--against", "claim/published.yaml", "--no-write", cwd=tmp_path)
    assert done.returncode == 4 and "(fixed.epochs absent vs 1)" in one_sentence(done), done.stdout + done.stderr
    done = repro500("verify", "runs/open", "--against", "claim/published.yaml", "--no-write", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def closed_and_open_history(runs: Path) -> None:
    """Quickstart runs (5 epochs) with one run in between made with --set fixed.epochs=1 --open-division."""
    for name, created, accuracy in (("h1", "2026-11-01T10:00:00Z", [0.930, 0.935, 0.940]),
                                    ("h2", "2026-11-02T10:00:00Z", [0.932, 0.938, 0.934]),
                                    ("short", "2026-11-03T10:00:00Z", [0.801, 0.805, 0.803]),
                                    ("h3", "2026-11-04T10:00:00Z", [0.936, 0.931, 0.937])):
        root = history_run(runs, name, created, accuracy)
        if name == "short":
            with_recipe(root, fixed={"epochs": 1}, overrides={"fixed.epochs": 1})
        else:
            with_recipe(root, fixed={"epochs": 5})


def test_history_gives_a_run_with_other_fixed_keys_its_own_series_and_names_the_override(tmp_path):
    closed_and_open_history(tmp_path / "runs")
    done = repro500("history", "runs", "accuracy", "--recipe", "quickstart", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    rows = {r["run_id"]: r for r in doc["runs"]}
    short = rows["short"]
    assert short["moved"] is None and short["p_value"] is None and short["previous"] is None, short
    assert short["benchmark"] == "B2" and rows["h1"]["benchmark"] == rows["h3"]["benchmark"] == "B1"
    assert short["other_benchmark"]["run"] == "h2"
    assert short["other_benchmark"]["difference"] == "fixed.epochs 1 vs 5 (1 set in the open division)"
    first = short["changes"][0]
    assert (first["key"], first["before"], first["after"]) == ("recipe.fixed.epochs", 5, 1), short["changes"]
    assert "--set fixed.epochs" in first["reason"] and "open division" in first["reason"]
    assert rows["h3"]["previous"] == "h2"  # the closed runs stay one series
    assert doc["benchmarks"]["B2"].startswith("quickstart with fixed.epochs=1 set in the open division")
    text = repro500("history", "runs", "accuracy", "--recipe", "quickstart", cwd=tmp_path, env=WIDE).stdout
    assert "worse" not in text and "another benchmark than h2: not compared" in text, text
    assert "recipe.fixed.epochs: 5 -> 1" in text, text


def test_history_lists_an_override_of_a_mutable_key_before_the_provenance(tmp_path):
    runs = tmp_path / "runs"
    history_run(runs, "h1", "2026-11-01T10:00:00Z", [0.930, 0.935, 0.940])
    with_recipe(history_run(runs, "h2", "2026-11-02T10:00:00Z", [0.890, 0.892, 0.891], torch="2.15.0"),
                mutable={"lr": 0.5}, overrides={"mutable.lr": 0.5})
    doc = json.loads(repro500("history", "runs", "accuracy", "--json", cwd=tmp_path).stdout)
    row = doc["runs"][1]
    assert row["previous"] == "h1" and row["moved"] == "worse"  # the same benchmark: compared
    # one order for every command: by impact (the torch build first), the override said in its reason
    keys = [c["key"] for c in row["changes"]]
    assert "recipe.mutable.lr" in keys and any(c["after"] == "2.15.0" for c in row["changes"]), row["changes"]
    assert "set with --set mutable.lr" in row["changes"][keys.index("recipe.mutable.lr")]["reason"]


def test_verify_against_a_history_uses_the_same_rule(tmp_path):
    runs = tmp_path / "runs"
    closed_and_open_history(runs)
    # -n 5 is recorded as an override of repeats: it changes no key of the benchmark or the recipe
    with_recipe(history_run(runs, "five", "2026-11-04T11:00:00Z", [0.934, 0.936, 0.933, 0.935, 0.932]),
                fixed={"epochs": 5}, overrides={"repeats": 5})
    with_recipe(history_run(runs, "new", "2026-11-05T10:00:00Z", [0.934, 0.936, 0.933]), fixed={"epochs": 5})
    done = repro500("verify", "runs/new", "--against", "history:runs", "--json", "--no-write", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    hist = json.loads(done.stdout)["against"]["history"]
    assert hist["runs"] == ["h1", "h2", "h3", "five"]
    why = {s["run"]: s["why"] for s in hist["skipped"]}
    assert why["short"] == "another benchmark: fixed.epochs 1 vs 5 (1 set in the open division)"


@pytest.mark.slow
def test_real_runs_with_a_fixed_key_set_in_the_open_division(in_tmp):
    write_recipe(in_tmp / "tiny.yaml", repeats=2, fixed__epochs=1)
    for run_id, extra in (("closed", ()), ("open", ("--set", "fixed.epochs=2", "--open-division"))):
        made = repro500("run", "tiny.yaml", "--no-tracking", "--run-id", run_id, *extra, cwd=in_tmp)
        assert made.returncode in (0, 1, 3), made.stdout + made.stderr
    done = repro500("verify", "runs/open", "--against", "runs/closed", "--no-write", cwd=in_tmp)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "(fixed.epochs 2 vs 1 (2 set in the open division))" in one_sentence(done)
    doc = json.loads(repro500("history", "runs", "accuracy", "--json", cwd=in_tmp).stdout)
    rows = {r["run_id"]: r for r in doc["runs"]}
    assert rows["open"]["previous"] is None and rows["open"]["other_benchmark"]["run"] == "closed"
    assert rows["open"]["changes"][0]["key"] == "recipe.fixed.epochs"


def test_a_run_against_another_benchmarks_claim_is_refused_before_it_trains(tmp_path):
    write_recipe(tmp_path / "tiny.yaml", fixed__epochs=1, repeats=1)
    done = repro500("run", "tiny.yaml", "--against", str(DEEP500), "--no-tracking", "--out", "runs", cwd=tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    message = one_sentence(done)
    assert "different benchmarks (recipe 'tiny' vs 'cifar10_resnet44')" in message
    assert "verify with --across-benchmarks" in message
    assert not (tmp_path / "runs").exists()  # refused before a run directory (or any training)
