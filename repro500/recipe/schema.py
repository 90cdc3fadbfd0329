"""The recipe schema and its validation, with the file and line of every offending key
(``experiments/x.yaml:12: mutable.batch_size must be an integer, got 'big'``).

:mod:`repro500.recipe.load` loads, overrides and resolves recipes; this module says what a valid one
is: one table per section, and the rules that tie sections together (a trained workload's
model, data set and epochs; a command's argv and metric declarations).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from repro500 import untrusted
from repro500.errors import InvalidInput
from repro500.rundir.names import RECIPE_SCHEMA

SCHEMA = RECIPE_SCHEMA

# The trained tasks (the built-in trainer computes their loss and evaluates them), ``command``:
# any program, run once per repeat, whose metrics are read from what it produces (docs/command.md),
# and ``system``: a measurement of the machine itself (repro500.system, docs/system.md).
TASKS = ("classification", "detection", "regression")
WORKLOADS = (*TASKS, "command", "system")
MEASURES = ("ops", "roofline", "inference", "io")
DIRECTIONS = ("higher", "lower")
# The optimizers the trainer builds (repro500.workloads.trainer.train.build_optimizer): the recipe schema
# accepts exactly these, so a name the trainer cannot build is refused at load, before any work.
OPTIMIZERS = ("sgd", "adam", "adamw")


# ---------------------------------------------------------------------------------------------
# The schema: one table per section; a value is a type, a tuple of types, a list of choices, or
# a nested table for mappings.  ``None`` in a tuple allows null.
# ---------------------------------------------------------------------------------------------
NUMBER = (int, float)

DATASET_SCHEMA: dict[str, Any] = {
    "name": str,  # a registered name (entry point group repro500.datasets) or module:callable
    "entry": str,  # the same, spelt as a plug-in's import path; name and entry are alternatives
    "path": (str, list, type(None)),
    "params": dict,
    "eval_path": (str, type(None)),
}
TARGET_SCHEMA: dict[str, Any] = {"metric": str, "value": NUMBER, "direction": list(DIRECTIONS)}
OPTIMIZER_SCHEMA: dict[str, Any] = {
    "name": list(OPTIMIZERS),
    "lr": NUMBER,
    "momentum": NUMBER,
    "weight_decay": NUMBER,
    "nesterov": bool,
    "betas": list,
    "eps": NUMBER,
}
SCHEDULE_SCHEMA: dict[str, Any] = {
    "name": ["constant", "step", "multistep", "cosine"],
    "warmup_epochs": NUMBER,
    "step_epochs": int,
    "milestones": list,
    "gamma": NUMBER,
    "min_lr": NUMBER,
}

FIXED_SCHEMA: dict[str, Any] = {
    "workload": list(WORKLOADS),
    "model": str,
    "model_options": dict,
    "dataset": DATASET_SCHEMA,
    "target": TARGET_SCHEMA,
    "epochs": int,
    "valid_flops_exponent": int,
    "mlperf_benchmark": (str, type(None)),
    # a recipe that is not MLPerf's reference benchmark (another model, optimizer or data) says so:
    # its logs and `repro500 export mlperf` are then open division even when run as it is
    "mlperf_division": ["closed", "open"],
    "evaluate": (str, type(None)),  # evaluator: registered name or module:callable (docs/workloads.md)
    # a command workload (docs/command.md)
    "command": (list, str),  # a string is split as a POSIX shell splits words
    "workdir": str,
    "timeout_s": (int, float, type(None)),
    "outputs": list,
    "env": dict,
    "inputs": list,  # files and directories the command reads, hashed like data sets
    "observe_inputs": ["auto", "strace", "off"],  # how the files it opens are found (docs/command.md)
    "inputs_budget_mb": (int, float),
    "inputs_budget_s": (int, float),
    # a system workload (docs/system.md): what it measures, and that measurement's own options,
    # checked by repro500.system before anything is written
    "measure": list(MEASURES),
    "system": dict,
}
MUTABLE_SCHEMA: dict[str, Any] = {
    "batch_size": int,
    "eval_batch_size": int,
    "optimizer": OPTIMIZER_SCHEMA,
    "lr_schedule": SCHEDULE_SCHEMA,
    "device": ["cpu", "cuda", "auto"],
    "engine": ["local", "ddp", "horovod"],
    "nproc": int,
    "compressor": (str, dict),
    "workers": int,
    "threads": (int, type(None)),
    "deterministic": bool,
    "precision": ["fp32", "amp-bf16", "amp-fp16"],  # autocast (workloads/step.py)
    "micro_batch_size": (int, type(None)),  # gradient accumulation in parts of the batch
    "sync": {"mode": ["allreduce", "average", "gossip"], "every": int},  # workloads/engines/averaging.py
}
ACCEPTANCE_ENTRY_SCHEMA: dict[str, Any] = {
    "target": NUMBER,
    "direction": list(DIRECTIONS),
    "tolerance": NUMBER,
}
TOP_LEVEL = ("schema", "name", "description", "fixed", "mutable", "acceptance", "metrics", "repeats", "seed",
             "launcher")
# How the repeats fan out where the command line chooses a launcher (runner/fanout.py): not part of
# the benchmark (a reproducer's cluster is not the publisher's), so never written into a run's
# recipe.yaml; what a run used is recorded in run.json's launcher.  --parallel and --slurm win.
SLURM_SCHEMA: dict[str, Any] = {"partition": str, "time": int, "cpus": int, "gpus": int, "mem": str,
                                "account": str, "qos": str}
LAUNCHER_SCHEMA: dict[str, Any] = {"parallel": int, "slurm": SLURM_SCHEMA}

DEFAULT_MUTABLE: dict[str, Any] = {
    "batch_size": 64,
    "eval_batch_size": 256,
    "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0005, "nesterov": False},
    "lr_schedule": {"name": "constant"},
    "device": "cpu",
    "engine": "local",
    "nproc": 1,
    "compressor": "none",
    "workers": 0,
    "threads": None,
    "deterministic": False,
    "precision": "fp32",
    "micro_batch_size": None,
    "sync": {"mode": "allreduce", "every": 1},
}
# A system workload's mutable part: where it measures (its options are fixed.system's).
SYSTEM_MUTABLE: dict[str, Any] = {"device": "cpu", "engine": "local", "nproc": 1, "threads": None,
                                  "deterministic": False}
SYSTEM_KEYS = ("workload", "measure", "system")
SYSTEM_ONLY = ("measure", "system")
REQUIRED_FIXED = ("workload", "model", "dataset", "target", "epochs")
REQUIRED_COMMAND = ("command",)
# Keys only a trained workload has, and keys only a command has: naming one in the other kind of
# recipe is a mistake worth one sentence, not a silently ignored key.
TRAINED_ONLY = ("model", "model_options", "dataset", "epochs", "valid_flops_exponent", "mlperf_benchmark", "mlperf_division", "evaluate")
COMMAND_ONLY = ("command", "workdir", "timeout_s", "outputs", "env", "inputs", "observe_inputs", "inputs_budget_mb",
                "inputs_budget_s")


# ---------------------------------------------------------------------------------------------
# YAML with line numbers: compose the node tree and remember where every key path was defined.
# ---------------------------------------------------------------------------------------------
class Located:
    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: dict[str, int] = {}

    def where(self, path: str) -> str:
        # fall back to the nearest enclosing key that has a line
        probe = path
        while probe:
            if probe in self.lines:
                return f"{self.source}:{self.lines[probe]}"
            probe = probe.rpartition(".")[0]
        return self.source

    def construct(self, node: yaml.Node, path: str = "") -> Any:
        constructor = yaml.constructor.SafeConstructor()
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = constructor.construct_object(key_node, deep=True)
                if not isinstance(key, str):
                    raise InvalidInput(f"{self.source}:{key_node.start_mark.line + 1}: keys must be strings, got {key!r}")
                sub = f"{path}.{key}" if path else key
                if key in out:
                    raise InvalidInput(f"{self.source}:{key_node.start_mark.line + 1}: duplicate key {sub}")
                self.lines[sub] = key_node.start_mark.line + 1
                out[key] = self.construct(value_node, sub)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.construct(item, f"{path}[{i}]") for i, item in enumerate(node.value)]
        return constructor.construct_object(node, deep=True)


def load_located(text: str, source: str) -> tuple[Any, Located]:
    located = Located(source)
    try:
        node = untrusted.compose_yaml(text, source)  # aliases bounded: a recipe may come from a publication
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise InvalidInput(f"{where}: malformed YAML ({problem})") from None
    if node is None:
        return {}, located
    try:
        return located.construct(node), located
    except yaml.YAMLError as err:
        raise InvalidInput(f"{source}: malformed YAML ({err})") from None


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------
def _type_name(expected: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a mapping", list: "a list", type(None): "null"}
    if isinstance(expected, tuple):
        if expected == NUMBER:
            return "a number"
        return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in expected))
    return names.get(expected, getattr(expected, "__name__", str(expected)))


def _check_value(value: Any, expected: Any, path: str, loc: Located) -> None:
    if isinstance(expected, dict):
        if not isinstance(value, Mapping):
            raise InvalidInput(f"{loc.where(path)}: {path} must be a mapping, got {value!r}")
        _check_mapping(value, expected, path, loc)
        return
    if isinstance(expected, list):
        if value not in expected:
            raise InvalidInput(f"{loc.where(path)}: {path} must be one of {', '.join(map(str, expected))}; got {value!r}")
        return
    types = expected if isinstance(expected, tuple) else (expected,)
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        raise InvalidInput(f"{loc.where(path)}: {path} must be {_type_name(expected)}, got {value!r}")


def _check_mapping(value: Mapping[str, Any], schema: Mapping[str, Any], path: str, loc: Located) -> None:
    for key, sub in value.items():
        sub_path = f"{path}.{key}"
        if key not in schema:
            raise InvalidInput(
                f"{loc.where(sub_path)}: unknown key {sub_path} (allowed: {', '.join(schema)})"
            )
        _check_value(sub, schema[key], sub_path, loc)


def validate(data: Any, loc: Located) -> None:
    if not isinstance(data, Mapping):
        raise InvalidInput(f"{loc.source}: a recipe must be a YAML mapping with fixed, mutable and acceptance sections")
    for key in data:
        if key not in TOP_LEVEL:
            raise InvalidInput(f"{loc.where(key)}: unknown key {key} (allowed: {', '.join(TOP_LEVEL)})")
    if data.get("schema", SCHEMA) != SCHEMA:
        raise InvalidInput(f"{loc.where('schema')}: schema must be {SCHEMA}, got {data.get('schema')!r}")
    for section in ("fixed", "mutable", "acceptance"):
        if section in data and not isinstance(data[section], Mapping):
            raise InvalidInput(f"{loc.where(section)}: {section} must be a mapping")
    fixed = data.get("fixed") or {}
    mutable = data.get("mutable") or {}
    both = sorted(set(fixed) & set(mutable))
    if both:
        raise InvalidInput(
            f"{loc.where('mutable.' + both[0])}: {both[0]} is in both fixed and mutable; a key is either part of "
            "the benchmark's definition or tunable, not both"
        )
    _check_mapping(fixed, FIXED_SCHEMA, "fixed", loc)
    system = fixed.get("workload") == "system"
    if is_command_fixed(fixed):
        _validate_command(data, fixed, mutable, loc)
    elif system:
        _validate_system(data, fixed, mutable, loc)
    else:
        _validate_trained(data, fixed, mutable, loc)
    if "target" in fixed:
        for key in ("metric", "value"):
            if key not in fixed["target"]:
                raise InvalidInput(f"{loc.where('fixed.target')}: fixed.target.{key} is required")
    acceptance = data.get("acceptance") or {}
    if not acceptance and not system:  # a measurement may only measure (verify: nothing to decide)
        raise InvalidInput(f"{loc.where('acceptance')}: acceptance needs at least one metric with a target")
    for metric, entry in acceptance.items():
        path = f"acceptance.{metric}"
        _check_value(entry, ACCEPTANCE_ENTRY_SCHEMA, path, loc)
        if "target" not in entry:
            raise InvalidInput(f"{loc.where(path)}: {path}.target is required")
        if entry.get("tolerance", 0) < 0:
            raise InvalidInput(f"{loc.where(path + '.tolerance')}: {path}.tolerance must not be negative")
    if "launcher" in data:
        _check_value(data["launcher"], LAUNCHER_SCHEMA, "launcher", loc)
        slurm = data["launcher"].get("slurm") or {}
        for path, value, least in (("launcher.parallel", data["launcher"].get("parallel"), 1),
                                   ("launcher.slurm.time", slurm.get("time"), 1),
                                   ("launcher.slurm.cpus", slurm.get("cpus"), 1),
                                   ("launcher.slurm.gpus", slurm.get("gpus"), 0)):
            if value is not None and value < least:
                raise InvalidInput(f"{loc.where(path)}: {path} must be at least {least}, got {value}")
    for key in ("repeats", "seed"):
        if key in data:
            _check_value(data[key], int, key, loc)
    if data.get("repeats", 1) < 1:
        raise InvalidInput(f"{loc.where('repeats')}: repeats must be at least 1")
    untrusted.count(data.get("repeats", 1), loc.where("repeats"))  # a publication's recipe plans seeds for each
    if data.get("seed", 0) < 0:
        raise InvalidInput(f"{loc.where('seed')}: seed must be a non-negative integer")


def is_command_fixed(fixed: Mapping[str, Any]) -> bool:
    return fixed.get("workload") == "command" or ("command" in fixed and "workload" not in fixed)


def _validate_system(data: Mapping[str, Any], fixed: Mapping[str, Any], mutable: Mapping[str, Any], loc: Located) -> None:
    for key in fixed:
        if key not in SYSTEM_KEYS:
            raise InvalidInput(f"{loc.where('fixed.' + key)}: fixed.{key} is not part of a system workload, which "
                               f"has only {', '.join(SYSTEM_KEYS)} (docs/system.md)")
    if "measure" not in fixed:
        raise InvalidInput(f"{loc.where('fixed')}: fixed.measure is required: one of {', '.join(MEASURES)}")
    for key in mutable:
        if key not in SYSTEM_MUTABLE:
            raise InvalidInput(f"{loc.where('mutable.' + key)}: mutable.{key} is not tunable in a system workload "
                               f"(allowed: {', '.join(SYSTEM_MUTABLE)})")
    _check_mapping(mutable, MUTABLE_SCHEMA, "mutable", loc)
    if "metrics" in data:
        raise InvalidInput(f"{loc.where('metrics')}: metrics declares where a command's metrics come from; "
                           "a system workload's metrics are its measurement's")


def _validate_trained(data: Mapping[str, Any], fixed: Mapping[str, Any], mutable: Mapping[str, Any], loc: Located) -> None:
    _check_mapping(mutable, MUTABLE_SCHEMA, "mutable", loc)
    for key in REQUIRED_FIXED:
        if key not in fixed:
            raise InvalidInput(f"{loc.where('fixed')}: fixed.{key} is required")
    for key in SYSTEM_ONLY:
        if key in fixed:
            raise InvalidInput(f"{loc.where('fixed.' + key)}: fixed.{key} is for system workloads (fixed.workload: "
                               f"system, docs/system.md), not a {fixed['workload']} workload")
    for key in COMMAND_ONLY:
        if key in fixed:
            raise InvalidInput(f"{loc.where('fixed.' + key)}: fixed.{key} is for command workloads (fixed.workload: command), "
                               f"not a {fixed['workload']} workload")
    if "metrics" in data:
        raise InvalidInput(f"{loc.where('metrics')}: metrics declares where a command's metrics come from; "
                           "a trained workload's metrics are its evaluator's")
    dataset = fixed["dataset"]
    if "name" not in dataset and "entry" not in dataset:
        raise InvalidInput(f"{loc.where('fixed.dataset')}: fixed.dataset.name (or .entry, a plug-in's module:callable) is required")
    if "name" in dataset and "entry" in dataset:
        raise InvalidInput(f"{loc.where('fixed.dataset.entry')}: fixed.dataset has both name and entry; give one")
    if fixed["epochs"] < 1:
        raise InvalidInput(f"{loc.where('fixed.epochs')}: fixed.epochs must be at least 1")
    for key in ("batch_size", "eval_batch_size", "nproc"):
        if key in mutable and mutable[key] < 1:
            raise InvalidInput(f"{loc.where('mutable.' + key)}: mutable.{key} must be at least 1")


def _validate_command(data: Mapping[str, Any], fixed: Mapping[str, Any], mutable: Mapping[str, Any], loc: Located) -> None:
    for key in (*TRAINED_ONLY, *SYSTEM_ONLY):
        if key in fixed:
            raise InvalidInput(f"{loc.where('fixed.' + key)}: fixed.{key} belongs to a {'system' if key in SYSTEM_ONLY else 'trained'} workload; "
                               "a command workload names its program in fixed.command")
    argv = fixed.get("command")
    if isinstance(argv, str):
        import shlex

        try:
            argv = shlex.split(argv)
        except ValueError as err:
            raise InvalidInput(f"{loc.where('fixed.command')}: fixed.command cannot be split into words ({err})") from None
    if not argv or not all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in argv):
        raise InvalidInput(f"{loc.where('fixed.command')}: fixed.command must be a non-empty list of strings, "
                           f"e.g. [python, train.py, --lr, '{{mutable.lr}}']")
    for key, value in mutable.items():  # free-form, but each must be something a placeholder can show
        if isinstance(value, Mapping) or (isinstance(value, list) and any(isinstance(v, (Mapping, list)) for v in value)):
            raise InvalidInput(f"{loc.where('mutable.' + key)}: mutable.{key} of a command workload must be a scalar or a list of scalars")
    timeout = fixed.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or timeout <= 0):
        raise InvalidInput(f"{loc.where('fixed.timeout_s')}: fixed.timeout_s must be a positive number of seconds")
    metrics = data.get("metrics")
    if metrics is not None and not isinstance(metrics, Mapping):
        raise InvalidInput(f"{loc.where('metrics')}: metrics must be a mapping of metric name to its source")
    if not metrics:
        raise InvalidInput(f"{loc.where('metrics')}: a command workload must declare its metrics "
                           "(metrics: {accuracy: {regex: 'Acc@1 ([0-9.]+)'}}; docs/command.md)")
