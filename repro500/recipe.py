"""Benchmark recipes: load, validate, override and resolve ``experiments/*.yaml``.

Deep500's split, made strict (docs/recipes.md):

- ``fixed``: what defines the benchmark (workload, model, dataset, target quality, epoch budget).
  Changing any of it makes the run *open division*, which must be declared and is recorded.
- ``mutable``: what a submitter may tune (batch size, optimizer, lr schedule, device, engine,
  compressor, workers, ...).
- ``acceptance``: per metric, a target, a direction (higher/lower is better) and a tolerance.
- ``repeats`` and ``seed``.

Every error names the file and line of the offending key, e.g.
``experiments/x.yaml:12: mutable.batch_size must be an integer, got 'big'``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from repro500.errors import InvalidInput, UsageError

SCHEMA = "repro500/recipe/v1"

# The trained tasks (the built-in trainer computes their loss and evaluates them) and ``command``:
# any program, run once per repeat, whose metrics are read from what it produces (docs/command.md).
TASKS = ("classification", "detection", "regression")
WORKLOADS = (*TASKS, "command")
DIRECTIONS = ("higher", "lower")
# The optimizers the trainer builds (repro500.workloads.train.build_optimizer): the recipe schema
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
    "evaluate": (str, type(None)),  # evaluator: registered name or module:callable (docs/workloads.md)
    # a command workload (docs/command.md)
    "command": (list, str),  # a string is split as a POSIX shell splits words
    "workdir": str,
    "timeout_s": (int, float, type(None)),
    "outputs": list,
    "env": dict,
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
}
ACCEPTANCE_ENTRY_SCHEMA: dict[str, Any] = {
    "target": NUMBER,
    "direction": list(DIRECTIONS),
    "tolerance": NUMBER,
}
TOP_LEVEL = ("schema", "name", "description", "fixed", "mutable", "acceptance", "metrics", "repeats", "seed")

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
}
REQUIRED_FIXED = ("workload", "model", "dataset", "target", "epochs")
REQUIRED_COMMAND = ("command",)
# Keys only a trained workload has, and keys only a command has: naming one in the other kind of
# recipe is a mistake worth one sentence, not a silently ignored key.
TRAINED_ONLY = ("model", "model_options", "dataset", "epochs", "valid_flops_exponent", "mlperf_benchmark", "evaluate")
COMMAND_ONLY = ("command", "workdir", "timeout_s", "outputs", "env")


@dataclass
class Recipe:
    """A validated, resolved recipe."""

    name: str
    fixed: dict[str, Any]
    mutable: dict[str, Any]
    acceptance: dict[str, dict[str, Any]]
    repeats: int
    seed: int
    description: str = ""
    source: str = "<memory>"
    open_division: bool = False
    overrides: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)  # a command's metric declarations

    @property
    def is_command(self) -> bool:
        return self.fixed.get("workload") == "command"

    def to_dict(self) -> dict[str, Any]:
        """The resolved recipe as written to a run directory's ``recipe.yaml``."""
        return {
            "schema": SCHEMA,
            "name": self.name,
            "description": self.description,
            "fixed": copy.deepcopy(self.fixed),
            "mutable": copy.deepcopy(self.mutable),
            "acceptance": copy.deepcopy(self.acceptance),
            **({"metrics": copy.deepcopy(self.metrics)} if self.metrics else {}),
            "repeats": self.repeats,
            "seed": self.seed,
            "open_division": self.open_division,
            "overrides": copy.deepcopy(self.overrides),
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def flat_params(self) -> dict[str, str]:
        """``{"fixed.model": "resnet20", "mutable.optimizer.lr": "0.1", ...}`` for MLflow params."""
        out: dict[str, str] = {}
        for section in ("fixed", "mutable", "acceptance"):
            _flatten(getattr(self, section), section, out)
        out["repeats"] = str(self.repeats)
        out["seed"] = str(self.seed)
        out["open_division"] = str(self.open_division).lower()
        return out


def _flatten(value: Any, prefix: str, out: dict[str, str]) -> None:
    if isinstance(value, Mapping) and value:
        for key, sub in value.items():
            _flatten(sub, f"{prefix}.{key}", out)
    else:
        out[prefix] = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


# ---------------------------------------------------------------------------------------------
# YAML with line numbers: compose the node tree and remember where every key path was defined.
# ---------------------------------------------------------------------------------------------
class _Located:
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


def _load_yaml(text: str, source: str) -> tuple[Any, _Located]:
    located = _Located(source)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
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


def _check_value(value: Any, expected: Any, path: str, loc: _Located) -> None:
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


def _check_mapping(value: Mapping[str, Any], schema: Mapping[str, Any], path: str, loc: _Located) -> None:
    for key, sub in value.items():
        sub_path = f"{path}.{key}"
        if key not in schema:
            raise InvalidInput(
                f"{loc.where(sub_path)}: unknown key {sub_path} (allowed: {', '.join(schema)})"
            )
        _check_value(sub, schema[key], sub_path, loc)


def _validate(data: Any, loc: _Located) -> None:
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
    if _is_command(fixed):
        _validate_command(data, fixed, mutable, loc)
    else:
        _validate_trained(data, fixed, mutable, loc)
    if "target" in fixed:
        for key in ("metric", "value"):
            if key not in fixed["target"]:
                raise InvalidInput(f"{loc.where('fixed.target')}: fixed.target.{key} is required")
    acceptance = data.get("acceptance") or {}
    if not acceptance:
        raise InvalidInput(f"{loc.where('acceptance')}: acceptance needs at least one metric with a target")
    for metric, entry in acceptance.items():
        path = f"acceptance.{metric}"
        _check_value(entry, ACCEPTANCE_ENTRY_SCHEMA, path, loc)
        if "target" not in entry:
            raise InvalidInput(f"{loc.where(path)}: {path}.target is required")
        if entry.get("tolerance", 0) < 0:
            raise InvalidInput(f"{loc.where(path + '.tolerance')}: {path}.tolerance must not be negative")
    for key in ("repeats", "seed"):
        if key in data:
            _check_value(data[key], int, key, loc)
    if data.get("repeats", 1) < 1:
        raise InvalidInput(f"{loc.where('repeats')}: repeats must be at least 1")
    if data.get("seed", 0) < 0:
        raise InvalidInput(f"{loc.where('seed')}: seed must be a non-negative integer")


def _is_command(fixed: Mapping[str, Any]) -> bool:
    return fixed.get("workload") == "command" or ("command" in fixed and "workload" not in fixed)


def _validate_trained(data: Mapping[str, Any], fixed: Mapping[str, Any], mutable: Mapping[str, Any], loc: _Located) -> None:
    _check_mapping(mutable, MUTABLE_SCHEMA, "mutable", loc)
    for key in REQUIRED_FIXED:
        if key not in fixed:
            raise InvalidInput(f"{loc.where('fixed')}: fixed.{key} is required")
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


def _validate_command(data: Mapping[str, Any], fixed: Mapping[str, Any], mutable: Mapping[str, Any], loc: _Located) -> None:
    for key in TRAINED_ONLY:
        if key in fixed:
            raise InvalidInput(f"{loc.where('fixed.' + key)}: fixed.{key} belongs to a trained workload; "
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


def _deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# ---------------------------------------------------------------------------------------------
# Overrides (--set key=value, params.yaml)
# ---------------------------------------------------------------------------------------------
def parse_assignment(text: str) -> tuple[str, Any]:
    """``"optimizer.lr=0.05"`` -> ``("optimizer.lr", 0.05)``; the value is read as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"--set expects key=value, got {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def _apply_override(data: dict[str, Any], key: str, value: Any, open_division: bool, origin: str) -> str:
    parts = key.split(".")
    if parts[0] in ("repeats", "seed") and len(parts) == 1:
        data[parts[0]] = value
        return key
    if parts[0] not in ("fixed", "mutable", "acceptance"):
        # a bare key: mutable if the schema knows it, else fixed; a command's mutable keys are its own
        command = _is_command(data.get("fixed") or {})
        section = ("mutable" if command or parts[0] in MUTABLE_SCHEMA
                   else "fixed" if parts[0] in FIXED_SCHEMA else None)
        if section is None:
            raise UsageError(
                f"{origin}: unknown key {key!r}; mutable keys are {', '.join(MUTABLE_SCHEMA)}"
            )
        parts = [section, *parts]
    if parts[0] in ("fixed", "acceptance") and not open_division:
        raise UsageError(
            f"{origin}: {'.'.join(parts)} is part of the benchmark's definition; overriding it is only allowed "
            "in the open division (add --open-division, which is recorded with the results)"
        )
    node = data.setdefault(parts[0], {})
    for part in parts[1:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            # a scalar (e.g. compressor: none) is replaced by the mapping being set into it
            child = node[part] = {}
        node = child
    node[parts[-1]] = value
    return ".".join(parts)


def load(
    path: str | Path,
    *,
    overrides: list[str] | None = None,
    params_file: str | Path | None = None,
    open_division: bool = False,
    repeats: int | None = None,
) -> Recipe:
    """Load, override, validate and resolve a recipe file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInput(f"recipe {path} does not exist") from None
    except IsADirectoryError:
        raise InvalidInput(f"recipe {path} is a directory, not a recipe file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InvalidInput(f"recipe {path} cannot be read ({err})") from None
    data, loc = _load_yaml(text, str(path))
    return from_data(data, loc, overrides=overrides, params_file=params_file, open_division=open_division,
                     repeats=repeats, name=path.stem)


def from_data(
    data: Any,
    loc: _Located | str,
    *,
    overrides: list[str] | None = None,
    params_file: str | Path | None = None,
    open_division: bool = False,
    repeats: int | None = None,
    name: str = "recipe",
) -> Recipe:
    """Validate, override and resolve recipe ``data`` (a parsed YAML mapping); ``loc`` names its
    source in error messages (an ad-hoc ``--command`` recipe has no file)."""
    if isinstance(loc, str):
        loc = _Located(loc)
    path = loc.source
    _validate(data, loc)
    data = copy.deepcopy(data)
    applied: dict[str, Any] = {}

    if params_file is not None:
        params = load_params_file(params_file)
        open_division = open_division or bool(params.pop("open_division", False))
        params.pop("recipe", None)
        for key, value in _flatten_params(params):
            applied[_apply_override(data, key, value, open_division, str(params_file))] = value
        _validate(data, _Located(f"{params_file} (applied to {path})"))  # a params file is input: exit 4
    for assignment in overrides or []:
        key, value = parse_assignment(assignment)
        origin = f"--set {assignment}"
        applied[_apply_override(data, key, value, open_division, origin)] = value
        try:  # each --set on its own, so the message names the one at fault
            _validate(data, _Located(origin))
        except InvalidInput as err:  # a bad command-line value is a usage error, like click's (exit 2)
            raise UsageError(str(err)) from None
    if repeats is not None:
        data["repeats"] = repeats
        applied["repeats"] = repeats
        _validate(data, _Located(f"{path} (after --repeats)"))
    fixed_changed = any(k.startswith(("fixed.", "acceptance.")) for k in applied)

    fixed = copy.deepcopy(data["fixed"])
    if _is_command(fixed):
        fixed.setdefault("workload", "command")
        if isinstance(fixed["command"], str):
            import shlex

            fixed["command"] = shlex.split(fixed["command"])
        fixed["command"] = [str(a) for a in fixed["command"]]
        fixed.setdefault("workdir", ".")
        fixed.setdefault("timeout_s", None)
        fixed.setdefault("outputs", [])
        fixed.setdefault("env", {})
        mutable = copy.deepcopy(data.get("mutable") or {})
    else:
        mutable = _deep_merge(DEFAULT_MUTABLE, data.get("mutable") or {})
        fixed.setdefault("model_options", {})
        fixed["dataset"].setdefault("params", {})
        fixed["dataset"].setdefault("path", None)
        fixed.setdefault("valid_flops_exponent", 5)
        fixed.setdefault("mlperf_benchmark", None)
        fixed.setdefault("evaluate", None)
    if "target" in fixed:
        fixed["target"].setdefault("direction", "higher")
    acceptance = {
        metric: {"target": entry["target"], "direction": entry.get("direction", "higher"), "tolerance": entry.get("tolerance", 0.0)}
        for metric, entry in data["acceptance"].items()
    }
    return Recipe(
        name=str(data.get("name") or name),
        description=str(data.get("description") or ""),
        fixed=fixed,
        mutable=mutable,
        acceptance=acceptance,
        repeats=int(data.get("repeats", 3)),
        seed=int(data.get("seed", 0)),
        source=str(path),
        open_division=bool(open_division and fixed_changed),
        overrides=applied,
        metrics=copy.deepcopy(data.get("metrics") or {}),
    )


def load_params_file(path: str | Path) -> dict[str, Any]:
    """Read a DVC ``params.yaml``: ``recipe``, ``repeats``, ``seed``, ``mutable`` (and, in the open
    division, ``fixed``) sections applied on top of the recipe."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise InvalidInput(f"params file {path} does not exist") from None
    except yaml.YAMLError as err:
        raise InvalidInput(f"params file {path} is malformed YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"params file {path} must be a YAML mapping")
    run_section = data.get("run", data)
    if not isinstance(run_section, dict):
        raise InvalidInput(f"params file {path}: 'run' must be a mapping")
    allowed = {"recipe", "repeats", "seed", "mutable", "fixed", "acceptance", "open_division"}
    return {k: copy.deepcopy(v) for k, v in run_section.items() if k in allowed}


def _flatten_params(params: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in params.items():
        full = f"{prefix}.{key}" if prefix else key
        # dataset/target/optimizer... sub-mappings are merged key by key
        if isinstance(value, Mapping) and value and full.count(".") < 2:
            out.extend(_flatten_params(value, full))
        else:
            out.append((full, value))
    return out


def from_run_dir(run_dir: str | Path) -> Recipe:
    """Read the resolved recipe stored in a run directory (used by --resume and verify)."""
    path = Path(run_dir) / "recipe.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput(f"{path} is missing: not a repro500 run directory") from None
    except yaml.YAMLError as err:
        raise InvalidInput(f"{path} is malformed YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise InvalidInput(f"{path} is not a {SCHEMA} document")
    return Recipe(
        name=data["name"],
        description=data.get("description", ""),
        fixed=data["fixed"],
        mutable=data["mutable"],
        acceptance=data["acceptance"],
        repeats=int(data["repeats"]),
        seed=int(data["seed"]),
        source=str(path),
        open_division=bool(data.get("open_division", False)),
        overrides=data.get("overrides", {}),
        metrics=data.get("metrics") or {},
    )
