"""The docs' own outputs are ignored by git, so the next run does not record them as untracked source."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Paths the documentation's examples write into the working directory (docs/publish.md, docs/report.md,
# docs/verify.md, docs/run.md), and the lock beside the default tracking store.
DOC_OUTPUTS = ["publications/mine/published.yaml", "publications/mine/recipe.yaml", "reproductions/r1/verdict.json",
               "reproductions/r1/mlflow.db", "mine.tar.gz", "r1.report.html", "mine-vs-theirs.html",
               "runs/r1/run.json", "mlflow.db", "mlflow.db.lock", "data/quickstart-train.h5"]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_doc_outputs_are_not_untracked_source(tmp_path):
    from repro500.capture.code import describe_repo

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    shutil.copyfile(ROOT / ".gitignore", tmp_path / ".gitignore")
    (tmp_path / "train.py").write_text("print('a source file is still seen')\n")
    for name in DOC_OUTPUTS:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x\n")
    facet, _ = describe_repo(tmp_path)
    assert sorted(item["path"] for item in facet["untracked"]) == [".gitignore", "train.py"]
    # metrics/verdict.json and dvc.lock are DVC's, meant to be committed: not ignored
    for kept in ("metrics/verdict.json", "dvc.lock"):
        ignored = subprocess.run(["git", "check-ignore", "-q", kept], cwd=tmp_path)
        assert ignored.returncode == 1, kept
