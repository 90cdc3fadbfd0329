"""Multi-node runs under faults: the nodes agree before the first step, every node blames the rank
that died, node 0 keeps every node's launcher log, and a resume keeps the run's topology."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.ports import free_port
from helpers.runs import COSMO, repro500, write_recipe

from repro500.capture.source import package_digest
from repro500.errors import InvalidInput, UsageError
from repro500.runner.plan import RunOptions, check_options
from repro500.workloads.engines import nodes

# torchrun's "Root Cause" block as its elastic agent prints it (errors/__init__.py's template)
ROOT_CAUSE = """
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-24_12:00:03
  host      : node-b
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
"""
LOST_PEER = ROOT_CAUSE.replace("node-b", "node-a").replace("3 (local_rank: 1)", "0 (local_rank: 0)").replace(
    "-9 (pid: 4242)", "1 (pid: 17)").replace("Signal 9 (SIGKILL) received by PID 4242",
                                             "RuntimeError: [gloo] Connection closed by peer").replace(
    "12:00:03", "12:00:01")


def test_a_launcher_report_names_rank_local_rank_pid_and_signal():
    report = nodes.launcher_report(ROOT_CAUSE, 1)
    assert (report["rank"], report["local_rank"], report["pid"], report["signal"], report["host"]) == \
        (3, 1, 4242, 9, "node-b")
    assert nodes.launcher_report("all fine", 0)["ok"] is True


def test_a_rank_that_raised_is_named_with_its_own_error_line():
    """torchrun's report of a worker without its error handler says only "To enable traceback see
    ..."; the rank's own last line says why it failed."""
    raised = ROOT_CAUSE.replace("-9 (pid: 4242)", "1 (pid: 4242)").replace(
        "Signal 9 (SIGKILL) received by PID 4242", "To enable traceback see: "
        "https://pytorch.org/docs/stable/elastic/errors.html")
    output = ("[rank3]: Traceback (most recent call last):\n[rank3]:   File \"train.py\", line 1, in <module>\n"
              "[rank2]: RuntimeError: [gloo] Connection closed by peer\n"
              "[rank3]: repro500.errors.InvalidInput: no eval files in cls.h5\n" + raised)
    report = nodes.launcher_report(output, 1)
    assert report["detail"] == "InvalidInput: no eval files in cls.h5"
    assert nodes.describe({**report, "node_rank": 1}).endswith("exited with code 1 (InvalidInput: no eval files in "
                                                                "cls.h5)")


def test_every_node_blames_the_killed_rank_not_the_one_that_lost_its_peer():
    node0 = {**nodes.launcher_report(LOST_PEER, 1), "node_rank": 0}
    node1 = {**nodes.launcher_report(ROOT_CAUSE, 1), "node_rank": 1}
    assert node0["signal"] is None and node0["time"] < node1["time"]  # node 0 noticed first
    for order in ([node0, node1], [node1, node0]):
        assert nodes.blame(order)["rank"] == 3
    text = nodes.describe(nodes.blame([node0, node1]))
    assert text == "rank 3 (node 1 on host node-b, local rank 1, pid 4242) was killed by signal 9 (SIGKILL)"
    # without a signal, a rank that failed on its own goes before one that lost its peer
    crashed = {**node1, "signal": None, "exitcode": 1, "detail": "ValueError: nan in batch", "time": "2026-11-24_12:00:09"}
    assert nodes.blame([node0, crashed])["rank"] == 3
    assert nodes.blame([{**node0, "ok": True}]) is None


def test_a_disagreement_names_the_key_the_values_and_the_nodes():
    base = {"mutable.optimizer.lr": "0.05", "code.repro500": "0.1.0+abc", "data:train.h5": "aa"}
    prints = {0: base, 1: {**base, "mutable.optimizer.lr": "0.1"}, 2: base}
    assert nodes.disagreement({0: base, 1: dict(base)}) is None
    problem = nodes.disagreement(prints)
    assert "mutable.optimizer.lr is 0.05 on nodes 0, 2 but 0.1 on node 1" in problem
    assert "data:train.h5" not in problem
    missing = nodes.disagreement({0: base, 1: {k: v for k, v in base.items() if not k.startswith("data")}})
    assert "data:train.h5 is aa on node 0 but absent on node 1" in missing


def test_the_fingerprint_names_the_design_torch_and_the_plugin_distributions(in_tmp, monkeypatch):
    """What the nodes compare besides the recipe: a factorial design, a sequential one, torch, and
    the version of every installed plug-in distribution the recipe uses."""
    import torch

    from repro500.recipe import load as recipes
    from repro500.runner import multinode
    from repro500.runner.plan import design_repeats, load_recipe, make_plan
    from repro500.workloads import plugins

    site = in_tmp / "site"
    (site / "labnets").mkdir(parents=True)
    (site / "labnets" / "__init__.py").write_text(
        "import torch\n\ndef build(num_classes=10, **kw):\n    return torch.nn.Linear(4, num_classes)\n")
    info = site / "labnets-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: labnets\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text("[repro500.models]\nlab_linear = labnets:build\n")
    monkeypatch.syspath_prepend(str(site))
    plugins.registered.cache_clear()
    try:
        write_recipe(in_tmp / "c.yaml", fixed__model="lab_linear")
        options = design_repeats(RunOptions(recipe="c.yaml", vary=["init", "data_order"], repeats_per_cell=2))
        plan = make_plan(load_recipe(options), options)
        fp = multinode.fingerprint(plan, "x")
    finally:
        plugins.registered.cache_clear()
    assert fp["code.plugin.labnets"] == "0.3" and fp["code.torch"].startswith(torch.__version__)
    # the nodes compare the digest of repro500's code that the manifest records
    package = sys.modules["repro500"]
    version, digest = fp["code.repro500"].split("+")
    assert version == package.__version__
    assert package_digest(Path(package.__file__).parent).startswith(digest) and len(digest) == 16
    assert (fp["design.vary"], fp["design.repeats_per_cell"], fp["repeats"]) == ("init,data_order", "2", "4")
    assert fp["design.until_decided"] == "false" and multinode.fingerprint(plan, "x", True)["design.until_decided"] == "true"
    assert isinstance(recipes.load(in_tmp / "c.yaml").repeats, int)


@pytest.mark.parametrize(("options", "says"), [
    (RunOptions(resume="runs/x", nnodes=2, node_rank=1, rdzv_endpoint="h:29500"), "on node 0 only"),
    (RunOptions(recipe="r.yaml", nnodes=2, run_id="x", rdzv_endpoint="h:99999"), "not HOST:PORT"),
    (RunOptions(recipe="r.yaml", nnodes=2, run_id="x", rdzv_endpoint="29500"), "not HOST:PORT"),
    (RunOptions(recipe="r.yaml", nnodes=2, run_id="x", rdzv_endpoint="h:29500", until_decided=True),
     "--until-decided runs on one node: node 0 alone decides when to stop"),
])
def test_multinode_options_are_checked_before_anything_runs(options, says):
    with pytest.raises(UsageError, match=says):
        check_options(options)


@contextmanager
def _rendezvous_port_with_the_next_one_taken():
    """A free port P on 127.0.0.1 while another program listens on P + 1: a run needs one free port,
    not two next to each other."""
    for _ in range(50):
        with socket.socket() as probe, socket.socket() as taken:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
            try:
                taken.bind(("0.0.0.0", port + 1))
            except OSError:
                continue
            taken.listen()
            probe.close()
            yield port
            return
    raise RuntimeError("no free port on 127.0.0.1 with the next one free to take")


def _agree_on_two_nodes(port, follower_print=None):
    """Node 0 and node 1 agreeing through NodeLinks in two threads; returns what each got or raised."""
    endpoint = f"127.0.0.1:{port}"
    links = [nodes.NodeLink({"endpoint": endpoint, "nnodes": 2, "node_rank": r}) for r in (0, 1)]
    got: dict[int, object] = {}

    def node(rank):
        try:
            fp = {"recipe": "a"} if rank == 0 or follower_print is None else follower_print
            got[rank] = links[rank].agree(fp, todo=[1] if rank == 0 else None, run_dir="runs/x")
        except Exception as err:  # noqa: BLE001 - the test compares what each node raised
            got[rank] = err

    threads = [threading.Thread(target=node, args=(r,), daemon=True) for r in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "the nodes did not agree within 60 s"
    return links, got


@pytest.fixture
def port_beside_a_taken_one():
    with _rendezvous_port_with_the_next_one_taken() as port:
        yield port


def test_one_free_port_is_enough_and_it_is_free_again_for_torchrun_once_the_nodes_agree():
    with _rendezvous_port_with_the_next_one_taken() as port:
        links, got = _agree_on_two_nodes(port)
        assert got == {0: [1], 1: [1]} and links[1].run_dir == "runs/x"
        assert links[0].port == links[1].port not in (port, port + 1)  # published by node 0, found by node 1
        with socket.socket() as torchrun:  # torchrun's rendezvous binds the port for every repeat
            torchrun.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            torchrun.bind(("0.0.0.0", port))
        # the run's store outlives the rendezvous port: a failed repeat's reports still travel
        links[1].report(0, {"ok": False, "rank": 1})
        links[0].report(0, {"ok": True, "rank": None})
        assert [(r["node_rank"], r["ok"]) for r in links[0].reports(0)] == [(0, True), (1, False)]


def test_a_disagreement_still_reaches_every_node_through_the_published_store():
    with _rendezvous_port_with_the_next_one_taken() as port:
        _, got = _agree_on_two_nodes(port, follower_print={"recipe": "b"})
    assert all(isinstance(got[r], UsageError) and "recipe is a on node 0 but b on node 1" in str(got[r])
               for r in (0, 1)), got


def test_a_node_that_refused_itself_stops_every_node_with_its_own_sentence():
    # a SLURM task's node whose data differs from what the head planned: it states only its refusal,
    # and node 0 (whose fingerprint differs on every key) says that sentence, not a key-by-key diff
    refusal = "node n2 does not run what the head planned: data:/d/x is 1f on node n2 but 9c on the head"
    assert nodes.disagreement({0: {"recipe": "a"}, 1: {nodes.REFUSED: refusal}}) == refusal
    with _rendezvous_port_with_the_next_one_taken() as port:
        _, got = _agree_on_two_nodes(port, follower_print={nodes.REFUSED: refusal})
    assert all(isinstance(got[r], UsageError) and str(got[r]) == refusal for r in (0, 1)), got


def test_a_taken_rendezvous_port_is_one_sentence_naming_it():
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        link = nodes.NodeLink({"endpoint": f"127.0.0.1:{port}", "nnodes": 2, "node_rank": 0})
        with pytest.raises(InvalidInput) as raised:
            link.agree({"recipe": "a"})
    assert str(raised.value) == (f"node 0 cannot listen on the rendezvous port of 127.0.0.1:{port}: another program "
                                 "or run on this host holds it; give every node another port in --rdzv-endpoint")


def _start(common, node, cwd, *extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "repro500.cli", *common, "--node-rank", str(node), *extra], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _common(recipe, run_id, port=None):
    return ["run", recipe, "--nproc", "1", "--nnodes", "2", "--no-tracking", "--run-id", run_id,
            "--rdzv-endpoint", f"127.0.0.1:{port or free_port()}"]


@pytest.mark.usefixtures("cosmo_data")
@pytest.mark.slow  # two nodes of torch processes on 2 cores; CI runs make test-slow
def test_nodes_started_with_different_settings_stop_before_anything_is_written(in_tmp):
    write_recipe(in_tmp / "c.yaml", COSMO, fixed__epochs=1)
    common = _common("c.yaml", "mm")
    follower = _start(common, 1, in_tmp, "--set", "optimizer.lr=0.1")
    leader = _start(common, 0, in_tmp)
    (_, lead_err), (_, follow_err) = leader.communicate(timeout=180), follower.communicate(timeout=60)
    for proc, err in ((leader, lead_err), (follower, follow_err)):
        assert proc.returncode == 2, err
        assert "mutable.optimizer.lr is 0.05 on node 0 but 0.1 on node 1" in err and "Traceback" not in err
    assert not (in_tmp / "runs/mm").exists()


@pytest.mark.usefixtures("cosmo_data")
@pytest.mark.slow  # two nodes of torch processes on 2 cores; CI runs make test-slow
def test_nodes_with_other_data_stop_naming_the_data_before_anything_is_written(in_tmp):
    """Node 1 starts in its own directory, where the same recipe's data files hold other samples."""
    write_recipe(in_tmp / "c.yaml", COSMO, fixed__epochs=1)
    other = in_tmp / "node1"
    other.mkdir()
    shutil.copy(in_tmp / "c.yaml", other / "c.yaml")
    for out, split, n in (("cosmo.h5", "train", "40"), ("cosmo-eval.h5", "eval", "8")):
        made = repro500("data", "generate", "cosmo", "--out", out, "--samples", n, "--size", "16", "--seed", "3",
                        "--split", split, cwd=other)
        assert made.returncode == 0, made.stderr
    common = _common("c.yaml", "md")
    follower = _start(common, 1, other)
    leader = _start(common, 0, in_tmp)
    (_, lead_err), (_, follow_err) = leader.communicate(timeout=180), follower.communicate(timeout=60)
    for proc, err in ((leader, lead_err), (follower, follow_err)):
        said = " ".join(err.split())
        assert proc.returncode == 2, err
        assert "the nodes disagree before the first step: data:cosmo-eval.h5 is " in said, err
        assert " on node 0 but " in said and " on node 1; data:cosmo.h5 is " in said and "Traceback" not in err
    assert not (in_tmp / "runs/md").exists() and not (other / "runs").exists()


@pytest.mark.usefixtures("cosmo_data")
# two nodes, a killed rank and a resume on both: about two and a half minutes in CI's suite on 2
# cores, make test-heavy; in CI, a killed rank named and resumed is tests/test_distributed.py's, a
# two-node job stopped and resubmitted tests/test_slurm.py's
@pytest.mark.slow
@pytest.mark.heavy
def test_a_killed_rank_on_node_1_is_named_on_both_nodes_and_the_resume_keeps_two_nodes(in_tmp,
                                                                                        port_beside_a_taken_one):
    """With the rendezvous port + 1 held by another program throughout: one free port is enough."""
    write_recipe(in_tmp / "c.yaml", COSMO, repeats=2, fixed__epochs=12)
    common = _common("c.yaml", "mk", port_beside_a_taken_one)
    follower, leader = _start(common, 1, in_tmp), _start(common, 0, in_tmp)
    ranks_file = in_tmp / "runs/mk/repeats/1/ranks.json"
    deadline = time.monotonic() + 240
    while not ranks_file.exists():
        assert leader.poll() is None and time.monotonic() < deadline, leader.communicate()
        time.sleep(0.05)
    victim = json.loads(ranks_file.read_text())["ranks"][1]  # rank 1 runs on node 1 (static rendezvous)
    os.kill(victim["pid"], signal.SIGKILL)
    (_, lead_err), (_, follow_err) = leader.communicate(timeout=120), follower.communicate(timeout=120)
    named = "rank 1 (node 1 on host "
    for proc, err in ((leader, lead_err), (follower, follow_err)):
        assert proc.returncode == 5, err  # a crashed repeat: not a verdict
        assert named in err and f"pid {victim['pid']}) was killed by signal 9 (SIGKILL)" in err, err
    repeat = in_tmp / "runs/mk/repeats/1"
    assert "Signal 9 (SIGKILL)" in (repeat / "launcher-node-1.log").read_text() and (repeat / "launcher.log").is_file()
    assert str(repeat.resolve()) in follow_err  # the follower says where its log went
    assert json.loads((in_tmp / "runs/mk/repeats/0/summary.json").read_text())["status"] == "completed"

    # the command the run suggests, on one node, would run the missing repeat on one rank
    before = (in_tmp / "runs/mk/run.json").read_bytes()
    alone = repro500("run", "--resume", "runs/mk", cwd=in_tmp)
    assert alone.returncode == 2 and "ran on 2 nodes (world size 2)" in alone.stderr
    assert (in_tmp / "runs/mk/run.json").read_bytes() == before

    # on both nodes: node 0 resumes, node 1 reruns its own command and is told to run repeat 1 only
    again = _common("c.yaml", "mk", port_beside_a_taken_one)  # the same port: nothing of the first launch holds it
    endpoint = again[again.index("--rdzv-endpoint") + 1]
    follower = _start(again, 1, in_tmp)
    resumed = repro500("run", "--resume", "runs/mk", "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", endpoint,
                       cwd=in_tmp, timeout=300)
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    assert resumed.returncode in (0, 1, 3), resumed.stderr
    assert "repeat 1" in out and "repeat 0" not in out
    meta = json.loads((in_tmp / "runs/mk/run.json").read_text())
    assert meta["status"] == "completed" and meta["world_size"] == 2
    assert json.loads((repeat / "summary.json").read_text())["world_size"] == 2


def test_a_run_of_two_node_slurm_tasks_is_resumed_as_slurm_tasks_or_says_how():
    from repro500.runner import multinode

    meta = {"nnodes": 2, "world_size": 2, "launcher": {"kind": "slurm", "nodes": 2, "ranks": 1}}
    with pytest.raises(UsageError) as raised:
        multinode.check_resume("runs/x", meta, RunOptions(resume="runs/x"), None)
    assert str(raised.value) == ("run runs/x ran each repeat as a SLURM task of 2 nodes (world size 2); resume it "
                                 "with `repro500 run --resume runs/x --launcher slurm`, whose tasks keep 2 nodes")
    # with the launcher, the resume plans tasks of the recorded node count (runner._resumed), which passes
    planned = SimpleNamespace(world_size=2, nproc=1)
    multinode.check_resume("runs/x", meta, RunOptions(resume="runs/x", launcher="slurm", nnodes=2), planned)
