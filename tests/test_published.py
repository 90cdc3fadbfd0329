"""Published-results files: the shipped examples, strict validation, and verdicts against them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.rundirs import make_run

from repro500.errors import InvalidInput, UsageError
from repro500.rundir import sums as bundle
from repro500.verify.published import load_published
from repro500.verify.verdict import verify_run

EXAMPLES = Path(__file__).resolve().parent.parent / "experiments" / "published"
HPCAI500 = EXAMPLES / "hpcai500_resnet50.yaml"
DEEP500 = EXAMPLES / "deep500_cifar10_resnet44.yaml"
GOOD = """schema: repro500/published/v1
benchmark: toy
source: {citation: "A. Author, Toy paper, 2026"}
metrics:
  accuracy: {value: 0.9, margin: 0.01, direction: higher}
"""


def run_of(recipe: str, parent: Path, name: str, values: dict) -> Path:
    """A run of ``recipe``: a shipped claim names the recipe it is a result of, and a run of
    another recipe is no reproduction of it (test_same_benchmark.py)."""
    root = make_run(parent, name, values=values)
    path = root / "recipe.yaml"
    path.write_text(path.read_text().replace("name: quickstart", f"name: {recipe}"))
    bundle.write_sums(root)
    return root


def test_shipped_examples_load_with_citations():
    hpc = load_published(HPCAI500)
    assert hpc.metrics["accuracy"].values == [0.763] and hpc.metrics["accuracy"].test == "equivalence"
    assert "arXiv:2007.00279" in hpc.citation and hpc.recipe == "imagenet_resnet50"
    d5 = load_published(DEEP500)
    assert d5.metrics["accuracy"].values == [0.93] and d5.metrics["accuracy"].test == "non_inferiority"
    assert "Ben-Nun" in d5.citation and d5.recipe == "cifar10_resnet44"


def test_deep500_threshold_is_one_sided(tmp_path):
    above = run_of("cifar10_resnet44", tmp_path, "above", values={"accuracy": [0.935, 0.938, 0.940]})
    below = run_of("cifar10_resnet44", tmp_path, "below", values={"accuracy": [0.900, 0.905, 0.910]})
    straddle = run_of("cifar10_resnet44", tmp_path, "straddle", values={"accuracy": [0.925, 0.935, 0.930]})
    assert verify_run(above, against=DEEP500).status == "REPRODUCED"
    assert verify_run(below, against=DEEP500).status == "NOT REPRODUCED"
    assert verify_run(straddle, against=DEEP500).status == "INCONCLUSIVE"


def test_deep500_rerun_stopped_at_the_threshold_is_decided_not_inconclusive(tmp_path):
    # the recipe stops at 0.93, so every repeat ends just above it; the interval's lower end dips
    # below 0.93 and only the shipped margin lets the claim be decided
    stopped = run_of("cifar10_resnet44", tmp_path, "stopped", values={"accuracy": [0.9302, 0.9305, 0.9340, 0.9301, 0.9310]})
    verdict = verify_run(stopped, against=DEEP500)
    assert verdict.status == "REPRODUCED"
    assert verdict.equivalence[0].margin == 0.005 and verdict.equivalence[0].tost["ci_low"] < 0.0


def test_hpcai500_equivalence_both_sides_of_the_margin(tmp_path):
    near = run_of("imagenet_resnet50", tmp_path, "near", values={"accuracy": [0.762, 0.764, 0.763, 0.7625]})
    far = run_of("imagenet_resnet50", tmp_path, "far", values={"accuracy": [0.70, 0.702, 0.701, 0.699]})
    above = run_of("imagenet_resnet50", tmp_path, "above", values={"accuracy": [0.80, 0.802, 0.801, 0.799]})
    assert verify_run(near, against=HPCAI500).status == "REPRODUCED"
    assert verify_run(far, against=HPCAI500).status == "NOT REPRODUCED"
    assert verify_run(above, against=HPCAI500).status == "NOT REPRODUCED"  # equivalence is two-sided


def test_per_repeat_published_values_use_welch_and_the_margin_override(tmp_path):
    pub = tmp_path / "paper.json"
    pub.write_text(json.dumps({
        "schema": "repro500/published/v1", "benchmark": "toy", "source": {"citation": "X, 2026"},
        "metrics": {"accuracy": {"values": [0.931, 0.934, 0.936], "margin": 0.02, "direction": "higher"}},
        "epochs_to_quality": [10, 11, 9],
    }))
    run = make_run(tmp_path, "run", values={"accuracy": [0.93, 0.935, 0.94]}, epochs_to_quality=[10, 10, 11])
    verdict = verify_run(run, against=pub)
    assert verdict.status == "REPRODUCED"
    assert verdict.equivalence[0].tost["method"] == "two-sample Welch TOST"
    assert verdict.time_to_train.status == "PASS"
    tight = verify_run(run, against=pub, margins={"accuracy": 0.0005})
    assert tight.equivalence[0].margin_source == "--margin" and tight.status != "REPRODUCED"
    with pytest.raises(UsageError, match="'loss'"):
        verify_run(run, against=pub, margins={"loss": 0.1})


def test_published_values_with_one_element_advise_fixing_the_file_not_the_run(tmp_path):
    pub = tmp_path / "paper.yaml"
    pub.write_text(GOOD.replace("value: 0.9,", "values: [0.935],"))
    run = make_run(tmp_path, "run", values={"accuracy": [0.933, 0.936, 0.935, 0.934]})
    verdict = verify_run(run, against=pub)
    assert verdict.status == "INCONCLUSIVE"
    advice = " ".join(verdict.advice)
    assert "published file lists 1 value(s) under `values`" in advice and "run at least" not in advice


def test_reference_metric_the_run_lacks_is_invalid_input(tmp_path):
    pub = tmp_path / "paper.yaml"
    pub.write_text(GOOD.replace("accuracy:", "map_50:"))
    run = make_run(tmp_path, "run")
    with pytest.raises(InvalidInput, match="names metric 'map_50', which the run does not report"):
        verify_run(run, against=pub)


@pytest.mark.parametrize("text, message", [
    (GOOD.replace("repro500/published/v1", "v0"), "schema"),
    (GOOD + "extra: 1\n", "'extra' is unknown"),
    (GOOD.replace("margin: 0.01, ", ""), "margin is missing"),
    (GOOD.replace("margin: 0.01", "margin: 0"), "must be > 0"),
    (GOOD.replace("direction: higher", "direction: up"), "direction"),
    (GOOD.replace("value: 0.9", "value: .nan"), "not a finite number"),
    (GOOD.replace('{citation: "A. Author, Toy paper, 2026"}', "{}"), "citation"),
    ("metrics: [1, 2\n", "not valid YAML"),
])
def test_bad_files_name_the_file_and_the_problem(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InvalidInput, match=message) as err:
        load_published(path)
    assert "bad.yaml" in str(err.value)


def test_manifest_may_be_a_relative_path(tmp_path):
    (tmp_path / "ref_manifest.json").write_text(json.dumps({"schema": "repro500/manifest/v1", "facets": {}}))
    path = tmp_path / "paper.yaml"
    path.write_text(GOOD + "manifest: ref_manifest.json\n")
    assert load_published(path).manifest == {"schema": "repro500/manifest/v1", "facets": {}}
    path.write_text(GOOD + "manifest: nowhere.json\n")
    with pytest.raises(InvalidInput, match="does not exist"):
        load_published(path)
