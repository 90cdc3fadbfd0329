"""The ad-hoc recipe of ``repro500 run --command``: its name and its declared inputs."""

from __future__ import annotations

import pytest

from repro500.runner.summaries import new_run_id
from repro500.workloads.command.adhoc import recipe_data

DECLARED = {"metrics": ["accuracy=regex:Acc ([0-9.]+)"], "accept": ["accuracy>=0.9"]}


@pytest.mark.parametrize(("argv", "name"), [
    (["python", "-m", "mypkg.train", "--lr", "0.1"], "mypkg.train"),
    (["python3", "-u", "-m", "mypkg.train"], "mypkg.train"),
    (["python3.11", "-X", "dev", "-W", "error", "-m", "pkg.sub.main"], "pkg.sub.main"),
    (["/opt/conda/bin/python", "-mpkg.mod"], "pkg.mod"),
    ([".venv/bin/python", "scripts/train.py", "--epochs", "3"], "train"),
    (["python", "train.py"], "train"),
    (["torchrun", "--standalone", "--nproc-per-node", "2", "train.py", "--lr", "0.1"], "train"),
    (["torchrun", "--nproc-per-node", "2", "-m", "pkg.train"], "pkg.train"),
    (["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "ddp.py"], "ddp"),
    (["./run experiment.sh"], "run-experiment.sh"),
    (["python", "-c", "print(1)"], "python"),
    (["python", "../.hidden.py"], "hidden"),
])
def test_an_adhoc_run_is_named_after_the_script_or_module(argv, name):
    data = recipe_data(argv, **DECLARED)
    assert data["name"] == name
    # the run directory's name keeps only safe characters, whatever the recipe's name holds
    run_id = new_run_id(data["name"])
    assert "/" not in run_id and not run_id.startswith(".") and " " not in run_id


def test_an_explicit_name_wins():
    assert recipe_data(["python", "-m", "mypkg.train"], name="mine", **DECLARED)["name"] == "mine"


def test_inputs_become_fixed_inputs_as_given():
    data = recipe_data(["python", "train.py"], inputs=["data/train.csv", "/srv/shards/{mutable.split}"], **DECLARED)
    assert data["fixed"]["inputs"] == ["data/train.csv", "/srv/shards/{mutable.split}"]
    assert "inputs" not in recipe_data(["python", "train.py"], **DECLARED)["fixed"]
    assert "inputs" not in recipe_data(["python", "train.py"], inputs=[], **DECLARED)["fixed"]
