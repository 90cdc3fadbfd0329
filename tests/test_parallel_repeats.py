"""A run's repeats side by side (``--launcher local --parallel K``): one run, one chain, the serial verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.runs import interrupt_once_started, invoke, tool_env

# A deterministic seeded workload: its score depends on REPRO500_SEED only, and it reports the CPU
# set and thread count it ran with, so the test sees the pinning from inside the program.
SCRIPT = """\
import os, random
rng = random.Random(int(os.environ["REPRO500_SEED"]))
x = sum(rng.random() for _ in range(20000)) / 20000
print(f"score {x:.9f}")
print("where", sorted(os.sched_getaffinity(0)), os.environ.get("OMP_NUM_THREADS"))
if os.environ.get("FAIL_REPEAT") == os.environ["REPRO500_REPEAT"]:
    raise SystemExit("boom")
"""
COMMAND = ("--command", "--metric", "score=regex:score ([0-9.]+)", "--accept", "score>=0.4", "--")
TWO_CORES = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two repeats at once need two CPU cores")


def repro500(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "repro500.cli", *args], cwd=cwd, env=tool_env(**env),
                          capture_output=True, text=True, timeout=600)


def _run(tmp_path: Path, run_id: str, *options: str, **env: str):
    return repro500("run", "--run-id", run_id, "--repeats", "4", *options, *COMMAND, sys.executable, "work.py",
                    cwd=tmp_path, **env)


def _repeats(run: Path) -> dict[int, dict]:
    return {k: json.loads((run / "repeats" / str(k) / "summary.json").read_text()) for k in range(4)}


@TWO_CORES
@pytest.mark.slow
def test_four_repeats_two_at_a_time_make_the_serial_runs_verdict(tmp_path):
    (tmp_path / "work.py").write_text(SCRIPT)
    fanned = _run(tmp_path, "fanned", "--launcher", "local", "--parallel", "2")
    assert fanned.returncode == 0, fanned.stdout + fanned.stderr
    serial = _run(tmp_path, "serial", "--no-tracking")
    assert serial.returncode == 0, serial.stdout + serial.stderr
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["fanned", "serial"]
    run = tmp_path / "runs" / "fanned"
    assert "running on cpu" in fanned.stdout and "completed after" in fanned.stdout

    checked = repro500("verify", str(run), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "repeat chain intact" in " ".join(checked.stdout.split())
    chain = [json.loads(line) for line in (run / "chain.jsonl").read_text().splitlines()]
    assert sorted(r["repeat"] for r in chain[1:]) == [0, 1, 2, 3]  # one link each, in the order they landed

    mine, theirs = _repeats(run), _repeats(tmp_path / "runs" / "serial")
    assert [mine[k]["metrics"]["score"] for k in range(4)] == [theirs[k]["metrics"]["score"] for k in range(4)]
    verdicts = [json.loads((tmp_path / "runs" / r / "verdict.json").read_text()) for r in ("fanned", "serial")]
    assert verdicts[0]["status"] == verdicts[1]["status"] == "PASS"
    assert verdicts[0]["exit_code"] == verdicts[1]["exit_code"]

    sets = {}
    for k, summary in mine.items():
        place = summary["placement"]
        assert place["launcher"] == "local" and place["threads"] == len(place["cpus"]) >= 1
        seen = (run / "repeats" / str(k) / "stdout.txt").read_text()
        assert f"where {sorted(place['cpus'])} {place['threads']}" in seen  # what the program itself saw
        sets[place["slot"]] = set(place["cpus"])
    assert sets.keys() == {0, 1} and not sets[0] & sets[1]  # disjoint shares of the node
    meta = json.loads((run / "run.json").read_text())
    assert meta["launcher"]["parallel"] == 2
    assert sorted(meta["mlflow"]["repeat_run_ids"]) == ["0", "1", "2", "3"]  # the parent got its four children


@TWO_CORES
def test_a_failed_task_is_a_failed_repeat_named_as_in_a_serial_run(tmp_path):
    (tmp_path / "work.py").write_text(SCRIPT)
    done = _run(tmp_path, "broken", "--no-tracking", "--launcher", "local", "--parallel", "2", FAIL_REPEAT="1")
    assert done.returncode == 5, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert "repeat 1 failed: the command exited with status 1: boom" in said
    assert "repro500 run --resume runs/broken" in said and "Traceback" not in said
    assert json.loads((tmp_path / "runs/broken/repeats/1/summary.json").read_text())["status"] == "failed"


@pytest.mark.parametrize(("options", "code", "sentence"), [
    (["--launcher", "local", "--parallel", "0"], 2, "--parallel must be a whole number of repeats of at least 1, not 0"),
    (["--launcher", "local", "--parallel", "-3"], 2, "--parallel must be a whole number of repeats of at least 1, not -3"),
    (["--launcher", "local", "--parallel", "two"], 2, "'two' is not a valid integer"),
    (["--parallel", "2"], 2, "--parallel 2 needs a launcher to run the repeats side by side"),
    (["--detach"], 2, "--detach leaves the repeats to SLURM's queue and returns; it goes with --launcher slurm"),
    (["--launcher", "local", "--detach"], 2, "--detach leaves the repeats to SLURM's queue and returns; it goes with "
                                             "--launcher slurm"),
    (["--launcher", "slurm", "--detach", "--until-decided"], 2, "--until-decided looks at the verdict after each "
                                                                "batch of repeats, which needs the head to stay"),
    (["--launcher", "local", "--parallel", str(len(os.sched_getaffinity(0)) + 1)], 2, "needs a CPU core per repeat"),
    (["--launcher", "local", "--nnodes", "2"], 2, "--launcher local runs each repeat on this node; a repeat of "
                                                  "several nodes (--nnodes) is a task of --launcher slurm"),
    (["--nnodes", "2"], 2, "a multi-node run started on each node needs --rdzv-endpoint HOST:PORT and the same "
                           "--run-id on every node; or let SLURM start each repeat's nodes: --launcher slurm"),
    (["--launcher", "slurm", "--nnodes", "2", "--rdzv-endpoint", "n1:29500"], 2,
     "--launcher slurm starts the nodes of each repeat's task itself, and they find each other: drop --node-rank "
     "and --rdzv-endpoint"),
])
def test_bad_launcher_options_are_refused_before_anything_is_written(in_tmp, options, code, sentence):
    result = invoke("run", *options, "--no-tracking", *COMMAND, sys.executable, "-c", "print('score 1')")
    assert result.exit_code == code, result.output
    assert sentence in result.text and "Traceback" not in result.output
    assert not (in_tmp / "runs").exists()


def test_launcher_slurm_without_sbatch_is_refused(in_tmp):
    bare = in_tmp / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    result = invoke("run", "--launcher", "slurm", "--no-tracking", *COMMAND, "python", "-c", "print('score 1')",
                    env={"PATH": str(bare)})
    assert result.exit_code == 4, result.output
    assert "--launcher slurm submits the repeats with sbatch, which is not on PATH here" in result.text
    assert not (in_tmp / "runs").exists()


@TWO_CORES
@pytest.mark.slow
def test_reproduce_reruns_the_publications_repeats_side_by_side(tmp_path):
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "work.py").write_text(SCRIPT)
    (lab / "exp.yaml").write_text(json.dumps({
        "schema": "repro500/recipe/v1", "name": "lab", "fixed": {"command": [sys.executable, "work.py"]},
        "metrics": {"score": {"regex": "score ([0-9.]+)"}},
        "acceptance": {"score": {"target": 0.5, "tolerance": 0.05}}, "repeats": 3, "seed": 4}))
    ran = repro500("run", "exp.yaml", "--no-tracking", "--run-id", "orig", cwd=lab)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    published = repro500("publish", str(lab / "runs" / "orig"), "--out", str(tmp_path / "pub"), cwd=tmp_path)
    assert published.returncode == 0, published.stderr

    done = repro500("reproduce", "pub", "--out", "again", "--run-code", "--launcher", "local", "--parallel", "2",
                    cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((tmp_path / "again" / "verdict.json").read_text())["status"] == "REPRODUCED"
    (rerun,) = (tmp_path / "again" / "runs").iterdir()
    assert json.loads((rerun / "run.json").read_text())["launcher"]["parallel"] == 2
    assert all(json.loads((rerun / "repeats" / str(k) / "summary.json").read_text())["placement"]["threads"] >= 1
               for k in range(3))


def test_reproduce_refuses_parallel_without_a_launcher_before_anything_is_written(in_tmp):
    result = invoke("reproduce", "pub", "--out", "again", "--parallel", "2")
    assert result.exit_code == 2, result.output
    assert "--parallel 2 needs a launcher" in result.text and not (in_tmp / "again").exists()


# Repeats 2 and 3 wait until a file "go" exists: the run is interrupted while they run.
WAITING = """\
import os, time
k = int(os.environ["REPRO500_REPEAT"])
while k >= 2 and not os.path.exists("go"):
    time.sleep(0.1)
print("score 0.5")
"""


@TWO_CORES
@pytest.mark.slow
def test_ctrl_c_stops_the_running_tasks_keeps_finished_repeats_and_resume_completes_the_run(tmp_path):

    (tmp_path / "work.py").write_text(WAITING)
    args = ["--run-id", "cut", "--repeats", "4", "--no-tracking", "--launcher", "local", "--parallel", "2",
            *COMMAND, sys.executable, "work.py"]
    run = tmp_path / "runs" / "cut"
    code, out, err = interrupt_once_started(args, cwd=tmp_path, env=tool_env(), run=run, end_timeout_s=120)
    assert code == 130, out + err
    assert "complete the run with: repro500 run --resume runs/cut" in " ".join(out.split())
    statuses = [json.loads((run / "repeats" / str(k) / "summary.json").read_text())["status"] for k in range(4)]
    assert statuses == ["completed", "completed", "killed", "killed"]

    (tmp_path / "go").write_text("")
    resumed = repro500("run", "--resume", "runs/cut", "--launcher", "local", "--parallel", "2", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    checked = repro500("verify", "runs/cut", cwd=tmp_path)
    assert checked.returncode == 0 and "repeat chain intact" in " ".join(checked.stdout.split()), checked.stdout


NOISY = "import random, sys\nrandom.seed(int(sys.argv[1]))\nprint(f'score {0.95 + random.gauss(0, 0.01):.5f}')\n"


@TWO_CORES
@pytest.mark.slow
def test_until_decided_side_by_side_looks_after_each_batch_and_verifies(tmp_path):
    from repro500.verify import sequential
    from repro500.verify.verdict import verify_run

    (tmp_path / "t.py").write_text(NOISY)
    done = repro500("run", "--run-id", "seq", "--no-tracking", "--launcher", "local", "--parallel", "2", "--until-decided",
                    "--max-repeats", "8", "--command", "--metric", "score=regex:score ([0-9.]+)", "--accept",
                    "score>=0.9", "--", sys.executable, "t.py", "{seed}", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    design = json.loads((tmp_path / "runs/seq/run.json").read_text())["design"]
    # looked at after each batch of two (the 3rd repeat is no look: its batch is still running)
    assert design["batch"] == 2 and sequential.looks(8, 3, 2) == [4, 6, 8]
    assert design["nominal_levels"] == list(sequential.nominal_levels(8, 0.05, "obrien-fleming", batch=2))
    assert "look after 3 repeats" not in done.stdout and "look after 4 repeats" in done.stdout
    assert design["stopped_at"] in (4, 6, 8) and design["decision"] == {"score": "PASS"}
    # no repeat past the look that decided was started
    assert sorted(int(p.name) for p in (tmp_path / "runs/seq/repeats").iterdir()) == list(range(design["stopped_at"]))
    verdict = verify_run(tmp_path / "runs/seq")
    assert verdict.status == "PASS" and verdict.design["look"] == design["stopped_at"]
    assert verdict.design["stop_check"].startswith("re-derived from the repeats")


def test_until_decided_on_slurm_without_a_batch_size_is_refused(in_tmp):
    bare = in_tmp / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    (bare / "sbatch").write_text("#!/bin/sh\nexit 0\n")
    (bare / "sbatch").chmod(0o755)
    result = invoke("run", "--launcher", "slurm", "--until-decided", "--no-tracking", *COMMAND, "python", "-c",
                    "print('score 1')", env={"PATH": str(bare)})
    assert result.exit_code == 2, result.output
    assert "--until-decided --launcher slurm needs --parallel B" in result.text
    assert not (in_tmp / "runs").exists()


def test_launcher_slurm_where_slurm_cannot_be_asked_for_its_partitions_is_refused(in_tmp):
    bare = in_tmp / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    for name, script in (("sbatch", "exit 0"), ("sinfo", "echo 'slurm_load_partitions: Unable to contact slurm controller' >&2; exit 1")):
        (bare / name).write_text(f"#!/bin/sh\n{script}\n")
        (bare / name).chmod(0o755)
    result = invoke("run", "--launcher", "slurm", "--no-tracking", *COMMAND, "python", "-c", "print('score 1')",
                    env={"PATH": str(bare)})
    assert result.exit_code == 4, result.output
    assert ("--launcher slurm cannot ask SLURM for its partitions (sinfo: slurm_load_partitions: Unable to contact "
            "slurm controller)") in result.text
    assert not (in_tmp / "runs").exists()


def test_slurm_resources_without_launcher_slurm_are_refused(in_tmp):
    result = invoke("run", "--launcher", "local", "--slurm", "partition=gpu", "--no-tracking", *COMMAND,
                    sys.executable, "-c", "print('score 1')")
    assert result.exit_code == 2, result.output
    assert "--slurm sets the resources of the repeats' SLURM tasks; it goes with --launcher slurm" in result.text
    assert not (in_tmp / "runs").exists()


def test_nodes_whose_hardware_differs_are_named_and_alike_ones_are_not():
    from repro500.runner.fanout import hardware_note

    def at(node: str, cpu: str, gpus: list[str]) -> dict:
        return {"placement": {"node": node, "hardware": {"cpu": cpu, "cpu_threads": 64, "gpus": gpus}}}

    alike = {0: at("n1", "EPYC 7763", ["A100"]), 1: at("n2", "EPYC 7763", ["A100"]), 2: {"status": "killed"}}
    assert hardware_note(alike) is None
    differ = {**alike, 3: at("n3", "EPYC 7763", ["H100"])}
    assert hardware_note(differ) == ("the repeats ran on nodes whose hardware differs: n1: EPYC 7763 (64 threads), "
                                     "A100; n2: EPYC 7763 (64 threads), A100; n3: EPYC 7763 (64 threads), H100")


def test_reproduce_refuses_slurm_resources_without_launcher_slurm_before_anything_is_written(in_tmp):
    result = invoke("reproduce", "pub", "--out", "again", "--launcher", "local", "--slurm", "partition=gpu")
    assert result.exit_code == 2, result.output
    assert "--slurm sets the resources of the repeats' SLURM tasks; it goes with --launcher slurm" in result.text
    assert not (in_tmp / "again").exists()


def test_a_task_reading_another_copy_of_the_run_directory_is_refused_before_its_repeat(tmp_path):
    # a node whose path reaches a stale copy (synced earlier, not the shared filesystem): the head's
    # mark in run.json's launcher record is not what the task was handed.  The task runs in a process
    # of its own, as under SLURM (it takes the signals and the environment of the process it runs in).
    from helpers.rundirs import make_run

    run = make_run(tmp_path, "copied")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    task = (f"from repro500.runner import fanout\n"
            f"landed = fanout.run_task({str(run)!r}, 3, None, {{'SLURMD_NODENAME': 'n7'}}, False, None, 'slurm', "
            f"{str(tmp_path / 'task.pid')!r}, expected={{fanout.SUBMISSION: 'the-heads-mark'}})\n"
            "print(landed.failed, landed.error)\n")
    done = subprocess.run([sys.executable, "-c", task], capture_output=True, text=True, timeout=120,
                          env=tool_env(SLURMD_NODENAME="n7"))
    assert done.stdout.strip() == (
        f"True node n7 sees another copy of the run directory {run}: its run.json is not the one the head wrote "
        "when it submitted this repeat; the repeats' tasks need a filesystem every node shares"), done.stderr
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # nothing of repeat 3 written


def test_a_tasks_result_file_is_read_as_its_outcome_whatever_it_holds(tmp_path):
    # the head reads a task's result as soon as submitit has written it (before the task's controller
    # ends): a repeat's outcome as it was handed back, and a task that raised, or handed back something
    # else, as a repeat without a result
    import pickle
    from types import SimpleNamespace

    from repro500.runner import fanout

    def job(content) -> SimpleNamespace:
        path = tmp_path / f"result-{len(list(tmp_path.iterdir()))}.pkl"
        path.write_bytes(content if isinstance(content, bytes) else pickle.dumps(content))
        return SimpleNamespace(paths=SimpleNamespace(result_pickle=path))

    handed = fanout.Landed(summary={"status": "completed", "metrics": {"score": 0.5}})
    assert fanout.Local._result(job(("success", handed))) == handed and not handed.failed
    raised = fanout.Local._result(job(("error", "Traceback (most recent call last):\n...\nMemoryError: boom")))
    assert raised.failed and str(raised.error) == "the repeat's task process ended without a result (MemoryError: boom)"
    other = fanout.Local._result(job(("success", 42)))
    assert other.failed and "ended without a result" in str(other.error)
    torn = fanout.Local._result(job(b"\x80\x04truncated"))
    assert torn.failed and str(torn.error) == "the repeat's task left a result that cannot be read (UnpicklingError)"


def test_a_repeat_of_several_ranks_needs_a_cpu_core_per_rank(in_tmp):
    from helpers.runs import write_recipe

    write_recipe(in_tmp / "tiny.yaml")
    cores = len(os.sched_getaffinity(0))
    result = invoke("run", "tiny.yaml", "--no-tracking", "--nproc", "2", "--launcher", "local", "--parallel", str(cores))
    assert result.exit_code == 2, result.output
    assert (f"--parallel {cores} needs a CPU core per rank (2 ranks a repeat), but this process may use {cores}; "
            f"give --parallel {max(1, cores // 2)} or fewer") in result.text
    assert not (in_tmp / "runs").exists()
