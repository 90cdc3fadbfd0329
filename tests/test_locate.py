"""repro500 locate, calibrated: deterministic same-seed runs never part; a planted divergence is
found at exactly its step, module and operator (noise from an unseeded generator from a chosen
step on; a thread count that changes a float32 reduction), with the recorded difference that
explains it or "no recorded difference explains it"; bad input is one sentence and an exit code."""

from __future__ import annotations

import contextlib
import io
import json
import math
import textwrap
from pathlib import Path

import pytest
import torch
from helpers.rundirs import make_run
from helpers.runs import repro500, write_recipe
from helpers.stores import mlflow_store
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks

from repro500.verify import divergence as dv
from repro500.workloads.trainer.build import Task
from repro500.workloads.trainer.replay import (
    Hasher,
    OpRecord,
    OpRecorder,
    StopReplay,
    bitwise_equal,
    difference,
)
from repro500.workloads.trainer.step import Step

# a plug-in model that becomes non-deterministic at a chosen step: from its NOISE_FROM-th training
# forward on, a module adds noise drawn from a generator the operating system seeds
NOISY = '''
import torch
from torch import nn


class Noise(nn.Module):
    def __init__(self, from_step):
        super().__init__()
        self.from_step, self.calls = from_step, 0

    def forward(self, x):
        if not self.training:
            return x
        self.calls += 1
        if self.calls < self.from_step:
            return x
        generator = torch.Generator(device=x.device)
        generator.seed()  # not the run's seeds: every process draws other noise
        return x + 1e-3 * torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)


class Net(nn.Module):
    def __init__(self, num_classes, in_channels, noise_from):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 8, 3, padding=1)
        self.noise = Noise(noise_from)
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.head(self.noise(torch.relu(self.conv(x))).mean(dim=(2, 3)))


def build(num_classes=10, in_channels=3, noise_from=6):
    return Net(num_classes, in_channels, noise_from)
'''

# a plug-in model whose first operator is a large float32 sum: torch splits a sum that size among
# its threads, so its last bits follow the thread count; a cosine of a large multiple of the sum
# carries a last-bit change into the loss
MIXING = '''
import torch
from torch import nn


class Mix(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.register_buffer("big", torch.randn(size, generator=torch.Generator().manual_seed(0)), persistent=False)

    def forward(self, x):
        return x * (1 + 0.01 * torch.cos(self.big.sum() * 1e3))


class Net(nn.Module):
    def __init__(self, num_classes, in_channels, size):
        super().__init__()
        self.mix = Mix(size)
        self.conv = nn.Conv2d(in_channels, 8, 3, padding=1)
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.head(torch.relu(self.conv(self.mix(x))).mean(dim=(2, 3)))


def build(num_classes=10, in_channels=3, size=1048576):
    return Net(num_classes, in_channels, size)
'''

SMALL = {"fixed__epochs": 2, "fixed__dataset__params__train_samples": 64, "fixed__dataset__params__eval_samples": 32,
         "mutable__batch_size": 16, "mutable__eval_batch_size": 32}  # 4 steps an epoch


def _run(cwd: Path, *args: str, env: dict | None = None, tracking: bool = False) -> Path:
    done = repro500("run", *args, *(() if tracking else ("--no-tracking",)), cwd=cwd, env=env)
    assert done.returncode in (0, 1, 3), done.stderr[-2000:]
    return cwd / "runs" / args[args.index("--run-id") + 1]


def _locate(cwd: Path, *args: str) -> dict:
    done = repro500("locate", *args, "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _verify(cwd: Path, *args: str) -> dict:
    done = repro500("verify", *args, "--json", "--no-write", cwd=cwd)
    assert done.returncode in (0, 1, 3), done.stderr[-2000:]
    return json.loads(done.stdout)


# ----- the hash and the recording mode ------------------------------------------------------------
def test_the_hash_sees_every_bit_and_nothing_else():
    h = Hasher()
    x = torch.randn(3 * (1 << 20) + 5)  # more than one chunk, and a partial one
    assert h(x) == h(x.clone())
    for places in ([5], [7, 3 * (1 << 20) + 1], [0, 1]):  # two last-bit flips must not cancel
        y = x.clone()
        for i in places:
            y.view(torch.int32)[i] ^= 1
        assert h(y) != h(x)
    assert h(x[:10].flip(0)) != h(x[:10])  # the order counts
    for t in (torch.randn(7, dtype=torch.bfloat16), torch.arange(9), torch.ones(3, dtype=torch.bool),
              torch.randn(4, dtype=torch.complex64), torch.randn(5, 6).t()):
        assert h(t) == h(t.clone().contiguous())
    assert h(torch.zeros(0)) == 0


def test_the_recording_mode_names_module_phase_and_parameter():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    recorder = OpRecorder(model)
    recorder.optimizer_phase(optimizer)
    x, y = torch.randn(5, 4), torch.randn(5, 2)
    recorder.begin(1, (x, y))
    with recorder.step():
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    seen = {(phase, op, path) for _, phase, op, path, _ in recorder.records}
    assert ("data", "(batch)", "") in seen
    assert ("forward", "aten.addmm.default", "0") in seen and ("forward", "aten.relu.default", "1") in seen
    assert ("backward", "aten.threshold_backward.default", "1") in seen
    assert any(phase == "backward" and op == "aten.mm.default" and path == "2" for phase, op, path in seen)
    assert any(phase == "optimizer" and path in ("0.weight", "2.bias") for phase, _, path in seen)
    assert not any(op in ("aten.t.default", "aten.view.default", "aten.detach.default") for _, op, _ in seen)


def _one_step(**recording) -> tuple[OpRecorder, Step, torch.optim.Optimizer, int]:
    """A recorder on a trainer's Step the way a replay puts it there: a watcher of the step and the
    optimizer's step hooks; the step trained once.  What it raised is in the recorder's stop."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = Step(Task("classification"), model, optimizer, torch.device("cpu"))
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 1, 0, 1])

    @contextlib.contextmanager
    def watch(inputs, targets):
        recorder.begin(1, (inputs, targets))
        with recorder.step():
            yield
    global_hooks = len(_global_forward_pre_hooks) + len(_global_forward_hooks)
    with OpRecorder(model, **recording) as recorder, step.register_watcher(watch):
        recorder.optimizer_phase(optimizer)
        recorder.initial_state()
        with contextlib.suppress(StopReplay):
            step(x, y, 5)
    assert len(_global_forward_pre_hooks) + len(_global_forward_hooks) == global_hooks
    return recorder, step, optimizer, recorder.count


def test_the_recorder_reaches_the_step_through_hooks_that_come_off_however_it_ends():
    whole, step, optimizer, ops = _one_step(sink=io.StringIO())
    lines = [json.loads(line) for line in whole.sink.getvalue().splitlines()]
    # ops.jsonl: a JSON list a record, its fields in OpRecord's order
    assert len(lines) == ops and all(isinstance(line, list) and len(line) == len(OpRecord._fields) for line in lines)
    assert any(OpRecord(*line).phase == "optimizer" for line in lines) and whole.stop is None
    # stopped inside the optimizer's step, so its post-hook never ran: the hooks still came off
    at = next(i for i, line in enumerate(lines) if OpRecord(*line).phase == "optimizer")
    stopped, step, optimizer, _ = _one_step(expect=[OpRecord(*line) for line in lines], save_at=at + 1)
    assert stopped.stop == {"reason": "saved", "index": at + 1} and stopped.phase == "forward"
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    assert not step._watchers
    before = stopped.count
    step(torch.randn(5, 4), torch.tensor([0, 1, 1, 0, 1]), 5)
    assert stopped.count == before  # nothing of a later step reaches the recorder


def test_difference_is_exact_for_equal_bits_and_relative_to_the_larger():
    a = torch.tensor([1.0, -2.0, 0.0, float("nan")])
    b = torch.tensor([1.0, -2.5, 0.0, float("nan")])
    assert bitwise_equal(a, a.clone()) and not bitwise_equal(a, b)
    d = difference(a, b)
    assert d["max_abs"] == 0.5 and d["max_rel"] == pytest.approx(0.2) and d["differing"] == 1


# ----- calibration: deterministic same-seed runs never part -----------------------------------------
def _calibrate(tmp_path: Path, runs: int) -> list[dict]:
    write_recipe(tmp_path / "tiny.yaml", **SMALL)
    found = []
    for i in range(runs):
        run = _run(tmp_path, "tiny.yaml", "--deterministic", "--same-seed", "--repeats", "3", "--run-id", f"cal{i}")
        doc = _verify(tmp_path, str(run))
        found.append(doc["divergence"])
        located = _locate(tmp_path, str(run))
        assert located["operator"] is None and located["records"]["shape"] == "none"
    return found


@pytest.mark.slow
def test_deterministic_same_seed_runs_never_part(tmp_path):
    # one run of 3 repeats here; the calibration proper, ten runs, is bench/locate_calibration.py
    # (each run with its verify and locate is about 9 s of CPU on 2 cores)
    sections = _calibrate(tmp_path, runs=1)
    assert [s["status"] for s in sections] == ["NONE"]
    assert all(p["shape"] == "none" and p["steps_compared"] == 8 for s in sections for p in s["pairs"])


# ----- a planted divergence: noise from an unseeded generator from step 6 on -----------------------
@pytest.fixture(scope="module")
def noisy(tmp_path_factory) -> tuple[Path, Path]:
    """The planted run, logged to MLflow in its directory's own store (``mlflow.db``)."""
    cwd = tmp_path_factory.mktemp("noisy")
    (cwd / "noisy.py").write_text(textwrap.dedent(NOISY))
    write_recipe(cwd / "noisy.yaml", fixed__model="noisy:build", fixed__model_options={"noise_from": 6}, **SMALL)
    env = {"MLFLOW_TRACKING_URI": mlflow_store(cwd / "mlflow.db")}
    return cwd, _run(cwd, "noisy.yaml", "--deterministic", "--same-seed", "--repeats", "2", "--run-id", "noisy",
                     env=env, tracking=True)


def test_the_records_find_the_planted_step(noisy):
    cwd, run = noisy
    section = _verify(cwd, str(run))["divergence"]
    pair = section["pairs"][0]
    assert section["status"] == "FOUND" and section["first_step"] == 6
    assert (pair["shape"], pair["first_epoch"], pair["quantity"]) == ("within training", 2, "loss")
    assert pair["steps_compared"] == 5 and pair["explanation"].endswith(dv.NO_CAUSE)


@pytest.mark.slow
def test_locate_names_the_planted_operator(noisy):
    cwd, run = noisy
    answer = _locate(cwd, str(run))
    op = answer["operator"]
    assert answer["steps"] == 6  # bounded: nothing replayed past the step the records part at
    assert (op["op"], op["module"], op["phase"], op["step"]) == ("aten.randn.generator", "noise", "forward", 6)
    assert op["inputs_agree"] is True and op["random_op"] is True
    assert op["self_consistent"] == {"A": False, "B": False}  # each run differs from itself there
    assert all(r["records_match_until"] >= 5 for r in op["replays"][:2])  # the replays are the runs, up to it
    # two independent standard normal draws of 32768 numbers: each number below 6 in magnitude
    # (P(|z| > 6) is 2e-9), so the difference is below 12, and the relative one at most 2; never 0
    assert op["outputs"][0]["shape"] == [16, 8, 16, 16] and op["outputs"][0]["dtype"] == "float32"
    assert 0 < op["max_abs"] < 12 and 0 < op["max_rel"] <= 2
    assert answer["cause"]["kind"] == "non-deterministic" and answer["cause"]["explanation"].endswith(dv.NO_CAUSE)
    assert op["ops_hashed"] > 0 and op["seconds"] > 0
    # the replays imported the run's plug-in from its sealed source/ and left no bytecode there
    assert not list(run.rglob("__pycache__")), list(run.rglob("__pycache__"))


def test_the_report_marks_the_first_divergence(noisy, tmp_path):
    cwd, run = noisy
    done = repro500("report", str(run), "--out", str(tmp_path / "r.html"), cwd=cwd)
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "r.html").read_text()
    section = page[page.index('<section id="divergence">'):]
    section = section[:section.index("</section>")]
    assert "part at step 6" in section and '<img class="plot"' in section


def test_mlflow_has_where_the_repeats_part(noisy):
    cwd, run = noisy
    from mlflow.tracking import MlflowClient

    parent = json.loads((run / "run.json").read_text())["mlflow"]["parent_run_id"]
    logged = MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}").get_run(parent)
    assert logged.data.metrics[dv.METRIC] == 6.0
    assert logged.data.tags[dv.TAG] == "step 6 (repeats 0 and 1; within training)"


# ----- a planted environment difference: the thread count of a reduction -----------------------------
def _a_size_threads_change() -> int | None:
    """A buffer size whose float32 sum this CPU's torch computes differently on 1 and 2 threads."""
    before = torch.get_num_threads()
    try:
        for size in (1 << 20, 3 * (1 << 20) + 7, 1 << 22, 5 * (1 << 20) + 3, 1 << 23):
            big = torch.randn(size, generator=torch.Generator().manual_seed(0))
            torch.set_num_threads(1)
            one = big.sum()
            torch.set_num_threads(2)
            if not bitwise_equal(one, big.sum()):
                return size
    finally:
        torch.set_num_threads(before)
    return None


@pytest.fixture(scope="module")
def threads(tmp_path_factory) -> tuple[Path, Path, Path, int]:
    size = _a_size_threads_change()
    if size is None:
        pytest.skip("this CPU's torch sums each buffer tried alike on 1 and 2 threads: nothing to plant")
    cwd = tmp_path_factory.mktemp("threads")
    (cwd / "mixing.py").write_text(textwrap.dedent(MIXING))
    write_recipe(cwd / "mix.yaml", fixed__model="mixing:build", fixed__model_options={"size": size},
                 mutable__threads=None, **{**SMALL, "fixed__epochs": 1})
    one = _run(cwd, "mix.yaml", "--deterministic", "--repeats", "1", "--run-id", "one", env={"OMP_NUM_THREADS": "1"})
    two = _run(cwd, "mix.yaml", "--deterministic", "--repeats", "1", "--run-id", "two", env={"OMP_NUM_THREADS": "2"})
    return cwd, one, two, size


def test_the_records_find_a_kernel_difference_at_the_first_step(threads):
    cwd, one, two, _ = threads
    pair = _verify(cwd, str(two), "--against", str(one))["divergence"]["pairs"][0]
    assert (pair["shape"], pair["first_step"]) == ("first step", 1)
    assert pair["causes"][0]["key"] == "environment.env.values.OMP_NUM_THREADS"
    assert (pair["causes"][0]["run"], pair["causes"][0]["reference"]) == ("2", "1")


@pytest.mark.slow  # a second replay to the operator (16 s): the planted one stays in make test
def test_locate_names_the_reduction_the_thread_count_changes(threads):
    cwd, one, two, size = threads
    answer = _locate(cwd, str(two), str(one))
    op = answer["operator"]
    assert (op["op"], op["module"], op["phase"], op["step"]) == ("aten.sum.default", "mix", "forward", 1)
    assert op["inputs_agree"] is True and op["self_consistent"] == {"A": True, "B": True}
    assert answer["environments"]["A"]["OMP_NUM_THREADS"] == "2" and answer["environments"]["B"]["OMP_NUM_THREADS"] == "1"
    # two float32 summation orders of n terms differ by at most about 2 n eps sum|x| (a loose bound:
    # the error of each order is below (n - 1) eps sum|x|); and they do differ
    big = torch.randn(size, generator=torch.Generator().manual_seed(0))
    bound = 2 * size * torch.finfo(torch.float32).eps * float(big.abs().sum())
    assert 0 < op["max_abs"] <= bound and math.isfinite(op["max_rel"])
    assert answer["cause"]["kind"] == "kernels"
    assert answer["cause"]["causes"][0]["key"] == "environment.env.values.OMP_NUM_THREADS"


# ----- a planted environment difference: oneDNN held to an older instruction set ---------------------
CONV_BITS = """
import hashlib, torch
g = torch.Generator().manual_seed(0)
x, w = torch.randn(16, 3, 16, 16, generator=g), torch.randn(16, 3, 3, 3, generator=g)
print(hashlib.sha256(torch.nn.functional.conv2d(x, w, padding=1).numpy().tobytes()).hexdigest())
"""


# three minutes of CI's 2 cores: make test-heavy. In CI, locate names an operator a real kernel
# difference changes (the thread count of a float32 sum) and a planted one
@pytest.mark.slow
@pytest.mark.heavy
def test_locate_names_the_convolution_onednn_computes_differently(tmp_path):
    import subprocess
    import sys

    def bits(env: dict) -> str:
        import os

        return subprocess.run([sys.executable, "-c", CONV_BITS], env={**os.environ, **env}, capture_output=True,
                              text=True, check=True).stdout
    if bits({}) == bits({"ONEDNN_MAX_CPU_ISA": "SSE41"}):
        pytest.skip("oneDNN computes this convolution alike with SSE4.1 and with this CPU's own instructions")
    write_recipe(tmp_path / "tiny.yaml", **{**SMALL, "fixed__epochs": 1})
    mine = _run(tmp_path, "tiny.yaml", "--deterministic", "--repeats", "1", "--run-id", "mine")
    old = _run(tmp_path, "tiny.yaml", "--deterministic", "--repeats", "1", "--run-id", "old",
               env={"ONEDNN_MAX_CPU_ISA": "SSE41"})
    pair = _verify(tmp_path, str(old), "--against", str(mine))["divergence"]["pairs"][0]
    # the loss is a float32 mean: a last-bit change of a convolution may round away in it at step 1 and
    # show at step 2; the records see the loss, the replay sees the operator
    assert pair["first_step"] in (1, 2) and pair["causes"][0]["key"] == "environment.env.values.ONEDNN_MAX_CPU_ISA"
    op = (answer := _locate(tmp_path, str(old), str(mine)))["operator"]
    assert (op["op"], op["module"], op["phase"], op["step"]) == ("aten.convolution.default", "conv1", "forward", 1)
    assert op["inputs_agree"] is True and op["self_consistent"] == {"A": True, "B": True}
    assert answer["cause"]["causes"][0]["key"] == "environment.env.values.ONEDNN_MAX_CPU_ISA"


# ----- bad input ----------------------------------------------------------------------------------
def _one_sentence(done) -> str:
    """The error line; locate's progress lines (``repro500 locate: ...``) may come before it."""
    lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("repro500 locate: ")]
    assert "Traceback" not in done.stderr and len(lines) == 1 and lines[0].startswith("repro500: error: "), done.stderr
    return lines[0]


def test_bad_input_is_one_sentence_and_an_exit_code(tmp_path):
    done = repro500("locate", str(tmp_path / "missing"), cwd=tmp_path)
    assert done.returncode == 4 and "does not exist" in _one_sentence(done)
    unshared = make_run(tmp_path, "unshared", values={"accuracy": [0.9, 0.91]})
    done = repro500("locate", str(unshared), cwd=tmp_path)
    assert done.returncode == 4 and "share a seed" in _one_sentence(done)
    done = repro500("locate", str(unshared), "--repeat", "7", "--other-repeat", "1", cwd=tmp_path)
    assert done.returncode == 2 and "no completed repeat 7" in _one_sentence(done)
    done = repro500("locate", str(unshared), "--rtol", "0", cwd=tmp_path)
    assert done.returncode == 2
    tampered = make_run(tmp_path, "tampered", values={"accuracy": [0.9, 0.91]}, torch_seeds=[3, 3])
    (tampered / "repeats" / "1" / "metrics.jsonl").write_text("{}\n")
    done = repro500("locate", str(tampered), cwd=tmp_path)
    assert done.returncode == 4 and "not what its run wrote" in _one_sentence(done)


@pytest.mark.slow
def test_a_run_that_cannot_be_replayed_is_said_so(tmp_path):
    # fabricated repeats that share a seed and part at a step, but whose recipe trains nothing
    root = make_run(tmp_path, "fabricated", values={"accuracy": [0.9, 0.9]}, torch_seeds=[3, 3],
                    diverge={"repeat": 1, "epoch": 1, "tensor": "fc.weight"})
    done = repro500("locate", str(root), cwd=tmp_path)
    assert done.returncode == 4 and "replay of A" in _one_sentence(done)
    # what it knew at once, and what it was doing when the replay failed, came first, a line each
    progress = [line for line in done.stderr.splitlines() if line.startswith("repro500 locate: ")]
    assert progress[0].startswith("repro500 locate: records: ") and "replaying repeat 0 of A" in progress[1], done.stderr
