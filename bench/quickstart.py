"""Quickstart end to end, as `make demo` runs it: generate -> run (3 repeats) -> verify -> report.

Prints the wall time of each stage and the total against the 2-minute target (installed venv,
2-core machine). Runs in a temporary directory with its own SQLite MLflow store.

    python bench/quickstart.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 120.0


def main() -> int:
    repro500 = [sys.executable, "-m", "repro500.cli"]
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DVC_NO_ANALYTICS="1")
    with tempfile.TemporaryDirectory(prefix="repro500-quickstart-") as tmp:
        shutil.copytree(ROOT / "experiments", Path(tmp) / "experiments")
        stages = [
            ("generate", [*repro500, "data", "generate", "classification", "--out", "data/quickstart-train.h5",
                          "--samples", "2048", "--seed", "500", "--noise", "0.04"]),
            ("generate eval", [*repro500, "data", "generate", "classification", "--out", "data/quickstart-eval.h5",
                               "--samples", "512", "--seed", "500", "--noise", "0.04", "--split", "eval"]),
            ("run (3 repeats, MLflow, verify)", [*repro500, "run", "experiments/quickstart.yaml", "--run-id", "q"]),
            ("verify", [*repro500, "verify", "runs/q"]),
            ("report", [*repro500, "report", "runs/q"]),
        ]
        total, failed = 0.0, []
        for name, cmd in stages:
            start = time.perf_counter()
            result = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
            elapsed = time.perf_counter() - start
            total += elapsed
            print(f"{name:34s} {elapsed:7.1f} s  (exit {result.returncode})")
            if result.returncode != 0:
                failed.append(name)
                print(result.stderr[-2000:])
    # a stage that stopped early is fast for the wrong reason: its time says nothing
    verdict = f"FAILED ({', '.join(failed)})" if failed else ("OK" if total <= TARGET_S else "MISSED")
    print(f"{'total':34s} {total:7.1f} s  ratio {total / TARGET_S:.2f} of the {TARGET_S:.0f} s target {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
