"""The official MLPerf compliance checker (``mlperf_logging.compliance_checker``) run on a
repro500 log: which benchmark a log says it is, and whether the checker accepts it under the
ruleset that benchmark is judged by (:mod:`repro500.mlperf.logger` writes the logs)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from repro500.errors import InvalidInput, UsageError
from repro500.mlperf.logger import BENCHMARKS


@dataclass(frozen=True)
class ComplianceResult:
    passed: bool
    benchmark: str
    usage: str
    ruleset: str
    output: str  # the checker's own report (its log file), for people to read


def _rules_root() -> Path:
    import mlperf_logging.compliance_checker as checker

    return Path(checker.__file__).parent


def _version_key(ruleset: str) -> tuple[int, ...]:
    return tuple(int(part) for part in ruleset.split("."))


def rulesets_with(usage: str, benchmark: str) -> list[str]:
    """The rulesets of the installed mlperf-logging that hold rules for ``benchmark``, oldest first."""
    found = []
    for folder in _rules_root().glob(f"{usage}_*"):
        ruleset = folder.name.split("_", 1)[1]
        if re.fullmatch(r"\d+\.\d+\.\d+", ruleset) and (folder / f"open_{benchmark}.yaml").is_file():
            found.append(ruleset)
    return sorted(found, key=_version_key)


def resolve_rules(benchmark: str, usage: str | None = None, ruleset: str | None = None) -> tuple[str, str]:
    """``(usage, ruleset)`` for ``benchmark``: the ones it is judged by (BENCHMARKS) unless given.

    A ruleset without rules for the benchmark is one sentence naming the one to use, checked
    before the checker runs: the compliance checker itself crashes with a traceback there
    (training 4.1.0 and later hold no ResNet rules).
    """
    rules = BENCHMARKS.get(benchmark)
    usage = usage or (rules.usage if rules else None)
    ruleset = ruleset or (rules.ruleset if rules else None)
    if usage is None or ruleset is None:
        raise UsageError(
            f"MLPerf has no compliance rules for benchmark {benchmark!r}; pass usage and ruleset explicitly."
        )
    known = rulesets_with(usage, benchmark)
    if ruleset not in known:
        hint = (f"use {usage} ruleset {known[-1]}, the last one with {benchmark} rules" if known
                else f"no installed {usage} ruleset holds {benchmark} rules")
        raise UsageError(f"MLPerf {usage} {ruleset} holds no {benchmark} rules: {hint}.")
    return usage, ruleset


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
    usage, ruleset = resolve_rules(benchmark, usage, ruleset)
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
    if "Traceback (most recent call last)" in done.stderr:
        # The checker crashed rather than judged: its last line, never the traceback.
        last = done.stderr.strip().splitlines()[-1]
        raise InvalidInput(f"the MLPerf compliance checker crashed on {path} ({usage} {ruleset}): {last}")
    output = output or (done.stdout + done.stderr)
    return ComplianceResult(
        passed=done.returncode == 0,
        benchmark=benchmark,
        usage=usage,
        ruleset=ruleset,
        output=output,
    )


def problems(text: str, limit: int = 3) -> str:
    """A checker report in one clause: its own ERROR lines first, then the rules its compliance
    reports say failed (the report's INFO lines are for people reading the whole log)."""
    errors: list[str] = []
    rules: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("ERROR - ") and line[len("ERROR - "):].strip() not in errors:
            errors.append(line[len("ERROR - "):].strip())
            continue
        line = line.removeprefix("WARNING - ").strip()  # a compliance report's first line carries it
        if line.startswith(("Failed checks for", "Required ")) and line not in rules:
            rules.append(line)
    seen = errors + rules
    shown = "; ".join(seen[:limit])
    return shown + (f" (and {len(seen) - limit} more)" if len(seen) > limit else "")
