"""Compare two manifests: what differs, ranked by how likely it is to change results.

Each facet is flattened into ``key -> value`` pairs (lists of records become keyed by
their ``name``/``path``/``index``, so a changed package is one row, not a shifted list),
the pairs are compared, and each difference gets an *impact* from :data:`RULES`: the
first rule whose pattern matches ``facet.key`` wins.  A record present on one side only
(an untracked file, a package, a data entry) or differing in several fields is one
difference keyed by the record, with its differing fields on each side and the highest
impact among them, so one added file counts once, not once per field.  Library, CUDA and cuDNN versions,
the GPU model and driver, determinism flags, data digests and the code commit/diff rank
first; host names last.  A difference is *result-relevant* when its impact is at least
:data:`RELEVANT_IMPACT` (and called so only then); ``repro500 diff`` exits 1 when there is one.
The documented non-differences (:data:`NOT_DIFFERENCES`) are no rows at all.

The same table ranks the sections :mod:`repro500.verify.compare` adds beside the manifest's
facets (``recipe``, ``plan``, ``lock``, ``outputs``, a pair's ``seeds``): that module is the one
comparison of two runs every command asks.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from repro500.ext import specs
from repro500.progress import human_bytes
from repro500.untrusted import (  # what a diff prints, one of the two runs recorded
    SENTENCE_CHARS,
    plain,
    record_console,
    shown,
)

SCHEMA = "repro500/diff/v1"
RELEVANT_IMPACT = 50
_MISSING = "<absent>"
# A data record (a digested data set, an input a command read) whose bytes one side has at another
# path: the same data, moved.  Listed once, below the result-relevant threshold: a path is where the
# bytes were found, not what they are (docs/verify.md, "Moved data").
MOVED_IMPACT = 10
MOVED_REASON = "moved: the same bytes at another path (same digest and size), so not a difference of the result"
_DATA_LISTS = ("entries", "inputs", "observed")  # the data facet's lists of records keyed by path

# (pattern over "facet.key", impact 0-100, why it matters). First match wins.
RULES: list[tuple[str, int, str]] = [
    # before repro500 recorded the toolchain; unknown is not different, and it matters
    # only to runs that compile custom operators
    ("toolchain.<facet>", 40, "the build toolchain was recorded on one side only"),
    ("experiment.<facet>", 20, "the experiment facet was recorded on one side only (repro500 before 0.2)"),
    # the experiment's own code by content: what ran, whatever git says (docs/capture.md)
    ("experiment.source.tree_sha256", 95, "the experiment's own source differs (content digest)"),
    ("experiment.repro500.source_sha256", 90, "repro500's own source differs (content digest)"),
    ("experiment.workload.workdir", 5, "where the command ran; its files are in the source digest"),
    ("experiment.workload.*", 90, "a different workload (model, data set, evaluator or command)"),
    ("experiment.imported_sources*", 5, "where the plug-ins' modules lie; their content is in the source digest"),
    ("experiment.repository.*", 5, "the experiment repository's git state; its content is in the source digest"),
    ("experiment.*", 10, "how much source was kept"),
    # the recipe as resolved (fixed, mutable, acceptance, plug-in options): compare.py adds it
    ("recipe.fixed.epochs", 95, "a different number of epochs"),
    ("recipe.fixed.workload", 95, "a different workload"),
    ("recipe.fixed.dataset*", 95, "a different data set or data set option"),
    ("recipe.fixed.model*", 95, "a different model or model option"),
    ("recipe.fixed.command*", 95, "a different command"),
    ("recipe.fixed.workdir", 5, "where the command ran; its files are in the source digest"),
    ("recipe.fixed.timeout_s", 10, "how long a repeat may take, not what it computes"),
    ("recipe.fixed.outputs", 20, "which outputs are digested; their digests are compared themselves"),
    ("recipe.fixed.env*", 60, "an environment variable the recipe sets for the command"),
    ("recipe.fixed.evaluate*", 90, "a different evaluator"),
    ("recipe.fixed.target*", 60, "a different target: when a run reaches quality and may stop"),
    ("recipe.fixed.valid_flops_exponent", 55, "Valid FLOPS is scored with another exponent"),
    ("recipe.fixed.mlperf_benchmark", 10, "which MLPerf rules the logs are checked against"),
    ("recipe.fixed.*", 90, "the benchmark's definition differs"),
    ("recipe.mutable.optimizer*", 95, "a different optimizer hyperparameter"),
    ("recipe.mutable.lr_schedule*", 95, "a different learning-rate schedule"),
    ("recipe.mutable.batch_size", 95, "a different batch size"),
    ("recipe.mutable.micro_batch_size", 90, "gradient accumulation changes the summation order"),
    ("recipe.mutable.deterministic", 95, "determinism settings change numerical results"),
    ("recipe.mutable.threads", 70, "intra-op threads change CPU reduction order and speed"),
    ("recipe.mutable.eval_batch_size", 60, "the evaluation's batch size changes its reduction order"),
    ("recipe.mutable.workers", 55, "loader workers draw augmentation from other random streams"),
    ("recipe.mutable.sync*", 90, "a different synchronisation of the ranks"),
    ("recipe.mutable.*", 80, "a different mutable setting"),
    ("recipe.metrics*", 40, "how a command's metrics are read from its output, not what it computes"),
    ("recipe.acceptance*", 10, "how the result is judged, not the result"),
    ("recipe.open_division", 20, "the division; the fixed keys it lets differ are compared themselves"),
    ("recipe.*", 10, "recipe detail"),
    # the plan: where and how the repeats ran
    ("plan.device", 95, "a different device"),
    ("plan.precision", 95, "a different numerical precision"),
    ("plan.compressor*", 95, "a different gradient compressor"),
    ("plan.world_size", 90, "a different process layout changes reduction order"),
    ("plan.nnodes", 90, "a different process layout changes reduction order"),
    ("plan.nproc", 90, "a different process layout changes reduction order"),
    ("plan.engine", 80, "a different engine changes how gradients are reduced"),
    ("plan.*", 60, "a different plan"),
    # what the repeats wrote: a result of the run, not a cause
    ("outputs.*", 40, "a declared output differs (a result of the run, not a cause)"),
    # the environment lock, beside the versions the environment facet compares
    ("lock.distributions.*", 60, "the package is pinned from another source in the environment lock"),
    ("lock.platform*", 30, "the lock was written for another platform"),
    ("lock.*", 5, "how the environment lock was written"),
    # how the run was confined (reproduce --run-code), not what it computed
    ("sandbox.<facet>", 5, "one side recorded no sandbox facet (a run of its own, or repro500 before it)"),
    ("sandbox.*", 5, "whether the run ran in the sandbox and what it was granted, not what it computes"),
    ("*.<facet>", 55, "the facet was captured on one side only; the two cannot be compared there"),
    ("environment.torch_build.path", 5, "install location only"),
    ("environment.torch_build.source", 0, "how the facts were read"),
    ("environment.torch_build.*", 100, "the torch build (version, CUDA, cuDNN, NCCL) changes kernels and numerics"),
    ("runtime.torch.num_threads", 70, "intra-op threads change CPU reduction order and speed"),
    ("runtime.torch.num_interop_threads", 60, "inter-op threads change CPU scheduling and speed"),
    ("runtime.torch.*", 100, "the torch build or device set changes kernels and numerics"),
    ("runtime.determinism.*", 95, "determinism settings change numerical results"),
    ("environment.distributions.torch*", 100, "the deep-learning framework changed"),
    ("environment.distributions.nvidia-*", 95, "a CUDA library (cuDNN, cuBLAS, NCCL, ...) changed"),
    ("environment.distributions.triton*", 95, "the kernel compiler changed"),
    ("environment.distributions.numpy*", 85, "a numerical library changed"),
    ("environment.distributions.scipy*", 80, "a numerical library changed"),
    ("environment.distributions.*.source*", 75, "the package was installed from a different source"),
    ("environment.distributions.*", 60, "an installed library changed"),
    ("data.*", 95, "the input data differ"),
    ("code.commit", 95, "different code"),
    ("code.diff*", 95, "different uncommitted changes"),
    ("code.dirty", 90, "uncommitted changes on one side"),
    ("code.in_repo", 80, "only one side ran from a git work tree"),
    ("code.untracked.*", 60, "an untracked source file differs"),  # refined in _impact
    ("code.commit_time", 5, "follows the commit"),
    ("code.branch", 10, "branch names do not change code; the commit does"),
    ("code.detached", 10, "branch names do not change code; the commit does"),
    ("code.*", 5, "repository location or remotes"),
    ("seeds.*", 90, "different random seeds"),
    ("distributed.rank_plan.*.host", 1, "host names do not change results"),
    ("distributed.rank_plan.*.gpu", 95, "a different GPU model"),
    ("distributed.*", 90, "a different process layout changes reduction order"),
    ("artifacts.code.diff*", 95, "different uncommitted changes"),
    ("hardware.gpus.*.name", 95, "a different GPU model"),
    ("hardware.gpu_count", 90, "a different number of GPUs"),
    ("hardware.gpus.*.compute_capability", 95, "a different GPU architecture"),
    ("hardware.gpu_driver.*", 85, "a different GPU driver / CUDA driver"),
    ("hardware.gpus.*.mig*", 75, "a different MIG partitioning"),
    ("hardware.gpu_links*", 65, "a different GPU interconnect changes collective algorithms and speed"),
    ("hardware.gpus.*.memory_total_bytes", 60, "a different GPU memory size"),
    ("hardware.gpus.*.power_limit_w", 55, "a different power limit changes speed"),
    ("hardware.gpus.*.*clock*", 55, "different clocks change speed"),
    ("hardware.gpus.*.ecc_enabled", 40, "ECC changes usable memory and speed"),
    ("hardware.gpus.*.pcie_max*", 40, "a different PCIe link"),
    ("hardware.gpus.*.uuid", 20, "a different card of the same model"),
    ("hardware.gpus.*.pci_bus_id", 15, "the same model in another slot"),
    ("hardware.gpus.*", 20, "a GPU property that rarely changes results"),
    ("hardware.gpu_reason", 10, "why no GPU was seen"),
    ("hardware.cpu.current_frequency_mhz", 2, "the current clock varies with load"),
    ("hardware.cpu.model*", 60, "a different CPU model changes CPU kernels and speed"),
    ("hardware.cpu.flags", 60, "different CPU instruction sets select different kernels"),
    ("hardware.cpu.vendor", 60, "a different CPU vendor"),
    ("hardware.cpu.architecture", 90, "a different CPU architecture"),
    ("hardware.cpu.usable_cpus", 55, "a different number of usable CPUs changes threading"),
    ("hardware.cgroup.cpu_limit_cores", 55, "a different container CPU limit"),
    ("hardware.cpu.*", 30, "a CPU property that affects speed"),
    ("hardware.cgroup.*", 30, "a different container limit"),
    ("hardware.memory.total_bytes", 20, "a different amount of memory"),
    ("hardware.memory.*", 20, "memory configuration"),
    ("hardware.numa.*.memory_bytes", 2, "a node's memory as the kernel counts it; the layout is its CPUs and distances"),
    ("hardware.numa*", 30, "a different NUMA layout affects speed"),
    ("hardware.infiniband*", 40, "a different interconnect affects multi-node speed"),
    ("hardware.network*", 15, "network interfaces"),
    ("hardware.*", 20, "hardware detail"),
    ("environment.python.version", 80, "a different Python version"),
    ("environment.python.implementation", 80, "a different Python implementation"),
    ("environment.python.*", 5, "interpreter location"),
    ("environment.env.values.CUBLAS_WORKSPACE_CONFIG", 90, "cuBLAS determinism depends on it"),
    ("environment.env.values.PYTHONHASHSEED", 70, "hash randomisation changes iteration order"),
    ("environment.env.values.NCCL_*", 75, "NCCL settings change collective algorithms and results"),
    ("environment.env.values.CUDA_VISIBLE_DEVICES", 70, "a different set of visible GPUs"),
    ("environment.env.values.*_NUM_THREADS", 65, "thread counts change reduction order and speed"),
    ("environment.env.values.LD_*", 60, "different shared libraries may be loaded"),
    ("environment.env.values.TORCH*", 60, "a torch setting changed"),
    ("environment.env.values.PYTORCH_*", 60, "a torch setting changed"),
    # the instruction set and math mode CPU kernels are chosen for: another one picks other kernels
    ("environment.env.values.ATEN_CPU_CAPABILITY", 65, "the instruction set torch's CPU kernels are chosen for"),
    ("environment.env.values.*_CPU_ISA*", 65, "the instruction set oneDNN's kernels are chosen for"),
    ("environment.env.values.MKL_ENABLE_INSTRUCTIONS", 65, "the instruction set MKL's kernels are chosen for"),
    ("environment.env.values.MKL_DEBUG_CPU_TYPE", 65, "the instruction set MKL's kernels are chosen for"),
    ("environment.env.values.MKL_CBWR", 65, "MKL's numerical reproducibility mode"),
    ("environment.env.values.KMP_DETERMINISTIC_REDUCTION", 65, "OpenMP's reduction order"),
    ("environment.env.values.*FPMATH_MODE", 65, "the floating-point math mode of oneDNN's kernels"),
    ("environment.env.values.NVIDIA_TF32_OVERRIDE", 75, "TF32 on or off changes GPU matmul numerics"),
    ("environment.env.values.*", 40, "an environment variable not known to change results"),
    ("environment.env.names*", 3, "other environment variables (names only)"),
    ("environment.os.libc", 60, "a different C library"),
    ("environment.os.kernel", 30, "a different kernel"),
    ("environment.os.system", 60, "a different operating system"),
    ("environment.os.distribution*", 25, "a different OS release"),
    ("environment.os.kernel_build", 5, "kernel build string"),
    ("environment.os.hostname", 1, "host names do not change results"),
    ("environment.tool.*", 5, "repro500's own interpreter, not the one the command ran in"),
    ("environment.*", 20, "environment detail"),
    ("toolchain.cuda_toolkit.version", 80,
     "nvcc compiles custom CUDA operators; another toolkit changes their kernels"),
    ("toolchain.cuda_toolkit.release", 10, "follows the nvcc version"),
    ("toolchain.cuda_toolkit.problem", 10, "why the toolkit's version is unknown"),
    ("toolchain.cuda_toolkit.*", 5, "toolkit location or how its version was read"),
    ("toolchain.tools.cmake.version", 15, "CMake drives builds but generates no code"),
    ("toolchain.tools.cxx.version", 50,
     "the C++ compiler builds custom CPU operators; another version can change their numerics"),
    ("toolchain.tools.*.version", 45, "a different compiler version (used when code is built here)"),
    ("toolchain.tools.*.version_line", 10, "a vendor build string (alone: a rebuild of the same release)"),
    ("toolchain.*", 5, "tool location or how it was probed"),
    ("facet_errors.*", 55, "a facet could be gathered on one side only"),
    ("tool.version", 20, "a different repro500 version"),
    ("tool.*", 5, "tool identity"),
]
# Documented non-differences (docs/verify.md, "What is not a difference"): rows matching these
# are not differences at all, whatever their values.
NOT_DIFFERENCES: list[tuple[str, str]] = [
    ("created_utc", "when the manifest was captured"),
    ("*_utc", "a capture time"),
    ("seeds.repeats", "the number of repeats: a rerun with more or fewer repeats ran the same thing"),
    ("environment.env.values.REPRO500_*", "repro500's own control variables, which steer repro500, not the run"),
    # the kernel's count of a node's free-to-use memory moves with a VM's balloon and reserved pages;
    # the node's layout (its CPUs and distances) is compared
    ("hardware.numa.*.memory_bytes", "memory the kernel reports for a NUMA node"),
]
_OWN = "repro500"  # the tool's own distribution: a command's rebuilt venv runs without it, by design
# Byte counts the kernel reports a little differently from boot to boot (reserved pages, a VM's
# balloon, a container's view): a change smaller than this share is not a difference.
_DRIFTING_BYTES = ("hardware.numa.*.memory_bytes", "hardware.memory.total_bytes")
DRIFT_SHARE = 0.02
_CODE_SUFFIXES = (".py", ".pyx", ".pxd", ".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".cu",
                  ".cuh", ".sh", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".txt")
_ID_KEYS = ("index", "rank", "repeat", "node", "port", "path", "name")


@dataclass(frozen=True)
class Difference:
    """One key that differs between manifest A and B (``"<absent>"`` on a missing side)."""

    facet: str
    key: str
    a: Any
    b: Any
    impact: int  # 0-100: higher = more likely to change results
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_result_relevant(diff: Difference | int) -> bool:
    """True when the difference could plausibly change a benchmark result: impact at least
    :data:`RELEVANT_IMPACT`, the one threshold every command words its differences by."""
    impact = diff if isinstance(diff, int) else diff.impact
    return impact >= RELEVANT_IMPACT


def relevance(diff: Difference | int) -> str:
    """The words for a difference's impact: every command says "result-relevant" iff the impact
    reaches :data:`RELEVANT_IMPACT`."""
    return "result-relevant" if is_result_relevant(diff) else "not result-relevant"


def counted(diffs: list[Difference]) -> str:
    """``"3 difference(s), 1 result-relevant"``: the count every command prints."""
    return f"{len(diffs)} difference(s), {sum(1 for d in diffs if is_result_relevant(d))} result-relevant"


def _record_id(item: Mapping[str, Any]) -> str | None:
    for key in _ID_KEYS:
        if key in item and isinstance(item[key], (str, int)):
            return str(item[key])
    return None


# A flattened key before it is joined with ".": ("distributions", "backports.tarfile", "version")
KeyPath = tuple[str, ...]


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "l": [{"name": "x", "v": 2}]}`` -> ``{"a.b": 1, "l.x.v": 2}``.

    Lists of records with an identifying key are keyed by it; other lists are leaves.
    Empty mappings vanish (their keys show up as absent on the other side).
    """
    flat, _ = flatten_paths(value, (prefix,) if prefix else ())
    return {".".join(path): item for path, item in flat.items()}


def flatten_paths(value: Any, path: KeyPath = ()) -> tuple[dict[KeyPath, Any], set[KeyPath]]:
    """:func:`flatten` keyed by paths (tuples of parts), and the paths of the keyed records.

    Paths keep record identities whole: package ``backports`` and package
    ``backports.tarfile`` are ``("distributions", "backports")`` and
    ``("distributions", "backports.tarfile")``, so neither is mistaken for a field of the
    other, as a prefix test on the joined strings would.
    """
    out: dict[KeyPath, Any] = {}
    records: set[KeyPath] = set()
    if isinstance(value, Mapping):
        for key, item in value.items():
            flat, inner = flatten_paths(item, (*path, str(key)))
            out.update(flat)
            records |= inner
        return out, records
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        ids = [_record_id(v) for v in value]
        if all(i is not None for i in ids) and len(set(ids)) == len(ids):
            for ident, item in zip(ids, value, strict=True):
                name = (*path, str(ident))
                flat, inner = flatten_paths(item, name)
                out.update(flat)
                records |= inner | {name}
            return out, records
    out[path] = value
    return out, records


def _impact(facet: str, path: KeyPath) -> tuple[int, str]:
    full = ".".join((facet, *path))
    if (facet == "code" and len(path) > 1 and path[0] == "untracked"
            and not path[1].endswith(_CODE_SUFFIXES)):
        return 20, "an untracked non-source file differs"
    for pattern, impact, reason in RULES:
        if fnmatch.fnmatchcase(full, pattern):
            return impact, reason
    return 10, "other detail"


def _sections(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The comparable parts: each facet, plus facet errors, artifacts, tool and time."""
    sections = dict(manifest.get("facets") or {})
    for extra in ("facet_errors", "artifacts", "tool", "created_utc"):
        if extra in manifest:
            sections[extra] = manifest[extra]
    facet = sections.get("distributed")
    if isinstance(facet, Mapping) and "compressor" in facet:  # resolved: older runs recorded a bare name
        sections["distributed"] = {**facet, "compressor": specs.canonical(facet["compressor"])}
    env = sections.get("environment")
    if isinstance(env, Mapping) and isinstance(env.get("env"), Mapping) and isinstance(env["env"].get("names"), list):
        # repro500's own control variables steer repro500, not the run (NOT_DIFFERENCES)
        names = [n for n in env["env"]["names"] if not (isinstance(n, str) and n.startswith("REPRO500_"))]
        sections["environment"] = {**env, "env": {**env["env"], "names": names}}
    return sections


def _common_seed_plans(sa: dict[str, Any], sb: dict[str, Any]) -> None:
    """The seed plans of the repeats both runs have: a run with more repeats has more plan entries,
    and the number of repeats is no difference (NOT_DIFFERENCES)."""
    plans = [s.get("seeds", {}).get("plan") if isinstance(s.get("seeds"), Mapping) else None for s in (sa, sb)]
    if not all(isinstance(p, list) for p in plans):
        return
    repeats = [{e.get("repeat") for e in p if isinstance(e, Mapping)} for p in plans]  # type: ignore[union-attr]
    both = repeats[0] & repeats[1]
    for side, plan in zip((sa, sb), plans, strict=True):
        side["seeds"] = {**side["seeds"], "plan": [e for e in plan if not isinstance(e, Mapping)  # type: ignore[union-attr]
                                                   or e.get("repeat") in both]}


def not_a_difference(d: Difference) -> str | None:
    """Why a row is a documented non-difference (docs/verify.md), or None when it is a difference."""
    full = f"{d.facet}.{d.key}" if d.key else d.facet
    for pattern, why in NOT_DIFFERENCES:
        if fnmatch.fnmatchcase(full, pattern):
            return why
    if full == f"environment.distributions.{_OWN}" and _MISSING in (d.a, d.b):
        return ("repro500 itself, absent from a wrapped command's own environment: repro500 drives that "
                "environment from outside, and its own source is compared by digest (experiment.repro500)")
    return None


_FACET_ORDER = {name: i for i, name in enumerate(("recipe", "plan", "seeds", "data", "experiment", "code"))}


def order(d: Difference) -> tuple[Any, ...]:
    """The one order of differences: by impact, then what a user changes most (recipe, plan, seeds,
    data, code) before what the machine does, then by name."""
    return (-d.impact, _FACET_ORDER.get(d.facet, len(_FACET_ORDER)), d.facet, d.key)


def diff_manifests(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    """Every difference between two manifests, most result-relevant first."""
    sa, sb = _sections(a), _sections(b)
    _common_seed_plans(sa, sb)
    diffs: list[Difference] = _moved_data(sa, sb)
    for facet in sorted(set(sa) | set(sb)):
        if facet not in sa or facet not in sb:
            impact, reason = _impact(facet, ("<facet>",))
            if facet in ("facet_errors", "artifacts"):
                impact, reason = _impact(facet, ("x",))
            diffs.append(Difference(facet, "", "present" if facet in sa else _MISSING,
                                    "present" if facet in sb else _MISSING, impact, reason))
            continue
        diffs.extend(_facet_differences(facet, sa[facet], sb[facet]))
    diffs = [_capability_only(d) for d in _own_packages(a, b, _by_content(a, b, diffs)) if not_a_difference(d) is None]
    diffs.sort(key=order)
    return diffs


def _content(entry: Any) -> tuple[Any, ...] | None:
    """What a data record's bytes are (digest, kind, size, files), or None when it records no digest."""
    if not isinstance(entry, Mapping) or not isinstance(entry.get("path"), str):
        return None
    digest = entry.get("md5") or entry.get("sha256")
    return (digest, entry.get("kind"), entry.get("size"), entry.get("nfiles")) if digest else None


def _moved_data(sa: dict[str, Any], sb: dict[str, Any]) -> list[Difference]:
    """The data records one side has at a path the other lacks, whose bytes the other side has at a
    path the first lacks: one ``moved`` row each (:data:`MOVED_IMPACT`), taken out of both sides'
    data facets so that no absent/present pair of rows is left for them.  Records are matched in
    the same list first (``entries`` with ``entries``), then across (a declared data set the other
    side's command was seen to read)."""
    da, db = sa.get("data"), sb.get("data")
    if not isinstance(da, Mapping) or not isinstance(db, Mapping):
        return []
    lone: list[dict[tuple[str, str], Mapping[str, Any]]] = []
    for mine, theirs in ((da, db), (db, da)):
        theirs_paths = {e.get("path") for name in _DATA_LISTS for e in theirs.get(name) or [] if isinstance(e, Mapping)}
        lone.append({(name, e["path"]): e for name in _DATA_LISTS for e in mine.get(name) or []
                     if _content(e) is not None and e["path"] not in theirs_paths})
    moved: list[Difference] = []
    for same_list in (True, False):
        for (list_a, path_a), ea in list(lone[0].items()):
            match = next(((list_b, path_b) for (list_b, path_b), eb in lone[1].items()
                          if (list_b == list_a) == same_list and _content(eb) == _content(ea)), None)
            if match is None:
                continue
            eb = lone[1].pop(match)
            del lone[0][(list_a, path_a)]
            moved.append(Difference("data", f"{list_a}.{path_a}", dict(ea), dict(eb), MOVED_IMPACT, MOVED_REASON))
    for side, data, gone in ((sa, da, {m.a["path"] for m in moved}), (sb, db, {m.b["path"] for m in moved})):
        if gone:  # a path listed twice (declared and seen read) is one place of the same bytes
            side["data"] = {k: ([e for e in v if not (isinstance(e, Mapping) and e.get("path") in gone)]
                                if k in _DATA_LISTS and isinstance(v, list) else v) for k, v in data.items()}
    return moved


def is_moved(d: Difference) -> bool:
    """Whether a row is a moved data record (:func:`_moved_data`): its two sides are the records."""
    return (d.facet == "data" and d.reason.startswith(MOVED_REASON) and isinstance(d.a, Mapping)
            and isinstance(d.b, Mapping))


def _capability_only(d: Difference) -> Difference:
    """torch's build description (``runtime.torch.config``) names the instruction set its CPU kernels
    use: two descriptions that differ in that line alone are one torch build run with another
    instruction set (``ATEN_CPU_CAPABILITY`` or another CPU), ranked as that, not as another build."""
    if (d.facet, d.key) != ("runtime", "torch.config") or not (isinstance(d.a, str) and isinstance(d.b, str)):
        return d
    la, lb = d.a.splitlines(), d.b.splitlines()
    differing = set(la) ^ set(lb)
    if len(la) != len(lb) or not differing or not all("CPU capability usage" in x for x in differing):
        return d
    return Difference(d.facet, d.key, d.a, d.b, 65, "the instruction set torch's CPU kernels use (CPU capability usage)")


def _code_digests(manifest: Mapping[str, Any]) -> tuple[Any, Any] | None:
    experiment = (manifest.get("facets") or {}).get("experiment")
    if not isinstance(experiment, Mapping):
        return None
    source = experiment.get("source") or {}
    own = (experiment.get("repro500") or {}).get("source_sha256")
    return (source.get("tree_sha256"), own) if own else None


def _by_content(a: Mapping[str, Any], b: Mapping[str, Any], diffs: list[Difference]) -> list[Difference]:
    """When both runs recorded what code ran by content (the experiment's source tree and
    repro500's own) and it is the same, the git state around it is not different code: a
    reproduction from a publication runs outside any work tree ("commit absent") from the very
    same files.  Those code-facet rows then rank low, with the reason said."""
    da, db = _code_digests(a), _code_digests(b)
    if da is None or da != db:
        return diffs
    why = "the code that ran is the same by content (source digests match); only the git state around it differs"
    return [Difference(d.facet, d.key, d.a, d.b, min(d.impact, 5), why)
            if d.facet == "code" or (d.facet == "artifacts" and d.key.startswith("code.diff")) else d
            for d in diffs]


def _source_place(manifest: Mapping[str, Any], url: Any) -> tuple[str, ...] | None:
    """Where a ``file://`` URL lies inside the run's experiment directory, or None."""
    from pathlib import PurePosixPath
    from urllib.parse import unquote, urlparse

    workdir = (((manifest.get("facets") or {}).get("experiment") or {}).get("workload") or {}).get("workdir")
    if not isinstance(url, str) or not url.startswith("file://") or not isinstance(workdir, str):
        return None
    path, root = PurePosixPath(unquote(urlparse(url).path)), PurePosixPath(workdir)
    return path.relative_to(root).parts if path.is_relative_to(root) else None


def _own_packages(a: Mapping[str, Any], b: Mapping[str, Any], diffs: list[Difference]) -> list[Difference]:
    """The experiment's own package, installed from its own directory: a reproduction installs it
    from its copy of the source (OUT/source), so its path differs by design.  When both runs'
    source trees are the same by content and the package sits at the same place in each, the
    path is no different code."""
    source = [((m.get("facets") or {}).get("experiment") or {}).get("source") or {} for m in (a, b)]
    if (not source[0].get("tree_sha256") or source[0].get("tree_sha256") != source[1].get("tree_sha256")
            or not (source[0].get("complete") and source[1].get("complete"))):
        return diffs
    why = "the experiment's own package, from the same place in the same source tree (digests match)"
    return [Difference(d.facet, d.key, d.a, d.b, min(d.impact, 5), why)
            if d.facet == "environment" and d.key.startswith("distributions.") and d.key.endswith(".source.url")
            and _source_place(a, d.a) is not None and _source_place(a, d.a) == _source_place(b, d.b) else d
            for d in diffs]


def _facet_differences(facet: str, a: Any, b: Any) -> list[Difference]:
    """One facet's differences, one per record that differs in more than one field."""
    (fa, ra), (fb, rb) = flatten_paths(a), flatten_paths(b)
    groups: dict[KeyPath, list[KeyPath]] = {}
    for path in sorted(set(fa) | set(fb)):
        va, vb = fa.get(path, _MISSING), fb.get(path, _MISSING)
        if va != vb and not _same_in_substance(facet, path, va, vb):
            groups.setdefault(_record_of(path, ra, rb) or path, []).append(path)
    out = []
    for name, paths in groups.items():
        one_sided = (name in ra) != (name in rb)
        if len(paths) == 1 and not one_sided:
            path = paths[0]
            out.append(Difference(facet, ".".join(path), fa.get(path, _MISSING),
                                  fb.get(path, _MISSING), *_impact(facet, path)))
            continue
        impact, reason = max((_impact(facet, p) for p in paths), key=lambda r: r[0])
        out.append(Difference(facet, ".".join(name), _fields(fa, ra, name, paths),
                              _fields(fb, rb, name, paths), impact, reason))
    return out


def _same_in_substance(facet: str, path: KeyPath, va: Any, vb: Any) -> bool:
    """Differences in form only: an empty list against nothing recorded (``entries [] vs <absent>``:
    the records on the other side, if any, are differences of their own), and byte counts that
    drift by less than :data:`DRIFT_SHARE`."""
    if _MISSING in (va, vb):
        other = vb if va == _MISSING else va
        return isinstance(other, (list, dict)) and not other
    if (isinstance(va, int) and isinstance(vb, int) and not isinstance(va, bool) and not isinstance(vb, bool)
            and any(fnmatch.fnmatchcase(".".join((facet, *path)), p) for p in _DRIFTING_BYTES)):
        return abs(va - vb) <= DRIFT_SHARE * max(abs(va), abs(vb))
    return False


def _record_of(path: KeyPath, ra: set[KeyPath], rb: set[KeyPath]) -> KeyPath | None:
    """The record a differing key belongs to: the outermost one present on one side only,
    else the innermost one, else None (the key is not inside a record)."""
    holders = [path[:n] for n in range(1, len(path)) if path[:n] in ra or path[:n] in rb]
    lone = [r for r in holders if (r in ra) != (r in rb)]
    if lone:
        return lone[0]
    return holders[-1] if holders else None


def _fields(flat: dict[KeyPath, Any], records: set[KeyPath], name: KeyPath, paths: list[KeyPath]) -> Any:
    """A record's differing fields on one side (``"<absent>"`` when it has no such record)."""
    if name not in records:
        return _MISSING
    return {".".join(p[len(name):]): flat[p] for p in paths if p in flat}


def _changed_list(va: Any, vb: Any) -> str | None:
    """For two lists of scalars (CPU flags, env names): ``+added -removed`` instead of both."""
    if isinstance(va, list) and isinstance(vb, list):
        try:
            added, removed = sorted(set(vb) - set(va)), sorted(set(va) - set(vb))
        except TypeError:
            return None
        parts = [f"+{x}" for x in added[:5]] + [f"-{x}" for x in removed[:5]]
        more = len(added) + len(removed) - len(parts)
        return " ".join(parts) + (f" (+{more} more)" if more > 0 else "")
    return None


def short(value: Any, width: int = 48) -> str:
    """The one rendering of a recorded value on one line, cut to *width*, for every command and the
    report: text as it is; a data record by its digest, size and path (the path cut at its start,
    so the file's name stays); a mapping as ``key=value`` pairs and a list as its items -- never
    Python's repr of either.  What a run recorded is escaped as :func:`repro500.untrusted.plain`
    escapes it, so the text can drive no terminal."""
    if _content(value) is not None:
        digest = str(value.get("md5") or value.get("sha256"))
        head = f"{'md5' if value.get('md5') else 'sha256'} {digest[:12]} {_size(value)} "
        path = plain(value["path"])
        room = max(width - len(head), 8)
        return head + (path if len(path) <= room else "…" + path[len(path) - room + 1:])
    text = plain(re.sub(r"\s+", " ", _text(value)))
    return text if len(text) <= width else text[: width - 1] + "…"


def _size(entry: Mapping[str, Any]) -> str:
    size = entry.get("size")
    files = f", {entry['nfiles']} files" if isinstance(entry.get("nfiles"), int) else ""
    return (human_bytes(size) if isinstance(size, int) and not isinstance(size, bool) else "size unknown") + files


def _text(value: Any) -> str:
    """A value in words, nested values included (the part of :func:`short` before the cut)."""
    if isinstance(value, str):
        return value
    if _content(value) is not None:
        return short(value, 10**6)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_text(v)}" for k, v in value.items()) or "(empty)"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(_text(v) for v in value) or "(none)"
    return str(value)


def to_json(diffs: list[Difference], a_label: str = "A", b_label: str = "B") -> dict[str, Any]:
    """The ``repro500/diff/v1`` document ``repro500 diff --json`` prints."""
    return {
        "schema": SCHEMA,
        "a": a_label,
        "b": b_label,
        "relevant_impact": RELEVANT_IMPACT,
        "result_relevant": any(is_result_relevant(d) for d in diffs),
        "differences": [dict(d.as_dict(), result_relevant=is_result_relevant(d)) for d in diffs],
    }


def render(diffs: list[Difference], a_label: str = "A", b_label: str = "B",
           console: Any = None, show_all: bool = False) -> None:
    """Print the differences as rich tables, one per facet, most relevant facet first.

    Without ``show_all`` only the first 15 low-impact differences of each facet are shown.
    """
    from rich.table import Table

    console = console or record_console()
    if not diffs:
        console.print("[green]No differences.[/green]")
        return
    by_facet: dict[str, list[Difference]] = {}
    for d in diffs:  # already sorted by impact, so facets come out most relevant first
        by_facet.setdefault(d.facet, []).append(d)
    for facet, items in by_facet.items():
        table = Table(title=shown(facet), title_justify="left", show_lines=False, expand=False)
        table.add_column("impact", justify="right")
        table.add_column("key", overflow="fold")
        table.add_column(shown(a_label), overflow="fold", max_width=40)
        table.add_column(shown(b_label), overflow="fold", max_width=40)
        table.add_column("why it matters", overflow="fold")
        low_shown = 0
        for d in items:
            relevant = is_result_relevant(d)
            if not relevant and not show_all:
                low_shown += 1
                if low_shown > 15:
                    continue
            style = "bold red" if d.impact >= 90 else ("yellow" if relevant else "dim")
            delta = _changed_list(d.a, d.b)
            table.add_row(shown(d.impact), shown(d.key or "(whole facet)"),
                          shown(short(d.a) if delta is None else f"{len(d.a)} items"),
                          shown(short(d.b) if delta is None else delta), shown(d.reason, SENTENCE_CHARS), style=style)
        if low_shown > 15 and not show_all:
            table.caption = f"{low_shown - 15} more low-impact differences (use --all)"
        console.print(table)
    relevant = [d for d in diffs if is_result_relevant(d)]
    first = diffs[0]
    style = "bold red" if relevant else "green"
    console.print(f"[{style}]{counted(diffs)}[/] (result-relevant: impact >= {RELEVANT_IMPACT}); first: "
                  f"{shown(first.facet + ('.' + first.key if first.key else ''))} ({relevance(first)})",
                  highlight=False)
