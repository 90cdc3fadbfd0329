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


def test_a_margin_the_publication_does_not_publish_is_refused_before_anything_runs(lab: Path, tmp_path: Path) -> None:
    done = repro500("reproduce", str(lab / "pub"), "--out", "OUT", "--margin", "foo=0.1", "--run-code", cwd=tmp_path)
    assert done.returncode == 2, _said(done)
    assert "--margin names 'foo', which published.yaml does not publish" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "repeat 0" not in done.stdout
    assert not (tmp_path / "OUT").exists()
    # a packed run is published on the fly with the margins: refused there, as early
    done = repro500("reproduce", str(lab / "pub" / "orig.tar.gz"), "--out", "OUT", "--margin", "foo=0.1",
                    "--run-code", cwd=tmp_path)
    assert done.returncode == 2 and "foo" in done.stderr, _said(done)
    assert not (tmp_path / "OUT").exists()


def test_a_tampered_publication_is_named_as_given_and_its_copy_is_taken_away(lab: Path, tmp_path: Path) -> None:
    pub = tmp_path / "given"
    shutil.copytree(lab / "pub", pub)
    (pub / "published.yaml").write_text((pub / "published.yaml").read_text().replace("margin: 0.03", "margin: 0.3"))
    done = repro500("reproduce", "given", "--out", "m6", "--run-code", cwd=tmp_path)
    assert done.returncode == 4, _said(done)
    assert "publication given was changed after repro500 publish wrote it" in done.stderr, done.stderr
    assert "m6" not in done.stderr and not (tmp_path / "m6").exists()


@pytest.mark.slow
def test_one_verdict_is_printed_once_with_the_reruns_own_check_as_a_section(lab: Path, tmp_path: Path) -> None:
    done = repro500("reproduce", str(lab / "pub"), "--out", "OUT", "--run-code", cwd=tmp_path)
    assert done.returncode == 0, _said(done)
    assert done.stdout.count("(exit ") == 1, done.stdout
    assert "starting the rerun" in done.stdout  # said before the child's seconds of silence
    assert "Rerun's own check  PASS" in done.stdout
    verdict = json.loads((tmp_path / "OUT" / "verdict.json").read_text())
    assert verdict["status"] == "REPRODUCED" and verdict["rerun_own"]["status"] == "PASS"
    sequential = repro500("reproduce", str(lab / "pub"), "--out", "SEQ", "--run-code", "--until-decided",
                          "--max-repeats", "4", cwd=tmp_path)
    assert sequential.returncode in (0, 3), _said(sequential)
    assert sequential.stdout.count("(exit ") == 1 and sequential.stdout.count("Verdict against") == 1, sequential.stdout


@pytest.mark.slow  # four trained repeats, twice: about two minutes on 2 cores
def test_a_factorial_publication_is_reproduced_as_the_same_factorial(tmp_path: Path) -> None:
    from helpers.runs import write_recipe

    write_recipe(tmp_path / "tiny.yaml", fixed__epochs=1, fixed__dataset__params__train_samples=64,
                 fixed__dataset__params__eval_samples=32)
    ran = repro500("run", "tiny.yaml", "--no-tracking", "--vary", "init,kernels", "--repeats-per-cell", "2",
                   "--run-id", "fact", cwd=tmp_path)
    assert ran.returncode in (0, 1, 3), ran.stdout + ran.stderr
    assert repro500("publish", "runs/fact", "--out", "pub", cwd=tmp_path).returncode == 0
    index = json.loads((tmp_path / "pub" / "publication.json").read_text())
    assert index["run"]["design"] == {"kind": "factorial", "sources": ["init", "kernels"], "per_cell": 2}
    refused = repro500("reproduce", "pub", "--out", "OUT", "--repeats", "4", cwd=tmp_path)
    assert refused.returncode == 2 and "factorial" in refused.stderr, _said(refused)
    assert not (tmp_path / "OUT").exists()
    done = repro500("reproduce", "pub", "--out", "OUT", cwd=tmp_path)
    assert done.returncode in (0, 1, 3), _said(done)
    assert "the rerun is the same factorial" in done.stdout
    (rerun,) = (tmp_path / "OUT" / "runs").iterdir()
    design = json.loads((rerun / "run.json").read_text())["design"]
    assert design["kind"] == "factorial" and design["sources"] == ["init", "kernels"] and design["per_cell"] == 2
