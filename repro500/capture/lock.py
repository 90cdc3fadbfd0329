"""The experiment's environment as an installer can rebuild it: ``environment.lock.json`` and
``requirements.lock.txt`` beside the manifest (docs/publish.md, "On another machine").

Built from the manifest's environment facet alone (the interpreter that ran the experiment, its
distributions and where each came from, PEP 610), so writing it never touches the network and
never holds a run up.  Each distribution is pinned exactly and says where it came from:

``index``     a release from a package index (``name==version``); torch's local version tags
              (``+cpu``, ``+cu126``, ``+rocm6.2``) name the PyTorch index that serves that build
``vcs``       ``name @ git+URL@commit`` (the commit PEP 610 recorded, never a branch)
``archive``   ``name @ https://...`` (a wheel or sdist installed from a URL)
``local``     a directory install (editable or not): when the directory is part of the
              experiment's kept source, the rebuild installs it from the run's ``source/``;
              otherwise it is unpinnable, and ``why`` says so
``tool``      repro500 itself: a reproduction installs the repro500 that runs it

What cannot be pinned (a local directory outside the run, a ``file://`` archive, a URL whose
credentials were redacted, a local version no known index serves) is listed with the reason.
Artifact hashes are not recorded here: only the index knows them, and a run must not wait for it;
``repro500 publish`` asks the index for them (publish/index.py).

``wheel_tags`` maps each distribution installed from a wheel to that wheel's ``Tag:`` lines (read
from its ``WHEEL`` file under the recorded interpreter's prefix), and the
platform carries ``sys_platform`` and the platform tag ``packaging.tags`` sees here (libc
included: ``manylinux_2_36_x86_64``): the rebuild refuses up front, naming both platforms, a lock
whose wheels cannot install on its machine.  Both are additions to v1: a lock without them
rebuilds as before, unjudged.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from packaging import tags as wheel_tags
from packaging.utils import canonicalize_version

from repro500.capture.env import normalize
from repro500.redact import REDACTED, redact_url
from repro500.rundir.names import LOCK_SCHEMA

SCHEMA = LOCK_SCHEMA
PYPI = "https://pypi.org/simple"
PYTORCH_INDEX = "https://download.pytorch.org/whl/"
# torch's own builds: their local version tag names the PyTorch index directory that serves them
_TORCH_FAMILY = {"torch", "torchvision", "torchaudio", "torchtext", "torchdata", "pytorch-triton",
                 "pytorch-triton-rocm", "triton"}
_TORCH_TAG = re.compile(r"^(cpu|cu\d{2,3}|rocm\d+(\.\d+)*|xpu)$")
_TOOL = "repro500"
HASHES_NOTE = ("artifact hashes are not recorded by the run: only the index knows them, and a run does not wait "
               "for the network; repro500 publish asks the index and writes them beside the packed run "
               "(environment.hashes.json)")


def _index_urls(environ: Mapping[str, str]) -> tuple[str, list[str]]:
    """The index the experiment's packages came from as far as this machine says (pip's and uv's
    variables), credentials redacted; PyPI otherwise."""
    main = environ.get("PIP_INDEX_URL") or environ.get("UV_INDEX_URL") or environ.get("UV_DEFAULT_INDEX") or PYPI
    extra = " ".join(environ.get(k, "") for k in ("PIP_EXTRA_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_INDEX"))
    return redact_url(main.strip()), [redact_url(u) for u in extra.split() if u]


def _local_path(url: str | None) -> Path | None:
    if not url or not url.startswith("file://"):
        return None
    return Path(unquote(urlparse(url).path))


def _inside(path: Path, root: Path) -> str | None:
    try:
        rel = path.resolve().relative_to(root.resolve())
    except (ValueError, OSError):
        return None
    return rel.as_posix() or "."


def _site_dirs(python: Mapping[str, Any]) -> Iterator[Path]:
    """Where the recorded interpreter's distributions are: this interpreter's ``sys.path`` when it
    is the one recorded (a built-in recipe), else its prefix's site-packages (a wrapped command's
    venv or conda env; the facet keeps its prefix, not its ``sys.path``)."""
    prefix = python.get("prefix")
    if not prefix or os.path.realpath(prefix) == os.path.realpath(sys.prefix):
        yield from (Path(p) for p in sys.path if p)
        return
    minor = ".".join(str(python.get("version") or "").split(".")[:2])
    root = Path(prefix)
    yield from sorted(root.glob(f"lib*/python{minor}*/site-packages")) if minor else ()
    yield root / "Lib" / "site-packages"  # Windows


def _wheel_tags(python: Mapping[str, Any]) -> dict[tuple[str, str], list[str]]:
    """(normalized name, version) -> the ``Tag:`` lines of the wheel each distribution was installed
    from, read from its ``.dist-info/WHEEL`` (an egg-info install has none: it is not judged)."""
    found: dict[tuple[str, str], list[str]] = {}
    for folder in _site_dirs(python):
        try:
            infos = [d for d in folder.iterdir() if d.name.endswith(".dist-info")]
        except OSError:
            continue
        for info in infos:
            # a dist-info directory is "{name}-{version}.dist-info"; neither part holds a "-"
            name, _, version = info.name[: -len(".dist-info")].rpartition("-")
            key = (normalize(name), canonicalize_version(version))
            if not name or key in found:
                continue
            try:
                with (info / "WHEEL").open(encoding="utf-8", errors="replace") as handle:
                    text = handle.read(64 * 1024)  # a few lines; a larger file is not a WHEEL file
            except OSError:
                continue
            tags = [v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())
                    if k.strip().lower() == "tag" and v.strip()]
            if tags:
                found[key] = tags
    return found


def run_platform() -> dict[str, Any]:
    """This machine as an installer picking wheels sees it: ``sys.platform`` and its most specific
    platform tag (``manylinux_2_36_x86_64`` says glibc 2.36; ``linux_x86_64``, which packaging
    lists first, says nothing a wheel on an index is built for)."""
    found = list(dict.fromkeys(wheel_tags.platform_tags()))
    specific = [t for t in found if not t.startswith("linux_")]
    return {"sys_platform": sys.platform, "tag": (specific or found or [None])[0]}


def pin(dist: Mapping[str, Any], source_root: str | None) -> dict[str, Any]:
    """One distribution's lock entry: ``requirement`` (what an installer is given) or ``why`` not."""
    name, version = str(dist.get("name")), str(dist.get("version"))
    entry: dict[str, Any] = {"name": name, "version": version}
    source = dist.get("source") or None
    if normalize(name) == _TOOL:
        return {**entry, "kind": "tool", "requirement": None,
                "why": "repro500 itself: a reproduction installs the repro500 that runs it"}
    if source is None:
        entry.update(kind="index", requirement=f"{name}=={version}")
        _, plus, tag = version.partition("+")
        if plus:
            if normalize(name) in _TORCH_FAMILY and _TORCH_TAG.match(tag):
                entry["index"] = PYTORCH_INDEX + tag
            else:
                entry.update(requirement=None, why=f"a local version (+{tag}) that no known public index serves")
        return entry
    kind, url = source.get("kind"), str(source.get("url") or "")
    if REDACTED in url:
        return {**entry, "kind": kind, "requirement": None, "url": url,
                "why": "its URL held credentials, which are never recorded"}
    if kind == "vcs":
        commit = source.get("commit")
        if not commit:
            return {**entry, "kind": kind, "requirement": None, "url": url, "why": "no commit was recorded"}
        vcs = source.get("vcs") or "git"
        return {**entry, "kind": kind, "url": url, "commit": commit,
                "requirement": f"{name} @ {vcs}+{url}@{commit}"}
    if kind == "local":
        entry.update(kind="local", editable=bool(source.get("editable")), url=url, requirement=None)
        path = _local_path(url)
        rel = _inside(path, Path(source_root)) if path and source_root else None
        if rel is not None:
            entry.update(experiment=True, source_path=rel)  # installed from the run's source/ on rebuild
        else:
            entry["why"] = f"installed from a local directory ({path or url}) that is not part of the run's source"
        return entry
    if kind == "archive":
        if url.startswith("https://"):
            return {**entry, "kind": kind, "url": url, "requirement": f"{name} @ {url}"}
        return {**entry, "kind": kind, "url": url, "requirement": None,
                "why": "installed from a local file or a non-https URL, which another machine cannot fetch"}
    return {**entry, "kind": "unknown", "requirement": None, "why": "its install record (direct_url.json) is unreadable"}


def build(manifest: Mapping[str, Any], *, source_root: str | None = None,
          environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The lock of the experiment's environment in *manifest* (its environment facet)."""
    facets = manifest.get("facets") or {}
    env = facets.get("environment") or {}
    python = env.get("python") or None
    osinfo = env.get("os") or {}
    doc: dict[str, Any] = {"schema": SCHEMA, "manifest_digest": (manifest.get("digest") or {}).get("value")}
    platform = {"system": osinfo.get("system"), "machine": osinfo.get("machine"), "libc": osinfo.get("libc")}
    if python is None:  # a command that is not Python
        return {**doc, "applies": False, "why": env.get("lock") or "no Python interpreter was recorded",
                "program": env.get("program"), "platform": platform, "distributions": [], "unpinnable": []}
    main, extra = _index_urls(os.environ if environ is None else environ)
    pins = [pin(d, source_root) for d in env.get("distributions") or []]
    # the lock is written on the machine that ran, right after it ran: its files and platform are these
    tagged = _wheel_tags(python)
    wheels = {p["name"]: tags for p in pins
              if (tags := tagged.get((normalize(p["name"]), canonicalize_version(p["version"]))))}
    platform.update(run_platform())
    indexes = sorted({p["index"] for p in pins if p.get("index")})
    return {
        **doc, "applies": True,
        "python": {"version": python.get("version"), "implementation": python.get("implementation"),
                   "executable": python.get("executable")},
        "platform": platform,
        "index": {"url": main, "extra": [*extra, *(i for i in indexes if i not in extra)]},
        "distributions": pins,
        "unpinnable": [{"name": p["name"], "version": p["version"], "why": p["why"]}
                       for p in pins if p.get("why") and p["kind"] != "tool"],
        "hashes": HASHES_NOTE,
        "wheel_tags": wheels,
    }


def requirements(doc: Mapping[str, Any]) -> str:
    """``requirements.lock.txt``: the same pins for ``pip install -r`` / ``uv pip install -r``."""
    lines = ["# repro500 environment lock (environment.lock.json has where each pin came from)"]
    if not doc.get("applies"):
        return "\n".join([*lines, f"# {doc.get('why')}", ""])
    python, platform = doc.get("python") or {}, doc.get("platform") or {}
    lines.append(f"# Python {python.get('version')} ({python.get('implementation')}) on "
                 f"{platform.get('system')} {platform.get('machine')} ({platform.get('libc')})")
    index = doc.get("index") or {}
    if index.get("url") and REDACTED not in index["url"]:
        lines.append(f"--index-url {index['url']}")
    lines.extend(f"--extra-index-url {u}" for u in index.get("extra") or [] if REDACTED not in u)
    for p in doc.get("distributions") or []:
        if p.get("requirement"):
            lines.append(p["requirement"])
        elif p.get("experiment"):
            lines.append(f"# {p['name']} {p['version']}: the experiment's own package, installed from "
                         f"source/{p['source_path']} on rebuild")
        else:
            lines.append(f"# not pinned: {p['name']} {p['version']}: {p.get('why')}")
    return "\n".join(lines) + "\n"
