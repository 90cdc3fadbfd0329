"""``repro500 reproduce`` checks what it is given before it writes or runs anything, and says
one verdict once.

A wrapped command (a script printing one number) stands for the experiment: a run of it takes
about a second, so every reproduction here is a real one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.runs import repro500

from repro500.rundir import sums as bundle

NOISY = "import random, sys\nrandom.seed(int(sys.argv[1]))\nprint(f'acc {float(sys.argv[2]) + random.gauss(0, 0.01):.5f}')\n"
COMMAND = ["run", "--command", "--no-tracking", "--metric", "acc=regex:acc ([0-9.]+)", "--accept", "acc>=0.9±0.03"]


def _said(done) -> str:
    text = done.stdout + done.stderr
    assert "Traceback" not in text, text
    return text


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 3 repeats and its publication (pub)."""
    root = tmp_path_factory.mktemp("lab")
    (root / "t.py").write_text(NOISY)
    ran = repro500(*COMMAND, "--run-id", "orig", "--repeats", "3", "--", "python", "t.py", "{seed}", "0.95", cwd=root)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    done = repro500("publish", "runs/orig", "--out", "pub", cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def test_a_run_id_that_leaves_its_directory_is_refused_before_anything_is_written(lab: Path, tmp_path: Path) -> None:
    """A packed run whose run.json names its run '../../../x/OUTSIDE', sealed anew: the publication
    made of it on the fly would have put OUTSIDE.tar.gz three directories above its staging
    directory (in the temporary directory's parent)."""
    evil = tmp_path / "evil"
    shutil.copytree(lab / "runs" / "orig", evil)
    meta = json.loads((evil / "run.json").read_text())
    meta["run_id"] = "../../../x/OUTSIDE"
    (evil / "run.json").write_text(json.dumps(meta))
    bundle.write_sums(evil)
    packed = repro500("pack", str(evil), "--out", "evil.tar.gz", cwd=tmp_path)
    assert packed.returncode == 0, packed.stdout + packed.stderr
    temp = tmp_path / "temp"  # reproduce's temporary directory: tmp_path/temp/repro500-reproduce-*/...
    temp.mkdir()
    (tmp_path / "x").mkdir()
    done = repro500("reproduce", "evil.tar.gz", "--out", "OUT", "--run-code", cwd=tmp_path, env={"TMPDIR": str(temp)})
    text = _said(done)
    assert done.returncode == 4, text
    assert "leaves its directory" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "x" / "OUTSIDE.tar.gz").exists()
    assert not list(tmp_path.rglob("OUTSIDE*")) and not (tmp_path / "OUT").exists()
    # publish itself refuses the same run id, before its --out exists
    done = repro500("publish", "evil.tar.gz", "--out", "pub", cwd=tmp_path, env={"TMPDIR": str(temp)})
    assert done.returncode == 4 and "leaves its directory" in done.stderr, _said(done)
    assert not (tmp_path / "pub").exists() and not list(tmp_path.rglob("OUTSIDE*"))
