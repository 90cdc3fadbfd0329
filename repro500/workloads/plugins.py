"""The one door through which a recipe's model, dataset and evaluator are found.

A recipe names each part either by a registered name or by an import path:

- ``resnet20``: a name registered in an entry-point group (``repro500.models``,
  ``repro500.datasets``, ``repro500.evaluators``; ``importlib.metadata``).  repro500's own
  built-ins are registered this way in its ``pyproject.toml``, so they arrive through the
  same door as an installed package's plug-ins.
- ``mypkg.nets:build``: ``module:attribute`` imported directly.  The directory the run starts
  in and the recipe's directory are searched first (the console script's ``sys.path`` holds
  neither), so a researcher's ``nets.py`` next to their recipe needs no packaging.

Every failure (cannot import, no such attribute, not callable, unknown name) is one sentence
naming the recipe key and the entry, exit 4 (docs/workloads.md, "Plug-ins").

Whether an import path may be imported at all is :mod:`repro500.untrusted`'s rule: a rerun of
someone else's publication without ``--run-code`` imports no ``module:callable`` and puts no
directory on ``sys.path``; only registered names (installed software) are found.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterable
from functools import cache
from importlib import metadata
from typing import Any

from repro500 import untrusted
from repro500.errors import InvalidInput

GROUPS = {"model": "repro500.models", "dataset": "repro500.datasets", "evaluator": "repro500.evaluators"}


def is_import_path(ref: str) -> bool:
    return ":" in ref


@cache
def registered(kind: str) -> dict[str, metadata.EntryPoint]:
    """Names registered for ``kind`` by every installed distribution (repro500's own included)."""
    # Union over every distribution found, not entry_points(group=...): that keeps only the first
    # copy of a distribution on sys.path, and a stale ``repro500.egg-info`` in the working
    # directory (left by a source build) would then hide the installed entry points.
    out: dict[str, metadata.EntryPoint] = {}
    for dist in metadata.distributions():
        for ep in dist.entry_points.select(group=GROUPS[kind]):
            out.setdefault(ep.name, ep)
    return out


def search_paths(extra: Iterable[str] = ()) -> list[str]:
    """The directories an import path is looked up in before ``sys.path``: absolute, so that a
    distributed worker started elsewhere finds the same modules (they travel in the job).  None
    where foreign code is refused: a publication's directory never comes before ``sys.path``."""
    if untrusted.code_refused():
        return []
    out = [os.path.abspath(p) for p in (*extra, os.getcwd())]
    return list(dict.fromkeys(out))


def add_search_paths(paths: Iterable[str]) -> None:
    if untrusted.code_refused():
        return
    for path in reversed(list(paths)):
        if path not in sys.path:
            sys.path.insert(0, path)


def resolve(kind: str, ref: str, *, key: str, paths: Iterable[str] = ()) -> Callable[..., Any]:
    """The callable ``ref`` names for recipe key ``key`` (``fixed.model`` ...)."""
    if not isinstance(ref, str) or not ref.strip():
        raise InvalidInput(f"{key} must name a registered {kind} or a module:callable, got {ref!r}")
    if is_import_path(ref):
        if untrusted.code_refused():
            raise untrusted.refuse_code(key, ref)
        obj = _import(ref, key, paths)
    else:
        entries = registered(kind)
        if ref not in entries:
            close = difflib.get_close_matches(ref, list(entries), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidInput(f"{key}: unknown {kind} {ref!r}{hint}; registered: {', '.join(sorted(entries)) or 'none'}; "
                               f"a plug-in is named as module:callable")
        try:
            obj = entries[ref].load()
        except Exception as err:  # noqa: BLE001 - a broken plug-in's import error is the user's to fix
            raise InvalidInput(f"{key}: the {kind} {ref!r} ({entries[ref].value}) cannot be loaded: {_one_line(err)}") from None
    if not callable(obj):
        raise InvalidInput(f"{key}: {ref!r} is a {type(obj).__name__}, not a callable")
    return obj


def _import(ref: str, key: str, paths: Iterable[str]) -> Any:
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise InvalidInput(f"{key}: {ref!r} is not module:callable")
    add_search_paths(search_paths(paths))
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - ImportError or whatever the module raises on import
        raise InvalidInput(f"{key}: cannot import {module_name!r} for {ref!r}: {_one_line(err)}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InvalidInput(f"{key}: module {module_name!r} has no attribute {attr!r}") from None
    return obj


def call(fn: Callable[..., Any], key: str, ref: str, *args: Any, **kwargs: Any) -> Any:
    """Call a plug-in, passing only the keyword arguments it accepts; its exceptions become one
    sentence naming the recipe key and the entry (a plug-in's bug is not repro500's traceback)."""
    try:
        return fn(*args, **accepted(fn, kwargs))
    except InvalidInput:
        raise
    except Exception as err:  # noqa: BLE001
        raise InvalidInput(f"{key}: {ref!r} raised {type(err).__name__}: {_one_line(err)}") from None


def accepted(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``kwargs`` that ``fn`` takes (all of them when it has ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def source_modules(before: set[str]) -> list[tuple[str, str]]:
    """Modules imported since ``before`` whose files lie outside site-packages, the standard
    library and repro500: the experiment's own source the workload actually loaded, as
    (import root, file) pairs — the root is the ``sys.path`` entry the module was found under,
    so a copy of the files below it imports the same way elsewhere."""
    import sysconfig

    own = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # repro500 itself: its own facet
    paths = sysconfig.get_paths()
    # The interpreter's trees and its scripts directory: a console script (.venv/bin/repro500)
    # is the program that started, never the experiment's source.
    skip = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib", "scripts")} | {own}
    skip |= {os.path.realpath(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix)}
    out = []
    for name in sorted(set(sys.modules) - before):
        if name in ("__main__", "__mp_main__"):
            continue
        path = getattr(sys.modules[name], "__file__", None)
        if not isinstance(path, str) or not os.path.isabs(path) or not os.path.isfile(path):
            continue  # built-in, namespace or synthetic modules (torch's _ops, _classes) have no file
        real = os.path.realpath(path)
        if any(real.startswith(s + os.sep) for s in skip) or "site-packages" in real:
            continue
        depth = name.count(".") + (2 if os.path.basename(real).startswith("__init__.") else 1)
        root = real
        for _ in range(depth):
            root = os.path.dirname(root)
        out.append((root, real))
    return out


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[-1] if text else type(err).__name__
