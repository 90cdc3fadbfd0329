"""The training variants: precision, micro-batching and sampling bias, on the trainer's own step."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers.runs import repro500, write_recipe

from repro500.errors import InvalidInput
from repro500.workloads.trainer import sampling
from repro500.workloads.trainer.build import Task
from repro500.workloads.trainer.step import Step, check_micro_batch, check_precision


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5)).double()


def _train(micro: int | None, steps: int = 3) -> tuple[list[torch.Tensor], list[float]]:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = Step(Task("classification"), model, opt, torch.device("cpu"), "fp32", micro)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(32, 12, generator=gen, dtype=torch.float64), torch.randint(0, 5, (32,), generator=gen)
        out = step(x, y, 32)
        assert out.get("micro_batches") == (None if micro is None else 32 // micro)
        losses.append(out["loss"])
    return [p.detach().clone() for p in model.parameters()], losses


def test_micro_batched_steps_equal_full_batch_steps_without_batch_dependent_layers():
    full, full_losses = _train(None)
    parts, part_losses = _train(8)
    # float64, summed in another order (4 micro-batch gradients of 8, not one of 32): per step about
    # gamma_32(u64) ~ 4e-15 times the O(1) gradients, over 3 momentum steps with lr 0.1 well under
    # 1e-13; atol 1e-12 is above that on any CPU and far below a lost or doubled micro-batch.
    for a, b in zip(full, parts, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert part_losses == pytest.approx(full_losses, abs=1e-12)  # the recorded loss is the batch mean


def test_amp_bf16_runs_the_forward_pass_under_autocast_and_keeps_fp32_parameters():
    seen = []

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 3)

        def forward(self, x):
            out = self.fc(x)
            seen.append(out.dtype)
            return out

    model = Probe()
    step = Step(Task("classification"), model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"),
                "amp-bf16")
    step(torch.randn(4, 8), torch.tensor([0, 1, 2, 0]), 4)
    assert seen == [torch.bfloat16] and model.fc.weight.dtype == model.fc.weight.grad.dtype == torch.float32


@pytest.mark.parametrize(("call", "words"), [
    (lambda: check_precision("amp-fp16", "cpu"), "amp-fp16 needs a CUDA device"),
    (lambda: check_precision("fp8", "cpu"), "not one of fp32, amp-bf16, amp-fp16"),
    (lambda: check_micro_batch(12, 32), "does not divide mutable.batch_size 32"),
    (lambda: check_micro_batch(0, 32), "at least 1"),
])
def test_variants_a_device_or_batch_cannot_run_are_one_sentence(call, words):
    with pytest.raises(InvalidInput, match=words):
        call()


def test_sampling_record_flags_duplicates_gaps_and_a_biased_draw():
    labels = np.repeat(np.arange(4), 25)  # 100 samples, 4 balanced classes
    whole = sampling.epoch_record(list(range(96)), 100, 32, labels, None, epochs=1)
    assert whole["complete"] and whole["missing"] == whole["expected_missing"] == 4
    assert not whole["balance"]["biased"] and whole["balance"]["p_value"] > 0.9
    padded = sampling.epoch_record([*range(94), 0, 1], 100, 32, labels, None, epochs=1)
    assert not padded["complete"] and padded["duplicated"] == 2 and padded["missing"] == 6
    skewed = sampling.epoch_record([i for i in range(100) if labels[i] < 2] * 2, 100, 32, labels, None, epochs=1)
    assert skewed["balance"]["biased"] and skewed["balance"]["p_value"] < 1e-10
    unknown = sampling.epoch_record(list(range(96)), 100, 32, None, "no labels here", epochs=1)
    assert unknown["balance"] == {"not_measured": "no labels here"} and unknown["complete"]



@pytest.mark.parametrize("drawn", [[25, 25, 25, 21], [40, 30, 20, 6], [0, 1, 90, 5]])
def test_the_class_balance_test_is_pearsons_as_scipy_stats_computes_it(drawn):
    from scipy import stats

    observed = np.array(drawn, dtype=float)
    expected = observed.sum() * np.array([0.25, 0.25, 0.25, 0.25])
    theirs = stats.chisquare(observed, f_exp=expected)
    ours = sampling.pearson_chi2(observed, expected)
    assert ours == pytest.approx((theirs.statistic, theirs.pvalue), rel=64 * np.finfo(float).eps, abs=1e-300)

@pytest.mark.slow  # two runs, verify and a report: about a minute on 2 cores
def test_a_bf16_micro_batched_run_records_its_variant_and_verifies_against_fp32(in_tmp):
    recipe = write_recipe(in_tmp / "tiny.yaml", repeats=2)
    assert repro500("run", str(recipe), "--no-tracking", "--run-id", "fp32", cwd=in_tmp).returncode == 0
    proc = repro500("run", str(recipe), "--no-tracking", "--run-id", "bf16", "--set", "precision=amp-bf16",
                    "--set", "micro_batch_size=8", cwd=in_tmp)
    assert proc.returncode == 0, proc.stderr
    rep = in_tmp / "runs" / "bf16" / "repeats" / "0"
    summary = json.loads((rep / "summary.json").read_text())
    assert summary["training"] == {"precision": "amp-bf16", "micro_batch_size": 8, "batch_size": 32,
                                   "sync": {"mode": "allreduce", "every": 1}}
    assert summary["sampling"]["incomplete_epochs"] == [] and summary["sampling"]["biased_epochs"] == []
    steps = [json.loads(line) for line in (rep / "metrics.jsonl").read_text().splitlines()]
    assert {s["micro_batches"] for s in steps if s["kind"] == "step"} == {4}
    epoch = next(s for s in steps if s["kind"] == "epoch")
    assert epoch["sampling"]["drawn"] == 256 and epoch["sampling"]["balance"]["dataset_histogram"] == [26] * 6 + [25] * 4
    assert '"gradient_accumulation_steps", "value": 4' in (rep / "mllog.txt").read_text()
    verdict = repro500("verify", "runs/bf16", "--against", "runs/fp32", "--margin", "accuracy=0.5", "--json", cwd=in_tmp)
    doc = json.loads(verdict.stdout)
    gains = doc["gains"]
    assert gains["run_variant"]["precision"] == "amp-bf16" and gains["reference_variant"]["precision"] == "fp32"
    ratio = gains["figures"]["throughput_samples_per_s"]
    assert ratio["ratio"] == pytest.approx(ratio["run"] / ratio["reference"])
    assert doc["sampling"]["status"] == "OK" and doc["equivalence"][0]["metric"] == "accuracy"
    shown = repro500("verify", "runs/bf16", "--against", "runs/fp32", "--margin", "accuracy=0.5", cwd=in_tmp).stdout
    assert "precision amp-bf16 vs fp32" in " ".join(shown.split())
    assert "micro_batch_size 8 vs none (whole batches)" in " ".join(shown.split())
    report = repro500("report", "runs/bf16", "--against", "runs/fp32", "--margin", "accuracy=0.5", cwd=in_tmp)
    assert report.returncode == 0, report.stderr
    page = (in_tmp / "runs" / "bf16" / "report.html").read_text()
    section = page[page.index('id="variants"'):]
    section = section[:section.index("</section>")]
    assert "amp-bf16" in section and "fp32" in section and 'alt="classes drawn vs the data set"' in section


def test_against_the_reference_names_every_variant_that_differs():
    from repro500.verify.gains import describe

    whole = {"precision": "fp32", "micro_batch_size": None, "batch_size": 32, "sync": {"mode": "allreduce", "every": 1}}
    line = describe({"figures": {}, "run_variant": {**whole, "micro_batch_size": 8}, "reference_variant": whole})
    assert line == "; micro_batch_size 8 vs none (whole batches)"
    legacy = {**whole, "batch_size": None}  # a reference that did not record its batch size: not a difference
    assert describe({"figures": {}, "run_variant": whole, "reference_variant": legacy}) == ""


@pytest.mark.parametrize(("override", "code", "words"), [
    ("precision=amp-fp16", 4, "amp-fp16 needs a CUDA device"),
    ("micro_batch_size=12", 4, "does not divide mutable.batch_size 32"),
])
def test_a_variant_the_machine_cannot_run_is_refused_before_anything_is_written(in_tmp, override, code, words):
    recipe = write_recipe(in_tmp / "tiny.yaml")
    proc = repro500("run", str(recipe), "--no-tracking", "--set", override, cwd=in_tmp)
    assert proc.returncode == code, proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (in_tmp / "runs").exists() or not any((in_tmp / "runs").iterdir())


@pytest.mark.parametrize("name", ["bf16", "microbatch", "localsgd", "gossip"])
def test_each_variant_has_a_cpu_sized_recipe_that_passes_its_checks(name):
    from pathlib import Path

    from repro500.recipe import load as recipes
    from repro500.runner.plan import check_sync, check_variants

    root = Path(__file__).resolve().parents[1]
    recipe = recipes.load(str(root / "experiments" / f"quickstart_{name}.yaml"))
    mutable = recipe.mutable
    assert mutable["device"] == "cpu"
    check_variants(mutable, mutable["engine"], "cpu")
    check_sync(mutable["sync"], mutable["engine"], int(mutable.get("nproc", 1)), "none")
    changed = {"bf16": mutable["precision"] == "amp-bf16", "microbatch": mutable["micro_batch_size"] == 16,
               "localsgd": mutable["sync"]["mode"] == "average", "gossip": mutable["sync"]["mode"] == "gossip"}
    assert changed[name]
