"""The layers hold by construction: import-linter (`make lint`) fails on an import that runs up
or sideways, which this test shows by planting one in a copy of the package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def _lint(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT), "--no-cache", "--config", str(tree / ".importlinter")], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("module, planted, named", [
    ("workloads/workload.py", "from repro500.verify import stats", "repro500.workloads is not allowed to import repro500.verify"),
    ("verify/render.py", "from repro500 import report", "repro500.verify is not allowed to import repro500.report"),
    ("publish/index.py", "from repro500.report import html", "repro500.publish is not allowed to import repro500.report"),
    # the drivers were once ordered (locate above publish, report above system); now none leans on another
    ("locate/pipeline.py", "from repro500.publish import publication", "repro500.locate is not allowed to import repro500.publish"),
    ("report/system.py", "from repro500.system import render", "repro500.report is not allowed to import repro500.system"),
])
def test_a_planted_sideways_driver_import_fails_the_lint(tmp_path, module, planted, named):
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "repro500", tree / "repro500", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / ".importlinter", tree / ".importlinter")
    assert _lint(tree).returncode == 0  # the copy as it is holds
    target = tree / "repro500" / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{planted}  # noqa\n", encoding="utf-8")
    done = _lint(tree)
    assert done.returncode != 0 and named in done.stdout, done.stdout[-2000:]
