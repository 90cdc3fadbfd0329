"""Verdicts on crafted run directories: bands, tampering, equivalence, determinism, time-to-train."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers.rundirs import edit_json, make_manifest, make_run
from scipy import stats as sps

from repro500.digest import file_digest
from repro500.errors import InvalidInput, UsageError
from repro500.rundir import sums as bundle
from repro500.verify import timing
from repro500.verify.verdict import verify_run, write_verdict

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


def _status(verdict):
    return verdict.status, verdict.exit_code


# ------------------------------------------------------------------------ bands


def test_clean_run_passes_its_band_and_writes_a_nan_free_verdict(tmp_path):
    run = make_run(tmp_path)
    verdict = verify_run(run)
    assert _status(verdict) == ("PASS", 0)
    band = verdict.bands[0]
    assert band.status == "PASS" and band.lower_bound >= 0.88
    path = write_verdict(verdict, run)
    doc = json.loads(path.read_text())
    assert doc["schema"] == "repro500/verdict/v1" and doc["status"] == "PASS" and doc["exit_code"] == 0
    assert doc["statistics"]["accuracy"]["n"] == 3
    json.dumps(doc, allow_nan=False)
    assert bundle.check_sums(run).ok  # verdict.json is not covered by SHA256SUMS


def test_band_decided_on_the_confidence_bound_not_the_best_repeat(tmp_path):
    # the best repeat (0.95) meets the target but the mean is far below it: FAIL, not PASS
    run = make_run(tmp_path, values={"accuracy": [0.80, 0.81, 0.82, 0.95]},
                   acceptance={"accuracy": {"target": 0.95, "direction": "higher", "tolerance": 0.0}})
    assert _status(verify_run(run)) == ("FAIL", 1)


def test_the_bands_table_shows_the_bound_its_reason_cites(tmp_path):
    from rich.console import Console

    from repro500.verify.render import render

    run = make_run(tmp_path, values={"accuracy": [0.80, 0.81, 0.82, 0.83]},
                   acceptance={"accuracy": {"target": 0.95, "direction": "higher", "tolerance": 0.0}})
    verdict = verify_run(run)
    band = verdict.bands[0]
    assert band.status == "FAIL" and band.reason.startswith("upper")  # a miss rests on the far bound
    console = Console(record=True, width=200)
    render(verdict, console)
    row = next(line for line in console.export_text().splitlines() if line.startswith("accuracy") and ">=" in line)
    assert f"upper {band.upper_bound:.4g}" in row and f"{band.lower_bound:.4g}" not in row


def test_band_straddling_the_threshold_is_inconclusive_with_repeats_advice(tmp_path):
    run = make_run(tmp_path, values={"accuracy": [0.87, 0.89, 0.885]})
    verdict = verify_run(run)
    assert _status(verdict) == ("INCONCLUSIVE", 3)
    assert verdict.bands[0].repeats_needed and verdict.bands[0].repeats_needed > 3
    assert any("repeats would decide" in a for a in verdict.advice)


def test_lower_is_better_band_is_mirrored(tmp_path):
    acceptance = {"loss": {"target": 0.5, "direction": "lower", "tolerance": 0.05}}
    good = make_run(tmp_path, "good", values={"loss": [0.40, 0.42, 0.41]}, acceptance=acceptance)
    bad = make_run(tmp_path, "bad", values={"loss": [0.70, 0.72, 0.71]}, acceptance=acceptance)
    assert _status(verify_run(good)) == ("PASS", 0)
    assert _status(verify_run(bad)) == ("FAIL", 1)


def test_zero_variance_repeats_are_decided_exactly_without_nan(tmp_path):
    run = make_run(tmp_path, values={"accuracy": [0.93, 0.93, 0.93]})
    verdict = verify_run(run)
    assert _status(verdict) == ("PASS", 0)
    stats = verdict.statistics["accuracy"]
    assert stats["zero_variance"] and stats["ci_low"] == stats["ci_high"] == 0.93
    json.dumps(verdict.to_dict(), allow_nan=False)


def test_one_repeat_is_inconclusive_with_advice(tmp_path):
    run = make_run(tmp_path, values={"accuracy": [0.99]})
    verdict = verify_run(run)
    assert _status(verdict) == ("INCONCLUSIVE", 3)
    assert any("at least 3 repeats" in a for a in verdict.advice)
    json.dumps(verdict.to_dict(), allow_nan=False)


def test_a_diverged_repeat_keeps_the_band_from_passing_on_the_lucky_ones(tmp_path):
    run = make_run(tmp_path, values={"accuracy": [0.93, 0.94, 0.935, 0.1, 0.938]},
                   statuses=["completed", "completed", "completed", "diverged", "completed"])
    verdict = verify_run(run)
    assert _status(verdict) == ("INCONCLUSIVE", 3)
    band = verdict.bands[0]
    assert band.status == "INCONCLUSIVE" and band.n == 4
    assert band.lower_bound >= band.threshold  # the four completed ones alone would pass
    assert "3 (diverged) did not complete" in band.reason and "investigate the divergence" in band.reason
    assert verdict.statistics["accuracy"]["n"] == 4
    assert any("3: diverged" in a for a in verdict.advice)
    assert any("investigate the divergence" in a for a in verdict.advice)


def test_failed_and_killed_repeats_also_block_a_pass_with_rerun_advice(tmp_path):
    run = make_run(tmp_path, values={"accuracy": [0.93, 0.94, 0.935, 0.5, 0.6]},
                   statuses=["completed", "completed", "completed", "failed", "killed"])
    verdict = verify_run(run)
    assert _status(verdict) == ("INCONCLUSIVE", 3)
    assert "3 (failed), 4 (killed) did not complete" in verdict.reasons[0]
    assert any("rerun them" in a and "--resume" in a for a in verdict.advice)


def test_a_band_the_completed_repeats_miss_stays_fail_despite_a_diverged_one(tmp_path):
    run = make_run(tmp_path, values={"accuracy": [0.70, 0.71, 0.1, 0.72]},
                   statuses=["completed", "completed", "diverged", "completed"])
    verdict = verify_run(run)
    assert _status(verdict) == ("FAIL", 1)
    assert "misses band" in verdict.bands[0].reason


@pytest.mark.parametrize("recipe", ["cifar10_resnet44", "imagenet_resnet50", "ewa_fasterrcnn"])
def test_shipped_recipe_band_decides_repeats_that_stopped_at_the_target(tmp_path, recipe):
    # training stops at the target, so every repeat ends just above it; the one-sided bound then
    # dips below the target, and only the recipe's tolerance lets the band be decided
    acceptance = yaml.safe_load((EXPERIMENTS / f"{recipe}.yaml").read_text())["acceptance"]
    (metric, spec), = acceptance.items()
    stopped = [spec["target"] + d for d in (0.0002, 0.0005, 0.004, 0.0001, 0.001)]
    shipped = make_run(tmp_path, "shipped", values={metric: stopped}, acceptance=acceptance)
    assert _status(verify_run(shipped)) == ("PASS", 0)
    zero = {metric: {**spec, "tolerance": 0.0}}
    assert verify_run(make_run(tmp_path, "zero", values={metric: stopped}, acceptance=zero)).status == "INCONCLUSIVE"


def test_no_criteria_and_no_reference_is_inconclusive(tmp_path):
    run = make_run(tmp_path, acceptance=None)
    verdict = verify_run(run)
    assert _status(verdict) == ("INCONCLUSIVE", 3)
    assert "nothing to decide" in verdict.reasons[0]


def test_no_criteria_and_no_reference_is_decided_by_determinism_alone(tmp_path):
    # docs/verify.md, "How the sections combine": a determinism check that ran is a decision
    same = make_run(tmp_path, "same", acceptance=None, torch_seeds=[7, 7, 7])
    verdict = verify_run(same)
    assert _status(verdict) == ("PASS", 0)
    assert verdict.reasons[0].startswith("determinism: 3 repeats sharing a seed")
    assert any("only determinism was decided" in a for a in verdict.advice)
    diverged = make_run(tmp_path, "diverged", acceptance=None, torch_seeds=[7, 7, 7],
                        diverge={"repeat": 1, "epoch": 2, "tensor": "fc.weight"})
    assert _status(verify_run(diverged)) == ("FAIL", 1)


# ------------------------------------------------------------------- integrity


def test_one_edited_number_in_a_repeat_summary_is_invalid(tmp_path):
    run = make_run(tmp_path)
    edit_json(run / "repeats" / "1" / "summary.json", lambda d: d["metrics"].update(accuracy=0.99))
    verdict = verify_run(run)
    assert _status(verdict) == ("INVALID", 4)
    assert "repeats/1/summary.json" in verdict.reasons[0] and "edited" in verdict.reasons[0]


def test_number_edited_and_resummed_is_still_caught_without_new_sums(tmp_path):
    run = make_run(tmp_path)
    edit_json(run / "repeats" / "1" / "summary.json", lambda d: d["metrics"].update(accuracy=0.99))
    edit_json(run / "summary.json", lambda d: d["metrics"]["accuracy"]["values"].__setitem__(1, 0.99))
    verdict = verify_run(run)
    assert verdict.status == "INVALID"
    assert "summary.json" in verdict.reasons[0] and "repeats/1/summary.json" in verdict.reasons[0]


def test_aggregate_disagreeing_with_repeats_is_invalid_even_with_regenerated_sums(tmp_path):
    run = make_run(tmp_path)
    edit_json(run / "summary.json", lambda d: d["metrics"]["accuracy"]["values"].__setitem__(0, 0.99))
    bundle.write_sums(run)
    verdict = verify_run(run)
    assert verdict.status == "INVALID"
    assert any("metrics.accuracy" in r for r in verdict.reasons)


def test_forger_who_rewrites_everything_is_flagged_by_metrics_jsonl_and_expect_sums(tmp_path):
    run = make_run(tmp_path)
    published = file_digest(run / bundle.SUMS_NAME)
    edit_json(run / "repeats" / "1" / "summary.json", lambda d: d["metrics"].update(accuracy=0.99))
    edit_json(run / "summary.json", lambda d: d["metrics"]["accuracy"]["values"].__setitem__(1, 0.99))
    bundle.write_sums(run)
    verdict = verify_run(run)
    # self-consistent directory: not INVALID by itself (documented), but the warning shows it
    assert verdict.status != "INVALID"
    assert any("metrics.jsonl" in w for w in verdict.integrity.warnings)
    # a SHA256SUMS digest kept elsewhere catches it
    assert verify_run(run, expect_sums_digest=published).status == "INVALID"


def test_a_repeat_on_another_world_size_or_engine_than_the_run_is_invalid(tmp_path):
    """a resume that reran a repeat on one rank left run.json saying world size 2."""
    run = make_run(tmp_path)
    edit_json(run / "run.json", lambda d: d.update(engine="ddp", world_size=2))
    for k in range(3):
        edit_json(run / "repeats" / str(k) / "summary.json", lambda d: d.update(engine="ddp", world_size=2))
    bundle.write_sums(run)
    assert verify_run(run).status != "INVALID"
    edit_json(run / "repeats" / "2" / "summary.json", lambda d: d.update(engine="local", world_size=1))
    bundle.write_sums(run)
    verdict = verify_run(run)
    assert verdict.status == "INVALID"
    assert "repeat 2 ran with world size 1, but run.json records world size 2 for the run" in " ".join(verdict.reasons)
    assert "repeat 2 ran with engine 'local', but run.json records engine 'ddp' for the run" in " ".join(
        verdict.reasons)


def test_edited_manifest_with_regenerated_sums_fails_its_canonical_digest(tmp_path):
    run = make_run(tmp_path)
    edit_json(run / "manifest.json", lambda d: d["facets"]["environment"]["packages"].update(torch="9.9"))
    bundle.write_sums(run)
    verdict = verify_run(run)
    assert verdict.status == "INVALID"
    assert "manifest.json digest mismatch" in verdict.reasons[0]


def test_missing_and_extra_files_are_listed(tmp_path):
    run = make_run(tmp_path)
    (run / "repeats" / "2" / "metrics.jsonl").unlink()
    (run / "notes.txt").write_text("added later")
    verdict = verify_run(run)
    assert verdict.status == "INVALID"
    assert "missing: repeats/2/metrics.jsonl" in verdict.reasons[0]
    assert "extra: notes.txt" in verdict.reasons[0]


def test_missing_sums_or_directory_is_invalid_input(tmp_path):
    run = make_run(tmp_path)
    (run / "SHA256SUMS").unlink()
    with pytest.raises(InvalidInput, match="SHA256SUMS is missing"):
        verify_run(run)
    with pytest.raises(InvalidInput, match="does not exist|not a run directory"):
        verify_run(tmp_path / "nope")


def test_changed_data_file_is_invalid(tmp_path, monkeypatch):
    data = tmp_path / "train.h5"
    data.write_bytes(b"original bytes")
    entry = {"path": str(data), "hash": "md5", "md5": "0" * 32, "size": 14, "nfiles": None}
    absent = {"path": str(tmp_path / "elsewhere.h5"), "hash": "md5", "md5": "1" * 32, "size": 1, "nfiles": None}
    run = make_run(tmp_path, manifest=make_manifest(data={"entries": [entry, absent]}))
    pytest.importorskip("repro500.capture.data", reason="the capture engineer's compare() is not there yet")
    verdict = verify_run(run)
    assert verdict.status == "INVALID"
    assert any("train.h5" in r for r in verdict.reasons)
    assert any("not on this machine" in n for n in verdict.integrity.notes)  # absent path is skipped


# ----------------------------------------------------------------- equivalence


def test_equivalent_runs_are_reproduced(tmp_path):
    a = make_run(tmp_path, "a", values={"accuracy": [0.930, 0.935, 0.940]})
    b = make_run(tmp_path, "b", values={"accuracy": [0.932, 0.936, 0.938]})
    verdict = verify_run(a, against=b)  # margin from the acceptance tolerance (0.02)
    assert _status(verdict) == ("REPRODUCED", 0)
    eq = verdict.equivalence[0]
    assert eq.margin_source == "acceptance tolerance"
    assert -0.02 <= eq.tost["ci_low"] <= eq.tost["ci_high"] <= 0.02


def test_a_rerun_with_a_diverged_repeat_is_not_reproduced_on_the_others(tmp_path):
    a = make_run(tmp_path, "a", values={"accuracy": [0.930, 0.935, 0.1, 0.940]},
                 statuses=["completed", "completed", "diverged", "completed"])
    b = make_run(tmp_path, "b", values={"accuracy": [0.932, 0.936, 0.938]})
    verdict = verify_run(a, against=b)
    assert _status(verdict) == ("INCONCLUSIVE", 3)
    eq = verdict.equivalence[0]
    assert eq.status == "INCONCLUSIVE" and "2 (diverged) of the run did not complete" in eq.reason
    assert -0.02 <= eq.tost["ci_low"] <= eq.tost["ci_high"] <= 0.02  # the three completed ones alone would pass


def test_runs_differing_beyond_the_margin_are_not_reproduced(tmp_path):
    a = make_run(tmp_path, "a", values={"accuracy": [0.930, 0.935, 0.940]})
    b = make_run(tmp_path, "b", values={"accuracy": [0.880, 0.884, 0.882]})
    verdict = verify_run(a, against=b, margins={"accuracy": 0.01})
    assert _status(verdict) == ("NOT REPRODUCED", 1)
    assert verdict.equivalence[0].tost["ci_low"] > 0.01


def test_interval_straddling_the_margin_is_inconclusive_with_repeats_estimate(tmp_path):
    a = make_run(tmp_path, "a", values={"accuracy": [0.930, 0.945, 0.920]})
    b = make_run(tmp_path, "b", values={"accuracy": [0.925, 0.940, 0.935]})
    verdict = verify_run(a, against=b, margins={"accuracy": 0.01})
    assert _status(verdict) == ("INCONCLUSIVE", 3)
    eq = verdict.equivalence[0]
    assert eq.repeats_needed is not None and eq.repeats_needed > 3
    assert any("repeats" in a for a in verdict.advice)


def test_a_reference_with_one_repeat_is_inconclusive_and_the_advice_names_the_reference(tmp_path):
    run = make_run(tmp_path, "run")  # 3 repeats: enough on the run's side
    ref = make_run(tmp_path, "ref", values={"accuracy": [0.935]})
    verdict = verify_run(run, against=ref)
    assert _status(verdict) == ("INCONCLUSIVE", 3)
    assert any("the reference has 1 repeat(s): rerun it" in a for a in verdict.advice)
    assert not any("run at least 3 repeats" in a for a in verdict.advice)
    short_run = verify_run(make_run(tmp_path, "short", values={"accuracy": [0.935]}), against=run)
    assert any(a.startswith("accuracy: run at least 3 repeats") for a in short_run.advice)


def test_against_a_published_value_one_sample(tmp_path):
    pub = tmp_path / "paper.yaml"
    pub.write_text(
        "schema: repro500/published/v1\nbenchmark: toy\nsource: {citation: 'A. Author, Toy paper, 2026'}\n"
        "metrics:\n  accuracy: {value: 0.935, margin: 0.01, direction: higher}\n"
    )
    close = make_run(tmp_path, "close", values={"accuracy": [0.933, 0.936, 0.935, 0.934]})
    far = make_run(tmp_path, "far", values={"accuracy": [0.900, 0.902, 0.901, 0.899]})
    verdict = verify_run(close, against=pub)
    assert _status(verdict) == ("REPRODUCED", 0)
    assert verdict.equivalence[0].tost["method"] == "one-sample TOST"
    assert verdict.against["source"]["citation"].startswith("A. Author")
    assert _status(verify_run(far, against=pub)) == ("NOT REPRODUCED", 1)


def test_margin_and_reference_errors(tmp_path):
    a = make_run(tmp_path, "a")
    b = make_run(tmp_path, "b", values={"map_50": [0.3, 0.31, 0.32]}, acceptance=None)
    with pytest.raises(InvalidInput, match="does not report 'accuracy'"):
        verify_run(a, against=b)
    with pytest.raises(UsageError, match="'top5'"):
        verify_run(a, against=make_run(tmp_path, "c"), margins={"top5": 0.01})
    with pytest.raises(UsageError, match="needs --against"):
        verify_run(a, margins={"accuracy": 0.01})
    with pytest.raises(InvalidInput, match="does not exist"):
        verify_run(a, against=tmp_path / "missing-ref")


def test_tampered_reference_makes_the_verdict_invalid(tmp_path):
    a = make_run(tmp_path, "a")
    b = make_run(tmp_path, "b")
    edit_json(b / "repeats" / "0" / "summary.json", lambda d: d["metrics"].update(accuracy=0.5))
    verdict = verify_run(a, against=b)
    assert verdict.status == "INVALID"
    assert verdict.reasons[0].startswith("reference: files do not match SHA256SUMS")


def test_provenance_diff_lists_the_differences_with_the_verdict(tmp_path):
    a = make_run(tmp_path, "a")
    b = make_run(tmp_path, "b", manifest=make_manifest(environment={"python": "3.11.7", "packages": {"torch": "2.13.0", "numpy": "2.4.0"}}))
    verdict = verify_run(a, against=b)
    prov = verdict.provenance
    if not prov.available:
        pytest.skip(f"repro500.verify.diff not available: {prov.note}")
    assert prov.total >= 1
    row = prov.top[0]
    assert (row["run"], row["reference"]) == ("2.14.1", "2.13.0")


def test_provenance_diff_uses_the_diff_module_sorted_by_impact(tmp_path, monkeypatch):
    from repro500.verify import compare
    from repro500.verify.diff import Difference, order

    found = [Difference("hardware", "hostname", "x", "y", 1, "host"),
             Difference("environment", "torch", "2.14", "2.13", 100, "framework")]
    monkeypatch.setattr(compare, "compare_reference", lambda run, ref: compare.Comparison(sorted(found, key=order)))
    a, b = make_run(tmp_path, "a"), make_run(tmp_path, "b")
    prov = verify_run(a, against=b).provenance
    assert prov.available and prov.total == 2 and prov.result_relevant == 1
    assert [r["key"] for r in prov.top] == ["torch", "hostname"]


# ----------------------------------------------------------------- determinism


def test_shared_seed_with_identical_digests_passes(tmp_path):
    run = make_run(tmp_path, torch_seeds=[7, 7, 7])
    verdict = verify_run(run)
    assert verdict.determinism.status == "PASS" and verdict.status == "PASS"


def test_divergence_is_located_at_the_first_epoch_and_tensor(tmp_path):
    run = make_run(tmp_path, torch_seeds=[7, 7, 9],
                   diverge={"repeat": 1, "epoch": 2, "tensor": "layer1.0.bn1.weight"})
    verdict = verify_run(run)
    assert _status(verdict) == ("FAIL", 1)
    div = verdict.determinism.divergences[0]
    assert div.repeats == [0, 1]
    assert div.first_epoch == 2 and div.first_tensor == "layer1.0.bn1.weight"
    assert "epoch 2" in verdict.reasons[0] and "layer1.0.bn1.weight" in verdict.reasons[0]


def test_divergence_without_params_jsonl_falls_back_to_epoch_digests(tmp_path):
    run = make_run(tmp_path, torch_seeds=[7, 7, 7], diverge={"repeat": 2, "epoch": 3, "tensor": "fc.weight"})
    for k in range(3):
        (run / "repeats" / str(k) / "params.jsonl").unlink()
    bundle.write_sums(run)
    div = verify_run(run).determinism.divergences[0]
    assert div.first_epoch == 3 and div.first_tensor is None


def _drop_final_digests(run, repeats):
    for k in repeats:
        edit_json(run / "repeats" / str(k) / "summary.json", lambda d: d.update(final_param_digest=None))
        (run / "repeats" / str(k) / "params.jsonl").unlink()
    # the aggregate lists only recorded digests, as the runner writes it
    edit_json(run / "summary.json", lambda d: [d["final_param_digests"].pop(str(k)) for k in repeats])
    bundle.write_sums(run)


def test_shared_seed_without_recorded_digests_is_skipped_not_failed(tmp_path):
    run = make_run(tmp_path, "none", torch_seeds=[7, 7, 7])
    _drop_final_digests(run, [0, 1, 2])
    verdict = verify_run(run)
    d = verdict.determinism
    assert d.status == "SKIPPED" and not d.divergences
    assert "not recorded" in d.reason
    assert _status(verdict) == ("PASS", 0)  # the band decides; a missing digest is no failure
    partly = make_run(tmp_path, "partly", torch_seeds=[7, 7, 7])
    _drop_final_digests(partly, [1])
    d = verify_run(partly).determinism
    assert d.status == "PASS" and d.groups[0]["repeats"] == [0, 2]
    assert any("[1]" in n and "no final_param_digest" in n for n in d.notes)


def test_cross_run_bitwise_identity_is_reported_for_shared_seeds(tmp_path):
    a = make_run(tmp_path, "a")  # same master seed: each repeat shares its seed with the reference's
    b = make_run(tmp_path, "b")
    c = make_run(tmp_path, "c", diverge={"repeat": 1, "epoch": 1, "tensor": "conv1.weight"})
    same = verify_run(a, against=b).determinism.cross_run
    assert [(p["repeat"], p["identical"]) for p in same] == [(0, True), (1, True), (2, True)]
    differs = verify_run(c, against=b).determinism.cross_run
    assert [p["identical"] for p in differs] == [True, False, True]


# ---------------------------------------------------------------- time-to-train


def test_run_converging_suspiciously_fast_is_not_reproduced(tmp_path):
    ref = make_run(tmp_path, "ref", epochs_to_quality=[10, 11, 9, 10, 12])
    fast = make_run(tmp_path, "fast", epochs_to_quality=[5, 5, 6])
    normal = make_run(tmp_path, "normal", epochs_to_quality=[10, 9, 11])
    verdict = verify_run(fast, against=ref)
    assert _status(verdict) == ("NOT REPRODUCED", 1)
    assert "suspiciously fast" in verdict.time_to_train.reason
    assert verify_run(normal, against=ref).time_to_train.status == "PASS"


def test_min_epochs_bound_is_where_mlperfs_pooled_one_sided_test_reaches_alpha():
    ref = [10.0, 11.0, 9.0, 10.0, 12.0]
    bound, _ = timing.min_epochs_bound(ref, 3, 0.05)
    s = sps.tstd(ref)
    p = sps.ttest_ind_from_stats(bound, s, 3, timing._central(ref), s, len(ref), equal_var=True, alternative="less").pvalue
    # t.ppf then t.cdf in double: the statistic's cancellation (8.7 - 10.3 = -1.6: ~6 u) times the
    # tail's condition t pdf / cdf (~2.5), plus scipy's inversion (~1e-14): 1e-9 is headroom
    assert p == pytest.approx(0.05, rel=1e-9)


def test_time_to_quality_uses_the_olympic_mean(tmp_path):
    run = make_run(tmp_path, values={"accuracy": [0.93, 0.94, 0.935, 0.936]},
                   time_to_quality_s=[10.0, 20.0, 30.0, 1000.0])
    t = verify_run(run).time_to_train.time_to_quality_s
    assert t["olympic_mean"] == pytest.approx(25.0)
