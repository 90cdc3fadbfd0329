"""Recipe validation: strict sections, located errors, overrides and the open division."""

from __future__ import annotations

import textwrap

import pytest

from repro500.errors import InvalidInput, UsageError
from repro500.recipe import load as recipes

GOOD = """\
schema: repro500/recipe/v1
name: tiny
fixed:
  workload: classification
  model: resnet20
  dataset:
    name: synthetic-classification
    params: {samples: 64}
  target: {metric: accuracy, value: 0.5}
  epochs: 2
mutable:
  batch_size: 16
  optimizer: {name: sgd, lr: 0.1}
acceptance:
  accuracy: {target: 0.5, direction: higher, tolerance: 0.1}
repeats: 2
seed: 7
"""


def write(tmp_path, text, name="r.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_good_recipe_resolves_defaults(tmp_path):
    r = recipes.load(write(tmp_path, GOOD))
    assert r.name == "tiny" and r.repeats == 2 and r.seed == 7
    assert r.mutable["batch_size"] == 16
    assert r.mutable["optimizer"]["momentum"] == 0.9  # default merged under the recipe's values
    assert r.mutable["engine"] == "local"
    assert r.fixed["target"]["direction"] == "higher"
    assert not r.open_division
    params = r.flat_params()
    assert params["fixed.model"] == "resnet20"
    assert params["mutable.optimizer.lr"] == "0.1"


@pytest.mark.parametrize(
    ("bad", "good", "message"),
    [
        ("  batch_size: 16", "  batch_size: big", r"r.yaml:12: mutable.batch_size must be an integer, got 'big'"),
        ("  batch_size: 16", "  batch_size: 16\n  colour: red", r"r.yaml:13: unknown key mutable.colour"),
        ("  epochs: 2\n", "  epochs: 2\n  batch_size: 8\n", r"batch_size is in both fixed and mutable"),
        ("  workload: classification", "  workload: painting", r"r.yaml:4: fixed.workload must be one of"),
        ("repeats: 2", "repeats: 0", r"r.yaml:16: repeats must be at least 1"),
        ("  accuracy: {target: 0.5, direction: higher, tolerance: 0.1}",
         "  accuracy: {target: 0.5, direction: sideways}", r"acceptance.accuracy.direction must be one of higher, lower"),
        ("  epochs: 2\n", "", r"fixed.epochs is required"),
        ("seed: 7", "seeds: 7", r"r.yaml:17: unknown key seeds"),
        ("{name: sgd, lr: 0.1}", "{name: lars, lr: 0.1}",
         r"r.yaml:13: mutable.optimizer.name must be one of sgd, adam, adamw; got 'lars'"),
    ],
)
def test_bad_recipes_name_the_line(tmp_path, bad, good, message):
    assert bad in GOOD
    path = write(tmp_path, GOOD.replace(bad, good))
    with pytest.raises(InvalidInput, match=message):
        recipes.load(path)


def test_malformed_yaml_and_missing_file(tmp_path):
    with pytest.raises(InvalidInput, match=r"r.yaml:3: malformed YAML"):
        recipes.load(write(tmp_path, "fixed:\n  a: 1\n b: [\n"))
    with pytest.raises(InvalidInput, match="does not exist"):
        recipes.load(tmp_path / "nope.yaml")


def test_set_overrides_mutable_and_refuses_fixed(tmp_path):
    path = write(tmp_path, GOOD)
    r = recipes.load(path, overrides=["batch_size=32", "optimizer.lr=0.05", "compressor.name=topk", "compressor.ratio=0.01"])
    assert r.mutable["batch_size"] == 32
    assert r.mutable["optimizer"] == {**r.mutable["optimizer"], "lr": 0.05}
    assert r.mutable["compressor"] == {"name": "topk", "ratio": 0.01}
    assert r.overrides["mutable.batch_size"] == 32
    with pytest.raises(UsageError, match="open division"):
        recipes.load(path, overrides=["epochs=10"])
    with pytest.raises(UsageError, match="unknown key 'colour'"):
        recipes.load(path, overrides=["colour=red"])
    # a bad --set value is a command-line mistake like the others (exit 2), naming the --set at fault
    with pytest.raises(UsageError, match=r"--set batch_size=big: mutable.batch_size must be an integer, got 'big'"):
        recipes.load(path, overrides=["optimizer.lr=0.05", "batch_size=big"])
    with pytest.raises(UsageError, match=r"--set optimizer.name=lars: mutable.optimizer.name must be one of"):
        recipes.load(path, overrides=["optimizer.name=lars"])


def test_a_bad_params_file_value_is_invalid_input(tmp_path):
    recipe_path = write(tmp_path, GOOD)
    params = write(tmp_path, "run:\n  mutable:\n    batch_size: big\n", name="params.yaml")
    with pytest.raises(InvalidInput, match=r"params.yaml .*mutable.batch_size must be an integer"):
        recipes.load(recipe_path, params_file=params)


def test_every_optimizer_the_schema_accepts_the_trainer_builds(tmp_path):
    import torch

    from repro500.workloads.trainer.optim import build_optimizer

    assert tuple(recipes.MUTABLE_SCHEMA["optimizer"]["name"]) == recipes.OPTIMIZERS
    weight = torch.nn.Parameter(torch.zeros(2))
    for name in recipes.OPTIMIZERS:
        r = recipes.load(write(tmp_path, GOOD), overrides=[f"optimizer.name={name}"])
        assert isinstance(build_optimizer([weight], r.mutable["optimizer"]), torch.optim.Optimizer), name


def test_open_division_is_recorded(tmp_path):
    r = recipes.load(write(tmp_path, GOOD), overrides=["epochs=5"], open_division=True)
    assert r.fixed["epochs"] == 5
    assert r.open_division is True
    assert r.to_dict()["open_division"] is True
    # declaring the open division without changing a fixed key changes nothing
    assert recipes.load(write(tmp_path, GOOD), open_division=True).open_division is False


def test_params_file_applies_like_dvc_would(tmp_path):
    recipe_path = write(tmp_path, GOOD)
    params = write(tmp_path, "run:\n  recipe: r.yaml\n  repeats: 5\n  mutable:\n    batch_size: 8\n    optimizer: {lr: 0.2}\n",
                   name="params.yaml")
    r = recipes.load(recipe_path, params_file=params)
    assert r.repeats == 5 and r.mutable["batch_size"] == 8 and r.mutable["optimizer"]["lr"] == 0.2
    bad = write(tmp_path, "run:\n  fixed:\n    epochs: 9\n", name="bad.yaml")
    with pytest.raises(UsageError, match="open division"):
        recipes.load(recipe_path, params_file=bad)


@pytest.mark.parametrize(("text", "tracking"), [
    ("run:\n  tracking: true\n  repeats: 2\n", True),
    ("run:\n  tracking: false\n", False),
    ("run:\n  repeats: 2\n", None),  # the params file does not say: the command line's default decides
])
def test_params_file_run_tracking_is_read_and_not_applied_to_the_recipe(tmp_path, text, tracking):
    r = recipes.load(write(tmp_path, GOOD), params_file=write(tmp_path, text, name="params.yaml"))
    assert r.tracking is tracking
    assert "tracking" not in r.overrides and "tracking" not in r.to_dict()  # how it is logged, not what ran
    assert recipes.load(write(tmp_path, GOOD)).tracking is None


def test_an_empty_params_mutable_section_changes_nothing(tmp_path):
    command = write(tmp_path, "fixed: {command: [python, t.py]}\nmetrics: {a: {}}\nacceptance: {a: {target: 1}}\n",
                    name="c.yaml")
    params = write(tmp_path, "run:\n  repeats: 2\n  tracking: true\n  mutable: {}\n", name="params.yaml")
    r = recipes.load(command, params_file=params)
    assert (r.repeats, r.mutable, r.tracking) == (2, {}, True)
    assert recipes.load(write(tmp_path, GOOD), params_file=params).mutable["batch_size"] == 16


@pytest.mark.parametrize("value", ["'yes'", "1", "maybe", "[true]", "null"])
def test_a_params_file_tracking_that_is_not_a_bool_is_one_sentence(tmp_path, value):
    params = write(tmp_path, f"run:\n  tracking: {value}\n", name="params.yaml")
    with pytest.raises(InvalidInput, match=r"params.yaml: run.tracking must be true or false, not "):
        recipes.load(write(tmp_path, GOOD), params_file=params)


def test_a_bad_params_file_tracking_exits_4_before_anything_is_written(tmp_path):
    from click.testing import CliRunner

    from repro500.cli import cli

    recipe_path = write(tmp_path, GOOD)
    params = write(tmp_path, "run:\n  tracking: 'off'\n", name="params.yaml")
    result = CliRunner().invoke(cli, ["run", str(recipe_path), "--params", str(params), "--out", str(tmp_path / "runs"),
                                      "--no-tracking"])
    assert result.exit_code == 4, result.output
    assert "run.tracking must be true or false, not 'off'" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "runs").exists()


def test_round_trip_through_run_directory(tmp_path):
    r = recipes.load(write(tmp_path, GOOD), overrides=["batch_size=32"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "recipe.yaml").write_text(r.to_yaml())
    back = recipes.from_run_dir(run_dir)
    assert back.to_dict() == r.to_dict()


def test_every_shipped_recipe_is_valid():
    from pathlib import Path

    from repro500.data.loaders import DATASETS, PARAMS
    from repro500.workloads.models import model_options, model_task

    shipped = sorted((Path(__file__).resolve().parents[1] / "experiments").glob("*.yaml"))
    assert len(shipped) >= 8
    for path in shipped:
        r = recipes.load(path)
        assert model_task(r.fixed["model"]) == r.fixed["workload"], path
        assert set(r.fixed["model_options"]) <= set(model_options(r.fixed["model"])), path
        ds = r.fixed["dataset"]
        assert ds["name"] in DATASETS, path
        assert set(ds["params"]) - {"seed"} <= PARAMS[ds["name"]], path
        assert r.fixed["target"]["metric"] in r.acceptance or r.acceptance, path


def test_a_launcher_section_is_kept_out_of_the_runs_recipe_and_checked_like_any_section(tmp_path):
    from repro500.recipe.schema import SLURM_SCHEMA
    from repro500.runner.plan import SLURM_KEYS

    assert list(SLURM_SCHEMA) == list(SLURM_KEYS)  # the recipe's keys are --slurm's
    text = GOOD + "launcher:\n  parallel: 2\n  slurm: {partition: gpu, time: 30, mem: 8G}\n"
    r = recipes.load(write(tmp_path, text))
    assert r.launcher == {"parallel": 2, "slurm": {"partition": "gpu", "time": 30, "mem": "8G"}}
    assert "launcher" not in r.to_yaml()  # how the repeats ran: run.json records it, a publication does not carry it
    for bad, message in (("  parallel: 0", "r.yaml:19: launcher.parallel must be at least 1, got 0"),
                         ("  slurm: {nodes: 2}", "r.yaml:19: unknown key launcher.slurm.nodes"),
                         ("  slurm: {time: soon}", "r.yaml:19: launcher.slurm.time must be an integer, got 'soon'")):
        with pytest.raises(InvalidInput, match=message):
            recipes.load(write(tmp_path, GOOD + "launcher:\n" + bad + "\n"))
