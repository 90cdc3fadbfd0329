"""Tiny recipes for tests that run real training on the CPU in seconds, and the ways tests run
repro500's commands: in a subprocess (``repro500``, ``tool_env``) or in process (``invoke``)."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

TINY_CLASSIFICATION = {
    "schema": "repro500/recipe/v1",
    "name": "tiny",
    "fixed": {
        "workload": "classification",
        "model": "resnet20",
        "dataset": {
            "name": "synthetic-classification",
            "params": {"train_samples": 256, "eval_samples": 128, "size": "16x16", "noise": 0.04, "seed": 3},
        },
        "target": {"metric": "accuracy", "value": 0.99, "direction": "higher"},
        "epochs": 2,
        "mlperf_benchmark": "resnet",
    },
    "mutable": {
        "batch_size": 32,
        "eval_batch_size": 128,
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
        "lr_schedule": {"name": "cosine", "warmup_epochs": 0.5},
        "device": "cpu",
        "threads": 1,
    },
    "acceptance": {"accuracy": {"target": 0.2, "direction": "higher", "tolerance": 0.05}},
    "repeats": 2,
    "seed": 11,
}


def write_recipe(path: Path, recipe: dict | None = None, **changes: object) -> Path:
    """Write a recipe (default: the tiny classification one) with top-level or dotted changes."""
    data = yaml.safe_load(yaml.safe_dump(recipe or TINY_CLASSIFICATION))
    for key, value in changes.items():
        node = data
        parts = key.split("__")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tool_env(**extra: str) -> dict[str, str]:
    """The environment for repro500, dvc and mlflow run as commands: this environment's console
    scripts first on PATH, output unbuffered, no telemetry, and MLflow's default store (``mlflow.db`` where the command
    runs) unless ``extra`` names one: a MLFLOW_TRACKING_URI in the shell that runs the tests is not
    the test's.  ``extra`` comes last."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="1",
               DVC_NO_ANALYTICS="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def invoke(*args: object, env: dict[str, str] | None = None):
    """``repro500 ARGS`` in this process (click's CliRunner); ``result.text`` is its output on one
    line, since rich wraps at the test console's width."""
    from click.testing import CliRunner

    from repro500 import cli

    result = CliRunner().invoke(cli.cli, [str(a) for a in args], env=env)
    result.text = " ".join(result.output.split())
    return result


def repro500(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300, **kwargs):
    """Run the real ``repro500`` console entry point in a subprocess."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "repro500.cli", *args], cwd=cwd, env=full_env, capture_output=True,
        text=True, timeout=timeout, **kwargs,
    )


def kill_a_rank_when(ranks_file: Path, *args: str, cwd: Path, rank: int = 1,
                     start_timeout_s: float = 300) -> tuple[int, str, float, int]:
    """Start ``repro500 ARGS``; once ``ranks_file`` (a repeat's ranks.json) appears, SIGKILL that
    repeat's *rank*.  Returns (exit code, stderr, seconds from the kill to the exit, the pid killed)."""
    import json
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "repro500.cli", *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + start_timeout_s
    while not ranks_file.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{ranks_file} did not appear"
        time.sleep(0.05)
    victim = json.loads(ranks_file.read_text())["ranks"][rank]["pid"]
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err, time.monotonic() - killed_at, victim


def make_tar(path: Path, members, *, gz: bool = True, format: int = tarfile.DEFAULT_FORMAT) -> Path:
    """A tar from (TarInfo, bytes | None) pairs, written as a hostile packer would."""
    with tarfile.open(path, "w:gz" if gz else "w", format=format) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


def free_rendezvous_port() -> int:
    """A free port P for --rdzv-endpoint (one port is all a multi-node run needs: engines/nodes.py)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


COSMO = {
    "schema": "repro500/recipe/v1",
    "name": "tinycosmo",
    "fixed": {
        "workload": "regression",
        "model": "cosmoflow",  # no batch norm: two ranks can equal one process exactly
        "model_options": {"crop_size": 16, "base_channels": 4, "depth": 2, "fc1_size": 16, "fc2_size": 8},
        "dataset": {"name": "cosmo", "path": "cosmo.h5", "eval_path": "cosmo-eval.h5", "params": {"crop": 16}},
        "target": {"metric": "mae", "value": 0.0, "direction": "lower"},
        "epochs": 2,
        "mlperf_benchmark": "cosmoflow",
    },
    "mutable": {"batch_size": 8, "eval_batch_size": 16, "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
                "device": "cpu", "threads": 1},
    "acceptance": {"mae": {"target": 1.0, "direction": "lower", "tolerance": 0.0}},
    "repeats": 1,
    "seed": 5,
}


PLUGIN = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset


def build(*, num_classes: int = 2, in_channels: int = 3, width: int = 8):
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 8 * 8, width), nn.ReLU(), nn.Linear(width, num_classes))


def make(split, *, path=None, seed=0, samples=128):
    g = torch.Generator().manual_seed(seed + (0 if split == "train" else 1))
    y = torch.randint(0, 2, (samples,), generator=g)
    x = torch.randn(samples, 3, 8, 8, generator=g) * 0.3 + y.view(-1, 1, 1, 1).float()
    data = TensorDataset(x, y)
    data.info = {"task": "classification", "num_classes": 2, "in_channels": 3}
    return data


class Balanced:
    def __init__(self, *, num_classes):
        self.right, self.seen = 0, 0

    def update(self, outputs, targets):
        self.right += int((outputs.argmax(1) == targets).sum())
        self.seen += len(targets)

    def compute(self):
        return {"balanced_hits": self.right / self.seen if self.seen else None}


def not_a_model(**kw):
    return "a string"


def broken(**kw):
    raise RuntimeError("width must be even")
'''


def plugin_recipe(tmp: Path, **changes: object) -> Path:
    (tmp / "mylab").mkdir(exist_ok=True)
    (tmp / "mylab" / "__init__.py").write_text("")
    (tmp / "mylab" / "nets.py").write_text(PLUGIN)
    recipe = {
        "schema": "repro500/recipe/v1", "name": "mine",
        "fixed": {"workload": "classification", "model": "mylab.nets:build", "model_options": {"width": 16},
                  "dataset": {"entry": "mylab.nets:make", "params": {"samples": 128, "seed": 1}},
                  "evaluate": "mylab.nets:Balanced",
                  "target": {"metric": "balanced_hits", "value": 0.999}, "epochs": 2},
        "mutable": {"batch_size": 32, "eval_batch_size": 64, "optimizer": {"name": "sgd", "lr": 0.1}, "threads": 1},
        "acceptance": {"balanced_hits": {"target": 0.6, "tolerance": 0.05}},
        "repeats": 2, "seed": 5,
    }
    return write_recipe(tmp / "mine.yaml", recipe, **changes)


def interrupt_once_started(args: list[str], *, cwd: Path, env: dict, run: Path, repeats: tuple[int, ...] = (2, 3),
                           start_timeout_s: float = 300, end_timeout_s: float = 180) -> tuple[int, str, str]:
    """Start ``repro500 run ARGS`` in a session of its own (as a terminal's foreground job, so Ctrl-C
    reaches every process of the group), send it SIGINT a second after *repeats* of *run* started,
    and return (exit code, stdout, stderr)."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen([sys.executable, "-m", "repro500.cli", "run", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + start_timeout_s
    while not all((run / "repeats" / str(k) / "stdout.txt").exists() for k in repeats):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=end_timeout_s)
    return proc.returncode, out, err
