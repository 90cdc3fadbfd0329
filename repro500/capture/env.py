"""The ``environment`` facet (no torch import) and ``runtime_state()`` (torch imported).

``repro500 capture`` must stay fast, and importing torch alone costs seconds, so the
environment facet reads torch's build facts from files: the distribution metadata,
``torch/version.py`` (parsed, not executed) and the versions of the ``nvidia-cudnn-*`` /
``nvidia-nccl-*`` wheels torch loads its libraries from.  What only a live torch can say
(threads, ``torch.__config__.show()``, determinism flags) is :func:`runtime_state`, which
``repro500 run`` calls after seeding, when torch is loaded anyway, and records as the
``runtime`` facet (``repro500 capture --runtime`` does the same on demand).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import platform
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from repro500 import sandbox
from repro500.capture.registry import CaptureContext, facet
from repro500.redact import redact_env, redact_url

DIRECT_URL = "direct_url.json"  # PEP 610: where an installed distribution came from

# Distributions whose version is torch's cuDNN / NCCL (pip wheels torch depends on).
_CUDNN_DISTS = ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn-cu11")
_NCCL_DISTS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")


def normalize(name: str) -> str:
    # PEP 503 normalisation: "Foo_Bar.baz" and "foo-bar-baz" are one project
    return "-".join(name.replace("_", "-").replace(".", "-").lower().split("-"))


def install_source(dist: metadata.Distribution) -> dict[str, Any] | None:
    """Where a distribution came from when it was not an index release (PEP 610)."""
    try:
        raw = dist.read_text(DIRECT_URL)
    except OSError:
        return None
    if not raw:
        return None
    try:
        info = json.loads(raw)
    except json.JSONDecodeError:
        return {"kind": "unknown", "url": None}
    url = redact_url(str(info.get("url", "")))
    if "vcs_info" in info:
        vcs = info["vcs_info"]
        return {"kind": "vcs", "url": url, "vcs": vcs.get("vcs"), "commit": vcs.get("commit_id"),
                "requested_revision": vcs.get("requested_revision")}
    if "dir_info" in info:
        return {"kind": "local", "url": url, "editable": bool(info["dir_info"].get("editable"))}
    return {"kind": "archive", "url": url}


def name_version(dist: metadata.Distribution) -> tuple[str | None, str | None]:
    """``Name`` and ``Version`` from a distribution's metadata headers, as ``dist.metadata`` gives
    them (the first of each), read up to the first blank line.  ``dist.metadata`` parses the whole
    file with the ``email`` package, long description included, and ``dist.version`` does it
    again: two thirds of the capture's time with a few hundred packages installed."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or dist.read_text("") or ""
    name = version = None
    for line in text.splitlines():
        if not line.strip():
            break  # the headers end here; the description follows
        key, sep, value = line.partition(":")
        if not sep or line[:1].isspace():
            continue  # a folded continuation line: Name and Version are never folded
        key = key.strip().lower()
        if key == "name" and name is None:
            name = value.strip()
        elif key == "version" and version is None:
            version = value.strip()
        if name is not None and version is not None:
            break
    return name, version


def distributions() -> list[dict[str, Any]]:
    """Every installed distribution visible to this interpreter, sorted by name.

    The first one found on ``sys.path`` wins, as it does for ``import``.  Its ``source``
    may come from a shadowed copy of the same version: run from a project directory
    (``python -m``, ``python -c``), the ``<name>.egg-info`` that building an editable
    install leaves there comes first on ``sys.path``, while the PEP 610 record of where the
    install came from is only in the installer's ``.dist-info``.
    """
    return read_distributions(distribution_paths(sys.path))


def distribution_paths(entries: list[str]) -> list[str]:
    """The ``*.dist-info``/``*.egg-info`` entries of each ``sys.path`` entry, in order (sorted
    within one), as a wrapped command's processes list theirs (workloads/command/childsite)."""
    out = []
    for entry in entries:
        entry = entry or os.getcwd()  # "" is the working directory, for import as here
        try:
            names = sorted(os.listdir(entry))
        except OSError:
            continue
        out.extend(os.path.join(entry, name) for name in names if name.endswith((".dist-info", ".egg-info")))
    return out


def read_distributions(paths: list[str]) -> list[dict[str, Any]]:
    """The distributions whose metadata directories (or ``*.egg-info`` files) are *paths*, in
    ``sys.path`` order: the first of a name wins, with the ``source`` of a shadowed copy of the
    same version when the first has none.  This interpreter's environment and a wrapped command's
    interpreters (capture/interpreters.py) are read by this one function."""
    seen: dict[str, dict[str, Any]] = {}
    for path in paths:
        name, version, source = _distribution(path)
        if not name:
            continue
        key = normalize(name)
        entry = seen.get(key)
        if entry is not None:
            if "source" not in entry and entry["version"] == version and source:
                entry["source"] = source
            continue
        entry = {"name": name, "version": version}
        if source:
            entry["source"] = source
        seen[key] = entry
    return [seen[k] for k in sorted(seen)]


# What each distribution's metadata said, by path, with the fingerprint it had then.  A run reads
# the same ~200 distributions several times (its own environment beside the first repeat; a
# wrapped command's interpreters after every repeat): reading their metadata again held each next
# repeat back by 20-35 ms on two cores, where a few stats say whether anything changed (an
# installer replaces a distribution's directory, or the files in it).
_read: dict[str, tuple[tuple[Any, ...], tuple[str | None, str | None, dict[str, Any] | None]]] = {}
_FINGERPRINTED = ("", "/METADATA", "/PKG-INFO", "/" + DIRECT_URL)


def _fingerprint(path: str) -> tuple[Any, ...]:
    out: list[Any] = []
    for name in _FINGERPRINTED:
        try:
            st = os.stat(path + name)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _distribution(path: str) -> tuple[str | None, str | None, dict[str, Any] | None]:
    """(name, version, install source) of the distribution whose metadata is at *path*."""
    fingerprint = _fingerprint(path)
    known = _read.get(path)
    if known is not None and known[0] == fingerprint:
        return known[1]
    dist = metadata.PathDistribution(Path(path))
    name, version = name_version(dist)
    found = (name, version, install_source(dist) if name else None)
    _read[path] = (fingerprint, found)
    return found


def _dist_version(names: tuple[str, ...], dists: dict[str, str]) -> str | None:
    for name in names:
        if name in dists:
            return dists[name]
    return None


def _literal_assignments(path: Path) -> dict[str, Any]:
    """Top-level ``name = <literal>`` assignments of a Python file, without running it."""
    out: dict[str, Any] = {}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and value is not None:
            try:
                out[target.id] = ast.literal_eval(value)
            except ValueError:
                continue
    return out


def torch_build(dist_versions: dict[str, str], pkg_dir: Path | None = None) -> dict[str, Any]:
    """torch's build facts read from files; ``{"installed": False}`` without torch.  *pkg_dir*:
    another interpreter's torch (a wrapped command's), instead of the one this one imports."""
    if pkg_dir is None:
        spec = importlib.util.find_spec("torch")  # finds the package without importing it
        if spec is None or not spec.submodule_search_locations:
            return {"installed": False}
        pkg_dir = Path(next(iter(spec.submodule_search_locations)))
    info: dict[str, Any] = {"installed": True, "path": str(pkg_dir),
                            "source": "package files (torch not imported)"}
    version_file = pkg_dir / "version.py"
    if version_file.is_file():
        facts = _literal_assignments(version_file)
        info.update(
            version=facts.get("__version__"),
            git_version=facts.get("git_version"),
            cuda=facts.get("cuda"),
            hip=facts.get("hip"),
            debug=facts.get("debug"),
        )
    else:
        info["version"] = dist_versions.get("torch")
    info["cudnn"] = _dist_version(_CUDNN_DISTS, dist_versions)
    info["nccl"] = _dist_version(_NCCL_DISTS, dist_versions)
    info["torchvision"] = dist_versions.get("torchvision")
    info["triton"] = dist_versions.get("triton")
    return info


def _os_release() -> dict[str, str]:
    try:
        rel = platform.freedesktop_os_release()
    except OSError:
        return {}
    return {k: rel[k] for k in ("ID", "VERSION_ID", "PRETTY_NAME") if k in rel}


def python_info() -> dict[str, Any]:
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "virtualenv": sys.prefix != sys.base_prefix,
        "compiler": platform.python_compiler(),
    }


def os_info() -> dict[str, Any]:
    libc_name, libc_version = platform.libc_ver()
    uname = platform.uname()
    return {
        "system": uname.system,
        "kernel": uname.release,
        "kernel_build": uname.version,
        "machine": uname.machine,
        "distribution": _os_release(),
        "libc": f"{libc_name} {libc_version}".strip() or None,
        "hostname": socket.gethostname(),
    }


def environment(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The environment facet's data (see module docstring), of *environ* (default ``os.environ``)."""
    dists = distributions()
    versions = {normalize(d["name"]): d["version"] for d in dists}
    return {
        "python": python_info(),
        "os": os_info(),
        "torch_build": torch_build(versions),
        "distributions": dists,
        "env": redact_env(os.environ if environ is None else environ),
    }


@facet("environment")
def environment_facet(ctx: CaptureContext) -> dict[str, Any]:
    return environment(ctx.environ)


@facet("sandbox")
def sandbox_facet(ctx: CaptureContext) -> dict[str, Any]:
    """Whether this run ran confined (``reproduce --run-code``: bubblewrap) and with which grants, as
    the process that started it said (:data:`repro500.sandbox.RECORD_ENV`); one's own run: not."""
    return sandbox.recorded(os.environ)


def _maybe(func: Any, *args: Any) -> Any:
    """``func(*args)``, or None where this torch build or machine lacks it."""
    try:
        return func(*args)
    except Exception:  # e.g. NCCL absent in a CPU-only build, no CUDA device
        return None


def runtime_state() -> dict[str, Any]:
    """torch's live build and determinism state (imports torch).

    Call it after seeding and after the trainer set its determinism flags: it records what
    is in force, not what was asked for.
    """
    import torch

    cuda_available = torch.cuda.is_available()
    nccl = _maybe(torch.cuda.nccl.version) if hasattr(torch.cuda, "nccl") else None
    build = {
        "version": torch.__version__,
        "git_version": torch.version.git_version,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "debug": torch.version.debug,
        "cudnn": _maybe(torch.backends.cudnn.version),
        "nccl": ".".join(str(p) for p in nccl) if isinstance(nccl, tuple) else nccl,
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "openmp": torch.backends.openmp.is_available(),
        "config": torch.__config__.show(),
        "cuda_available": cuda_available,
        "cuda_device_count": torch.cuda.device_count() if cuda_available else 0,
        "cuda_devices": [
            {"name": torch.cuda.get_device_name(i),
             "capability": ".".join(map(str, torch.cuda.get_device_capability(i)))}
            for i in range(torch.cuda.device_count())
        ] if cuda_available else [],
    }
    matmul = torch.backends.cuda.matmul
    determinism = {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_enabled": torch.backends.cudnn.enabled,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "cuda_matmul_allow_tf32": matmul.allow_tf32,
        "cuda_matmul_allow_fp16_reduced_precision": matmul.allow_fp16_reduced_precision_reduction,
        "cuda_matmul_allow_bf16_reduced_precision": matmul.allow_bf16_reduced_precision_reduction,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        # newer per-backend precision knobs, where this torch has them
        "fp32_precision": {
            name: getattr(obj, "fp32_precision", None)
            for name, obj in (("cuda_matmul", matmul), ("cudnn", torch.backends.cudnn),
                              ("mkldnn", torch.backends.mkldnn))
        },
        "fill_uninitialized_memory": getattr(
            torch.utils.deterministic, "fill_uninitialized_memory", None
        ),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
    }
    return {"torch": build, "determinism": determinism}


@facet("runtime", default=False)
def runtime_facet(ctx: CaptureContext) -> dict[str, Any]:
    return runtime_state()
