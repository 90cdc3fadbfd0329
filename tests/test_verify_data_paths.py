"""verify re-hashes the data a run read where it finds it: a relative path is read from the
directory verify runs in, so another file there is named as such, not as a tampered run."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.runs import repro500, write_recipe

from repro500.data.generate import generate


@pytest.mark.slow
def test_another_file_at_a_relative_data_path_is_a_warning_not_an_invalid_run(tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    generate("classification", lab / "data" / "train.h5", samples=128, seed=7, options={"noise": 0.04})
    generate("classification", lab / "data" / "eval.h5", samples=64, seed=7, split="eval", options={"noise": 0.04})
    write_recipe(lab / "tiny.yaml", fixed__epochs=1, repeats=1,
                 fixed__dataset={"name": "classification-h5", "path": "data/train.h5", "eval_path": "data/eval.h5"})
    ran = repro500("run", "tiny.yaml", "--no-tracking", "--out", "runs", "--run-id", "r", cwd=lab)
    assert ran.returncode in (0, 1, 3), ran.stdout + ran.stderr
    same = repro500("verify", "runs/r", "--no-write", cwd=lab)
    assert same.returncode in (0, 1, 3) and "another file" not in same.stdout, same.stdout + same.stderr

    elsewhere = tmp_path / "elsewhere"  # an unrelated project whose data lies at the same relative path
    generate("classification", elsewhere / "data" / "train.h5", samples=128, seed=8, options={"noise": 0.04})
    other = repro500("verify", str(lab / "runs" / "r"), "--no-write", cwd=elsewhere)
    text = other.stdout + other.stderr
    assert other.returncode == same.returncode, text
    assert "data/train.h5 here is another file than the run read" in " ".join(text.split()), text
    assert "INVALID" not in text
