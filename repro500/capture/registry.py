"""The facet registry: each captured fact is one small registered function.

In the spirit of Sacred's ``host_info_gatherer``: a facet is a function that takes the
:class:`CaptureContext` and returns plain JSON-able data.  Registering one is a decorator::

    @facet("gpu_clocks")
    def gpu_clocks(ctx: CaptureContext) -> dict:
        ...

A facet that raises is recorded under the manifest's ``facet_errors`` with the reason and
never aborts the capture.  The exception is :class:`repro500.errors.ReproError`: that is
the user's own input being wrong (a ``--data`` path that does not exist), which must stop
the capture with its one-line message and exit code instead of hiding in the manifest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500.errors import ReproError


@dataclass
class CaptureContext:
    """What one capture was asked to record; facets read it and may add artifacts."""

    data_paths: tuple[str, ...] = ()
    repo_dir: Path | None = None
    progress: bool = False
    use_cache: bool = True
    seed: int | None = None
    repeats: int = 1
    world_size: int = 1
    same_seed: bool = False
    # a wrapped command's declared inputs (fixed.inputs): the data facet's ``inputs``
    input_paths: tuple[str, ...] = ()
    # the environment to record (the one the experiment runs with); None: os.environ
    environ: dict[str, str] | None = None
    # threads hashing data (None: every usable CPU; 1 beside a running repeat)
    jobs: int | None = None
    # file name -> bytes, written next to the manifest (e.g. "code.diff")
    artifacts: dict[str, bytes] = field(default_factory=dict)


FacetFunc = Callable[[CaptureContext], Any]


@dataclass(frozen=True)
class Facet:
    name: str
    func: FacetFunc
    default: bool  # gathered by every capture, or only when asked for by name


_REGISTRY: dict[str, Facet] = {}


def facet(name: str, *, default: bool = True) -> Callable[[FacetFunc], FacetFunc]:
    """Register ``func`` as the facet ``name`` (``default=False``: only when asked for)."""

    def register(func: FacetFunc) -> FacetFunc:
        _REGISTRY[name] = Facet(name, func, default)
        return func

    return register


def registered() -> dict[str, Facet]:
    """Every registered facet, in registration order."""
    return dict(_REGISTRY)


def gather(
    ctx: CaptureContext, also: Iterable[str] = (), only: Iterable[str] | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """Run the default facets (plus ``also``, or exactly ``only``): ``(facets, facet_errors)``."""
    wanted = list(only) if only is not None else [
        name for name, f in _REGISTRY.items() if f.default
    ] + [name for name in also if name not in _REGISTRY or not _REGISTRY[name].default]
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name in wanted:
        entry = _REGISTRY.get(name)
        if entry is None:
            errors[name] = "no facet of this name is registered"
            continue
        try:
            results[name] = entry.func(ctx)
        except ReproError:
            raise
        except Exception as err:  # a facet that cannot be gathered says why, never aborts
            # its patterns compile on import: paid only when a facet fails
            from repro500.redact import redact_text

            errors[name] = redact_text(f"{type(err).__name__}: {err}".strip())
    return results, errors
