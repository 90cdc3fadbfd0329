"""repro500 init: a user's repository becomes a DVC pipeline that runs their experiment through
repro500, checked by DVC itself (dvc repro, dvc exp run -S, dvc metrics show)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from runhelpers import repro500

SCRIPT = """import os, sys
lr = float(sys.argv[sys.argv.index("--lr") + 1])
seed = int(os.environ["REPRO500_SEED"])
print(f"Acc@1 {90 + lr + seed % 3 / 100:.3f}")
"""
ENV = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", "DVC_NO_ANALYTICS": "1"}


def _sh(cwd: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, cwd=cwd, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_init_then_dvc_repro_and_dvc_exp_run_vary_a_mutable_value(in_tmp):
    (in_tmp / "train.py").write_text(SCRIPT)
    _sh(in_tmp, "git", "init", "-q")
    _sh(in_tmp, str(Path(sys.executable).parent / "dvc"), "init", "-q")
    made = repro500("init", "--metric", "accuracy=regex:Acc@1 ([0-9.]+)", "--accept", "accuracy>=90", "--set", "lr=0.1",
                    "--", "python", "train.py", "--lr", "{mutable.lr}", cwd=in_tmp, env=ENV)
    assert made.returncode == 0, made.stderr
    dvc = str(Path(sys.executable).parent / "dvc")
    _sh(in_tmp, dvc, "repro")
    first = json.loads((in_tmp / "metrics" / "verdict.json").read_text())
    assert first["status"] == "PASS" and 90.1 <= first["accuracy"]["mean"] < 90.2
    _sh(in_tmp, "git", "add", "-A")
    _sh(in_tmp, "git", "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "experiment")
    _sh(in_tmp, dvc, "exp", "run", "-S", "run.mutable.lr=0.5")
    varied = json.loads((in_tmp / "metrics" / "verdict.json").read_text())
    assert 90.5 <= varied["accuracy"]["mean"] < 90.6
    shown = _sh(in_tmp, dvc, "metrics", "show", "--json").stdout
    assert "accuracy" in shown


def test_init_refuses_to_overwrite_and_checks_the_recipe_before_writing(in_tmp):
    (in_tmp / "train.py").write_text(SCRIPT)
    (in_tmp / "params.yaml").write_text("mine: 1\n")
    args = ["--metric", "accuracy=regex:Acc@1 ([0-9.]+)", "--accept", "accuracy>=90", "--", "python", "train.py"]
    kept = repro500("init", *args, cwd=in_tmp, env=ENV)
    assert kept.returncode == 4 and "params.yaml already exists" in kept.stderr
    assert (in_tmp / "params.yaml").read_text() == "mine: 1\n" and not (in_tmp / "repro500.yaml").exists()
    bad = repro500("init", "--metric", "accuracy=regex:no group", "--accept", "accuracy>=90", "--force",
                   "--", "python", "train.py", cwd=in_tmp, env=ENV)
    assert bad.returncode in (2, 4) and "Traceback" not in bad.stderr and not (in_tmp / "dvc.yaml").exists()
