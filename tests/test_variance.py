"""``run --vary``: a factorial run varies one source of randomness per cell, and ``verify``
decomposes each metric's variance into those sources."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.rundirs import make_run
from helpers.runs import repro500, write_recipe
from helpers.stores import mlflow_store
from scipy import stats as sps

from repro500.capture import seeds as seeding
from repro500.rundir import sums as bundle
from repro500.runner import RunOptions, run
from repro500.verify import variance
from repro500.verify.rundir import load_run
from repro500.verify.verdict import verify_run


def test_a_cell_varies_only_its_own_seeds():
    base, own = seeding.derive(7, 0), seeding.derive(7, 5)
    init = seeding.derive_varied(7, 5, 0, seeding.SOURCES["init"])
    assert (init.torch, init.loader, init.python, init.numpy) == (own.torch, base.loader, base.python, base.numpy)
    order = seeding.derive_varied(7, 5, 0, seeding.SOURCES["data_order"])
    assert (order.torch, order.loader) == (base.torch, own.loader)
    held = seeding.derive_varied(7, 5, 0, seeding.SOURCES["kernels"])
    assert (held.torch, held.loader, held.python) == (base.torch, base.loader, base.python)
    assert seeding.derive_varied(7, 5, 0, None) == own == seeding.derive_varied(7, 5, 0, seeding.SOURCES["seed"])


def test_the_decomposition_of_a_factorial_run(tmp_path):
    cells = ["init"] * 3 + ["data_order"] * 3 + ["seed"] * 3
    values = [0.90, 0.94, 0.92, 0.921, 0.919, 0.920, 0.90, 0.95, 0.93]
    root = make_run(tmp_path, values={"accuracy": values})
    meta = json.loads((root / "run.json").read_text())
    meta["design"] = {"kind": "factorial", "sources": ["init", "data_order", "seed"], "per_cell": 3, "cells": cells}
    (root / "run.json").write_text(json.dumps(meta))
    bundle.write_sums(root)
    (result,) = variance.decompose(load_run(root), 0.05)
    by = {c.source: c for c in result.components}
    assert by["init"].variance == pytest.approx(np.var(values[:3], ddof=1))
    low, high = by["init"].ci
    assert low == pytest.approx(2 * by["init"].variance / sps.chi2.ppf(0.975, 2)) and low < by["init"].variance < high
    expected = np.var(values[:3], ddof=1) / (np.var(values[:3], ddof=1) + np.var(values[3:6], ddof=1))
    assert result.dominant == "init" and by["init"].share == pytest.approx(expected)
    assert by["init"].share + by["data_order"].share == pytest.approx(1.0)
    assert by["init"].share_ci[0] < by["init"].share <= by["init"].share_ci[1] <= 1.0
    assert by["seed"].share is None and any("all seeds varied together" in n for n in result.notes)
    assert by["init"].repeats_needed and by["init"].repeats_needed >= by["data_order"].repeats_needed
    verdict = verify_run(root)
    assert verdict.to_dict()["variance"][0]["dominant"] == "init"


def test_share_intervals_are_proper_and_reproducible():
    first = variance.share_intervals([1.0, 0.25, 0.04], [5, 5, 5])
    assert first == variance.share_intervals([1.0, 0.25, 0.04], [5, 5, 5])  # a fixed seed: the same verdict
    assert all(0.0 <= low <= high <= 1.0 for low, high in first)
    assert first[0][0] > first[2][1]  # the dominant source is told apart from the small one


@pytest.mark.slow
def test_vary_runs_one_cell_per_source_and_verify_attributes_the_variance(in_tmp, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_store(in_tmp / "mlflow.db"))
    recipe = write_recipe(in_tmp / "tiny.yaml", fixed__epochs=1)
    outcome = run(RunOptions(recipe=str(recipe), tracking=True, run_id="f", vary=["init", "data_order", "kernels"],
                             repeats_per_cell=2))
    assert outcome.exit_code in (0, 1, 3)
    root = in_tmp / "runs/f"
    meta = json.loads((root / "run.json").read_text())
    assert meta["repeats"] == 6 and meta["deterministic"] is True  # only the kernels cell is not
    assert meta["design"]["cells"] == ["init", "init", "data_order", "data_order", "kernels", "kernels"]
    seeds = [json.loads((root / f"repeats/{k}/summary.json").read_text())["seeds"] for k in range(6)]
    torch, loader = [s["torch"] for s in seeds], [s["loader"] for s in seeds]
    assert torch[0] != torch[1] and loader[0] == loader[1]  # init varies torch's generator only
    assert loader[2] != loader[3] and torch[2] == torch[3] == torch[0]  # data_order the shuffling only
    assert (torch[4], loader[4]) == (torch[5], loader[5]) == (torch[0], loader[0])  # kernels: every seed held
    planned = json.loads((root / "manifest.json").read_text())["facets"]["seeds"]
    assert [p["ranks"][0]["torch"] for p in planned["plan"]] == torch and planned["design"]["per_cell"] == 2
    verdict = verify_run(root)
    assert verdict.status != "INVALID" and verdict.determinism.status != "FAIL", verdict.reasons
    assert [c.source for c in verdict.variance[0].components] == ["init", "data_order", "kernels"]
    import mlflow

    parent = mlflow.MlflowClient(f"sqlite:///{in_tmp / 'mlflow.db'}").get_run(meta["mlflow"]["parent_run_id"])
    assert parent.data.tags["repro500.design"] == "factorial" and parent.data.tags["repro500.design.per_cell"] == "2"
    assert parent.data.metrics["accuracy_variance_init"] == pytest.approx(verdict.variance[0].components[0].variance)
    # the intervals, the dominant source and the repeats a decision would need, as verify.json has them
    decomposition = verdict.variance[0]
    assert parent.data.tags["repro500.variance.accuracy.dominant"] == (decomposition.dominant or "none")
    for c in decomposition.components:
        if c.variance is not None:
            assert (parent.data.metrics[f"accuracy_variance_{c.source}_ci_low"],
                    parent.data.metrics[f"accuracy_variance_{c.source}_ci_high"]) == pytest.approx(c.ci)
        if c.share is not None:
            assert (parent.data.metrics[f"accuracy_share_{c.source}_ci_low"],
                    parent.data.metrics[f"accuracy_share_{c.source}_ci_high"]) == pytest.approx(c.share_ci)
        if c.repeats_needed is not None:
            assert parent.data.metrics[f"accuracy_repeats_needed_{c.source}"] == c.repeats_needed
    assert any(c.share is not None for c in decomposition.components)
    report = repro500("report", "runs/f", "--out", "r.html", cwd=in_tmp)
    assert report.returncode == 0 and "Where the variance of accuracy comes from" in (in_tmp / "r.html").read_text()


def test_bad_vary_options_are_one_sentence(in_tmp):
    write_recipe(in_tmp / "tiny.yaml")
    for args, says in ((["--vary", "init,weather"], "'weather' is not one"),
                       (["--vary", "init", "--repeats", "3"], "--repeats does not apply"),
                       (["--vary", "init", "--repeats-per-cell", "1"], "1 is not in the range"),
                       (["--vary", "seed,init,data_order,kernels", "--repeats-per-cell", "60"], "more than 200"),
                       (["--vary", "init,data_order", "--max-repeats", "4"],
                        "--vary init,data_order with --repeats-per-cell 3 is 6 repeats, more than --max-repeats 4; "
                        "use fewer repeats per cell (at most 2)"),
                       (["--repeats-per-cell", "3"], "--repeats-per-cell goes with --vary (a factorial run)")):
        result = repro500("run", "tiny.yaml", "--no-tracking", *args, cwd=in_tmp)
        assert result.returncode == 2 and says in result.stderr and "Traceback" not in result.stderr, result.stderr
    command = repro500("run", "--no-tracking", "--vary", "init", "--command", "--metric", "a=regex:a ([0-9.]+)",
                       "--accept", "a>=0", "--", "python", "-c", "print('a 1')", cwd=in_tmp)
    assert command.returncode == 2 and "needs a trained workload" in command.stderr
    assert not (in_tmp / "runs").exists()


def _on_nodes(tmp_path, name: str, values: list[float], nodes: list[str]):
    root = make_run(tmp_path, name, values={"accuracy": values})
    for k, node in enumerate(nodes):
        path = root / "repeats" / str(k) / "summary.json"
        summary = json.loads(path.read_text())
        summary["placement"] = {"launcher": "slurm", "node": node, "job_id": f"7_{k}"}
        path.write_text(json.dumps(summary))
    bundle.write_sums(root)
    return root


def test_a_run_on_two_nodes_is_split_by_node_and_a_node_effect_is_named(tmp_path):
    # node n2 runs 0.01 lower than n1, with a spread of 0.001 within each: the nodes differ
    values = [0.950, 0.951, 0.949, 0.940, 0.941, 0.939]
    root = _on_nodes(tmp_path, "apart", values, ["n1", "n1", "n1", "n2", "n2", "n2"])
    verdict = verify_run(root)
    (split,) = verdict.nodes
    assert [(g.node, g.n) for g in split.groups] == [("n1", 3), ("n2", 3)]
    assert split.groups[0].mean == pytest.approx(0.95) and split.groups[1].mean == pytest.approx(0.94)
    assert split.p_value == pytest.approx(sps.f_oneway(values[:3], values[3:]).pvalue) and split.differs
    assert any(a.startswith("accuracy differs by node (one-way ANOVA p = ") for a in verdict.advice)
    assert verdict.to_dict()["nodes"][0]["groups"][1]["node"] == "n2"

    # the same values interleaved over the nodes: no node effect, and no advice
    mixed = _on_nodes(tmp_path, "mixed", values, ["n1", "n2", "n1", "n2", "n1", "n2"])
    (split,) = verify_run(mixed).nodes
    assert not split.differs and split.p_value > 0.05
    assert not any("differs by node" in a for a in verify_run(mixed).advice)
    # one node, or none recorded (a run in turn): no split at all
    assert verify_run(_on_nodes(tmp_path, "one", values, ["n1"] * 6)).nodes is None
    assert verify_run(make_run(tmp_path, "serial")).nodes is None


def test_the_node_split_is_shown_by_verify_and_the_report(in_tmp):
    _on_nodes(in_tmp / "runs", "apart", [0.950, 0.951, 0.949, 0.940, 0.941, 0.939],
              ["n1", "n1", "n1", "n2\x1b[2J", "n2\x1b[2J", "n2\x1b[2J"])
    said = repro500("verify", "runs/apart", cwd=in_tmp)
    text = " ".join(said.stdout.split())
    assert "accuracy by node (one-way ANOVA p = " in text and "differs by node" in text, said.stdout
    assert "\x1b[2J" not in said.stdout  # a node's name is a record's text: shown, never played
    report = repro500("report", "runs/apart", "--out", "r.html", cwd=in_tmp)
    assert report.returncode == 0, report.stderr
    html = (in_tmp / "r.html").read_text()
    assert "accuracy by node" in html and "the nodes&#39; means differ" in html and "\x1b" not in html
    assert "n2\\x1b[2J" in html  # escaped where it was read, visible as such
