"""The ddp engine: torchrun-launched ranks, equivalence with one process, faults, compression."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from helpers.runs import COSMO, free_rendezvous_port, kill_a_rank_when, repro500, write_recipe

from repro500.runner import RunOptions, run


def _final(run_dir):
    return json.loads((run_dir / "repeats/0/summary.json").read_text())


@pytest.mark.slow
def test_two_ranks_match_one_process_with_the_same_global_batch(in_tmp, cosmo_data):
    recipe = write_recipe(in_tmp / "c.yaml", COSMO)
    single = run(RunOptions(recipe=str(recipe), tracking=False, run_id="single",
                            overrides=["batch_size=16"]))
    double = run(RunOptions(recipe=str(recipe), tracking=False, run_id="double", nproc=2,
                            overrides=["batch_size=8"]))
    a, b = _final(single.run_dir), _final(double.run_dir)
    assert b["world_size"] == 2 and b["engine"] == "ddp"
    # the manifest's planned rank -> host / device map is what the ranks then reported
    plan = json.loads((double.run_dir / "manifest.json").read_text())["facets"]["distributed"]["rank_plan"]
    host = socket.gethostname()
    assert plan == {str(r): {"node_rank": 0, "local_rank": r, "host": host, "device": "cpu", "gpu": None}
                    for r in (0, 1)}
    (reported,) = json.loads((double.run_dir / "run.json").read_text())["distributed"]["rank_maps"].values()
    assert [(m["rank"], m["host"], m["local_rank"], m["device"]) for m in reported] == \
        [(int(r), p["host"], p["local_rank"], p["device"]) for r, p in plan.items()]
    assert a["samples_seen"] == b["samples_seen"]
    # Not a derived float bound: float32 training in two summation orders (one process vs two ranks'
    # allreduce) drifts by rounding amplified over the steps; 1e-4 is ~1000 u32 of headroom
    for metric in ("mse", "mae"):
        assert b["metrics"][metric] == pytest.approx(a["metrics"][metric], rel=1e-4, abs=1e-6)
    ranks = json.loads((double.run_dir / "repeats/0/ranks.json").read_text())
    assert ranks["backend"] == "gloo" and [r["rank"] for r in ranks["ranks"]] == [0, 1]
    assert all("hardware" in r for r in ranks["ranks"])
    facet = json.loads((double.run_dir / "manifest.json").read_text())["facets"]["distributed"]
    assert facet["backend"] == "gloo" and facet["world_size"] == 2 and facet["engine"] == "ddp"
    assert isinstance(facet["comm_env"], dict)
    recorded = json.loads((double.run_dir / "run.json").read_text())["distributed"]  # known only once ranks ran
    assert recorded["backend"] == "gloo"
    assert [(r["rank"], r["host"], r["device"]) for r in recorded["rank_maps"]["0"]] == [
        (r["rank"], r["host"], "cpu") for r in ranks["ranks"]]
    step = json.loads((double.run_dir / "repeats/0/metrics.jsonl").read_text().splitlines()[0])
    assert step["bytes_sent"] > 0 and step["compression_ratio"] == pytest.approx(1.0)


@pytest.mark.slow  # make test stays under 10 minutes on 2 cores; CI runs make test-slow
def test_a_rank_killed_by_a_signal_is_named_its_log_kept_and_the_resume_keeps_two_ranks(in_tmp, cosmo_data):
    """As a user meets it: SIGKILL rank 1 of repeat 1, then the command
    the run suggests (`repro500 run --resume`), which reruns repeat 1 on the run's own two ranks."""
    write_recipe(in_tmp / "c.yaml", COSMO, repeats=2, fixed__epochs=40)
    run_dir = in_tmp / "runs/r"
    code, err, after_kill_s, pid = kill_a_rank_when(run_dir / "repeats/1/ranks.json", "run", "c.yaml", "--nproc",
                                                    "2", "--no-tracking", "--run-id", "r", cwd=in_tmp)
    assert after_kill_s < 60
    assert code == 5, err
    said = " ".join(err.split())
    assert "rank 1 (node 0 on host " in said and f", local rank 1, pid {pid}) was killed by signal 9 (SIGKILL)" in said
    assert "Traceback" not in err and "runs/r/repeats/1/launcher.log" in said
    log = run_dir / "repeats/1/launcher.log"  # torchrun's own words, inside the run directory
    assert f"Signal 9 (SIGKILL) received by PID {pid}" in log.read_text()
    assert _final(run_dir)["status"] == "completed"
    assert json.loads((run_dir / "repeats/1/summary.json").read_text())["status"] == "failed"
    assert "repro500 run --resume" in said

    resumed = repro500("run", "--resume", "runs/r", cwd=in_tmp, timeout=600)
    assert resumed.returncode in (0, 1, 3), resumed.stderr
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "completed" and (meta["world_size"], meta["engine"]) == (2, "ddp")
    again = json.loads((run_dir / "repeats/1/summary.json").read_text())
    assert again["status"] == "completed" and (again["world_size"], again["engine"]) == (2, "ddp")
    assert json.loads((run_dir / "repeats/1/ranks.json").read_text())["world_size"] == 2
    (resume,) = meta["resumes"]
    assert resume["result_relevant_differences"] == []  # a built-in workload, nothing changed
    verdict = repro500("verify", "runs/r", "--json", "--no-write", cwd=in_tmp)
    assert json.loads(verdict.stdout)["status"] != "INVALID", verdict.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.heavy
def test_topk_with_error_feedback_trains_the_quickstart_on_two_ranks(in_tmp):
    """Top-k 1% + error feedback, 2 ranks, the quickstart recipe and data: each repeat trains to far
    above chance (10 classes: 0.1) while sending about 1% of the gradient.  Whether two or three such
    repeats decide the quickstart's band at 95% is not this test's question: top-k's trajectory is
    chaotic (a last-bit change of the CPU's kernels moves it), so the verdict may be PASS or
    INCONCLUSIVE, but the band is never refuted."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for split, n in (("train", "2048"), ("eval", "512")):
        result = repro500("data", "generate", "classification", "--out", f"data/quickstart-{split}.h5",
                          "--samples", n, "--seed", "500", "--noise", "0.04", "--split", split, cwd=in_tmp)
        assert result.returncode == 0, result.stderr
    outcome = run(RunOptions(recipe=os.path.join(root, "experiments/quickstart.yaml"), tracking=False, nproc=2,
                             repeats=2, overrides=["batch_size=32", "compressor.name=topk", "compressor.ratio=0.01"]))
    assert outcome.verdict.status in ("PASS", "INCONCLUSIVE"), outcome.verdict.to_dict()["reasons"]
    for k in range(2):
        summary = json.loads((outcome.run_dir / f"repeats/{k}/summary.json").read_text())
        assert summary["status"] == "completed" and summary["metrics"]["accuracy"] > 0.8, summary
    step = json.loads((outcome.run_dir / "repeats/0/metrics.jsonl").read_text().splitlines()[0])
    assert step["compression_ratio"] > 40


@pytest.mark.slow  # make test stays under 10 minutes on 2 cores; CI runs make test-slow
def test_two_nodes_through_torchrun_rendezvous(in_tmp, cosmo_data):
    """Multi-node as users run it (one `repro500 run` per node), both nodes on loopback."""
    write_recipe(in_tmp / "c.yaml", COSMO, fixed__epochs=1)
    common = ["run", "c.yaml", "--nproc", "1", "--nnodes", "2", "--no-tracking", "--run-id", "mn",
              "--rdzv-endpoint", f"127.0.0.1:{free_rendezvous_port()}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    follower = subprocess.Popen([sys.executable, "-m", "repro500.cli", *common, "--node-rank", "1"], cwd=in_tmp,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    leader = repro500(*common, "--node-rank", "0", cwd=in_tmp, timeout=240)
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    assert leader.returncode in (0, 1, 3), leader.stderr
    ranks = json.loads((in_tmp / "runs/mn/repeats/0/ranks.json").read_text())
    assert ranks["world_size"] == 2
    assert _final(in_tmp / "runs/mn")["world_size"] == 2


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="device auto resolves to a GPU here")
def test_too_many_cpu_ranks_warn_also_when_the_device_is_auto(in_tmp, capsys):
    from repro500.recipe import load as recipes
    from repro500.runner import preflight

    path = write_recipe(in_tmp / "tiny.yaml")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    for device in ("auto", "cpu"):
        recipe = recipes.load(path, overrides=["engine=ddp", f"nproc={cores + 1}", f"device={device}"])
        assert preflight(recipe).device == "cpu"
        assert (f"warning: {cores + 1} ranks on the {cores} CPU cores this process may use will oversubscribe them"
                in capsys.readouterr().err)
    preflight(recipes.load(path, overrides=["engine=ddp", f"nproc={cores}", "device=auto"]))
    assert "oversubscribe" not in capsys.readouterr().err


def test_multinode_needs_endpoint_and_run_id(in_tmp):
    write_recipe(in_tmp / "c.yaml", COSMO)
    result = repro500("run", "c.yaml", "--nnodes", "2", "--nproc", "1", cwd=in_tmp)
    assert result.returncode == 2 and "--rdzv-endpoint" in result.stderr


TORCHRUN_FAILURE = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
repro500.workloads.engines.worker FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-23_12:00:01
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 101)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_12:00:00
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 102)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 102
============================================================
"""

HOROVOD_FAILURE = """\
[0]<stdout>:epoch 1
Process 1 exit with status code 137.
Terminating remaining workers after failure of Process 1.
Process 0 exit with status code 1.
Traceback (most recent call last):
RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing the job \
to be terminated. The first process to do so was:
Process name: 1
Exit code: -9
"""


@pytest.mark.parametrize(("text", "rank", "detail"), [
    (TORCHRUN_FAILURE, 1, "-9 (pid: 102)"),
    (HOROVOD_FAILURE, 1, "exitcode 137 (killed by signal 9)"),
    ("something else went wrong", None, ""),
])
def test_the_failed_rank_is_read_from_torchrun_and_horovodrun_reports(text, rank, detail):
    from repro500.workloads.engines.launch import failed_rank, failure_detail

    assert failed_rank(text) == rank
    assert failure_detail(text, rank) == detail


def test_a_horovod_rank_is_named_with_its_local_rank_and_pid_from_ranks_json(tmp_path):
    """horovodrun names only the failed process and its status; the rank's own record says the rest."""
    from repro500.workloads.engines.launch import _local_failure

    (tmp_path / "ranks.json").write_text(json.dumps({"schema": "repro500/ranks/v1", "ranks": [
        {"rank": 0, "local_rank": 0, "host": "h", "pid": 100}, {"rank": 1, "local_rank": 1, "host": "h", "pid": 101}]}))
    err = _local_failure("horovod", HOROVOD_FAILURE, 1, tmp_path)
    assert str(err).startswith("rank 1 (node 0 on host h, local rank 1, pid 101) was killed by signal 9 (SIGKILL) "
                               "(horovodrun: exitcode 137 (killed by signal 9)); the other ranks of the horovod job")
    assert (tmp_path / "launcher.log").read_text() == HOROVOD_FAILURE
    (tmp_path / "ranks.json").unlink()  # died before it recorded itself: the rank and its status only
    assert str(_local_failure("horovod", HOROVOD_FAILURE, 1, tmp_path)).startswith(
        "rank 1 of the horovod job failed (exitcode 137 (killed by signal 9))")


def test_a_resume_whose_records_disagree_on_the_world_size_says_how_to_start_again(in_tmp):
    """--resume takes no --nproc: the refusal must give advice a user can follow."""
    from repro500.errors import UsageError
    from repro500.workloads.command.adhoc import recipe_data

    adhoc = recipe_data([sys.executable, "-c", "print('acc 0.9')"], metrics=["acc=regex:acc ([0-9.]+)"],
                        accept=["acc>=0.5"], name="t")
    done = run(RunOptions(adhoc=adhoc, tracking=False, run_id="w", repeats=2))
    meta_path = done.run_dir / "run.json"
    meta = json.loads(meta_path.read_text())
    meta.update(world_size=2, status="interrupted")
    meta_path.write_text(json.dumps(meta))
    before = meta_path.read_bytes()
    with pytest.raises(UsageError) as refused:
        run(RunOptions(resume=str(done.run_dir), tracking=False))
    said = str(refused.value)
    assert "ran with world size 2 (command), but its recipe.yaml plans 1 rank(s)" in said
    assert "start a new run with `repro500 run" in said and "--nproc 2`" in said and "--resume" not in said
    assert meta_path.read_bytes() == before


@pytest.mark.slow  # make test stays under 10 minutes on 2 cores; CI runs make test-slow
def test_a_diverging_two_rank_run_is_recorded_as_diverged_not_failed(in_tmp):
    recipe = write_recipe(in_tmp / "tiny.yaml", repeats=1, fixed__epochs=2,
                          mutable__optimizer={"name": "sgd", "lr": 1.0e12})
    outcome = run(RunOptions(recipe=str(recipe), nproc=2, tracking=False))
    summary = _final(outcome.run_dir)
    assert summary["world_size"] == 2
    assert summary["status"] == "diverged", summary.get("error")
    assert "at epoch 1" in summary["error"]
    assert not (outcome.run_dir / "repeats/0/launcher.log").exists()  # no rank failed
