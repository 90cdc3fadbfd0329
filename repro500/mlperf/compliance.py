"""MLPerf compliance in the verdict: every finished repeat's MLPerf log (``repeats/<k>/mllog.txt``)
judged by MLPerf's own compliance checker under the ruleset its benchmark is judged by (training
4.0.0 for ResNet, HPC 3.0.0 for CosmoFlow; workloads/mlperf_check.py), so a verdict says whether
the logs would pass MLPerf's checker without an export. A WARN, not a failure: the run's metrics are
what they are, but a reader comparing against MLPerf should know which rules the logs break."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from repro500.capture.hardware import usable_cpus
from repro500.errors import ReproError
from repro500.mlperf.check import check_compliance, logged_benchmark, problems, resolve_rules
from repro500.rundir import layout
from repro500.statuses import OK, SKIPPED, WARN


@dataclass
class MlperfResult:
    status: str  # OK | WARN | SKIPPED
    reason: str
    usage: str | None = None
    ruleset: str | None = None
    benchmark: str | None = None
    repeats: dict[str, Any] = field(default_factory=dict)  # "k": {"passed": bool, "problems": str}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_mlperf(run: Any) -> MlperfResult | None:
    """None when no finished repeat wrote an MLPerf log (a command, a system workload)."""
    logs = {k: run.repeat_file(k, layout.MLLOG) for k in run.completed}
    logs = {k: path for k, path in logs.items() if path.is_file() and not path.is_symlink()}
    if not logs:
        return None
    try:
        benchmark = logged_benchmark(next(iter(logs.values())))
        usage, ruleset = resolve_rules(benchmark)
    except ReproError as err:  # a workload MLPerf has no rules for (Extreme Weather): said, not judged
        return MlperfResult(SKIPPED, str(err).rstrip("."))

    def judge(path: Any) -> dict[str, Any]:
        try:
            result = check_compliance(path, benchmark, usage=usage, ruleset=ruleset)
        except ReproError as err:  # the checker crashed or timed out: its sentence, never a traceback
            return {"passed": False, "problems": str(err).rstrip(".")}
        return {"passed": result.passed, "problems": "" if result.passed else
                problems(result.output) or "see the checker's log"}

    # one checker process per log (it keeps its rules in module globals), as many at once as there
    # are cores: ten repeats of CosmoFlow are judged in about the time of two or three
    with ThreadPoolExecutor(max_workers=usable_cpus()) as pool:
        found = dict(zip(sorted(logs), pool.map(judge, [logs[k] for k in sorted(logs)]), strict=True))
    judged = {str(k): found[k] for k in sorted(found)}
    rules = f"MLPerf {usage} {ruleset} ({benchmark})"
    failed = {k: v for k, v in judged.items() if not v["passed"]}
    if failed:
        k, first = next(iter(failed.items()))
        return MlperfResult(WARN, f"{len(failed)} of {len(judged)} repeat log(s) fail {rules}'s compliance checker; "
                                    f"repeat {k}: {first['problems']}", usage, ruleset, benchmark, judged)
    return MlperfResult(OK, f"all {len(judged)} repeat log(s) pass {rules}'s compliance checker",
                        usage, ruleset, benchmark, judged)
