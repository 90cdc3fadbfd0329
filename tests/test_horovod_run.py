"""`repro500 run --nproc 2 --set engine=horovod` end to end.

Unlike tests/test_horovod.py these tests must run *outside* horovodrun: each one starts its own
`repro500 run`, which launches `horovodrun -np 2 ... --gloo` itself.  `make test-horovod` runs this
file once, after the adapter tests under horovodrun.  They skip when Horovod is not installed
(scripts/build_horovod.sh) and refuse to run inside a horovodrun rank.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from helpers.runs import kill_a_rank_when, repro500, write_recipe

from repro500.rundir import sums as bundle

pytestmark = pytest.mark.horovod


@pytest.fixture(scope="module", autouse=True)
def _horovod_outside_ranks():
    pytest.importorskip("horovod.torch")
    if shutil.which("horovodrun") is None:
        pytest.skip("horovodrun is not on PATH (activate the venv Horovod was built into)")
    if "HOROVOD_RANK" in os.environ:
        pytest.skip("end-to-end runs start their own horovodrun: run this file outside it (make test-horovod)")


@pytest.mark.parametrize(
    ("name", "compressor"),
    [("plain", None), ("fp16", "fp16"), ("topk", "topk")],
)
def test_horovod_run_writes_a_two_rank_run_directory(in_tmp, name, compressor):
    write_recipe(in_tmp / "tiny.yaml", repeats=1, fixed__epochs=1)
    args = ["run", "tiny.yaml", "--nproc", "2", "--set", "engine=horovod", "--no-tracking", "--run-id", name]
    if compressor == "topk":
        args += ["--set", "compressor.name=topk", "--set", "compressor.ratio=0.05"]
    elif compressor:
        args += ["--set", f"compressor={compressor}"]
    result = repro500(*args, cwd=in_tmp, timeout=600)
    run_dir = in_tmp / "runs" / name
    log = run_dir / "repeats/0/launcher.log"  # written only when a rank failed
    assert not log.is_file(), log.read_text()[-4000:]
    assert result.returncode in (0, 1, 3), result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert (run_dir / "SHA256SUMS").is_file()
    assert bundle.check_sums(run_dir).ok

    manifest = json.loads((run_dir / "manifest.json").read_text())
    distributed = manifest["facets"]["distributed"]
    assert distributed["engine"] == "horovod" and distributed["world_size"] == 2
    assert distributed["backend"] == "horovod-gloo"
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["world_size"] == 2 and meta["engine"] == "horovod"

    summary = json.loads((run_dir / "repeats/0/summary.json").read_text())
    assert summary["status"] == "completed", summary.get("error")
    assert summary["engine"] == "horovod" and summary["world_size"] == 2

    ranks = json.loads((run_dir / "repeats/0/ranks.json").read_text())
    assert ranks["world_size"] == 2 and ranks["backend"] == "horovod-gloo"
    assert [r["rank"] for r in ranks["ranks"]] == [0, 1]
    assert len({r["pid"] for r in ranks["ranks"]}) == 2
    assert all("hardware" in r for r in ranks["ranks"])

    steps = [json.loads(line) for line in (run_dir / "repeats/0/metrics.jsonl").read_text().splitlines()]
    step = next(r for r in steps if r["kind"] == "step")
    assert step["bytes_sent"] > 0
    expected_ratio = {"plain": 1.0, "fp16": 2.0}.get(name)
    if expected_ratio is not None:
        # byte accounting, not rounding: at P = 2 a ring allreduce moves exactly its payload, so the
        # ratio is sum(4 n) / sum(4 n or 2 n), exact in double; rel 0.01 is slack, not a rounding bound
        assert step["compression_ratio"] == pytest.approx(expected_ratio, rel=0.01)
    else:  # top-k 5% through allgather: values + indices of 5% of every tensor
        assert step["compression_ratio"] > 5


def test_a_horovod_rank_that_dies_fails_the_run_naming_it_and_keeps_finished_repeats(in_tmp):
    write_recipe(in_tmp / "tiny.yaml", repeats=2, fixed__epochs=6)
    run_dir = in_tmp / "runs/r"
    # repeat 1's ranks.json: repeat 0 is finished, repeat 1 starting
    code, err, after_kill_s, pid = kill_a_rank_when(run_dir / "repeats/1/ranks.json", "run", "tiny.yaml", "--nproc",
                                                    "2", "--set", "engine=horovod", "--no-tracking", "--run-id", "r",
                                                    cwd=in_tmp)
    assert after_kill_s < 60
    assert code == 5, err
    # horovodrun names the rank and its status; ranks.json where it ran
    said = " ".join(err.split())
    assert f"local rank 1, pid {pid}) was killed by signal 9 (SIGKILL) (horovodrun: exitcode 137 (killed by signal 9))" \
        in said and "Traceback" not in err, err
    assert json.loads((run_dir / "repeats/0/summary.json").read_text())["status"] == "completed"
    assert json.loads((run_dir / "repeats/1/summary.json").read_text())["status"] == "failed"
    assert (run_dir / "repeats/1/launcher.log").is_file()
