"""`repro500 verify / pack / unpack` from the command line: exit codes, one-line errors, --json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.rundirs import edit_json, make_run
from helpers.runs import invoke


def _one_line_error(result) -> str:
    text = result.output.strip()
    assert "Traceback" not in text
    return text


@pytest.fixture
def runs(tmp_path):
    return {
        "pass": make_run(tmp_path, "pass"),
        "fail": make_run(tmp_path, "fail", values={"accuracy": [0.70, 0.71, 0.72]}),
        "inconclusive": make_run(tmp_path, "inconclusive", values={"accuracy": [0.95]}),
        "ref_far": make_run(tmp_path, "ref_far", values={"accuracy": [0.80, 0.801, 0.799]}),
    }


def test_exit_codes_follow_the_contract(runs):
    assert invoke("verify", runs["pass"]).exit_code == 0
    assert invoke("verify", runs["fail"]).exit_code == 1
    assert invoke("verify", runs["inconclusive"]).exit_code == 3
    assert invoke("verify", runs["pass"], "--against", runs["pass"]).exit_code == 0
    assert invoke("verify", runs["pass"], "--against", runs["ref_far"]).exit_code == 1
    edit_json(runs["pass"] / "repeats" / "0" / "summary.json", lambda d: d["metrics"].update(accuracy=0.9))
    tampered = invoke("verify", runs["pass"])
    assert tampered.exit_code == 4
    assert "INVALID" in tampered.output and "repeats/0/summary.json" in tampered.output


def test_summary_shows_status_and_writes_verdict_json(runs):
    result = invoke("verify", runs["pass"])
    assert "PASS" in result.output and "Bands" in result.output
    doc = json.loads((runs["pass"] / "verdict.json").read_text())
    assert doc["status"] == "PASS"
    assert not (runs["fail"] / "verdict.json").exists()
    invoke("verify", runs["fail"], "--no-write")
    assert not (runs["fail"] / "verdict.json").exists()


def test_json_prints_the_verdict_document(runs):
    result = invoke("verify", runs["inconclusive"], "--json")
    doc = json.loads(result.output)
    assert doc["schema"] == "repro500/verdict/v1" and doc["status"] == "INCONCLUSIVE" and doc["exit_code"] == 3


@pytest.mark.parametrize("args, code, text", [
    (["--margin", "accuracy"], 2, "METRIC=DELTA"),
    (["--margin", "accuracy=-1"], 2, "> 0"),
    (["--margin", "accuracy=abc"], 2, "not a number"),
    (["--alpha", "0.7"], 2, "alpha"),
])
def test_bad_options_are_usage_errors(runs, args, code, text):
    result = invoke("verify", runs["pass"], "--against", runs["pass"], *args)
    assert result.exit_code == code
    assert text in result.output


def test_user_errors_are_one_line_with_their_code(runs, tmp_path):
    missing = invoke("verify", tmp_path / "nope")
    assert missing.exit_code == 4
    assert _one_line_error(missing).startswith("repro500: error:") and "nope" in missing.output
    unknown = invoke("verify", runs["pass"], "--against", runs["pass"], "--margin", "top5=0.1")
    assert unknown.exit_code == 2
    assert _one_line_error(unknown) .startswith("repro500: error: --margin names 'top5'")
    no_ref = invoke("verify", runs["pass"], "--margin", "accuracy=0.1")
    assert no_ref.exit_code == 2


def test_pack_unpack_verify_round_trip_and_truncation(runs, tmp_path):
    archive = tmp_path / "pass.tar.gz"
    packed = invoke("pack", runs["pass"], "-o", archive)
    assert packed.exit_code == 0, packed.output
    assert "archive sha256:" in packed.output and "SHA256SUMS sha256:" in packed.output
    unpacked = invoke("unpack", archive, "--dest", tmp_path / "elsewhere")
    assert unpacked.exit_code == 0, unpacked.output
    assert "files match SHA256SUMS" in unpacked.output
    assert invoke("verify", tmp_path / "elsewhere" / "pass").exit_code == 0
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(archive.read_bytes()[:400])
    result = invoke("unpack", truncated, "--dest", tmp_path / "other")
    assert result.exit_code == 4 and "corrupt or truncated" in _one_line_error(result)
    assert invoke("verify", runs["pass"], "--against", truncated).exit_code == 4


def _rewrite_member(archive: Path, name: str, edit) -> None:
    """Rebuild ``archive`` with ``edit(bytes) -> bytes`` applied to one member (a forger's repack)."""
    import io
    import tarfile

    with tarfile.open(archive, "r:gz") as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]
    assert name in [m.name for m, _ in members]
    with tarfile.open(archive, "w:gz") as tar:
        for member, data in members:
            if member.name == name:
                data = edit(data)
                member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if data is not None else None)


def test_one_number_changed_inside_a_packed_bundle_is_invalid(runs, tmp_path):
    archive = tmp_path / "pass.tar.gz"
    assert invoke("pack", runs["pass"], "-o", archive).exit_code == 0
    assert invoke("verify", archive).exit_code == 0

    def lift_accuracy(data: bytes) -> bytes:
        doc = json.loads(data)
        assert doc["metrics"]["accuracy"] == 0.93
        doc["metrics"]["accuracy"] = 0.99
        return json.dumps(doc, indent=2).encode()

    _rewrite_member(archive, "pass/repeats/0/summary.json", lift_accuracy)
    result = invoke("verify", archive)
    assert result.exit_code == 4, result.output
    assert "INVALID" in result.output and "repeats/0/summary.json" in result.output
    assert "Traceback" not in result.output
    as_reference = invoke("verify", runs["pass"], "--against", archive, "--json")
    assert as_reference.exit_code == 4
    assert any("repeats/0/summary.json" in r for r in json.loads(as_reference.output)["reasons"])


def test_expect_sums_detects_a_rewritten_bundle(runs):
    good = (runs["pass"] / "SHA256SUMS").read_bytes()
    import hashlib

    digest = hashlib.sha256(good).hexdigest()
    assert invoke("verify", runs["pass"], "--expect-sums", digest).exit_code == 0
    assert invoke("verify", runs["pass"], "--expect-sums", "0" * 64).exit_code == 4


def _console_script() -> list[str]:
    script = Path(sys.executable).parent / "repro500"
    return [str(script)] if script.exists() else [sys.executable, "-m", "repro500.cli"]


def test_real_subprocess_exit_codes_and_json(runs):
    ok = subprocess.run([*_console_script(), "verify", str(runs["pass"]), "--json"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["status"] == "PASS"
    inconclusive = subprocess.run([*_console_script(), "verify", str(runs["inconclusive"])],
                                  capture_output=True, text=True, timeout=120)
    assert inconclusive.returncode == 3
    assert "INCONCLUSIVE" in inconclusive.stdout and "at least 3 repeats" in inconclusive.stdout
    (runs["fail"] / "SHA256SUMS").unlink()
    broken = subprocess.run([*_console_script(), "verify", str(runs["fail"])],
                            capture_output=True, text=True, timeout=120)
    assert broken.returncode == 4
    assert broken.stderr.strip().count("\n") == 0 and "SHA256SUMS is missing" in broken.stderr
    assert "Traceback" not in broken.stderr


@pytest.mark.slow
@pytest.mark.heavy
def test_verify_passes_on_a_real_quickstart_run(tmp_path):
    """The run issue's quickstart, run for real, verifies (and still does after pack/unpack)."""
    recipe = Path(__file__).resolve().parent.parent / "experiments" / "quickstart.yaml"
    for split, n in (("train", "2048"), ("eval", "512")):  # the data make demo generates
        made = subprocess.run([*_console_script(), "data", "generate", "classification", "--out",
                               f"data/quickstart-{split}.h5", "--samples", n, "--seed", "500", "--noise", "0.04",
                               "--split", split], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert made.returncode == 0, made.stderr
    env_cmd = [*_console_script(), "run", str(recipe), "--no-tracking", "--run-id", "qs", "--out", str(tmp_path / "runs")]
    ran = subprocess.run(env_cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert ran.returncode in (0, 1, 3), ran.stderr[-2000:]
    run_dir = tmp_path / "runs" / "qs"
    verdict = subprocess.run([*_console_script(), "verify", str(run_dir), "--json"],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert verdict.returncode == 0, verdict.stdout[-3000:] + verdict.stderr[-2000:]
    assert json.loads(verdict.stdout)["status"] == "PASS"
    archive = tmp_path / "qs.tar.gz"
    assert subprocess.run([*_console_script(), "pack", str(run_dir), "-o", str(archive)], timeout=120).returncode == 0
    again = subprocess.run([*_console_script(), "verify", str(archive)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout[-2000:]


def test_the_statistics_fit_an_80_column_terminal_without_wrapping_a_cell():
    """at 80 columns the single statistics table wrapped its median interval mid-cell."""
    from rich.console import Console

    from repro500.verify.render import _statistics
    from repro500.verify.verdict import Verdict

    verdict = Verdict(run_dir="runs/x", status="PASS", alpha=0.05)
    verdict.statistics = {
        name: {"n": 12, "mean": mean, "std": mean / 30, "cv": 1 / 30, "ci_low": mean * 0.98, "ci_high": mean * 1.02,
               "median": mean, "median_ci_low": mean * 0.97, "median_ci_high": mean * 1.03,
               "median_ci_confidence": 0.961}
        for name, mean in (("accuracy", 0.9351234), ("valid_flops", 1.234567e12),
                           ("throughput_samples_per_s", 18765.4321))}  # no band decides: every metric is shown
    console = Console(width=80, record=True, color_system=None)
    _statistics(verdict, console)
    lines = console.export_text().splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines)
    for name in ("accuracy", "valid_flops", "throughput_samples_per_s"):  # one line each, in both tables
        rows = [line for line in lines if line.startswith(name + " ")]
        assert len(rows) == 2 and all(line.count("[") == 1 and line.count("]") == 1 for line in rows), rows


def test_the_command_is_one_call_of_repro500_verify_judge(runs, tmp_path):
    """What `verify` decides and writes is reachable from Python, and gives the command's verdict."""
    from repro500.verify.judge import judge

    shown = json.loads(invoke("verify", runs["fail"], "--json", "--no-write").output)
    metrics = tmp_path / "metrics.json"
    verdict = judge(runs["fail"], metrics_path=metrics)
    assert (verdict.status, verdict.exit_code, verdict.reasons) == (shown["status"], shown["exit_code"], shown["reasons"])
    assert json.loads((runs["fail"] / "verdict.json").read_text())["status"] == verdict.status
    assert json.loads(metrics.read_text())
    # a verdict.json that cannot be written is a sentence, not a failure (a directory stands in its way)
    (runs["pass"] / "verdict.json").mkdir()
    said: list[str] = []
    assert judge(runs["pass"], warn=said.append).exit_code == 0
    assert len(said) == 1 and said[0].startswith(f"could not write {runs['pass'] / 'verdict.json'} ("), said
