"""The official MLPerf compliance checker (``mlperf_logging.compliance_checker``) run on a
repro500 log: which benchmark a log says it is, and whether the checker accepts it under the
ruleset that benchmark is judged by (:mod:`repro500.workloads.mlperf` writes the logs)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from repro500.errors import InvalidInput, UsageError
from repro500.workloads.mlperf import BENCHMARKS


@dataclass(frozen=True)
class ComplianceResult:
    passed: bool
    benchmark: str
    usage: str
    ruleset: str
    output: str  # the checker's own report (its log file), for people to read


def logged_benchmark(path: str | Path) -> str:
    """The ``submission_benchmark`` value recorded in an MLPerf log."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as err:
        raise InvalidInput(f"cannot read MLPerf log {path}: {err.strerror or err}.") from None
    for line in lines:
        if line.startswith(":::MLLOG ") and '"submission_benchmark"' in line:
            try:
                record = json.loads(line[len(":::MLLOG ") :])
            except json.JSONDecodeError:
                continue
            if record.get("key") == "submission_benchmark":
                return str(record.get("value"))
    raise InvalidInput(f"MLPerf log {path} has no submission_benchmark line; is it an MLLOG file?")


def check_compliance(
    path: str | Path,
    benchmark: str | None = None,
    *,
    usage: str | None = None,
    ruleset: str | None = None,
    timeout_s: float = 120.0,
) -> ComplianceResult:
    """Run ``python -m mlperf_logging.compliance_checker`` on the log at ``path``.

    The rules are chosen from ``benchmark`` (read from the log when not given): resnet ->
    training 4.0.0, cosmoflow -> hpc 3.0.0; ``usage``/``ruleset`` override them.  The checker
    runs in a subprocess because it keeps its rule queue in module globals.
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(
            f"MLPerf log {path} does not exist; pass the mllog.txt of a finished repeat."
        )
    benchmark = benchmark or logged_benchmark(path)
    rules = BENCHMARKS.get(benchmark)
    usage = usage or (rules.usage if rules else None)
    ruleset = ruleset or (rules.ruleset if rules else None)
    if usage is None or ruleset is None:
        raise UsageError(
            f"MLPerf has no compliance rules for benchmark {benchmark!r}; pass usage and ruleset explicitly."
        )
    with tempfile.TemporaryDirectory(prefix="repro500-mlperf-") as tmp:
        report = Path(tmp) / "compliance.log"
        command = [
            sys.executable, "-m", "mlperf_logging.compliance_checker", str(path.resolve()),
            "--usage", usage, "--ruleset", ruleset, "--log_output", str(report),
        ]  # fmt: skip
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, cwd=tmp, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            raise InvalidInput(
                f"the MLPerf compliance checker did not finish within {timeout_s:.0f} s on {path}."
            ) from None
        output = report.read_text(encoding="utf-8", errors="replace") if report.exists() else ""
    output = output or (done.stdout + done.stderr)
    return ComplianceResult(
        passed=done.returncode == 0,
        benchmark=benchmark,
        usage=usage,
        ruleset=ruleset,
        output=output,
    )
