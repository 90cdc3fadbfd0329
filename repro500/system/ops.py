"""``repro500 ops``: one repeat times every operator case and checks its error (Deep500 level 0).

The cases are operators x dtypes x sizes on the run's device.  Everything that can be wrong
with them (an unknown name, a dtype the device lacks, a size that does not fit in memory, an
all-reduce with one rank) is refused by :func:`check` before the run directory exists; a dtype
one operator does not implement on the device (found by calling it on a tiny input) is skipped
and listed, never guessed at.

Per case the repeat summary reports ``<case>.time_s`` (median of the timed calls),
``<case>.flops_per_s``, ``<case>.bytes_per_s``, ``<case>.max_abs_err``, ``<case>.max_rel_err`` and
``<case>.err_eps``; the repeat's ``system.json`` keeps the full record (the median's interval,
call counts, FLOPs and bytes per call, the tolerance, the kernel's backend).  The recipe's
acceptance holds ``<case>.err_eps <= 0 + tolerance``, so ``repro500 verify`` FAILs an operator
whose error exceeds its tolerance, by name.
"""

from __future__ import annotations

import difflib
import zlib
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from repro500.errors import InvalidInput, UsageError
from repro500.system import DTYPES, KERNEL_OPERATORS, OPERATORS, SIZE_PRESETS, timing

CASE_METRICS = ("time_s", "flops_per_s", "bytes_per_s", "max_abs_err", "max_rel_err", "err_eps")
DEFAULT_MODEL = "resnet20"  # the all-reduce goes up to this model's gradient (the quickstart's)


@dataclass
class OpsConfig:
    """``fixed.system`` of an ops recipe, with the device and ranks the plan resolved."""

    operators: list[str]
    dtypes: list[str]
    sizes: str = "default"
    custom: dict[str, list[str]] = field(default_factory=dict)  # --size OP=SPEC
    model: str = DEFAULT_MODEL
    tolerances: dict[str, float] = field(default_factory=dict)  # operator -> epsilons, replacing the stated one
    budget: timing.Budget = field(default_factory=timing.Budget)
    device: str = "cpu"
    nproc: int = 1
    engine: str = "local"
    explicit: bool = False  # operators and dtypes both named: a combination without a kernel is refused

    @classmethod
    def from_recipe(cls, system: dict[str, Any], mutable: dict[str, Any], device: str) -> OpsConfig:
        nproc = int(mutable.get("nproc") or 1)
        operators = list(system.get("operators") or [op for op in OPERATORS if op != "allreduce" or nproc > 1])
        budget = timing.Budget(**{k: system[k] for k in ("warmup", "min_reps", "max_reps", "budget_s") if k in system})
        return cls(operators=operators, dtypes=list(system.get("dtypes") or DTYPES),
                   sizes=str(system.get("sizes", "default")), custom=dict(system.get("custom") or {}),
                   model=str(system.get("model") or DEFAULT_MODEL), tolerances=dict(system.get("tolerances") or {}),
                   budget=budget, device=device, nproc=nproc, engine=str(mutable.get("engine") or "local"),
                   explicit=bool(system.get("operators") and system.get("dtypes")))


def _closest(name: str, allowed: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(name, allowed, n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def check_names(operators: list[str], dtypes: list[str], sizes: str, custom: dict[str, list[str]],
                tolerances: dict[str, float]) -> None:
    """Names a user typed (usage errors, exit 2): operators, dtypes, the size preset."""
    for op in [*operators, *custom, *tolerances]:
        if op not in OPERATORS:
            raise UsageError(f"unknown operator {op!r}; {_closest(op, OPERATORS)}known: {', '.join(OPERATORS)}")
    for dt in dtypes:
        if dt not in DTYPES:
            raise UsageError(f"unknown dtype {dt!r}; {_closest(dt, DTYPES)}known: {', '.join(DTYPES)}")
    if sizes not in SIZE_PRESETS:
        raise UsageError(f"unknown size preset {sizes!r}; known: {', '.join(SIZE_PRESETS)}")


def shapes(config: OpsConfig, op: str) -> list[dict[str, int]]:
    from repro500.system.operators import REGISTRY

    if op in config.custom:
        return [REGISTRY[op].parse(spec) for spec in config.custom[op]]
    if op == "allreduce" and config.sizes != "tiny":
        from repro500.scaling.sizes import params_of
        from repro500.system.allreduce import sizes_up_to

        return [{"bytes": b} for b in sizes_up_to(4 * params_of(config.model))]
    presets = REGISTRY[op].presets
    return presets.get(config.sizes) or presets["default"]


def expand(config: OpsConfig) -> list[Any]:
    from repro500.system import kernels  # noqa: F401 - registers repro500's kernels
    from repro500.system.operators import Case

    return [Case(op, dt, config.device, tuple(d.items()))
            for op in config.operators for dt in config.dtypes for d in shapes(config, op)]


@cache
def unsupported(op: str, dtype: str, device: str) -> str | None:
    """Why ``op`` cannot run in ``dtype`` on ``device`` (None: it can), from one call on a tiny input."""
    if op == "allreduce":
        return None  # decided by the ranks themselves (allreduce.py records a backend's refusal)
    import torch

    from repro500.system.operators import DTYPES as TORCH_DTYPES
    from repro500.system.operators import REGISTRY

    spec = REGISTRY[op]
    tiny = {key: 4 if key != "k" else 3 for key in spec.keys}
    try:
        x = spec.make(tiny, TORCH_DTYPES[dtype], device, torch.Generator().manual_seed(0))
        spec.call(x)()
    except (RuntimeError, NotImplementedError, TypeError) as err:
        return f"{op} has no {dtype} kernel on {device} ({str(err).splitlines()[0][:160]})"
    return None


def available_bytes(device: str) -> int | None:
    if device == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[0])
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check(config: OpsConfig) -> list[Any]:
    """Refuse what cannot be measured (before anything is written); the cases that will run."""
    from repro500.system.operators import ITEMSIZE, REGISTRY

    check_names(config.operators, config.dtypes, config.sizes, config.custom, config.tolerances)
    if "allreduce" in config.operators:
        if config.nproc < 2:
            raise UsageError("the all-reduce needs at least two ranks: add --nproc 2 (or leave allreduce out)")
        if config.engine == "horovod":
            raise UsageError("repro500 ops times torch.distributed's all-reduce (the ddp engine); Horovod's is not "
                             "measured: leave --set engine=horovod out")
    if config.device == "cuda" and "bf16" in config.dtypes:
        import torch

        if not torch.cuda.is_bf16_supported():
            raise InvalidInput(f"bf16 is not supported by this GPU ({torch.cuda.get_device_name()}); "
                               "leave it out (--dtype fp32 --dtype fp16)")
    cases = expand(config)
    available = available_bytes(config.device)
    for case in cases:
        need = REGISTRY[case.op].footprint(case.dims, ITEMSIZE[case.dtype])
        if available is not None and need > available:
            raise InvalidInput(f"{case.id} needs about {need / 2**30:.1f} GiB but {available / 2**30:.1f} GiB of "
                               f"{config.device} memory are available: choose a smaller --size")
    runnable = [c for c in cases if unsupported(c.op, c.dtype, c.device) is None]
    missing = [c for c in cases if c not in runnable]
    if missing and (config.explicit or not runnable):  # asked for by name, or nothing at all to measure
        raise InvalidInput(f"{unsupported(missing[0].op, missing[0].dtype, missing[0].device)}: leave "
                           f"--dtype {missing[0].dtype} or --op {missing[0].op} out")
    return runnable


def metric_names(cases: list[Any]) -> list[str]:
    return [f"{c.id}.{m}" for c in cases for m in CASE_METRICS]


def acceptance(cases: list[Any], config: OpsConfig) -> dict[str, dict[str, Any]]:
    """``<case>.err_eps <= 0 + tolerance`` for every case: what ``repro500 verify`` decides."""
    from repro500.system.operators import tolerance_eps, tolerance_for

    out = {}
    for c in cases:
        tol = config.tolerances.get(c.op)
        if tol is None:
            tol = tolerance_for(config.nproc) if c.op == "allreduce" else tolerance_eps(c.op, c.dims)
        out[f"{c.id}.err_eps"] = {"target": 0.0, "direction": "lower", "tolerance": float(tol)}
    return out


def measure_case(case: Any, seed: int, budget: timing.Budget) -> dict[str, Any]:
    """Error against float64 first (on the first call's output), then the timed calls."""
    import torch

    from repro500.system.operators import DTYPES as TORCH_DTYPES
    from repro500.system.operators import ITEMSIZE, REGISTRY, error, inputs64, tolerance_eps

    spec, dims = REGISTRY[case.op], case.dims
    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(case.id.encode())) % 2**63)
    x = spec.make(dims, TORCH_DTYPES[case.dtype], case.device, gen)
    call, sync = spec.call(x), timing.synchronizer(case.device)
    with timing.math_mode(case.dtype):
        out = call()
        sync()
        err = error(spec.outputs64(out, x), spec.reference(inputs64(x)), case.dtype)
        del out
        t = timing.time_calls(call, sync, budget)
    flops, moved = spec.flops(dims), spec.bytes(dims, ITEMSIZE[case.dtype])
    record = {"id": case.id, "op": case.op, "dtype": case.dtype, "device": case.device, "shape": dims,
              "time": t.as_dict(), "flops": flops, "bytes": moved,
              "flops_per_s": flops / t.median_s if flops and t.median_s > 0 else None,
              "bytes_per_s": moved / t.median_s if t.median_s > 0 else None,
              "error": err, "tolerance_eps": tolerance_eps(case.op, dims)}
    if case.op in KERNEL_OPERATORS:
        from repro500.system.kernels import backend

        record["backend"] = backend(case.device)
    return record


def metrics_of(record: dict[str, Any]) -> dict[str, Any]:
    err = record["error"]
    return {f"{record['id']}.time_s": record["time"]["median_s"], f"{record['id']}.flops_per_s": record["flops_per_s"],
            f"{record['id']}.bytes_per_s": record["bytes_per_s"], f"{record['id']}.max_abs_err": err["max_abs_err"],
            f"{record['id']}.max_rel_err": err["max_rel_err"], f"{record['id']}.err_eps": err["err_eps"]}


def run(config: OpsConfig, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One repeat: (the summary's metrics, the record kept as the repeat's system.json)."""
    import torch

    cases = expand(config)
    local = [c for c in cases if c.op != "allreduce"]
    records, skipped = [], []
    for case in local:
        why = unsupported(case.op, case.dtype, case.device)
        if why:
            skipped.append({"id": case.id, "reason": why})
            continue
        records.append(measure_case(case, seed, config.budget))
    reduced = [c for c in cases if c.op == "allreduce"]
    if reduced:
        from repro500.system.allreduce import measure

        backend = "nccl" if config.device == "cuda" else "gloo"
        for rec in measure(reduced, config.nproc, backend, seed, config.budget):
            (skipped if "skipped" in rec else records).append(
                {"id": rec["id"], "reason": rec["skipped"]} if "skipped" in rec else rec)
    for rec in records:  # the tolerance the verdict applies is the one recorded
        rec["tolerance_eps"] = config.tolerances.get(rec["op"], rec["tolerance_eps"])
        rec["within_tolerance"] = rec["error"]["err_eps"] <= rec["tolerance_eps"]
    metrics: dict[str, Any] = {}
    for rec in records:
        metrics.update(metrics_of(rec))
    doc = {"measure": "ops", "device": config.device, "threads": torch.get_num_threads(), "ranks": config.nproc,
           "budget": asdict(config.budget), "cases": records, "skipped": skipped}
    return metrics, doc
