"""MLPerf's own tools run on an exported submission tree (repro500.mlperf.export):
``package_checker`` and ``result_summarizer`` always, ``rcp_checker`` where mlperf-logging holds
reference convergence points (RCPs) for the benchmark and the run's batch size.

Each tool runs as ``python -m mlperf_logging.<tool>`` in a subprocess (they keep state in module
globals and configure the root logger) on a throwaway copy of the tree, because the RCP checker
writes ``scaling.json`` into the results it judges: the exported tree stays what export wrote.
What a tool says is reported in one line; a tool that crashes is reported by its last line,
never by its traceback.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from repro500.mlperf.check import problems
from repro500.mlperf.export import ExportedTree, logged_value

_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class CheckOutcome:
    tool: str  # package_checker, result_summarizer, rcp_checker
    passed: bool | None  # None: not run (the line says why)
    line: str  # what the tool said, in one line


def _run_tool(module: str, args: list[str], cwd: Path, copy: Path,
              tree_path: Path) -> subprocess.CompletedProcess[str] | str:
    """The finished process, or one sentence when it could not finish (a crash, a timeout)."""
    command = [sys.executable, "-m", f"mlperf_logging.{module}", *args]
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"did not finish within {_TIMEOUT_S:.0f} s"
    # The summarizer prints a caught traceback and goes on; only a tool that stopped crashed.
    if done.returncode != 0 and "Traceback (most recent call last)" in done.stderr:
        return f"crashed: {done.stderr.strip().splitlines()[-1]}"
    # Lines name the exported tree, not the throwaway copy the tool read.
    done.stdout = done.stdout.replace(str(copy), str(tree_path))
    done.stderr = done.stderr.replace(str(copy), str(tree_path))
    return done


def package_check(tree: ExportedTree, copy: Path, work: Path) -> CheckOutcome:
    log = work / "package_checker.log"
    done = _run_tool("package_checker", [str(copy), tree.usage, tree.ruleset, "--log_output", str(log)],
                     work, copy, tree.path)
    if isinstance(done, str):
        return CheckOutcome("package_checker", False, f"package_checker {done}")
    text = done.stdout + done.stderr
    # The package checker exits 0 either way; its verdict is this line.
    if "PACKAGE CHECKER FOUND NO ERRORS, SUCCESS" in text:
        return CheckOutcome("package_checker", True, "package_checker: PACKAGE CHECKER FOUND NO ERRORS, SUCCESS !")
    return CheckOutcome("package_checker", False,
                        f"package_checker: PACKAGE CHECKER FOUND ERRORS: {problems(text) or 'see its log'}")


def summarize(tree: ExportedTree, copy: Path, work: Path) -> CheckOutcome:
    csv = work / "summary.csv"
    done = _run_tool("result_summarizer", [str(copy), tree.usage, tree.ruleset, "--csv", str(csv)], work, copy, tree.path)
    if isinstance(done, str):
        return CheckOutcome("result_summarizer", False, f"result_summarizer {done}")
    text = done.stdout + done.stderr
    rows_path = csv.with_suffix(".json")
    rows = json.loads(rows_path.read_text(encoding="utf-8")) if rows_path.is_file() else []
    row = next((r for r in rows if r.get("system") == tree.system), {})
    # Time to train in minutes, the olympic mean over the result files (MLPerf's score).
    score = row.get(tree.benchmark)
    if done.returncode != 0 or score is None or "CRITICAL ERROR" in text:
        reason = next((line.strip() for line in text.splitlines() if line.startswith("CRITICAL ERROR")), "")
        reason = reason or f"exit {done.returncode}, no score"
        return CheckOutcome("result_summarizer", False, f"result_summarizer: {tree.benchmark} not scored ({reason})")
    aborted = _aborted(tree)
    if aborted:  # the summarizer times an aborted run too: a run short of its target has no time to train
        return CheckOutcome("result_summarizer", False,
                            f"result_summarizer: {tree.benchmark} not scored: {len(aborted)} of {len(tree.results)} "
                            f"runs did not reach the target (run_stop status aborted: {', '.join(aborted[:5])}), "
                            "so there is no time to train")
    dropped = next((line.strip() for line in text.splitlines() if line.startswith("NOTICE:")), "")
    return CheckOutcome("result_summarizer", True,
                        f"result_summarizer: {tree.benchmark} {score:.6g} min (time to train, olympic mean of "
                        f"{len(tree.results)} results, {tree.division} division)" + (f"; {dropped}" if dropped else ""))


def _aborted(tree: ExportedTree) -> list[str]:
    """The result files whose ``run_stop`` says the run did not reach its target."""
    out = []
    for rel in tree.results:
        for line in (tree.path / rel).read_text(encoding="utf-8", errors="replace").splitlines():
            _, marker, payload = line.partition(":::MLLOG ")
            if not marker:
                continue
            try:
                record = json.loads(payload)
            except json.JSONDecodeError:
                continue
            if record.get("key") == "run_stop" and (record.get("metadata") or {}).get("status") != "success":
                out.append(Path(rel).name)
    return out


def _rcp_batch_sizes(usage: str, ruleset: str, benchmark: str) -> list[int]:
    import mlperf_logging.rcp_checker as rcp

    path = Path(rcp.__file__).parent / f"{usage}_{ruleset}" / f"rcps_{benchmark}.json"
    if not path.is_file():
        return []
    return sorted(int(record["BS"]) for record in json.loads(path.read_text(encoding="utf-8")).values())


def rcp_check(tree: ExportedTree, copy: Path, work: Path) -> CheckOutcome:
    sizes = _rcp_batch_sizes(tree.usage, tree.ruleset, tree.benchmark)
    if not sizes:
        return CheckOutcome("rcp_checker", None, f"rcp_checker: not run, mlperf-logging holds no RCPs for "
                                                 f"{tree.benchmark} in this ruleset")
    first = (copy / tree.results[0]).read_text(encoding="utf-8").splitlines()
    batch = logged_value(first, "global_batch_size")
    # An RCP for the batch size itself, or two around it that the checker interpolates between.
    if not isinstance(batch, int) or not sizes[0] <= batch <= sizes[-1]:
        return CheckOutcome("rcp_checker", None,
                            f"rcp_checker: not run, no RCP for batch size {batch} ({tree.benchmark} RCPs cover "
                            f"batch sizes {sizes[0]} to {sizes[-1]})")
    log = work / "rcp_checker.log"
    done = _run_tool("rcp_checker", [str(copy / tree.results_dir), "--rcp_usage", tree.usage,
                                     "--rcp_version", tree.ruleset, "--log_output", str(log)],
                     work, copy, tree.path)
    if isinstance(done, str):
        return CheckOutcome("rcp_checker", False, f"rcp_checker {done}")
    lines = (done.stdout + done.stderr).splitlines()
    verdict = next((line.split(" - ", 1)[-1].strip() for line in lines
                    if "RCP test PASSED" in line or "RCP test FAILED" in line), "no verdict line")
    epochs = next((line.split(":", 1)[-1].strip() for line in lines if "Submission mean epochs" in line), None)
    return CheckOutcome("rcp_checker", done.returncode == 0, f"rcp_checker: {verdict}"
                        + (f" (batch size {batch}, submission mean epochs {epochs})" if epochs else f" (batch size {batch})"))


def rejected_by(outcomes: list[CheckOutcome]) -> list[str]:
    """The tools whose verdict rejects the tree: package_checker and result_summarizer.  rcp_checker
    is said but does not reject: a reference convergence point judges how fast the run converged
    against MLPerf's reference runs, not whether the tree is a valid submission (docs/mlperf.md)."""
    return [o.tool for o in outcomes if o.tool != "rcp_checker" and o.passed is False]


def check_tree(tree: ExportedTree, progress=lambda _line: None) -> list[CheckOutcome]:  # noqa: ANN001
    """Run MLPerf's tools on the exported tree; one outcome per tool, in the order they ran."""
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="repro500-mlperf-check-") as tmp:
        work = Path(tmp)
        # The tools' folder name is the submitter's (MLPerf's repositories name it so).
        copy = work / tree.submitter
        shutil.copytree(tree.path, copy)
        for tool, step in (("package_checker", package_check), ("result_summarizer", summarize),
                           ("rcp_checker", rcp_check)):
            progress(f"running mlperf_logging.{tool} ({tree.usage} {tree.ruleset})")
            outcome = step(tree, copy, work)
            # Every line names the ruleset that judged it; the caller shows the lines.
            outcomes.append(replace(outcome, line=outcome.line.replace(tool, f"{tool} ({tree.usage} {tree.ruleset})", 1)))
    return outcomes
