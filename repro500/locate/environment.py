"""What each replay of ``repro500 locate`` runs in: the run's recorded kernel-relevant environment
variables, and the interpreter a run rebuilt by ``reproduce --env venv`` ran under."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from repro500 import sandbox
from repro500.rundir.names import ENV_MARKER
from repro500.verify.rundir import RunData

# The variables a replay takes from its run's manifest: those that choose kernels or their numerics
# (thread counts and affinity, determinism and precision knobs, the instruction set), so that two
# runs made in different environments are replayed each in its own.  An allow-list, never a prefix:
# a manifest is the run's word, and OMP_TOOL_LIBRARIES, NCCL_NET_PLUGIN and their kin load a library
# into the replay (NCCL_DEBUG_FILE writes a file): such a variable is never set from a record.
REPLAY_ENV_NAMES = frozenset({
    # thread counts, scheduling and affinity
    "OMP_NUM_THREADS", "OMP_DYNAMIC", "OMP_THREAD_LIMIT", "OMP_MAX_ACTIVE_LEVELS", "OMP_NESTED", "OMP_SCHEDULE",
    "OMP_PROC_BIND", "OMP_PLACES", "OMP_WAIT_POLICY", "KMP_AFFINITY", "KMP_BLOCKTIME", "GOMP_CPU_AFFINITY",
    "GOMP_SPINCOUNT", "MKL_NUM_THREADS", "MKL_DYNAMIC", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    # determinism, precision and the instruction set kernels are picked for
    "KMP_DETERMINISTIC_REDUCTION", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE",
    "DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "DNNL_CPU_ISA_HINTS", "ONEDNN_CPU_ISA_HINTS",
    "DNNL_DEFAULT_FPMATH_MODE", "ONEDNN_DEFAULT_FPMATH_MODE", "ATEN_CPU_CAPABILITY", "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE", "CUDA_VISIBLE_DEVICES", "NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS", "PYTHONHASHSEED",
})
# The families those belong to: a variable of this process in one of them that the run did not have
# is unset for its replay (unsetting loads nothing).
KERNEL_ENV_PREFIXES = ("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "BLIS_", "DNNL_", "ONEDNN_", "ATEN_",
                       "CUBLAS_", "CUBLASLT_", "CUDNN_", "NVIDIA_TF32", "NCCL_", "CUDA_VISIBLE_DEVICES",
                       "PYTHONHASHSEED")
_PLAIN_VALUE = re.compile(r"[ -~]{0,256}")  # a thread count, an ISA name, ":4096:8": printable and short


def _recorded_env_values(run: RunData) -> dict[str, Any] | None:
    env = _recorded(run, "facets", "environment", "env")
    return env.get("values") if isinstance(env.get("values"), dict) else None


def replay_environment(run: RunData, environ: dict[str, str]) -> dict[str, str | None]:
    """The variables to set (a value) or unset (None) so that a replay runs with the run's recorded
    kernel-relevant environment: only names of :data:`REPLAY_ENV_NAMES` are set, and only to a
    plain value; empty without a manifest."""
    values = _recorded_env_values(run)
    if values is None:
        return {}
    names = _recorded(run, "facets", "environment", "env").get("names")
    listed = {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()
    out: dict[str, str | None] = {}
    for name, value in values.items():
        if name in REPLAY_ENV_NAMES and isinstance(value, str) and _PLAIN_VALUE.fullmatch(value) \
                and environ.get(name) != value:
            out[str(name)] = value
    for name in environ:
        if name.startswith(KERNEL_ENV_PREFIXES) and name not in values and name not in listed:
            out[name] = None  # the run did not have it
    return out


def replay_env_not_set(run: RunData) -> list[str]:
    """The kernel-family variables the run recorded that its replay does not take (not on the
    allow-list: a library or plug-in loader, a log file, a setting that picks no kernel; or a value
    that is not a plain one)."""
    values = _recorded_env_values(run) or {}
    return sorted(str(n) for n, v in values.items() if str(n).startswith(KERNEL_ENV_PREFIXES)
                  and (str(n) not in REPLAY_ENV_NAMES or not (isinstance(v, str) and _PLAIN_VALUE.fullmatch(v))))


def _recorded(run: RunData, *keys: str) -> dict[str, Any]:
    """The manifest's mapping at *keys* (facets, environment, ...); empty where it holds anything else."""
    node: Any = run.manifest or {}
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def recorded_interpreter(run: RunData) -> tuple[str | None, str | None]:
    """(the interpreter the run ran under, its Python version), as its manifest records them."""
    python = _recorded(run, "facets", "environment", "python")
    executable, version = python.get("executable"), python.get("version")
    return (executable if isinstance(executable, str) else None, version if isinstance(version, str) else None)


def own_interpreter(run: RunData) -> str | None:
    """The interpreter a run ran under when it is an environment ``reproduce --env venv`` built
    here (its directory holds the rebuild's marker): a replay of that run runs in it.  None for
    any other: an interpreter a run merely names is not run (``--python-a/-b`` choose one)."""
    executable, _ = recorded_interpreter(run)
    if not executable:
        return None
    path = Path(executable)
    return executable if path.is_file() and (path.parent.parent / ENV_MARKER).is_file() else None


def replay_grants(run: RunData, side: Any, choice: sandbox.Choice) -> sandbox.Grants | None:
    """The sandbox a consented replay of *run*'s own code runs in (None: ``--no-sandbox``): besides
    what the replay adds (the run's directory, its output), its interpreter's trees (a rebuilt venv
    and the Python it was made from) and the data the run's manifest recorded, read-only; its
    recorded kernel settings set inside as outside."""
    if not choice.confined:
        return None
    python = Path(side.python)
    entries = _recorded(run, "facets", "data").get("entries")
    data = [Path(str(e["path"])).absolute() for e in entries or [] if isinstance(e, dict) and e.get("path")]
    return sandbox.Grants(read=(python.absolute().parent.parent, python.resolve().parent.parent, *data),
                          network=choice.network, extra=choice.extra,
                          setenv={name: value for name, value in side.env.items() if value is not None})
