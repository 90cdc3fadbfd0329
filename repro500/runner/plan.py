"""Stage 1, plan: the recipe, and every decision about where and how it runs, made once.

Device, engine, communication backend, compressor and world size are resolved here into a
typed :class:`Plan` that the runner, the capture and the workers share: nothing downstream
decides again what ``mutable.device: auto`` means.  Everything that can be checked before any
file is written is checked here (the workload's own check included).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from repro500.capture import seeds as seeding
from repro500.capture.hardware import usable_cpus
from repro500.errors import InvalidInput, UsageError
from repro500.ext import specs
from repro500.recipe import load as recipes
from repro500.runner import kinds
from repro500.verify import check_comparison_options
from repro500.workloads import workload as workloads

ENGINES = ("local", "ddp", "horovod", "command")
MAX_FACTORIAL_REPEATS = 200
DEFAULT_PER_CELL = 3  # --repeats-per-cell
DEFAULT_MAX_REPEATS = 10  # --until-decided without --max-repeats, when no plan can be made (runner/decide.py)


@dataclass
class RunOptions:
    recipe: str | None = None
    repeats: int | None = None
    overrides: list[str] = field(default_factory=list)
    params_file: str | None = None
    out_dir: str = "runs"
    deterministic: bool = False
    same_seed: bool = False
    open_division: bool = False
    resume: str | None = None
    run_code: bool = False  # with resume: consent to a run this machine's repro500 did not make
    nproc: int | None = None
    tracking: bool | None = None  # None: the params file's run.tracking, else on (a resume: the run's own)
    experiment: str | None = None
    artifacts: str | None = None  # where a new MLflow experiment keeps its artifacts (default: beside the store)
    run_id: str | None = None
    # the run named after the DVC experiment that runs it (runner/dvcexp.py); outside one, the default id
    run_id_from_dvc: bool = False
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    argv: list[str] = field(default_factory=lambda: list(sys.argv))
    adhoc: dict[str, Any] | None = None  # an ad-hoc recipe (repro500 run --command ..., repro500 ops ...), not a file
    adhoc_source: str = "--command"  # how errors name the ad-hoc recipe
    sign_key: str | None = None  # an OpenSSH Ed25519 key: the finished run is signed (docs/trust.md)
    sign_principal: str | None = None
    trace_inputs: bool = False  # a command's reads found with strace (fixed.observe_inputs: strace)
    until_decided: bool = False  # repeats one at a time until the verdict is decided (verify/sequential.py)
    max_repeats: int | None = None
    spending: str = "obrien-fleming"
    against: str | None = None  # verified against this reference; with until_decided it decides the stop
    margins: dict[str, float] = field(default_factory=dict)
    vary: list[str] | None = None  # a factorial run over these sources of randomness (capture/seeds.py)
    repeats_per_cell: int | None = None  # None: DEFAULT_PER_CELL
    started_ms: int | None = None  # when the user started the run (epoch ms; None: when its session is made)
    launcher: str | None = None  # where repeats run side by side: local (this node) | slurm (runner/fanout.py)
    parallel: int | None = None  # repeats at once (None with a launcher: one per CPU set or GPU)
    slurm: tuple[str, ...] = ()  # --slurm KEY=VALUE: a SLURM task's resources (slurm_resources)
    detach: bool = False  # --detach: return once SLURM has the repeats; --resume collects them


@dataclass
class Plan:
    """One run's resolved plan."""

    recipe: recipes.Recipe
    workload: workloads.Workload
    device: str  # cpu | cuda
    engine: str  # local | ddp | horovod | command
    backend: str | None  # gloo | nccl | horovod-gloo | horovod-nccl | None
    compressor: Any
    nproc: int
    nnodes: int
    node_rank: int
    same_seed: bool
    rendezvous: dict[str, Any] | None
    vary: list[str] | None = None  # a factorial run: the sources of randomness varied, one per cell
    per_cell: int = 0

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    @property
    def deterministic(self) -> bool:
        return bool(self.recipe.mutable.get("deterministic"))

    def cell(self, k: int) -> str | None:
        """The source repeat k varies (a factorial run), cells in the order given to --vary."""
        return self.vary[k // self.per_cell] if self.vary else None

    def varied(self, k: int) -> tuple[str, ...] | None:
        """The seeds repeat k draws for itself (None: all of them)."""
        cell = self.cell(k)
        return None if cell is None else seeding.SOURCES[cell]

    def deterministic_at(self, k: int) -> bool:
        """The kernels cell lets torch choose non-deterministic algorithms; every other repeat of a
        factorial run with that cell is deterministic, so only that cell varies the kernels."""
        return False if self.cell(k) == "kernels" else self.deterministic

    def seeds(self, k: int, rank: int = 0) -> seeding.Seeds:
        return seeding.derive_varied(self.recipe.seed, 0 if self.same_seed else k, rank, self.varied(k))


def resolve_device(requested: str) -> str:
    """``cpu`` or ``cuda``: what ``mutable.device`` means on this machine (auto: cuda when visible)."""
    if requested == "cpu":
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if requested == "cuda":
        raise InvalidInput("mutable.device is cuda but this machine has no usable CUDA device "
                           "(torch.cuda.is_available() is false); run with --set device=cpu or --set device=auto")
    return "cpu"


def comm_backend(engine: str, device: str) -> str | None:
    """The collective backend a distributed engine uses on ``device`` (none for ``local``)."""
    if engine in ("local", "command"):
        return None
    if engine == "horovod":
        if device != "cuda":
            return "horovod-gloo"
        try:
            import horovod.torch as hvd
        except ImportError:  # make_plan has refused the engine already (check_horovod)
            return "horovod-gloo"
        return "horovod-nccl" if hvd.nccl_built() else "horovod-gloo"
    return "nccl" if device == "cuda" else "gloo"


def rendezvous(options: RunOptions) -> dict[str, Any] | None:
    """torchrun's multi-node rendezvous (static: node 0 hosts rank 0); none for the head of a run
    whose repeats are SLURM tasks of several nodes: each task's nodes make their own
    (runner/fanout.py), the head takes part in none."""
    if options.nnodes <= 1 or options.launcher == "slurm":
        return None
    return {"nnodes": options.nnodes, "node_rank": options.node_rank, "endpoint": options.rdzv_endpoint}


def check_options(options: RunOptions) -> None:
    if options.run_id_from_dvc and options.run_id:
        raise UsageError("give --run-id or --run-id-from-dvc, not both: each names the run directory")
    if options.nnodes > 1 and options.launcher is None:  # a SLURM task's nodes find each other (check_launcher)
        if not options.rdzv_endpoint or not (options.run_id or options.resume):
            raise UsageError("a multi-node run started on each node needs --rdzv-endpoint HOST:PORT and the same "
                             "--run-id on every node; or let SLURM start each repeat's nodes: --launcher slurm")
        if not 0 <= options.node_rank < options.nnodes:
            raise UsageError(f"--node-rank must be in 0..{options.nnodes - 1}")
        if options.resume and options.node_rank != 0:
            raise UsageError("--resume is given on node 0 only; on every other node run the command that started "
                             "the run there (node 0 tells it which repeats are missing)")
        host, _, port = options.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) <= 65535:
            raise UsageError(f"--rdzv-endpoint {options.rdzv_endpoint} is not HOST:PORT with a port from 1 to 65535")
    if options.max_repeats is not None and not (options.until_decided or options.vary is not None):
        raise UsageError("--max-repeats caps a sequential run (--until-decided) or a factorial one (--vary); "
                         "a fixed design takes --repeats")
    if options.until_decided:
        from repro500.verify import (
            sequential,  # numpy and scipy: not before a wrapped command's first repeat
        )
    if options.until_decided and (options.max_repeats or 0) > sequential.MAX_DESIGN_REPEATS:
        raise UsageError(f"--max-repeats {options.max_repeats} is over the {sequential.MAX_DESIGN_REPEATS:,} a "
                         "sequential design may plan (its levels are simulated for every repeat)")
    if options.until_decided and options.repeats is not None:
        raise UsageError("--until-decided runs up to --max-repeats repeats; --repeats is for a fixed design")
    if options.until_decided and options.nnodes > 1 and options.launcher != "slurm":
        raise UsageError("--until-decided runs on one node: node 0 alone decides when to stop, and the other nodes "
                         "would wait for repeats that never start; give a fixed --repeats N on several nodes")
    if options.repeats_per_cell is not None and options.vary is None:
        raise UsageError("--repeats-per-cell goes with --vary (a factorial run); a fixed design takes --repeats")
    if options.vary is not None:
        check_factorial(options)
    check_comparison_options(options.margins, options.against)
    if options.nproc is not None and options.nproc < 1:
        raise UsageError("--nproc must be at least 1")
    check_launcher(options)
    if options.sign_key:
        from repro500.attest import keys

        keys.load_private_key(options.sign_key)  # a wrong passphrase fails now, not after training


LAUNCHERS = ("local", "slurm")


def check_launcher(options: RunOptions) -> None:
    """``--launcher``/``--parallel``: refused before anything is written (one sentence each)."""
    if options.detach and options.launcher is None and not options.resume:  # a resume may take the recorded one
        raise UsageError("--detach leaves the repeats to SLURM's queue and returns; it goes with --launcher slurm")
    if options.parallel is not None and options.launcher is None:
        raise UsageError(f"--parallel {options.parallel} needs a launcher to run the repeats side by side: "
                         "add --launcher local (this node) or --launcher slurm")
    if options.launcher is None:
        return
    if options.launcher not in LAUNCHERS:
        raise UsageError(f"--launcher {options.launcher} is not one of {', '.join(LAUNCHERS)}")
    if options.parallel is not None and options.parallel < 1:
        raise UsageError(f"--parallel must be a whole number of repeats of at least 1, not {options.parallel}")
    if options.launcher == "local" and (options.nnodes > 1 or options.node_rank > 0):
        raise UsageError("--launcher local runs each repeat on this node; a repeat of several nodes (--nnodes) is a "
                         "task of --launcher slurm")
    if options.launcher == "slurm" and (options.node_rank > 0 or options.rdzv_endpoint):
        raise UsageError("--launcher slurm starts the nodes of each repeat's task itself, and they find each other: "
                         "drop --node-rank and --rdzv-endpoint (--nnodes N makes each repeat a task of N nodes)")
    if options.slurm and options.launcher != "slurm":
        raise UsageError("--slurm sets the resources of the repeats' SLURM tasks; it goes with --launcher slurm")
    if options.detach and options.launcher != "slurm":
        raise UsageError("--detach leaves the repeats to SLURM's queue and returns; it goes with --launcher slurm")
    if options.detach and options.until_decided:
        raise UsageError("--until-decided looks at the verdict after each batch of repeats, which needs the head to "
                         "stay; drop --detach (or --until-decided)")
    if options.launcher == "slurm":
        import shutil

        if shutil.which("sbatch") is None:
            raise InvalidInput("--launcher slurm submits the repeats with sbatch, which is not on PATH here; "
                               "run on a SLURM login node, or use --launcher local")
        if "partition" in slurm_pairs(options.slurm):  # the default one may come from the recipe's launcher section
            slurm_resources(options.slurm)


# --slurm KEY=VALUE: what each key asks of SLURM for one repeat's task, and how its value reads
# (the keys of a recipe's launcher.slurm, recipe.schema.SLURM_SCHEMA).
SLURM_KEYS = {"partition": "a partition name", "time": "minutes", "cpus": "CPUs", "gpus": "GPUs",
              "mem": "memory (SLURM's --mem: 8G, 500M)", "account": "an account", "qos": "a QOS"}
_SLURM_COUNTS = {"time": 1, "cpus": 1, "gpus": 0}  # the smallest whole number each count may be


def slurm_resources(pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """The resources ``--slurm KEY=VALUE`` asks for each repeat's task (a later pair wins), checked
    (one sentence for a bad pair), with the partition checked against the ones SLURM knows and the
    time defaulted to its limit: nothing is submitted before."""
    resources = slurm_pairs(pairs)
    limits, default = slurm_partitions()
    partition = resources.get("partition") or default
    if partition is None:
        raise UsageError("SLURM has no default partition here: give one with --slurm partition=NAME "
                         f"(partitions: {', '.join(sorted(limits)) or 'none'})")
    if partition not in limits:
        raise UsageError(f"SLURM has no partition {partition} (partitions: {', '.join(sorted(limits)) or 'none'})")
    resources["partition"] = partition
    limit = limits[partition]
    if limit is not None and resources.get("time", 0) > limit:  # SLURM would keep such tasks pending forever
        raise UsageError(f"--slurm time={resources['time']} is more than partition {partition} allows "
                         f"({limit} minutes)")
    # without a time sbatch would get submitit's default of 5 minutes: the partition's own limit instead
    resources.setdefault("time", limit or _NO_LIMIT_MIN)
    return {key: resources[key] for key in SLURM_KEYS if key in resources}  # one order: run.json, the resume line


def slurm_pairs(pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``--slurm KEY=VALUE`` pairs as resources, each checked (a later pair wins); SLURM not asked."""
    resources: dict[str, Any] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not value:
            raise UsageError(f"--slurm {pair} is not KEY=VALUE (keys: {', '.join(SLURM_KEYS)})")
        if key not in SLURM_KEYS:
            raise UsageError(f"--slurm {key} is not one of {', '.join(SLURM_KEYS)}")
        if key in _SLURM_COUNTS:
            if not value.isdigit() or int(value) < _SLURM_COUNTS[key]:
                raise UsageError(f"--slurm {key}= takes a whole number of {SLURM_KEYS[key]} of at least "
                                 f"{_SLURM_COUNTS[key]}, not {value}")
            resources[key] = int(value)
        else:
            resources[key] = value
    return resources


_NO_LIMIT_MIN = 7 * 24 * 60  # a task's time where its partition sets no limit


def slurm_partitions() -> tuple[dict[str, int | None], str | None]:
    """The partitions SLURM knows (``sinfo``), each with its time limit in minutes (None:
    unlimited), and the default one."""
    import subprocess

    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%P|%l"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise InvalidInput(f"--launcher slurm cannot ask SLURM for its partitions (sinfo: {err})") from None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InvalidInput(f"--launcher slurm cannot ask SLURM for its partitions (sinfo: {said})")
    limits: dict[str, int | None] = {}
    default = None
    for line in done.stdout.splitlines():
        name, _, limit = line.strip().partition("|")
        if name.endswith("*"):
            name = default = name[:-1]
        if name:
            limits[name] = _minutes(limit)
    return limits, default


def _minutes(limit: str) -> int | None:
    """sinfo's time limit ([days-]hours:minutes:seconds, minutes:seconds, or infinite) in whole minutes."""
    days, _, clock = limit.rpartition("-") if "-" in limit else ("0", "", limit)
    parts = clock.split(":")
    if not days.isdigit() or not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        return None
    h, m, sec = ([0] * (3 - len(parts)) + [int(p) for p in parts]) if len(parts) > 1 else (0, int(parts[0]), 0)
    return max(1, int(days) * 1440 + h * 60 + m + (1 if sec else 0))


def recorded_plan(recipe: recipes.Recipe, meta: dict[str, Any], *, tracking: bool, nnodes: int = 1,
                  rdzv_endpoint: str | None = None, run_id: str | None = None, node_rank: int = 0,
                  launcher: str | None = None) -> Plan:
    """The plan of a run as run.json recorded it: what ``--resume`` and a fanned-out repeat's task
    (each of its nodes, *node_rank*) run: the same seeds, design and world size as the attempt
    that started the run."""
    factorial = meta.get("design") if (meta.get("design") or {}).get("kind") == "factorial" else {}
    return make_plan(recipe, RunOptions(same_seed=bool(meta.get("same_seed")), tracking=tracking,
                                        vary=factorial.get("sources"), repeats_per_cell=factorial.get("per_cell"),
                                        nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                                        run_id=run_id, launcher=launcher))


def check_factorial(options: RunOptions) -> None:
    """``--vary`` with its cells: known sources, a size within the limits."""
    assert options.vary is not None
    unknown = [name for name in options.vary if name not in seeding.SOURCES]
    if unknown or not options.vary or len(set(options.vary)) != len(options.vary):
        raise UsageError(f"--vary {','.join(options.vary)}: name each source once, from "
                         f"{', '.join(seeding.SOURCES)}" + (f" ({unknown[0]!r} is not one)" if unknown else ""))
    clash = [flag for flag, given in (("--repeats", options.repeats is not None), ("--same-seed", options.same_seed),
                                      ("--until-decided", options.until_decided)) if given]
    if clash:
        raise UsageError(f"--vary runs --repeats-per-cell repeats per source; {clash[0]} does not apply")
    per_cell = per_cell_of(options)
    if per_cell < 2:
        raise UsageError("--repeats-per-cell must be at least 2: one repeat has no spread")
    total = per_cell * len(options.vary)
    size = f"--vary {','.join(options.vary)} with --repeats-per-cell {per_cell} is {total} repeats"
    if options.max_repeats is not None and total > options.max_repeats:
        raise UsageError(f"{size}, more than --max-repeats {options.max_repeats}; use fewer repeats per cell "
                         f"(at most {options.max_repeats // len(options.vary)}) or fewer sources, or raise "
                         "--max-repeats")
    if total > MAX_FACTORIAL_REPEATS:
        raise UsageError(f"{size}, more than {MAX_FACTORIAL_REPEATS}; use fewer repeats per cell or fewer sources")


def per_cell_of(options: RunOptions) -> int:
    return DEFAULT_PER_CELL if options.repeats_per_cell is None else options.repeats_per_cell


def design_repeats(options: RunOptions) -> RunOptions:
    """The repeats a sequential or factorial run plans (every node computes the same)."""
    if options.until_decided:  # the recipe plans the most repeats; the looks decide how many run
        return replace(options, repeats=options.max_repeats or DEFAULT_MAX_REPEATS)
    if options.vary:  # a factorial run: one cell of repeats per source of randomness
        return replace(options, repeats=per_cell_of(options) * len(options.vary))
    return options


def load_recipe(options: RunOptions) -> recipes.Recipe:
    """The recipe a new run starts from, with the command line's engine choices applied."""
    kwargs: dict[str, Any] = {"overrides": options.overrides, "params_file": options.params_file,
                              "open_division": options.open_division, "repeats": options.repeats}
    if options.adhoc is not None:
        recipe = recipes.from_data(options.adhoc, options.adhoc_source, name=str(options.adhoc.get("name") or "command"),
                                   **kwargs)
    elif options.recipe:
        recipe = recipes.load(options.recipe, **kwargs)
    else:
        raise UsageError("give a RECIPE file, --command -- PROGRAM ARGS..., or --resume RUN_DIR")
    if options.vary and recipe.kind == "system":
        raise UsageError("--vary needs a trained workload: a system measurement draws no training randomness")
    if options.vary and recipe.is_command:
        raise UsageError("--vary needs a trained workload, whose seeds repro500 applies one source at a time; a "
                         "command receives one seed ({seed}), so its sources cannot be told apart")
    if recipe.is_command:
        if options.nproc or options.nnodes > 1:
            raise UsageError("--nproc and --nnodes are for trained workloads; a command launches its own processes")
        if options.trace_inputs:  # how reads are watched, not what runs: no --open-division needed
            recipe.fixed["observe_inputs"] = "strace"
    elif options.trace_inputs:
        raise UsageError("--trace-inputs is for a command (--command or fixed.workload: command); a trained "
                         "workload's data are its recipe's data paths")
    else:
        mutable = recipe.mutable
        if options.nproc is not None:
            mutable["nproc"] = options.nproc
            recipe.overrides["mutable.nproc"] = options.nproc
            if (options.nproc > 1 or options.nnodes > 1) and mutable["engine"] == "local":
                mutable["engine"] = "ddp"
        if options.nnodes > 1 and mutable["engine"] == "local":
            mutable["engine"] = "ddp"
    if options.deterministic or (options.vary and "kernels" in options.vary):
        recipe.mutable["deterministic"] = True  # only the kernels cell lets torch choose (Plan.deterministic_at)
    return recipe


def tracking_choice(options: RunOptions, recipe: recipes.Recipe) -> bool:
    """Log to MLflow or not: the command line, else the params file's ``run.tracking``, else yes."""
    if options.tracking is not None:
        return options.tracking
    return recipe.tracking if recipe.tracking is not None else True


def make_plan(recipe: recipes.Recipe, options: RunOptions) -> Plan:
    """Resolve and check everything before any file is written (UsageError / InvalidInput)."""
    mutable = recipe.mutable
    extra_paths = [str(Path(options.recipe).resolve().parent)] if options.recipe else []
    if recipe.is_command:
        work = kinds.make(recipe, tracking=tracking_choice(options, recipe))
        work.check()
        return Plan(recipe, work, "cpu", "command", None, specs.resolve("none"), 1, 1, 0, options.same_seed, None)
    engine = mutable["engine"]
    # What the run records (manifest, run.json, MLflow) is the resolved spec, every default filled
    # in, so that two runs of one compressor compare equal however their recipes spelled it; an
    # unknown name or a bad value is a UsageError here, before any work.
    compressor = specs.resolve(mutable.get("compressor", "none"), seed_per_repeat=True)
    if compressor["name"] != "none" and engine == "local":
        raise UsageError("a gradient compressor needs a distributed engine: add --nproc 2 (or more)")
    if (engine, compressor["name"]) in specs.UNSUPPORTED:
        raise UsageError(specs.UNSUPPORTED[(engine, compressor["name"])])
    if engine == "horovod":
        check_horovod()
    device = resolve_device(mutable["device"])
    check_variants(mutable, engine, device)
    nproc = int(mutable.get("nproc", 1))
    check_sync(mutable.get("sync") or {}, engine, nproc * options.nnodes, compressor["name"])
    if engine == "local" and nproc > 1:
        raise UsageError("mutable.nproc > 1 needs a distributed engine: --set engine=ddp (or horovod)")
    meeting = rendezvous(options)
    work = kinds.make(recipe, device=device, engine=engine, rendezvous=meeting, search_paths=extra_paths)
    work.check()
    if engine != "local":
        cores = usable_cpus()
        if device == "cpu" and nproc > cores:
            print(f"repro500: warning: {nproc} ranks on the {cores} CPU cores this process may use will "
                  "oversubscribe them", file=sys.stderr)
    warn_uncompressed(compressor, recipe, getattr(work, "train_samples", None), nproc * options.nnodes)
    return Plan(recipe, work, device, engine, comm_backend(engine, device), compressor, nproc,
                options.nnodes, options.node_rank, options.same_seed, meeting,
                list(options.vary) if options.vary else None, per_cell_of(options) if options.vary else 0)


def check_variants(mutable: dict[str, Any], engine: str, device: str) -> None:
    """The training variants a device or engine cannot run, refused before anything is captured."""
    from repro500.workloads.trainer.step import check_micro_batch, check_precision

    precision, micro = mutable.get("precision", "fp32"), mutable.get("micro_batch_size")
    check_precision(precision, device)
    check_micro_batch(micro, int(mutable.get("batch_size", 1)))
    # Horovod's optimizer reduces on every backward unless told how many to accumulate, and
    # unscaling fp16 gradients needs its synchronize() first: neither is wired up
    if engine == "horovod" and micro is not None:
        raise UsageError("mutable.micro_batch_size is not supported with engine horovod; use engine ddp (--nproc N)")
    if engine == "horovod" and precision == "amp-fp16":
        raise UsageError("mutable.precision amp-fp16 is not supported with engine horovod; use amp-bf16 or engine ddp")


def check_sync(sync: dict[str, Any], engine: str, world: int, compressor: str) -> None:
    """Parameter averaging (mutable.sync) needs ranks to average with, and the ddp engine's group."""
    mode, every = sync.get("mode", "allreduce"), sync.get("every", 1)
    if every < 1:
        raise InvalidInput(f"mutable.sync.every must be at least 1 (steps between averagings), got {every}")
    if mode == "allreduce":
        return
    if engine != "ddp" or world < 2:
        raise UsageError(f"mutable.sync.mode {mode} averages the parameters of several ranks: run it with --nproc 2 "
                         "(or more), which selects engine ddp")
    if compressor != "none":
        raise UsageError(f"mutable.sync.mode {mode} sends parameters, which the gradient compressors are not made for; "
                         "drop the compressor or use mode allreduce")


def check_horovod() -> None:
    """The horovod engine launches ``horovodrun`` (workloads/engines/launch.py): without it the run
    would fail only after its directory is written."""
    import importlib.util
    import shutil

    if shutil.which("horovodrun") is None or importlib.util.find_spec("horovod") is None:
        raise UsageError("engine horovod needs Horovod: build it with scripts/build_horovod.sh (see docs/distributed.md)")


def warn_uncompressed(compressor: dict[str, Any], recipe: recipes.Recipe, samples: int | None, world: int) -> None:
    """PowerSGD sends plain allreduces for its first ``start_iter`` steps: a repeat with no more steps
    than that never compresses, and its bytes are a dense allreduce's (each step record says
    ``compressed: false``).  Say so before training rather than leave a ratio of 1.0 to explain."""
    start = compressor.get("start_iter")
    if compressor["name"] != "powersgd" or not samples or start is None:
        return
    batch, epochs = int(recipe.mutable.get("batch_size", 1)), int(recipe.fixed.get("epochs", 1))
    steps = (samples // world) // batch * epochs  # DistributedSampler and the loader drop the rest
    if start >= steps:
        print(f"repro500: warning: powersgd compresses only after start_iter={start} steps, but a repeat runs at most "
              f"{steps} ({samples} samples / ({batch} x {world} ranks) x {epochs} epochs): no step will be compressed "
              f"and the bytes recorded are a plain allreduce's; lower it with --set compressor.start_iter=N "
              f"(N >= 2)", file=sys.stderr)


def preflight(recipe: recipes.Recipe, options: RunOptions | None = None) -> Plan:
    """Everything that can be checked before any training (kept for library users and tests)."""
    return make_plan(recipe, options or RunOptions())
