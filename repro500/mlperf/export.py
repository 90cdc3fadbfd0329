"""``repro500 export mlperf``: a run's MLPerf logs as a submission tree in MLPerf's layout.

::

    OUT/                               the submitter's folder (what MLPerf's tools are given)
      systems/<system>.json            the system description, from the run's manifest
      results/<system>/<benchmark>/result_<k>.txt             training (ResNet): repeat k's log
      results/<system>/strong/<benchmark>/result_<k>.txt      HPC (CosmoFlow): strong scaling
      repro500-export.json             where it came from (run id, manifest digest, the division rule)

The division is ``closed`` when the run kept its recipe's benchmark definition (no fixed or
acceptance key overridden: ``open_division`` false in run.json) and ``open`` otherwise; each
result file is the repeat's log with its one ``submission_division`` line set to that division,
so that the logs and systems/<system>.json agree (MLPerf's compliance checker picks its rules
from the log, the package checker from the system file).  Nothing else in a log changes.

An export vouches for the run, so only an intact one is exported: the whole act, archive and gate
included, is :func:`repro500.verify.vouching.export_mlperf` (the gate is verify's, a layer above);
here are its steps, :func:`open_run` before the gate and :func:`export_intact` after it.

The tree is written into a temporary sibling of OUT and renamed into place when complete: an
export that fails leaves nothing behind.  Whether MLPerf's own tools accept it is
:mod:`repro500.mlperf.checkers`'s (docs/mlperf.md).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500 import untrusted
from repro500.errors import InvalidInput, UsageError
from repro500.mlperf.check import logged_benchmark, resolve_rules
from repro500.mlperf.logger import BENCHMARKS, run_division
from repro500.recipe.load import from_run_dir
from repro500.rundir import atomic
from repro500.rundir.layout import MLLOG, RunDir, read_json, repeat_indices
from repro500.rundir.writable import writing

EXPORT_SCHEMA = "repro500/mlperf-export/v1"
EXPORT_NOTE = "repro500-export.json"
_PREFIX = ":::MLLOG "
# The system description checker of training >= 4.0 accepts only these availabilities; the
# logs say "research" (MLPerf's log value for the same thing).
STATUS_RDI = "Research, Development, or Internal (RDI)"


@dataclass(frozen=True)
class ExportedTree:
    path: Path  # the submitter's folder (OUT)
    system: str
    submitter: str
    benchmark: str
    usage: str
    ruleset: str
    division: str
    division_reason: str
    results: list[Path]  # result files, relative to path
    results_dir: Path  # results/<system>[/strong]/<benchmark>, relative to path
    notes: list[str] = field(default_factory=list)


def _slug(text: str) -> str:
    """A name MLPerf's tools can use as a file and folder name (they split paths on '/')."""
    text = re.sub(r"\((R|TM|C)\)", "", text)  # Intel(R) Xeon(R) -> Intel Xeon
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_") or "system"


def _record(line: str) -> dict[str, Any] | None:
    if not line.startswith(_PREFIX):
        return None
    return untrusted.json_record(line[len(_PREFIX):])  # a line nested absurdly deep is no record either


def logged_value(lines: list[str], key: str) -> Any:
    """The value of the first ``key`` record of a log (None when absent)."""
    for line in lines:
        record = _record(line)
        if record is not None and record.get("key") == key:
            return record.get("value")
    return None


def with_division(text: str, division: str) -> str:
    """The log with its ``submission_division`` record's value set to ``division``, every other
    line (and that line's other fields) as it was."""
    out = []
    for line in text.splitlines(keepends=True):
        record = _record(line.rstrip("\n"))
        if record is not None and record.get("key") == "submission_division":
            record["value"] = division
            line = _PREFIX + json.dumps(record) + ("\n" if line.endswith("\n") else "")
        out.append(line)
    return "".join(out)


# ----- the system description -------------------------------------------------------------------
def _size(n: Any) -> str:
    if not isinstance(n, int | float) or n <= 0:
        return ""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{int(n)} B"


def _caches(cpu: dict[str, Any]) -> str:
    names = {"Data": "d", "Instruction": "i", "Unified": ""}
    return ", ".join(f"L{c.get('level')}{names.get(c.get('type'), '')} {_size(c.get('size_bytes'))}"
                     for c in cpu.get("caches") or [])


def _distribution(env: dict[str, Any], name: str) -> str | None:
    for dist in env.get("distributions") or []:
        if str(dist.get("name", "")).lower() == name:
            return str(dist.get("version"))
    return None


def system_description(manifest: dict[str, Any], meta: dict[str, Any], *, submitter: str, division: str,
                       system: str, accelerators_per_node: int) -> dict[str, str]:
    """MLPerf's system description fields from the manifest's hardware and environment facets.

    Every value is a string (MLPerf's system description checker joins some with ","), and a
    fact the manifest does not record (storage, cooling, interconnect topology) is an empty
    string, never a guess."""
    facets = manifest.get("facets") or {}
    hw, env = facets.get("hardware") or {}, facets.get("environment") or {}
    tool = manifest.get("tool") or {}
    digest = (manifest.get("digest") or {}).get("value", "")
    return {
        "submitter": submitter,
        "division": division,
        "status": STATUS_RDI,
        "system_name": system,
        "number_of_nodes": str(meta.get("nnodes") or 1),
        **_host_fields(hw),
        **_accelerator_fields(hw, accelerators_per_node),
        "cooling": "",
        "hw_notes": (f"from repro500 run {meta.get('run_id')} (manifest sha256 {digest}); "
                     "empty fields are facts the run did not record"),
        **_software_fields(env, accelerators_per_node),
        "sw_notes": f"{tool.get('name', 'repro500')} {tool.get('version', '')}".strip(),
    }


def _host_fields(hw: dict[str, Any]) -> dict[str, str]:
    """The system description's host_* fields, from the hardware facet's CPU, memory and network."""
    cpu, memory = hw.get("cpu") or {}, hw.get("memory") or {}
    sockets = int(cpu.get("sockets") or 1)
    mhz = cpu.get("max_frequency_mhz") or cpu.get("current_frequency_mhz")
    links = [f"{n.get('name')} ({n.get('driver') or 'unknown driver'})"
             for n in hw.get("network") or [] if not n.get("virtual")]
    links += [f"InfiniBand {ib.get('name', '')}".strip() for ib in hw.get("infiniband") or []]
    return {
        "host_processors_per_node": str(sockets),
        "host_processor_model_name": str(cpu.get("model") or cpu.get("architecture") or ""),
        "host_processor_core_count": str((cpu.get("cores") or 0) // sockets or ""),
        "host_processor_vcpu_count": str(cpu.get("threads") or ""),
        "host_processor_frequency": f"{mhz} MHz" if mhz else "",
        "host_processor_caches": _caches(cpu),
        "host_processor_interconnect": "",
        "host_memory_capacity": _size(memory.get("total_bytes")),
        "host_storage_type": "",
        "host_storage_capacity": "",
        "host_networking": ", ".join(links),
        "host_networking_topology": "",
        "host_memory_configuration": f"{len(hw.get('numa') or [])} NUMA node(s)" if hw.get("numa") else "",
    }


def _accelerator_fields(hw: dict[str, Any], accelerators_per_node: int) -> dict[str, str]:
    """The accelerator fields, from the first GPU the hardware facet lists (none on a CPU-only run)."""
    gpus = hw.get("gpus") or []
    gpu = gpus[0] if gpus and accelerators_per_node else {}
    pcie = (f"PCIe Gen{gpu['pcie_max_generation']} x{gpu.get('pcie_max_width')}"
            if gpu.get("pcie_max_generation") else "")
    return {
        "accelerators_per_node": str(accelerators_per_node),
        "accelerator_model_name": str(gpu.get("name") or ""),
        "accelerator_host_interconnect": pcie,
        "accelerator_frequency": f"{gpu['max_sm_clock_mhz']} MHz" if gpu.get("max_sm_clock_mhz") else "",
        "accelerator_on-chip_memories": "",
        "accelerator_memory_configuration": "",
        "accelerator_memory_capacity": _size(gpu.get("memory_total_bytes")),
        "accelerator_interconnect": "",
        "accelerator_interconnect_topology": "",
    }


def _software_fields(env: dict[str, Any], accelerators_per_node: int) -> dict[str, str]:
    """framework, other_software_stack and operating_system, from the environment facet (the CUDA
    libraries only where the run used accelerators)."""
    os_info = env.get("os") or {}
    torch_build = env.get("torch_build") or {}
    python = (env.get("python") or {}).get("version")
    stack = [f"Python {python}" if python else "",
             f"torchvision {torch_build['torchvision']}" if torch_build.get("torchvision") else "",
             f"CUDA {torch_build['cuda']}" if torch_build.get("cuda") and accelerators_per_node else "",
             f"cuDNN {torch_build['cudnn']}" if torch_build.get("cudnn") and accelerators_per_node else "",
             f"mlperf-logging {_distribution(env, 'mlperf-logging')}" if _distribution(env, "mlperf-logging") else ""]
    distro = (os_info.get("distribution") or {}).get("PRETTY_NAME") or os_info.get("system") or ""
    return {
        "framework": f"PyTorch {torch_build['version']}" if torch_build.get("version") else "",
        "other_software_stack": ", ".join(s for s in stack if s),
        "operating_system": " ".join(s for s in (distro, os_info.get("kernel") or "") if s),
    }


def default_system(manifest: dict[str, Any], nodes: int, accelerators_per_node: int) -> str:
    """``<nodes>x<accelerators>x<model>`` (MLPerf's habit), the CPU's model on a CPU-only run."""
    hw = (manifest.get("facets") or {}).get("hardware") or {}
    gpus = hw.get("gpus") or []
    if accelerators_per_node and gpus:
        return _slug(f"{nodes}x{accelerators_per_node}x{gpus[0].get('name') or 'gpu'}")
    return _slug(f"{nodes}x{(hw.get('cpu') or {}).get('model') or 'cpu'}")


# ----- the export -------------------------------------------------------------------------------
def _repeat_logs(rd: RunDir) -> tuple[dict[int, str], list[int]]:
    """The logs of the finished repeats (completed or diverged: MLPerf runs, converged or not),
    and the repeats that have a log but did not finish (a crash, a kill: no MLPerf result)."""
    finished = rd.summaries(max(repeat_indices(rd.path), default=-1) + 1, finished_only=True)
    logs, unfinished = {}, []
    for k in repeat_indices(rd.path):
        path = rd.repeat(k) / MLLOG
        if not path.is_file():
            continue
        if k not in finished:
            unfinished.append(k)
            continue
        try:
            logs[k] = untrusted.read_text(path, "a repeat's MLPerf log", untrusted.MAX_LOG_BYTES)
        except OSError as err:
            raise InvalidInput(f"{path} cannot be read ({err.__class__.__name__}): the run is corrupt") from None
    return logs, unfinished


def prepare_out(out: Path) -> None:
    """``out`` may be written: it does not exist, or is an empty directory."""
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise InvalidInput(f"{out} already exists and is not empty: export into a new or empty directory")


def open_run(root: Path, out: Path) -> RunDir:
    """The run directory to export into ``out``, refused when it is no run or ``out`` cannot take the tree.

    Whether the run is intact is not asked here: :func:`repro500.verify.vouching.export_mlperf`
    asks verify's gate between this and :func:`export_intact` (the gate is a layer above)."""
    rd = RunDir(root)
    if not root.is_dir() or not rd.is_run():
        raise InvalidInput(f"{root} is not a repro500 run directory (no run.json): give runs/<run-id>")
    prepare_out(out)
    if out.resolve().is_relative_to(root.resolve()):
        raise UsageError(f"{out} lies inside the run directory: export somewhere else")
    return rd


def export_intact(
    rd: RunDir,
    out: Path,
    *,
    submitter: str | None = None,
    system: str | None = None,
    ruleset: str | None = None,
    progress: Callable[[str], None] = lambda _line: None,
) -> ExportedTree:
    """Write the MLPerf submission tree of ``rd`` (as :func:`open_run` gave it, and found intact by
    the caller) into ``out``; the options are :func:`repro500.verify.vouching.export_mlperf`'s."""
    root = rd.path
    meta = rd.meta()
    logs, notes, benchmark = _results(rd, root, progress)
    usage, ruleset = resolve_rules(benchmark, None, ruleset)
    manifest = read_json(rd.manifest_path(), "the manifest")
    first = logs[min(logs)].splitlines()
    accelerators = int(logged_value(first, "accelerators_per_node") or 0)
    nodes = int(meta.get("nnodes") or logged_value(first, "number_of_nodes") or 1)
    submitter = _file_name("submitter", submitter or str(logged_value(first, "submission_org") or "repro500"))
    system = _file_name("system", system or default_system(manifest, nodes, accelerators))

    division, reason = run_division(from_run_dir(root).fixed.get("mlperf_division"), bool(meta.get("open_division")))
    progress(f"division {division}: {reason}")

    results_dir = Path("results", system, *(["strong"] if usage == "hpc" else []), benchmark)
    desc = system_description(manifest, meta, submitter=submitter, division=division, system=system,
                              accelerators_per_node=accelerators)
    note = {"schema": EXPORT_SCHEMA, "run_id": meta.get("run_id"),
            "manifest_sha256": (manifest.get("digest") or {}).get("value"),
            "benchmark": benchmark, "usage": usage, "ruleset": ruleset, "division": division,
            "division_reason": reason, "system": system, "submitter": submitter,
            "results": {str(results_dir / f"result_{k}.txt"): f"repeats/{k}/{MLLOG}" for k in sorted(logs)},
            "changed_in_logs": f"submission_division set to {division!r}; nothing else"}
    files = {Path("systems") / f"{system}.json": desc, Path(EXPORT_NOTE): note,
             **{results_dir / f"result_{k}.txt": with_division(text, division) for k, text in sorted(logs.items())}}
    _write_tree(out, files, progress)
    return ExportedTree(path=out, system=system, submitter=submitter, benchmark=benchmark, usage=usage,
                        ruleset=ruleset, division=division, division_reason=reason,
                        results=[results_dir / f"result_{k}.txt" for k in sorted(logs)],
                        results_dir=results_dir, notes=notes)


def _results(rd: RunDir, root: Path, progress: Callable[[str], None]) -> tuple[dict[int, str], list[str], str]:
    """(the finished repeats' logs, notes on the unfinished ones, the one benchmark they log)."""
    logs, unfinished = _repeat_logs(rd)
    if not logs:
        raise InvalidInput(f"{root} has no MLPerf logs of finished repeats (repeats/<k>/{MLLOG}): "
                           "only trained workloads write them")
    notes = [f"repeats {', '.join(map(str, unfinished))} did not finish: their logs are not results"] if unfinished else []
    for line in notes:
        progress(line)
    benchmarks = {k: logged_benchmark(root / "repeats" / str(k) / MLLOG) for k in logs}
    benchmark = benchmarks[min(logs)]
    if len(set(benchmarks.values())) > 1:
        raise InvalidInput(f"{root}'s repeats log different benchmarks ({', '.join(sorted(set(benchmarks.values())))})")
    if BENCHMARKS.get(benchmark, BENCHMARKS["extreme_weather"]).usage is None:
        raise InvalidInput(f"{root}'s logs are of {benchmark!r}, which MLPerf has no benchmark for: "
                           "only resnet and cosmoflow runs can be exported")
    return logs, notes, benchmark


def _file_name(what: str, name: str) -> str:
    """``name`` as MLPerf's tools need it (it names files and folders), or a UsageError."""
    if _slug(name) != name:
        raise UsageError(f"{what} name {name!r} must be letters, digits and '_' only (it names files "
                         f"and folders), e.g. {_slug(name)!r}")
    return name


def _write_tree(out: Path, files: dict[Path, Any], progress: Callable[[str], None]) -> None:
    """Write ``files`` (JSON documents or text) under ``out``, whole or not at all: any file-system
    failure (a full disk, no permission) is one sentence, and the staging directory goes with it."""
    with writing("the MLPerf export", out, "give --out a directory you can write to"):
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
        try:
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(staging, 0o777 & ~mask)  # mkdtemp makes it owner-only; a submission is meant to be shared
            for rel, content in files.items():
                progress(f"writing {rel}")
                if isinstance(content, str):
                    atomic.write_text(staging / rel, content)
                else:
                    atomic.write_json(staging / rel, content)
            os.replace(staging, out)  # an empty OUT is replaced whole; a non-empty one was refused above
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    progress(f"wrote {out}")
