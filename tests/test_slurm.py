"""The shipped SLURM script, submitted to a real SLURM: Debian's slurmctld and two slurmd, with munge.

The cluster lives in the test's own directory with its own slurm.conf: free ports on 127.0.0.1,
SlurmUser root, proctrack/linuxproc (every process of a step gets a signal, as under cgroups), no
accounting. Two nodes on this one machine: both slurmd listen on 127.0.0.1 on ports of their own
(distinct NodeHostname, each started with -N), and the second runs in a mount namespace of its own
where its node-local scratch directory holds its own files, as another host's disk would. The test
submits examples/slurm_ddp.sbatch itself, with sbatch's own options for the CPU sizes, and checks
what a user would: the job's exit code and output, the run directory, `repro500 verify`, the
manifest's SLURM facts and MLflow.  The same cluster runs `repro500 run --launcher slurm`: a run's
repeats as one job array, on both nodes at once.

Where slurm, munge or root are missing the tests skip saying why, except under CI
(.ci/run sets REPRO500_REQUIRE_SLURM=1 where it can install them), where they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.runs import COSMO, interrupt_once_started, repro500, write_recipe

pytestmark = pytest.mark.slow  # real daemons and two-node torch runs: about two minutes on 2 cores

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "slurm_ddp.sbatch"  # the shipped script, never a copy
SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "scancel", "squeue", "sinfo", "unshare", "mount")
SECRET = "token-not-for-the-manifest-5f1c"  # a credential in the environment a job is submitted with


def _unavailable() -> str | None:
    missing = [name for name in DAEMONS + CLIENTS if shutil.which(name, path=SBIN) is None]
    if missing:
        return (f"SLURM is not installed here ({', '.join(missing)} not found): "
                "apt-get install slurm-wlm slurmctld slurmd munge")
    if os.geteuid() != 0:
        return "the test cluster runs its daemons as SlurmUser root and mounts a node's scratch: it needs root"
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        return "unshare -m is refused here: the second node cannot have a scratch directory of its own"
    return None


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("REPRO500_REQUIRE_SLURM") == "1":
        pytest.fail(f"REPRO500_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


def _free_ports(n: int) -> list[int]:
    held = [socket.socket() for _ in range(n)]
    try:
        for s in held:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


@dataclass
class Cluster:
    base: Path
    conf: Path
    partition: str
    scratch: Path  # node-local: n1 sees this directory itself ...
    scratch_n2: Path  # ... and n2 sees this one at the same path
    env: dict[str, str]

    def run(self, *cmd: str, timeout: float = 30, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=timeout, **kwargs)

    def job(self, job_id: str) -> dict[str, str]:
        shown = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", shown))

    def cancel_all(self, timeout_s: float = 30) -> None:
        """Cancel every job still queued or running, and wait (bounded) until none is left."""
        deadline = time.monotonic() + timeout_s
        jobs = self.run("squeue", "-h", "-o", "%i").stdout.split()
        if jobs:
            self.run("scancel", *jobs)
        while jobs and time.monotonic() < deadline:
            time.sleep(0.5)
            jobs = self.run("squeue", "-h", "-o", "%i").stdout.split()

    def wait_done(self, job_id: str, timeout_s: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.job(job_id)
            if info.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                return info
            assert time.monotonic() < deadline, f"job {job_id} still {info.get('JobState')} after {timeout_s:.0f} s"
            time.sleep(0.5)


def _conf(base: Path, host: str, ports: list[int], partition: str, munge_socket: Path) -> str:
    ctld, n1, n2 = ports
    return f"""\
ClusterName=r5test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={n1}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
PlugStackConfig={base}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=3600
KillWait=5
InactiveLimit=0
NodeName=n1 NodeHostname=r5test-n1 NodeAddr=127.0.0.1 Port={n1} CPUs=1 RealMemory=2000 State=UNKNOWN
NodeName=n2 NodeHostname=r5test-n2 NodeAddr=127.0.0.1 Port={n2} CPUs=1 RealMemory=2000 State=UNKNOWN
PartitionName={partition} Nodes=n1,n2 Default=YES MaxTime=60 State=UP
"""


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _our_leftovers(conf: Path) -> list[int]:
    """Processes that still run with this cluster's slurm.conf in their environment (a job's, or a
    step daemon's), found by their id: nothing of the cluster may outlive the test."""
    marker = f"SLURM_CONF={conf}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture(scope="module")
def slurm() -> Iterator[Cluster]:
    reason = _unavailable()
    if reason:
        _skip_or_fail(reason)
    # Short: munge's socket and slurmd's step sockets are Unix sockets (108 bytes for a path).
    base = Path(tempfile.mkdtemp(prefix="r5slurm-", dir="/tmp"))
    for sub in ("state", "spool/n1", "spool/n2", "log", "scratch", "scratch-n2"):
        (base / sub).mkdir(parents=True)
    (base / "plugstack.conf").write_text("")
    key = base / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    munge_socket = base / "munge.sock"
    partition = "debug"
    conf = base / "slurm.conf"
    conf.write_text(_conf(base, socket.gethostname().split(".")[0], _free_ports(3), partition, munge_socket))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
    env.update(SLURM_CONF=str(conf), PATH=SBIN)
    logs: list = []
    procs: list[subprocess.Popen] = []

    def start(*cmd: str, log: str) -> subprocess.Popen:
        out = open(base / "log" / log, "w")  # noqa: SIM115 - closed at teardown
        logs.append(out)
        proc = subprocess.Popen(list(cmd), env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append(proc)
        return proc

    cluster = Cluster(base, conf, partition, base / "scratch", base / "scratch-n2", env)
    try:
        start("munged", "-F", "--force", f"--key-file={key}", f"--socket={munge_socket}",
              f"--pid-file={base}/munged.pid", f"--log-file={base}/log/munged.log", f"--seed-file={base}/munged.seed",
              log="munged.out")
        deadline = time.monotonic() + 20
        while not munge_socket.exists():
            assert time.monotonic() < deadline and procs[0].poll() is None, (base / "log/munged.out").read_text()
            time.sleep(0.1)
        start("slurmctld", "-D", "-i", "-f", str(conf), log="slurmctld.out")
        start("slurmd", "-D", "-f", str(conf), "-N", "n1", log="slurmd-n1.out")
        # n2's own scratch: the same path shows n2 another directory, as another host's local disk would
        start("unshare", "-m", "--propagation", "private", "sh", "-c",
              f'mount --bind "{cluster.scratch_n2}" "{cluster.scratch}" && exec slurmd -D -f "{conf}" -N n2',
              log="slurmd-n2.out")
        deadline = time.monotonic() + 60
        while True:
            states = cluster.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
            if states.count("idle") == 2:
                break
            dead = [p.args[0] for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs_text = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((base / "log").iterdir()))
                pytest.fail(f"the test cluster did not come up (exited: {dead}; sinfo: {states})\n{logs_text}")
            time.sleep(0.5)
        yield cluster
    finally:
        with suppress(OSError, subprocess.SubprocessError):  # the controller may be what failed
            cluster.cancel_all()
        for proc in reversed(procs):
            _stop(proc)
        for pid in _our_leftovers(conf):
            os.kill(pid, signal.SIGKILL)
        for out in logs:
            out.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_job_outlives_its_test(slurm: Cluster) -> Iterator[None]:
    """A test that failed with its job still running must not leave the nodes busy for the next."""
    yield
    slurm.cancel_all()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """Where a user submits from: their checkout with its .venv (this repository's)."""
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    return tmp_path


def _cosmo(where: Path, seed: str) -> None:
    for out, split, n in (("cosmo.h5", "train", "40"), ("cosmo-eval.h5", "eval", "8")):
        made = repro500("data", "generate", "cosmo", "--out", str(where / out), "--samples", n, "--size", "16",
                        "--seed", seed, "--split", split, "--force", cwd=where)
        assert made.returncode == 0, made.stderr


def _recipe(path: Path, slurm: Cluster, **changes: object) -> Path:
    """The tiny CosmoFlow recipe reading its data from the nodes' local scratch."""
    return write_recipe(path, COSMO, fixed__dataset__path=str(slurm.scratch / "cosmo.h5"),
                        fixed__dataset__eval_path=str(slurm.scratch / "cosmo-eval.h5"), **changes)


def _same_data_on_both_nodes(slurm: Cluster) -> None:
    _cosmo(slurm.scratch, "2")
    for name in ("cosmo.h5", "cosmo-eval.h5"):
        shutil.copy(slurm.scratch / name, slurm.scratch_n2 / name)


def _submit(slurm: Cluster, cwd: Path, *args: str, wait: bool = False) -> tuple[str, subprocess.CompletedProcess]:
    """sbatch the shipped script as a user on CPU nodes would: one rank per node (NPROC), no GPUs,
    one CPU per task; MLflow in the checkout; a free rendezvous port (other jobs share this host)."""
    env = dict(slurm.env, NPROC="1", RDZV_PORT=str(_free_ports(1)[0]), PYTHONUNBUFFERED="1",
               MLFLOW_TRACKING_URI=f"sqlite:///{cwd / 'mlflow.db'}",
               MLFLOW_TRACKING_TOKEN=SECRET, SLURM_SITE_TOKEN=SECRET)
    cmd = ["sbatch", "--parsable", "--gpus-per-node=0", "--cpus-per-task=1", "--time=10",
           f"--output={cwd}/slurm-%j.out", *(["--wait"] if wait else []), str(SCRIPT), *args]
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600 if wait else 30)
    job_id = done.stdout.strip().split(";")[0].splitlines()[0] if done.stdout.strip() else ""
    assert job_id.isdigit(), f"sbatch said: {done.stdout}{done.stderr}"
    return job_id, done


def _output(cwd: Path, job_id: str) -> str:
    return (cwd / f"slurm-{job_id}.out").read_text()


def _mlflow_runs(cwd: Path, run_id: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{cwd / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments, filter_string=f"tags.`repro500.run_id` = '{run_id}'")


# two and a half minutes of CI's 2 cores: make test-heavy. In CI, the same sbatch script on the same
# two nodes is test_a_node_without_the_venv_or_the_recipe_or_with_other_data_stops_the_job_in_one_sentence,
# a stop and a --resume that completes the run test_ctrl_c_scancels_the_array_keeps_finished_repeats...
@pytest.mark.heavy
def test_a_two_node_job_stopped_by_scancel_keeps_repeat_0_and_its_resubmission_finishes_the_run(slurm, checkout):
    _same_data_on_both_nodes(slurm)
    _recipe(checkout / "cosmo.yaml", slurm, repeats=2, fixed__epochs=6)  # repeat 1 lasts long enough to stop it
    job_id, _ = _submit(slurm, checkout, "cosmo.yaml")
    run_id = f"cosmo-{job_id}"
    run = checkout / "runs" / run_id
    deadline = time.monotonic() + 300
    while not (run / "repeats/1/ranks.json").is_file():  # repeat 1's ranks have started
        state = slurm.job(job_id).get("JobState")
        assert state in ("PENDING", "RUNNING", "CONFIGURING"), f"job {state}:\n{_output(checkout, job_id)}"
        assert time.monotonic() < deadline, f"repeat 1 did not start in 300 s:\n{_output(checkout, job_id)}"
        time.sleep(0.2)
    stopped = slurm.run("scancel", "--signal=TERM", job_id)  # what --signal=TERM@120 sends at the limit
    assert stopped.returncode == 0, stopped.stderr
    info = slurm.wait_done(job_id, 120)
    said = _output(checkout, job_id)
    # node 0's repro500 stops as on Ctrl-C (exit 130); the others end on the signal itself, so srun,
    # and the job, end with 143 (128 + SIGTERM)
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "143:0"), said
    assert f"Interrupted. Finished repeats are kept in runs/{run_id}" in " ".join(said.split()), said
    assert "task 0: Exited with exit code 130" in said, said
    assert "tracking store" not in said and "Traceback" not in said, said  # MLflow's logging outlives the signal
    assert json.loads((run / "repeats/0/summary.json").read_text())["status"] == "completed"
    assert json.loads((run / "run.json").read_text())["status"] != "completed"
    assert [r.info.status for r in _mlflow_runs(checkout, run_id) if "mlflow.parentRunId" not in r.data.tags] == \
        ["KILLED"]

    again, done = _submit(slurm, checkout, "--resume", run_id, "cosmo.yaml", wait=True)
    said = _output(checkout, again)
    assert done.returncode == 0, said  # sbatch --wait: the job's exit code, here verify's PASS
    assert f"Resuming {run_id}: 1 of 2 repeats already finished; running [1]" in said, said
    assert f"node 1: repeat 1 of run {run_id}" in said and "repeat 0 of run" not in said, said

    # the run directory is complete, and verifies anywhere
    meta = json.loads((run / "run.json").read_text())
    assert (meta["status"], meta["world_size"], meta["nnodes"]) == ("completed", 2, 2)
    for k in (0, 1):
        assert json.loads((run / f"repeats/{k}/summary.json").read_text())["world_size"] == 2
        ranks = json.loads((run / f"repeats/{k}/ranks.json").read_text())["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1]
    verified = repro500("verify", str(run), cwd=checkout)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    # the manifest records the scheduler's facts, as SLURM set them for node 0's repro500
    manifest = json.loads((run / "manifest.json").read_text())
    env = manifest["facets"]["environment"]["env"]
    facts = {name: env["values"].get(name) for name in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES",
                                                         "SLURM_NTASKS", "SLURM_CPUS_PER_TASK", "SLURM_JOB_PARTITION",
                                                         "SLURM_NODEID", "SLURM_PROCID")}
    assert facts == {"SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2",
                     "SLURM_NTASKS": "2", "SLURM_CPUS_PER_TASK": "1", "SLURM_JOB_PARTITION": slurm.partition,
                     "SLURM_NODEID": "0", "SLURM_PROCID": "0"}
    # ... and nothing secret: a credential in the job's environment is named, its value is nowhere
    # (SLURM_* values are kept, but not under a secret's name)
    for name in ("MLFLOW_TRACKING_TOKEN", "SLURM_SITE_TOKEN"):
        assert name in env["names"] and name not in env["values"]
    for path in run.rglob("*"):
        assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path

    # MLflow holds the parent run, finished, with the repeats under it
    runs = _mlflow_runs(checkout, run_id)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert [(r.info.run_name, r.info.status) for r in parents] == [(run_id, "FINISHED")]
    finished = sorted(r.info.run_name for r in runs if "mlflow.parentRunId" in r.data.tags
                      and r.info.status == "FINISHED")
    assert finished == [f"{run_id}-repeat-0", f"{run_id}-repeat-1"]


def test_a_node_without_the_venv_or_the_recipe_or_with_other_data_stops_the_job_in_one_sentence(slurm, checkout,
                                                                                              tmp_path_factory):
    _same_data_on_both_nodes(slurm)

    # submitted outside the checkout: every node says it has no .venv, and the job ends with 4
    elsewhere = tmp_path_factory.mktemp("not-a-checkout")
    _recipe(elsewhere / "cosmo.yaml", slurm)
    job_id, done = _submit(slurm, elsewhere, "cosmo.yaml", wait=True)
    said = _output(elsewhere, job_id)
    assert done.returncode == 4, said
    for node in ("node 0 (n1, host ", "node 1 (n2, host "):
        assert f"repro500: error: {node}" in said and f"has no .venv in {elsewhere}" in said, said
    assert not (elsewhere / "runs").exists() and not (elsewhere / "mlflow.db").exists()

    # a recipe on node 0's local disk only: node 1 names itself, and node 0 has written nothing
    _recipe(slurm.scratch / "local.yaml", slurm)
    job_id, done = _submit(slurm, checkout, str(slurm.scratch / "local.yaml"), wait=True)
    said = _output(checkout, job_id)
    assert done.returncode == 4, said
    lines = [line for line in said.splitlines() if line.startswith("repro500: error:")]
    assert lines == [f"repro500: error: recipe {slurm.scratch / 'local.yaml'} does not exist on node 1 (n2, host "
                     f"{socket.gethostname()}) in {checkout}: every node needs the same checkout and paths"], said
    assert not (checkout / "runs").exists() and not (checkout / "mlflow.db").exists()

    # other data on node 1's disk under the same path: both nodes stop with the same sentence, exit 2
    _cosmo(slurm.scratch_n2, "3")
    _recipe(checkout / "cosmo.yaml", slurm)
    job_id, done = _submit(slurm, checkout, "cosmo.yaml", wait=True)
    said = " ".join(_output(checkout, job_id).split())
    assert done.returncode == 2, said
    sentence = f"repro500: error: the nodes disagree before the first step: data:{slurm.scratch / 'cosmo-eval.h5'} is "
    assert said.count(sentence) == 2 and " on node 0 but " in said and f"; data:{slurm.scratch / 'cosmo.h5'} is " in said, said
    assert not (checkout / "runs").exists() and not (checkout / "mlflow.db").exists()


# A deterministic seeded 1-thread workload: its score depends on REPRO500_SEED only.
SEEDED = """\
import os, random
rng = random.Random(int(os.environ["REPRO500_SEED"]))
print(f"score {sum(rng.random() for _ in range(20000)) / 20000:.9f}")
"""
SEEDED_RUN = ("--repeats", "4", "--no-tracking", "--command", "--metric", "score=regex:score ([0-9.]+)",
              "--accept", "score>=0.4", "--")


def _command_recipe(path: Path, **launcher: object) -> Path:
    """A recipe running work.py four times, with the launcher section given."""
    import sys

    path.write_text(json.dumps({
        "schema": "repro500/recipe/v1", "name": "seeded", "fixed": {"command": [sys.executable, "work.py"]},
        "metrics": {"score": {"regex": "score ([0-9.]+)"}}, "acceptance": {"score": {"target": 0.5, "tolerance": 0.1}},
        "repeats": 4, "seed": 4, "launcher": launcher}))
    return path


def _tool_env(slurm: Cluster) -> dict[str, str]:
    """The cluster's environment with this interpreter first on PATH (repro500 passes PYTHONUNBUFFERED itself)."""
    import sys

    env = {k: v for k, v in slurm.env.items() if k != "PYTHONUNBUFFERED"}
    return dict(env, PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")


def test_four_repeats_as_a_job_array_on_two_nodes_make_the_serial_runs_verdict_with_each_node_recorded(slurm,
                                                                                                      checkout):
    import sys

    (checkout / "work.py").write_text(SEEDED)
    env = _tool_env(slurm)
    array = repro500("run", "--run-id", "array", "--launcher", "slurm", "--slurm", "time=5", "--slurm", "mem=500M",
                     "--slurm", "cpus=1", *SEEDED_RUN,
                     sys.executable, "work.py", cwd=checkout, env=env, timeout=300)
    said = array.stdout + array.stderr
    assert array.returncode == 0, said
    serial = repro500("run", "--run-id", "serial", *SEEDED_RUN, sys.executable, "work.py", cwd=checkout, env=env)
    assert serial.returncode == 0, serial.stdout + serial.stderr
    assert sorted(p.name for p in (checkout / "runs").iterdir()) == ["array", "serial"]  # no task folder left
    flat = " ".join(said.split())
    assert "queued as SLURM job " in flat and "running on n1 (SLURM job " in flat and "running on n2" in flat, said

    run = checkout / "runs" / "array"
    checked = repro500("verify", str(run), cwd=checkout, env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "repeat chain intact" in " ".join(checked.stdout.split())
    chain = [json.loads(line) for line in (run / "chain.jsonl").read_text().splitlines()]
    assert sorted(r["repeat"] for r in chain[1:]) == [0, 1, 2, 3]  # one link each

    mine, theirs = ({k: json.loads((checkout / "runs" / r / f"repeats/{k}/summary.json").read_text())
                     for k in range(4)} for r in ("array", "serial"))
    assert [mine[k]["metrics"]["score"] for k in range(4)] == [theirs[k]["metrics"]["score"] for k in range(4)]
    verdicts = [json.loads((checkout / "runs" / r / "verdict.json").read_text()) for r in ("array", "serial")]
    assert verdicts[0]["status"] == verdicts[1]["status"] == "PASS"
    # the array's verdict splits the score by node (both nodes are this machine: no effect to name)
    assert [(g["node"], g["n"]) for g in verdicts[0]["nodes"][0]["groups"]] in ([("n1", 2), ("n2", 2)],
                                                                                [("n1", 1), ("n2", 3)],
                                                                                [("n1", 3), ("n2", 1)])
    assert verdicts[1]["nodes"] is None
    places = [mine[k]["placement"] for k in range(4)]
    assert {p["node"] for p in places} == {"n1", "n2"}  # one CPU each: the array filled both nodes
    assert all(p["hardware"]["cpu_threads"] >= 1 and "gpus" in p["hardware"] for p in places), places
    assert "hardware differs" not in flat  # both nodes are this machine
    assert all(p["launcher"] == "slurm" and p["partition"] == slurm.partition and p["threads"] == 1
               and re.fullmatch(r"\d+_[0-3]", p["job_id"]) and p["host"] for p in places), places
    meta = json.loads((run / "run.json").read_text())
    assert meta["launcher"]["kind"] == "slurm" and meta["launcher"]["parallel"] == 4
    assert meta["launcher"]["slurm"] == {"partition": slurm.partition, "time": 5, "cpus": 1, "mem": "500M"}


def test_until_decided_submits_a_job_array_up_to_each_look(slurm, checkout):
    import sys

    (checkout / "work.py").write_text(SEEDED)
    # scores 0.5 +- 0.002 against a bound at their mean: no look decides, the run goes to its maximum
    done = repro500("run", "--run-id", "seq", "--launcher", "slurm", "--parallel", "2", "--slurm", "time=5",
                    "--slurm", "cpus=1", "--until-decided", "--max-repeats", "6", "--no-tracking", "--command",
                    "--metric", "score=regex:score ([0-9.]+)", "--accept", "score>=0.5", "--",
                    sys.executable, "work.py", cwd=checkout, env=_tool_env(slurm), timeout=300)
    said = done.stdout + done.stderr
    assert done.returncode == 3, said
    run = checkout / "runs" / "seq"
    design = json.loads((run / "run.json").read_text())["design"]
    assert design["batch"] == 2 and design["stopped_at"] is None, design
    assert "look after 4 repeats" in said and "look after 6 repeats" in said and "look after 5" not in said
    places = [json.loads((run / f"repeats/{k}/summary.json").read_text())["placement"] for k in range(6)]
    arrays = [p["job_id"].split("_")[0] for p in places]
    # the repeats before the first look in one array (two at a time), the next batch in another once it was taken
    assert len(set(arrays[:4])) == 1 and len(set(arrays[4:])) == 1 and arrays[0] != arrays[4], \
        [p["job_id"] for p in places]
    from repro500.verify.verdict import verify_run

    verdict = verify_run(run)
    assert verdict.status == "INCONCLUSIVE" and verdict.design["look"] == 6
    assert verdict.design["stop_check"] == "nothing to re-derive: no look decided the run"


def test_launcher_slurm_refuses_an_unknown_partition_and_parallel_0_before_anything_is_submitted(slurm, checkout):
    import sys

    env = _tool_env(slurm)
    for options, sentence in (
            (["--slurm", "partition=gpu"], f"SLURM has no partition gpu (partitions: {slurm.partition})"),
            (["--parallel", "0"], "--parallel must be a whole number of repeats of at least 1, not 0"),
            (["--slurm", "time=soon"], "--slurm time= takes a whole number of minutes of at least 1, not soon"),
            (["--slurm", "nodes=2"], "--slurm nodes is not one of partition, time, cpus, gpus, mem, account, qos"),
            (["--slurm", "time=61"], f"--slurm time=61 is more than partition {slurm.partition} allows (60 minutes)")):
        done = repro500("run", "--launcher", "slurm", *options, *SEEDED_RUN, sys.executable, "-c", "print(1)",
                        cwd=checkout, env=env)
        assert done.returncode == 2, done.stdout + done.stderr
        assert sentence in " ".join(done.stderr.split()) and "Traceback" not in done.stderr, done.stderr
        assert not (checkout / "runs").exists()
        assert slurm.run("squeue", "-h").stdout.strip() == ""
    # what only sbatch can refuse (more memory than any node has): said in sbatch's words, nothing queued
    done = repro500("run", "--run-id", "big", "--launcher", "slurm", "--slurm", "mem=999999G", *SEEDED_RUN,
                    sys.executable, "-c", "print('score 1')", cwd=checkout, env=env)
    assert done.returncode == 4, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert said == ("repro500: error: sbatch refused the repeats' job array: Memory specification can not be "
                    "satisfied; Batch job submission failed: Requested node configuration is not available"), said
    assert slurm.run("squeue", "-h").stdout.strip() == ""
    shutil.rmtree(checkout / "runs")
    # a recipe's partition is checked as --slurm's is
    (checkout / "work.py").write_text(SEEDED)
    _command_recipe(checkout / "exp.yaml", slurm={"partition": "nope"})
    done = repro500("run", "exp.yaml", "--no-tracking", "--launcher", "slurm", cwd=checkout, env=env)
    assert done.returncode == 2 and "SLURM has no partition nope (partitions: debug)" in done.stderr, done.stderr
    assert not (checkout / "runs").exists() and slurm.run("squeue", "-h").stdout.strip() == ""


# Repeats 2 and 3 wait until a file "go" exists: the run is interrupted while they run.
WAITING = """\
import os, time
k = int(os.environ["REPRO500_REPEAT"])
while k >= 2 and not os.path.exists("go"):
    time.sleep(0.1)
print("score 0.5")
"""


def test_ctrl_c_scancels_the_array_keeps_finished_repeats_and_resume_completes_the_run(slurm, checkout):
    import sys

    (checkout / "work.py").write_text(WAITING)
    env = _tool_env(slurm)
    run = checkout / "runs" / "cut"
    code, out, err = interrupt_once_started(["--run-id", "cut", "--launcher", "slurm", "--slurm", "time=5", *SEEDED_RUN,
                                             sys.executable, "work.py"], cwd=checkout, env=env, run=run,
                                            start_timeout_s=120)
    assert code == 130, out + err
    said = " ".join(out.split())
    assert "complete the run with: repro500 run --resume runs/cut --launcher slurm --parallel 4 --slurm " \
           f"partition={slurm.partition} --slurm time=5" in said, out + err
    assert slurm.run("squeue", "-h").stdout.strip() == ""  # nothing of the array left queued or running
    statuses = [json.loads((run / "repeats" / str(k) / "summary.json").read_text())["status"] for k in range(4)]
    assert statuses == ["completed", "completed", "killed", "killed"]
    assert not (checkout / "runs" / ".tasks").exists()  # the pickled tasks (the run's environment) are gone

    (checkout / "go").write_text("")
    resumed = repro500("run", "--resume", "runs/cut", "--launcher", "slurm", "--slurm", "time=5", cwd=checkout,
                       env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    places = [json.loads((run / "repeats" / str(k) / "summary.json").read_text())["placement"] for k in (2, 3)]
    assert all(p["node"] in ("n1", "n2") for p in places), places
    checked = repro500("verify", "runs/cut", cwd=checkout, env=env)
    assert checked.returncode == 0 and "repeat chain intact" in " ".join(checked.stdout.split()), checked.stdout


def test_a_detached_head_leaves_the_array_to_slurm_and_its_resume_collects_and_concludes_the_run(slurm, checkout):
    import sys

    from mlflow.tracking import MlflowClient

    # "go" outside the experiment's directory: a task that starts after the resume checks the
    # experiment's files against what the head planned, and a new file there would be another experiment
    go = checkout.parent / f"go-{checkout.name}"
    (checkout / "work.py").write_text(WAITING.replace('"go"', 'os.environ["GO"]'))
    uri = f"sqlite:///{checkout / 'mlflow.db'}"
    env = dict(_tool_env(slurm), MLFLOW_TRACKING_URI=uri, GO=str(go))
    run = checkout / "runs" / "away"
    # five repeats on two one-CPU nodes: 0 and 1 end with no head watching, 2 and 3 wait for "go",
    # and 4 is still pending when the resume starts (it then checks run.json as every task does)
    tracked_run = ["--repeats", "5", *[arg for arg in SEEDED_RUN[2:] if arg != "--no-tracking"]]
    left = repro500("run", "--run-id", "away", "--launcher", "slurm", "--slurm", "time=5", "--detach", *tracked_run,
                    sys.executable, "work.py", cwd=checkout, env=env, timeout=300)
    said = " ".join((left.stdout + left.stderr).split())
    assert left.returncode == 0, said
    assert re.search(r"Submitted: 5 repeat\(s\) queued as SLURM job array (\d+); the head leaves them to SLURM", said)
    assert "Collect them and conclude the run with: repro500 run --resume runs/away --launcher slurm" in said
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "submitted" and sorted(meta["launcher"]["detached"]["jobs"]) == ["0", "1", "2", "3", "4"]
    assert (checkout / "runs" / ".tasks" / meta["launcher"]["detached"]["folder"]).is_dir()  # kept for the resume
    client = MlflowClient(uri)
    parent = client.get_run(meta["mlflow"]["parent_run_id"])
    assert parent.info.status == "RUNNING"  # the run goes on without its head

    deadline = time.monotonic() + 180  # repeats 0 and 1 finish with no head watching; 2 and 3 wait for "go"
    while time.monotonic() < deadline and not all((run / f"repeats/{k}/summary.json").is_file() for k in (0, 1)):
        time.sleep(0.5)
    assert all((run / f"repeats/{k}/summary.json").is_file() for k in (0, 1))
    def queued(state: str) -> list[str]:
        return sorted(t.split("_")[1] for t in slurm.run("squeue", "-h", "-r", "-t", state, "-o", "%i").stdout.split())

    while time.monotonic() < deadline and (queued("RUNNING"), queued("PENDING")) != (["2", "3"], ["4"]):
        time.sleep(0.5)  # SLURM starts 2 and 3 on the nodes 0 and 1 left
    assert (queued("RUNNING"), queued("PENDING")) == (["2", "3"], ["4"])
    standing = repro500("status", "runs/away", cwd=checkout, env=env)
    lines = standing.stdout.splitlines()
    assert standing.returncode == 0 and "5 repeat(s) are SLURM's" in lines[0], standing.stdout + standing.stderr
    assert re.fullmatch(r"  repeat 0: ended \(completed; SLURM job \d+_0\), its result not yet collected", lines[1])
    assert re.fullmatch(r"  repeat 2: running on n[12] \(SLURM job \d+_2\)", lines[3]), lines
    assert re.fullmatch(r"  repeat 4: pending \(SLURM job \d+_4\)", lines[5]), lines
    assert lines[6] == "collect them and conclude the run with: repro500 run --resume runs/away"
    before = (run / "run.json").read_bytes()
    local = repro500("run", "--resume", "runs/away", "--launcher", "local", cwd=checkout, env=env)
    assert local.returncode == 2 and "resume it with --launcher slurm (or no --launcher)" in " ".join(
        local.stderr.split()), local.stdout + local.stderr
    assert (run / "run.json").read_bytes() == before  # refused before anything was written

    go.write_text("")
    collected = repro500("run", "--resume", "runs/away", cwd=checkout, env=env, timeout=300)
    flat = " ".join((collected.stdout + collected.stderr).split())
    assert collected.returncode == 0, flat
    assert "(submitted before the head left)" in flat, flat
    assert slurm.run("squeue", "-h").stdout.strip() == ""
    assert not (checkout / "runs" / ".tasks").exists()  # collected: the pickled tasks are gone
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "completed" and "detached" not in meta["launcher"]
    chain = [json.loads(line) for line in (run / "chain.jsonl").read_text().splitlines()]
    assert sorted(r["repeat"] for r in chain[1:]) == [0, 1, 2, 3, 4]  # each linked once, by the head that collected it
    summaries = [json.loads((run / f"repeats/{k}/summary.json").read_text()) for k in range(5)]
    assert [s["status"] for s in summaries] == ["completed"] * 5  # repeat 4 started after the resume, and ran
    checked = repro500("verify", "runs/away", "--check-tracking", cwd=checkout, env=env)
    text = " ".join(checked.stdout.split())
    assert checked.returncode == 0 and "repeat chain intact" in text and "MLflow agrees: 5 repeat(s)" in text, text
    runs = client.search_runs([parent.info.experiment_id])
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 6  # the parent and one run per repeat, all ended


def test_a_task_scancelled_from_outside_is_a_failed_repeat_and_resume_reruns_it(slurm, checkout):
    import sys

    (checkout / "work.py").write_text(WAITING)
    env = _tool_env(slurm)
    # the resources from the recipe's launcher section this time
    _command_recipe(checkout / "exp.yaml", parallel=2, slurm={"partition": slurm.partition, "time": 5})
    proc = subprocess.Popen([sys.executable, "-m", "repro500.cli", "run", "exp.yaml", "--run-id", "lost",
                             "--no-tracking", "--launcher", "slurm"],
                            cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = checkout / "runs" / "lost"
    deadline = time.monotonic() + 120
    while not all((run / f"repeats/{k}/stdout.txt").exists() for k in (2, 3)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    meta = json.loads((run / "run.json").read_text())
    array_id = slurm.run("squeue", "-h", "-r", "-o", "%i").stdout.split()[0].split("_")[0]
    # repeat 2's task is cancelled (SIGTERM: it stops its repeat and says so); repeat 3's process is
    # killed outright, as a node dying would take it, and leaves no result at all
    assert slurm.run("scancel", f"{array_id}_2").returncode == 0
    (pid_file,) = (checkout / "runs" / ".tasks").glob("lost-*/task-3.pid")
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 5, out + err
    said = " ".join(err.split())
    assert "repeat 2 failed: RuntimeError: the repeat's task was stopped by a signal" in said, out + err
    assert "repeat 3 (4 of 4): failed after" in " ".join(out.split()), out
    summary = json.loads((run / "repeats/3/summary.json").read_text())
    assert re.search(rf"RuntimeError: SLURM task {array_id}_3 on n[12] ended without a result \(cancelled, out of "
                     rf"time or memory, or its node failed; scontrol show job {array_id}_3 says which",
                     summary["error"]), summary
    assert "repro500 run --resume runs/lost" in said and "Traceback" not in said, err
    statuses = [json.loads((run / "repeats" / str(k) / "summary.json").read_text())["status"] for k in range(4)]
    assert statuses == ["completed", "completed", "failed", "failed"]
    (checkout / "go").write_text("")
    assert meta["launcher"]["parallel"] == 2  # --array=0-3%2
    assert meta["launcher"]["slurm"] == {"partition": slurm.partition, "time": 5}
    assert "launcher" not in (run / "recipe.yaml").read_text()  # how it ran, not what the benchmark is

    resumed = repro500("run", "--resume", "runs/lost", "--launcher", "slurm", "--slurm", "time=5", cwd=checkout,
                       env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "repeat 2 (3 of 4): running on n" in " ".join(resumed.stdout.split())
    assert "repeat 3 (4 of 4): running on n" in " ".join(resumed.stdout.split())
    checked = repro500("verify", "runs/lost", cwd=checkout, env=env)
    assert checked.returncode == 0 and "repeat chain intact" in " ".join(checked.stdout.split()), checked.stdout


# Repeat 1's first attempt saves its state and runs until SLURM preempts it; its second attempt
# continues from that state and finishes.  The mark lies outside the experiment's directory, whose
# files every node's task checks against the head's.
PREEMPTED = """\
import os, time
k = int(os.environ["REPRO500_REPEAT"])
state = os.path.join(os.environ["REPRO500_CHECKPOINT_DIR"], "state.txt")
if os.path.exists(state):
    print("continued from", open(state).read())
if k == 1 and not os.path.exists(os.environ["ATTEMPTED"]):
    with open(state, "w") as fh:
        fh.write("step 7")
    with open(os.environ["ATTEMPTED"], "w") as fh:
        fh.write(os.environ["SLURMD_NODENAME"])
    while True:
        time.sleep(0.1)
print("score 0.5")
"""


def _start_when_requeued(slurm: Cluster, task: str, head: subprocess.Popen) -> None:
    """SLURM holds a requeued job until a begin time a minute or two ahead (pending, reason
    BeginTime); the test lets it start at once, as an idle cluster's next scheduling pass would
    later: what is tested is the requeue and the attempt after it, not SLURM's hold."""
    deadline = time.monotonic() + 120
    while head.poll() is None and time.monotonic() < deadline:
        state = slurm.run("squeue", "-h", "-j", task, "-o", "%T %r").stdout.split()
        if state[:2] == ["PENDING", "BeginTime"]:
            slurm.run("scontrol", "update", f"JobId={task}", "StartTime=now")
            return
        time.sleep(0.5)


def test_a_preempted_task_is_requeued_and_its_repeat_runs_again_linked_once(slurm, checkout):
    import sys

    (checkout / "work.py").write_text(PREEMPTED)
    attempted = checkout.parent / f"attempted-{checkout.name}"  # shared by both nodes (their scratch is not)
    env = dict(_tool_env(slurm), ATTEMPTED=str(attempted))
    proc = subprocess.Popen([sys.executable, "-m", "repro500.cli", "run", "--run-id", "pre", "--launcher", "slurm",
                             "--slurm", "time=5", "--repeats", "2", "--no-tracking", "--command", "--metric",
                             "score=regex:score ([0-9.]+)", "--accept", "score>=0.4", "--", sys.executable, "work.py"],
                            cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not attempted.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    array_id = slurm.run("squeue", "-h", "-r", "-o", "%i").stdout.split()[0].split("_")[0]
    # what SLURM sends a task whose time is ending or that a preempting job displaces: submitit's
    # signal (USR2), on which the task is checkpointed and requeued
    assert slurm.run("scancel", "--signal=USR2", f"{array_id}_1").returncode == 0
    _start_when_requeued(slurm, f"{array_id}_1", proc)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, out + err
    said = " ".join(out.split())
    assert re.search(rf"repeat 1 \(2 of 2\): requeued as SLURM job {array_id}_1 \(preempted or out of time on "
                     r"n[12]; its repeat starts again, from the state its command saved in \$REPRO500_CHECKPOINT_DIR "
                     r"where it saved one\)", said), said
    # (its second start is shown too where the head's squeue, once a second, sees the task running:
    # a short repeat may start and end between two looks)
    run = checkout / "runs" / "pre"
    summaries = [json.loads((run / f"repeats/{k}/summary.json").read_text()) for k in (0, 1)]
    assert [s["status"] for s in summaries] == ["completed", "completed"]
    assert [s["placement"]["restarts"] for s in summaries] == [0, 1]
    # the requeued attempt continued from what the first one saved, and says so
    assert (run / "repeats/1/stdout.txt").read_text().startswith("continued from step 7")
    assert summaries[1]["checkpoint"]["continued"] and summaries[1]["checkpoint"]["files"] == 1
    assert "checkpoint" not in summaries[0] and not (run / "repeats/0/checkpoint").exists()
    chain = [json.loads(line) for line in (run / "chain.jsonl").read_text().splitlines()]
    assert sorted(r["repeat"] for r in chain[1:]) == [0, 1]  # the requeued repeat is linked once
    checked = repro500("verify", "runs/pre", cwd=checkout, env=env)
    assert checked.returncode == 0 and "repeat chain intact" in " ".join(checked.stdout.split()), checked.stdout
    assert "repeat(s) 1 continued from the state their command saved" in " ".join(checked.stdout.split())
    assert not list((checkout / "runs").glob(".tasks/pre-*"))  # the pickled tasks went with the head


def test_a_node_with_other_data_is_refused_with_its_name_before_its_repeat(slurm, checkout):
    import sys

    (checkout / "work.py").write_text(SEEDED)
    (slurm.scratch / "input.txt").write_text("the head's data\n")
    (slurm.scratch_n2 / "input.txt").write_text("n2's own data!!\n")  # the same path, another disk's file
    env = _tool_env(slurm)
    done = repro500("run", "--run-id", "split", "--launcher", "slurm", "--slurm", "time=5", "--repeats", "2",
                    "--no-tracking", "--command", "--input", str(slurm.scratch / "input.txt"), "--metric",
                    "score=regex:score ([0-9.]+)", "--accept", "score>=0.4", "--", sys.executable, "work.py",
                    cwd=checkout, env=env, timeout=300)
    said = " ".join(done.stderr.split())
    assert done.returncode == 4, done.stdout + done.stderr
    assert f"node n2 does not run what the head planned: data:{slurm.scratch / 'input.txt'} is " in said, said
    assert " on node n2 but " in said and " on the head; every node needs the same code, environment and data" in said
    assert "Traceback" not in done.stderr
    run = checkout / "runs" / "split"
    statuses = {json.loads((run / f"repeats/{k}/summary.json").read_text())["status"] for k in (0, 1)}
    assert statuses == {"completed", "failed"}  # n1's repeat ran and is kept


def test_repeats_of_two_ranks_are_tasks_of_either_launcher_or_of_two_nodes_with_the_serial_runs_parameters(
        slurm, checkout):
    # the tiny classification recipe (synthetic data: nothing to place on the nodes), two DDP ranks a
    # repeat: serially, as a task of this node, as a SLURM array task (one CPU a node here, so the
    # two ranks share it: --slurm cpus=1; by default a task asks for a CPU per rank), and as a SLURM
    # task of both nodes, one rank on each (the world size of the others, so the same training)
    write_recipe(checkout / "tiny.yaml", fixed__epochs=1, repeats=1)  # one repeat each: four trainings in all
    env = _tool_env(slurm)
    runs = {"serial": ("--nproc", "2"), "local": ("--nproc", "2", "--launcher", "local"),
            "slurm": ("--nproc", "2", "--launcher", "slurm", "--slurm", "time=5", "--slurm", "cpus=1"),
            "nodes": ("--nproc", "1", "--nnodes", "2", "--launcher", "slurm", "--slurm", "time=5")}
    for run_id, options in runs.items():
        done = repro500("run", "tiny.yaml", "--no-tracking", "--run-id", run_id, *options, cwd=checkout, env=env,
                        timeout=600)
        assert done.returncode in (0, 1, 3), done.stdout + done.stderr  # a verdict, whichever
    summaries = {run_id: [json.loads((checkout / "runs" / run_id / "repeats/0/summary.json").read_text())]
                 for run_id in runs}
    for run_id, ranks in (("local", 2), ("slurm", 2), ("nodes", 1)):  # the same training, bit for bit, wherever its ranks ran
        assert [s["final_param_digest"] for s in summaries[run_id]] == \
               [s["final_param_digest"] for s in summaries["serial"]], run_id
        assert all(s["world_size"] == 2 and s["placement"]["ranks"] == ranks and s["placement"]["threads"] == 1
                   for s in summaries[run_id]), [s["placement"] for s in summaries[run_id]]
    assert {s["placement"]["node"] for s in summaries["slurm"]} <= {"n1", "n2"}
    assert [s["placement"]["nodes"] for s in summaries["nodes"]] == [["n1", "n2"]]  # node 0 first: it wrote the repeat
    assert summaries["nodes"][0]["placement"]["node"] == "n1"
    launchers = {run_id: json.loads((checkout / "runs" / run_id / "run.json").read_text()) for run_id in ("slurm", "nodes")}
    assert launchers["slurm"]["launcher"]["ranks"] == 2 and launchers["slurm"]["launcher"]["nodes"] == 1
    assert (launchers["nodes"]["launcher"]["nodes"], launchers["nodes"]["nnodes"], launchers["nodes"]["world_size"]) \
        == (2, 2, 2)
    for run_id in ("local", "slurm", "nodes"):
        checked = repro500("verify", f"runs/{run_id}", cwd=checkout, env=env)
        assert "repeat chain intact" in " ".join(checked.stdout.split()), checked.stdout


def test_a_task_of_two_nodes_whose_second_node_has_other_data_stops_both_nodes_naming_it(slurm, checkout):
    # the head and n1 read the data SLURM's n2 sees under the same path with other bytes: n2 refuses
    # itself before the first step, node 0 (n1) stops with n2's sentence, nothing trains
    _cosmo(slurm.scratch, "2")
    _cosmo(slurm.scratch_n2, "3")
    _recipe(checkout / "cosmo.yaml", slurm, repeats=1)
    done = repro500("run", "cosmo.yaml", "--run-id", "apart", "--no-tracking", "--nproc", "1", "--nnodes", "2",
                    "--launcher", "slurm", "--slurm", "time=5", cwd=checkout, env=_tool_env(slurm), timeout=300)
    said = " ".join(done.stderr.split())
    assert done.returncode == 4, done.stdout + done.stderr
    assert f"node n2 does not run what the head planned: data:{slurm.scratch / 'cosmo-eval.h5'} is " in said, said
    assert " on node n2 but " in said and "every node needs the same code, environment and data" in said
    assert "Traceback" not in done.stderr
    summary = json.loads((checkout / "runs/apart/repeats/0/summary.json").read_text())
    assert summary["status"] == "failed" and "final_param_digest" not in summary
