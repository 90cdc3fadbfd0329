"""`repro500 export mlperf`: a real run's MLPerf logs as a submission tree that MLPerf's own
package_checker and result_summarizer accept (run as their modules, as submitters run them)."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers.runs import write_recipe

from repro500 import cli
from repro500.data.generate import generate
from repro500.errors import EXIT_FAIL, EXIT_INVALID, EXIT_OK, EXIT_USAGE, InvalidInput, UsageError
from repro500.rundir import archive as archives
from repro500.rundir import sums as bundle
from repro500.runner import RunOptions, run
from repro500.verify.vouching import export_mlperf

SMALL_DATA = {"train_samples": 64, "eval_samples": 32, "size": "16x16", "noise": 0.04, "seed": 3}
REQUIRED_SYSTEM_FIELDS = ("submitter", "division", "status", "system_name", "number_of_nodes",
                          "host_processor_model_name", "host_processor_core_count", "accelerators_per_node",
                          "accelerator_model_name", "framework", "operating_system", "hw_notes", "sw_notes")


def _tiny_run(where: Path, name: str, *, repeats: int, open_division: bool, open_target: float = 0.999,
              **changes: object) -> Path:
    recipe = write_recipe(where / f"{name}.yaml", repeats=repeats, fixed__epochs=1, **changes)
    options = RunOptions(recipe=str(recipe), tracking=False, run_id=name, out_dir=str(where / "runs"))
    if open_division:  # a fixed key overridden: the run is in the open division
        options.open_division, options.overrides = True, [f"fixed.target.value={open_target}"]
    outcome = run(options)
    assert (outcome.run_dir / "repeats/0/mllog.txt").is_file()
    return outcome.run_dir


@pytest.fixture(scope="module")
def open_run(tmp_path_factory) -> Path:
    """Two repeats of a tiny ResNet run with a fixed key overridden (open division); ~4 s."""
    return _tiny_run(tmp_path_factory.mktemp("open"), "open2", repeats=2, open_division=True,
                     fixed__dataset__params=SMALL_DATA)


def _export(*args: str):
    return CliRunner().invoke(cli.cli, ["export", "mlperf", *args])


def test_tree_has_the_system_from_the_manifest_and_one_result_per_repeat(open_run, tmp_path):
    lines: list[str] = []
    tree = export_mlperf(open_run, tmp_path / "sub", progress=lines.append)
    manifest = json.loads((open_run / "manifest.json").read_text())
    cpu = manifest["facets"]["hardware"]["cpu"]
    assert (tree.benchmark, tree.usage, tree.ruleset, tree.division) == ("resnet", "training", "4.0.0", "open")
    desc = json.loads((tmp_path / "sub" / "systems" / f"{tree.system}.json").read_text())
    assert all(isinstance(desc[key], str) for key in REQUIRED_SYSTEM_FIELDS)
    assert desc["division"] == "open" and desc["system_name"] == tree.system and desc["submitter"] == "repro500"
    assert desc["host_processor_model_name"] == cpu["model"]
    assert desc["host_processor_vcpu_count"] == str(cpu["threads"])
    assert desc["accelerators_per_node"] == "0" and desc["accelerator_model_name"] == ""
    assert manifest["digest"]["value"] in desc["hw_notes"]
    assert desc["framework"] == f"PyTorch {manifest['facets']['environment']['torch_build']['version']}"
    results = sorted((tmp_path / "sub" / "results" / tree.system / "resnet").iterdir())
    assert [p.name for p in results] == ["result_0.txt", "result_1.txt"]
    for k, result in enumerate(results):
        original = (open_run / "repeats" / str(k) / "mllog.txt").read_text().splitlines()
        exported = result.read_text().splitlines()
        changed = [(a, b) for a, b in zip(original, exported, strict=True) if a != b]
        # the one line export changes: the division the package claims, here the log's own
        assert changed == [] and '"submission_division", "value": "open"' in "".join(exported)
    note = json.loads((tmp_path / "sub" / "repro500-export.json").read_text())
    assert note["run_id"] == "open2" and note["results"][str(tree.results[1])] == "repeats/1/mllog.txt"
    assert any(line.startswith("division open") for line in lines) and lines[-1] == f"wrote {tmp_path / 'sub'}"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_a_packed_run_exports_the_same_results(open_run, tmp_path):
    archive = archives.pack(open_run, tmp_path / "open2.tar.gz")
    result = _export(str(archive), "--out", str(tmp_path / "sub"), "--no-check")
    assert result.exit_code == EXIT_OK, result.output
    exported = sorted((tmp_path / "sub" / "results").glob("*/resnet/result_*.txt"))
    assert [p.name for p in exported] == ["result_0.txt", "result_1.txt"]
    original = (open_run / "repeats/1/mllog.txt").read_text()
    assert exported[1].read_text() == original  # an open run's log already says open


def test_bad_input_is_one_sentence_and_writes_nothing(open_run, tmp_path):
    out = tmp_path / "out"
    result = _export(str(tmp_path), "--out", str(out), "--no-check")
    assert result.exit_code == EXIT_INVALID
    assert result.output.strip().endswith("is not a repro500 run directory (no run.json): give runs/<run-id>")

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    result = _export(str(open_run), "--out", str(tmp_path / "full"), "--no-check")
    assert result.exit_code == EXIT_INVALID and "is not empty" in result.output
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]

    result = _export(str(open_run), "--out", str(out), "--ruleset", "4.1.0")
    assert result.exit_code == EXIT_USAGE
    assert "MLPerf training 4.1.0 holds no resnet rules: use training ruleset 4.0.0" in result.output
    assert "Traceback" not in result.output

    no_logs = tmp_path / "command-run"
    shutil.copytree(open_run, no_logs)
    for log in no_logs.glob("repeats/*/mllog.txt"):
        log.unlink()
    bundle.write_sums(no_logs)  # as a command workload's run is sealed: nothing missing, no logs
    result = _export(str(no_logs), "--out", str(out))
    assert result.exit_code == EXIT_INVALID and "has no MLPerf logs of finished repeats" in result.output

    tampered = tmp_path / "tampered"
    shutil.copytree(open_run, tampered)
    log = tampered / "repeats/1/mllog.txt"
    log.write_text(log.read_text().replace('"value": 64', '"value": 640'))
    result = _export(str(tampered), "--out", str(out))
    assert result.exit_code == EXIT_INVALID
    assert "files do not match SHA256SUMS (edited: repeats/1/mllog.txt)" in result.output
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_a_tampered_run_is_refused_from_python_as_by_the_command(open_run, tmp_path):
    """The Python entry point asks verify's gate too, for a run directory and for a packed one."""
    import tarfile

    tampered = tmp_path / "tampered"
    shutil.copytree(open_run, tampered)
    log = tampered / "repeats/0/mllog.txt"
    log.write_text(log.read_text().replace('"value": 64', '"value": 640'))
    archive = tmp_path / "tampered.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:  # written directly: repro500 pack refuses it
        tar.add(tampered, arcname=tampered.name)
    out = tmp_path / "sub"
    for given in (tampered, archive):
        with pytest.raises(InvalidInput, match=r"would not verify \(files do not match SHA256SUMS \(edited: "
                                               r"repeats/0/mllog.txt\)\): only an untouched run can be exported"):
            export_mlperf(given, out)
        assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_a_failure_half_way_leaves_no_tree(open_run, tmp_path, monkeypatch):
    from repro500.rundir import atomic

    written: list[Path] = []
    real_write = atomic.write_text

    def disk_full_at_the_first_result(path, text):
        written.append(Path(path))
        if [p.name for p in written].count("result_0.txt"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_write(path, text)

    monkeypatch.setattr(atomic, "write_text", disk_full_at_the_first_result)
    with pytest.raises(InvalidInput, match="no space left"):
        export_mlperf(open_run, tmp_path / "sub")
    assert "result_1.txt" not in [p.name for p in written]
    assert list(tmp_path.iterdir()) == []


def test_compliance_checker_is_not_asked_for_a_ruleset_without_the_benchmark(open_run):
    from repro500.mlperf.check import check_compliance

    with pytest.raises(UsageError, match=r"MLPerf training 5\.0\.0 holds no resnet rules: use training ruleset 4\.0\.0"):
        check_compliance(open_run / "repeats/0/mllog.txt", usage="training", ruleset="5.0.0")
    with pytest.raises(UsageError, match="use hpc ruleset 3.0.0"):
        check_compliance(open_run / "repeats/0/mllog.txt", benchmark="cosmoflow", usage="hpc", ruleset="9.9.9")


def test_a_crashing_compliance_checker_is_its_last_line_not_its_traceback(open_run, monkeypatch):
    from repro500.mlperf import check as mlperf_check

    # let the ruleset without ResNet rules through, as an older repro500 did: the checker crashes
    monkeypatch.setattr(mlperf_check, "resolve_rules", lambda benchmark, usage, ruleset: ("training", "4.1.0"))
    with pytest.raises(InvalidInput) as caught:
        mlperf_check.check_compliance(open_run / "repeats/0/mllog.txt")
    message = str(caught.value)
    assert "the MLPerf compliance checker crashed on" in message and "(training 4.1.0): FileNotFoundError" in message
    assert "Traceback" not in message and "\n" not in message


# ----------------------------------------------------------- MLPerf's tools on the exported tree
def _tool(module: str, *args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", f"mlperf_logging.{module}", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)
    return done.stdout + done.stderr


@pytest.mark.slow
def test_open_run_is_accepted_by_package_checker_and_result_summarizer(tmp_path):
    # a target the one epoch reaches: every run_stop says success, so there is a time to train
    run_dir = _tiny_run(tmp_path, "open5", repeats=5, open_division=True, open_target=0.05,
                        fixed__dataset__params=SMALL_DATA)
    out = tmp_path / "repro500"
    result = _export(str(run_dir), "--out", str(out))
    assert result.exit_code == EXIT_OK, result.output
    assert "package_checker (training 4.0.0): PACKAGE CHECKER FOUND NO ERRORS, SUCCESS !" in result.stdout
    assert "result_summarizer (training 4.0.0): resnet " in result.stdout
    assert "min (time to train, olympic mean of 5 results, open division)" in result.stdout
    assert "rcp_checker (training 4.0.0): not run, no RCP for batch size 32" in result.stdout
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    # MLPerf's tools themselves, on the delivered tree, as a submitter runs them
    work = tmp_path / "work"
    work.mkdir()
    report = _tool("package_checker", str(out), "training", "4.0.0", "--log_output", "pc.log", cwd=work)
    assert "PACKAGE CHECKER FOUND NO ERRORS, SUCCESS" in report, report[-2000:]
    _tool("result_summarizer", str(out), "training", "4.0.0", "--csv", str(work / "s.csv"), cwd=work)
    rows = json.loads((work / "s.json").read_text())
    assert len(rows) == 1 and rows[0]["division"] == "open" and rows[0]["resnet"] > 0
    assert before == sorted(p.relative_to(out) for p in out.rglob("*"))


@pytest.mark.slow
def test_closed_run_gets_the_closed_rules_and_the_rcp_checker(tmp_path):
    # MLPerf's ResNet RCPs start at batch size 1632; the target is met in the one epoch, so
    # every run converged and the RCP checker compares epochs (far too fast: it fails).
    data = {**SMALL_DATA, "train_samples": 1632, "size": "8x8"}
    run_dir = _tiny_run(tmp_path, "closed5", repeats=5, open_division=False, fixed__dataset__params=data,
                        fixed__target__value=0.05, mutable__batch_size=1632, fixed__mlperf_division="closed")
    out = tmp_path / "repro500"
    result = _export(str(run_dir), "--out", str(out))
    assert result.exit_code == EXIT_FAIL, result.output
    tree = json.loads((out / "repro500-export.json").read_text())
    assert tree["division"] == "closed" and "declares fixed.mlperf_division: closed" in tree["division_reason"]
    for log in out.glob("results/*/resnet/result_*.txt"):
        assert '"submission_division", "value": "closed"' in log.read_text()
    assert "package_checker (training 4.0.0): PACKAGE CHECKER FOUND ERRORS" in result.stdout
    # the closed ResNet rules (75.9% accuracy, MLPerf's hyperparameters) reject every log
    assert "FOUND ERRORS: 5 files do not comply, directory cannot be accepted" in result.stdout
    assert "rcp_checker (training 4.0.0): RCP found, RCP test FAILED" in result.stdout
    assert "(batch size 1632, submission mean epochs 1.0000)" in result.stdout
    assert "not accepted by package_checker and result_summarizer" in result.stderr


@pytest.mark.slow
def test_runs_that_never_reached_their_target_have_no_time_to_train(tmp_path):
    # an overridden target (0.999) out of one epoch's reach: every run_stop is aborted, and MLPerf's
    # summarizer would still time the five runs
    run_dir = _tiny_run(tmp_path, "short5", repeats=5, open_division=True, fixed__dataset__params=SMALL_DATA)
    assert all('"status": "aborted"' in (run_dir / f"repeats/{k}/mllog.txt").read_text() for k in range(5))
    result = _export(str(run_dir), "--out", str(tmp_path / "sub"))
    assert result.exit_code == EXIT_FAIL, result.output
    assert "5 of 5 runs did not reach the target" in result.stdout and "min (time to train" not in result.stdout


def test_a_recipe_that_declares_no_division_logs_and_exports_the_same_one(tmp_path):
    run_dir = _tiny_run(tmp_path, "plain", repeats=1, open_division=False, fixed__dataset__params=SMALL_DATA)
    log = (run_dir / "repeats/0/mllog.txt").read_text()
    tree = export_mlperf(run_dir, tmp_path / "sub")
    # what verify's compliance check judged is what the export labels: not relabelled closed
    assert tree.division == "open" and '"submission_division", "value": "open"' in log


def test_a_recipe_that_declares_the_open_division_exports_open_when_run_as_it_is(tmp_path):
    run_dir = _tiny_run(tmp_path, "declared", repeats=1, open_division=False, fixed__dataset__params=SMALL_DATA,
                        fixed__mlperf_division="open", mutable__optimizer={"name": "adam", "lr": 0.01})
    assert json.loads((run_dir / "run.json").read_text())["open_division"] is False  # nothing was overridden
    log = (run_dir / "repeats/0/mllog.txt").read_text()
    # the log says what the recipe declares, and records no SGD momentum Adam never used
    assert '"submission_division", "value": "open"' in log and "opt_momentum" not in log
    tree = export_mlperf(run_dir, tmp_path / "sub")
    assert tree.division == "open"
    note = json.loads((tmp_path / "sub/repro500-export.json").read_text())
    assert note["division_reason"].startswith("its recipe declares fixed.mlperf_division: open")
    with pytest.raises(InvalidInput, match="mlperf_division"):
        _tiny_run(tmp_path, "bad", repeats=1, open_division=False, fixed__mlperf_division="half-open")


@pytest.mark.slow
def test_cosmoflow_goes_under_strong_scaling_and_only_mlperf_hpc_quality_is_missing(tmp_path, monkeypatch):
    """Ten repeats (HPC's count) of experiments/cosmoflow_cpu.yaml shrunk to tiny universes."""
    monkeypatch.chdir(tmp_path)
    generate("cosmo", tmp_path / "cosmo.h5", samples=8, size="8", seed=2)
    generate("cosmo", tmp_path / "cosmo-eval.h5", samples=4, size="8", seed=2, split="eval")
    recipe = yaml.safe_load((Path(__file__).parents[1] / "experiments/cosmoflow_cpu.yaml").read_text())
    recipe["fixed"].update(
        model_options={"crop_size": 8, "base_channels": 2, "depth": 1, "fc1_size": 8, "fc2_size": 4},
        dataset={"name": "cosmo", "path": "cosmo.h5", "eval_path": "cosmo-eval.h5", "params": {"crop": 8}},
        epochs=1,
    )
    recipe["mutable"].update(batch_size=4, eval_batch_size=4, threads=1)
    recipe["repeats"] = 10
    options = RunOptions(recipe=str(write_recipe(tmp_path / "cosmo.yaml", recipe)), tracking=False,
                         run_id="cosmo10", open_division=True, overrides=["fixed.target.value=0.5"])
    run_dir = run(options).run_dir
    result = _export(str(run_dir), "--out", str(tmp_path / "repro500"))
    assert result.exit_code == EXIT_FAIL, result.output
    assert "(open division, hpc 3.0.0)" in result.stdout
    results = sorted(p.name for p in (tmp_path / "repro500/results").glob("*/strong/cosmoflow/result_*.txt"))
    assert len(results) == 10
    checker = next(line for line in result.stdout.splitlines() if line.startswith("package_checker (hpc 3.0.0):"))
    # every key and the layout pass; one epoch of a tiny model is far from MLPerf's MAE 0.124
    assert checker == ("package_checker (hpc 3.0.0): PACKAGE CHECKER FOUND ERRORS: 10 files do not comply, directory cannot "
                       "be accepted; Failed checks for eval_error : v['value'] <= 0.124 and v['value'] > 0."), checker
    assert "rcp_checker (hpc 3.0.0): not run, no RCP for batch size 4 (cosmoflow RCPs cover batch sizes 32 to 1024)" \
        in result.stdout


def test_the_report_shows_what_mlperfs_checker_said_of_each_repeat(open_run, tmp_path):
    from repro500.verify.verdict import verify_run, write_verdict

    verdict = verify_run(open_run)
    assert verdict.mlperf.status == "OK" and verdict.mlperf.ruleset == "4.0.0"
    copy = tmp_path / "run"
    shutil.copytree(open_run, copy)  # the module's run stays as the other tests expect it
    write_verdict(verdict, copy)
    done = CliRunner().invoke(cli.cli, ["report", str(copy), "--out", str(tmp_path / "r.html")])
    assert done.exit_code == 0, done.output
    html = (tmp_path / "r.html").read_text()
    assert ("<h3>MLPerf compliance</h3><p><span class=\"badge muted\">OK</span> all 2 repeat log(s) pass MLPerf "
            "training 4.0.0 (resnet)&#39;s compliance checker</p>") in html
    assert html.count('<td class="nw">yes</td>') >= 2  # each repeat's log accepted
