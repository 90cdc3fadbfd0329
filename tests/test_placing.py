"""Inputs are recorded as the command addressed them, and a rerun gets them where it will look.

The layout of many public examples: a repository whose script reads ``../data/...`` beside it (a
file, and a directory it walks).  A real run records each input's path as opened, relative to the
experiment, resolved, its size and digest; placing the inputs for a rerun in another directory
finds them under a data root (by relative path or by digest), says one line each, and refuses,
naming the path the command will open, when one is missing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.runs import repro500

from repro500.capture import placing
from repro500.capture.data import digest_path
from repro500.errors import InvalidInput

PY = sys.executable
SCRIPT = """
    import os
    total = sum(float(x) for x in open("../data/values.csv") if x.strip())
    scale = float(open("../data/scale.txt").read())
    for folder, _, files in os.walk("../data/images"):
        for name in sorted(files):
            total += len(open(os.path.join(folder, name), "rb").read())
    print(f"Acc {total * scale:.3f}")
"""


def _layout(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir(parents=True)
    (repo / "main.py").write_text(textwrap.dedent(SCRIPT))
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "main.py"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"], cwd=repo, check=True)
    data = root / "data"
    (data / "images").mkdir(parents=True)
    (data / "values.csv").write_text("1\n2\n3\n")
    (data / "scale.txt").write_text("0.001")
    for i in range(20):  # past DIR_MIN_FILES: recorded as one directory digest
        (data / "images" / f"{i}.bin").write_bytes(bytes([i]) * (i + 1))
    return repo


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("placing")
    repo = _layout(root)
    done = repro500("run", "--command", "--metric", "accuracy=regex:Acc ([0-9.]+)", "--accept", "accuracy>=0",
                    "-n", "1", "--no-tracking", "--out", str(root / "runs"), "--run-id", "a", "--", PY, "main.py",
                    cwd=repo)
    assert done.returncode in (0, 3), done.stdout + done.stderr
    return root, json.loads((root / "runs" / "a" / "inputs.json").read_text())["observed"]


def test_inputs_are_recorded_as_the_command_addressed_them(recorded):
    root, entries = recorded
    by_opened = {e["opened"]: e for e in entries}
    assert sorted(by_opened) == ["../data/images", "../data/scale.txt", "../data/values.csv"]
    values = by_opened["../data/values.csv"]
    assert values["experiment"] == "../data/values.csv"  # the experiment is the repository
    assert values["resolved"] == str((root / "data" / "values.csv").resolve()) == values["path"]
    assert values["size"] == 6 and values["md5"] == digest_path(root / "data" / "values.csv")["md5"]
    assert by_opened["../data/images"]["kind"] == "directory" and by_opened["../data/images"]["nfiles"] == 20


def test_a_rerun_elsewhere_gets_each_input_where_the_command_will_look(recorded, tmp_path):
    root, entries = recorded
    out = tmp_path / "out"
    shutil.copytree(root / "repo", out / "source")
    copy = tmp_path / "copy"  # the reproducer's copy, laid out differently: found by path or digest
    shutil.copytree(root / "data" / "images", copy / "data" / "images")
    (copy / "elsewhere").mkdir()
    shutil.copyfile(root / "data" / "values.csv", copy / "data" / "values.csv")
    shutil.copyfile(root / "data" / "scale.txt", copy / "elsewhere" / "factor.txt")
    for entry in entries:  # the publisher's absolute paths are not on this machine
        entry["path"] = entry["resolved"] = "/nonexistent" + entry["path"]

    placed = placing.place_inputs(entries, cwd=out / "source", tree=out, data_root=copy, protected=[root / "runs"])
    lines = {p.opened: p.line() for p in placed}
    assert placing.missing_error(placed) is None, lines
    assert lines["../data/values.csv"].startswith(f"../data/values.csv: read at {out / 'data' / 'values.csv'} (linked from")
    assert str(copy / "elsewhere" / "factor.txt") in lines["../data/scale.txt"]  # by digest
    assert "copied from" in lines["../data/images"]
    ran = subprocess.run([PY, "main.py"], cwd=out / "source", capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout.startswith("Acc "), ran.stderr

    again = placing.place_inputs(entries, cwd=out / "source", tree=out, data_root=None)
    assert {p.how for p in again} == {"in place"}


def test_a_missing_input_is_refused_naming_the_path_the_command_will_open(recorded, tmp_path):
    _, entries = recorded
    out = tmp_path / "out"
    (out / "source").mkdir(parents=True)
    entries = [{**e, "path": "/nonexistent" + e["path"], "resolved": "/nonexistent" + e["resolved"]} for e in entries]
    placed = placing.place_inputs(entries, cwd=out / "source", tree=out, data_root=tmp_path / "empty")
    error = placing.missing_error(placed)
    assert error is not None and not (out / "data").exists()
    assert f"the command will open ../data/images at {out / 'data' / 'images'}" in str(error)
    assert "--data-root" in str(error) and "2 more" in str(error)


def test_a_place_outside_the_rerun_or_claimed_twice_is_refused(tmp_path):
    out = tmp_path / "out"
    (out / "source").mkdir(parents=True)
    outside = {"opened": "../../elsewhere/x.csv", "md5": "a" * 32, "size": 1, "kind": "file", "path": "/x"}
    with pytest.raises(InvalidInput, match=r"\.\./\.\./elsewhere/x\.csv: read from the rerun's directory as "
                                            r"'\.\./elsewhere/x\.csv' leaves its directory"):
        placing.place_inputs([outside], cwd=out / "source", tree=out)
    same = [{"opened": "../data/x.csv", "md5": "a" * 32, "path": "/a/x.csv"},
            {"opened": "../data/./x.csv", "md5": "b" * 32, "path": "/b/x.csv"}]
    with pytest.raises(InvalidInput, match="two recorded inputs claim .* with different digests"):
        placing.place_inputs(same, cwd=out / "source", tree=out)
    with pytest.raises(InvalidInput, match="the publication's own files"):
        placing.place_inputs([{"opened": "pub/x", "md5": "c" * 32, "path": "/x"}], cwd=out, tree=out,
                             protected=[out / "pub"])
    assert not (out / "data").exists()
    # the same rule as every path a record names: a link out of the tree, a kernel file
    (out / "data").symlink_to(tmp_path)
    with pytest.raises(InvalidInput, match=r"outside .* \(through a link\)"):
        placing.place_inputs([{"opened": "../data/x.csv", "md5": "a" * 32, "path": "/x"}], cwd=out / "source", tree=out)
    with pytest.raises(InvalidInput, match="a kernel file"):
        placing.place_inputs([{"opened": "/proc/self/status", "md5": "a" * 32}], cwd=out / "source", tree=out)
