"""Compile the ``repro500`` C++/CUDA operators with ``torch.utils.cpp_extension.load`` (JIT).

Two shared libraries, both loaded with ``torch.ops.load_library`` (no Python module):

- the CPU library (``csrc/*.cpp``): the ``TORCH_LIBRARY(repro500, ...)`` schema and the CPU
  kernels; it needs only a C++ compiler, and everything else in repro500 works without it;
- the CUDA library (``csrc/cuda/*.cu``): ``TORCH_LIBRARY_IMPL(repro500, CUDA, ...)`` kernels,
  built only on request (:func:`build_cuda_ops`) when ``nvcc`` is present.

Builds are cached under ``repro500.capture.cache.cache_dir("torch_extensions", <torch version>)``.
A library's name carries a digest of its sources and flags, so a finished build is found by
name and an edited source gets a fresh build; old builds are safe to delete.  A finished build is
loaded as it is, without asking ninja: ninja's command line holds the checkout's path, so a
second checkout (a clone, CI) would otherwise compile the same sources again.

The CPU sources are compiled as one translation unit that includes them all: each file spends
most of its compile parsing the same torch headers (a 31-line file takes 7 s here), so six units
cost 63 s of CPU and one 21 s, and on two cores the one unit also finishes first (21 s against
33 s); on a many-core machine six units in parallel would finish in ~13 s.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from pathlib import Path

from repro500.capture.cache import cache_dir
from repro500.capture.toolchain import find_cuda_home
from repro500.errors import EXIT_INVALID, ReproError, UsageError

CSRC = Path(__file__).parent / "csrc"
CPU_SOURCES = ("ops.cpp", "topk.cpp", "indexcode.cpp", "quantize.cpp", "sign.cpp", "ef_update.cpp")
CUDA_SOURCES = ("cuda/topk.cu", "cuda/quantize.cu", "cuda/sign.cu", "cuda/ef_update.cu")
HEADERS = ("rng.h", "cuda_common.h")
# -fopenmp: at::parallel_for is a header template that only runs in parallel when the
# extension itself is compiled with OpenMP (torch's CPU build uses the OpenMP backend).
CPU_CFLAGS = ("-O3", "-fopenmp")
CPU_LDFLAGS = ("-fopenmp",)
CUDA_CFLAGS = ("-O3", "--use_fast_math")
DEFAULT_CUDA_ARCH_LIST = "9.0"
COMPILING_MESSAGE = "repro500: compiling C++ operators (first use, about half a minute)..."
COMPILING_CUDA_MESSAGE = "repro500: compiling CUDA operators (first use, ~2 min)..."


def build_directory() -> Path:
    """Where compiled operators are cached (one folder per torch version)."""
    import torch

    version = torch.__version__.replace("+", "_")
    return cache_dir("torch_extensions", version)


def _library_name(prefix: str, sources: tuple[str, ...], flags: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for rel in sorted(sources + HEADERS):
        digest.update(rel.encode() + b"\0" + (CSRC / rel).read_bytes() + b"\0")
    digest.update("\0".join(flags).encode())
    return f"{prefix}_{digest.hexdigest()[:12]}"


def _library_path(name: str) -> Path:
    return build_directory() / name / f"{name}.so"


def _quiet_cpp_extension(verbose: bool) -> None:
    # cpp_extension warns at import that "no CUDA runtime is found" on every machine without
    # a GPU; that is expected here (CPU build, or CUDA compile-only) and only confuses users.
    if not verbose:
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


def _finished_marker(path: Path) -> Path:
    # written once torch has built and loaded the library: the linker writes the .so in place, so
    # the .so alone may be another process's build half written
    return path.with_suffix(".built")


def _compile_and_load(
    name: str,
    sources: tuple[str, ...],
    message: str,
    verbose: bool,
    unity: bool = False,
    **kwargs: object,
) -> Path:
    path = _library_path(name)
    if _finished_marker(path).exists() and path.exists():
        import torch

        torch.ops.load_library(str(path))
        return path
    _quiet_cpp_extension(verbose)
    from torch.utils import cpp_extension

    if not path.exists():
        # The one line a user sees while waiting; torch prints nothing unless verbose.
        print(message, file=sys.stderr, flush=True)
    folder = build_directory() / name
    folder.mkdir(parents=True, exist_ok=True)
    if unity:
        one = folder / f"{name}.cpp"
        text = "".join(f'#include "{rel}"\n' for rel in sources)
        if not one.exists() or one.read_text() != text:  # rewritten, ninja would compile it again
            tmp = one.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, one)
        paths = [str(one)]
    else:
        paths = [str(CSRC / rel) for rel in sources]
    cpp_extension.load(
        name=name,
        sources=paths,
        extra_include_paths=[str(CSRC)],
        build_directory=str(folder),
        verbose=verbose,
        is_python_module=False,
        **kwargs,
    )
    _finished_marker(path).touch()
    return path


def load_cpu_ops(verbose: bool = False) -> Path:
    """Compile (once) and load the operator schema and CPU kernels; returns the library path.

    Raises whatever the compiler raises (RuntimeError, OSError) when no working C++
    toolchain is present; :mod:`repro500.ext.ops` catches that and uses the references.
    """
    flags = CPU_CFLAGS + CPU_LDFLAGS
    name = _library_name("repro500_ops_cpu", CPU_SOURCES, flags + ("one unit",))
    return _compile_and_load(
        name,
        CPU_SOURCES,
        COMPILING_MESSAGE,
        verbose,
        unity=True,
        extra_cflags=list(CPU_CFLAGS),
        extra_ldflags=list(CPU_LDFLAGS),
        with_cuda=False,
    )


def build_cuda_ops(arch_list: str | None = None, verbose: bool = False) -> Path:
    """Compile (once) and load the CUDA kernels; returns the library path.

    Needs ``nvcc`` but not a GPU: loading registers the kernels, running them needs a device.
    *arch_list* is TORCH_CUDA_ARCH_LIST (default ``$TORCH_CUDA_ARCH_LIST`` or "9.0"); it is
    always given explicitly because torch cannot guess it on a machine without a GPU.
    Load the CPU library first (:func:`load_cpu_ops`): it defines the operator schema.
    """
    cuda_home = find_cuda_home()
    if cuda_home is None:
        raise UsageError(
            "no CUDA toolkit found (nvcc); set CUDA_HOME to the toolkit root "
            "to build the CUDA operators."
        )
    arch = arch_list or os.environ.get("TORCH_CUDA_ARCH_LIST") or DEFAULT_CUDA_ARCH_LIST
    os.environ["CUDA_HOME"] = cuda_home
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    _quiet_cpp_extension(verbose)
    from torch.utils import cpp_extension

    # cpp_extension resolves CUDA_HOME once at import time, possibly from a wrapper script on
    # PATH (then it points at a directory without include/); give it the toolkit we found.
    cpp_extension.CUDA_HOME = cuda_home
    flags = CUDA_CFLAGS + (f"arch={arch}",)
    name = _library_name("repro500_ops_cuda", CUDA_SOURCES, flags)
    return _compile_and_load(
        name,
        CUDA_SOURCES,
        COMPILING_CUDA_MESSAGE,
        verbose,
        extra_cuda_cflags=list(CUDA_CFLAGS),
        with_cuda=True,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m repro500.ext.build [--cuda] [--arch 9.0] [--verbose]``: build ahead of time.

    Useful before a multi-process launch (so ranks do not wait on the compiler) and in CI.
    Prints the path of each library; exit 0 when built, 4 when the build failed.
    """
    import argparse


    parser = argparse.ArgumentParser(prog="python -m repro500.ext.build", description=main.__doc__)
    parser.add_argument(
        "--cuda", action="store_true", help="also compile the CUDA kernels (needs nvcc, not a GPU)"
    )
    parser.add_argument(
        "--arch",
        default=None,
        help="TORCH_CUDA_ARCH_LIST for --cuda (default $TORCH_CUDA_ARCH_LIST or 9.0)",
    )
    parser.add_argument("--verbose", action="store_true", help="show the compiler's output")
    args = parser.parse_args(argv)
    try:
        print(load_cpu_ops(verbose=args.verbose))
        if args.cuda:
            print(build_cuda_ops(arch_list=args.arch, verbose=args.verbose))
    except ReproError as err:
        print(f"repro500: error: {err}", file=sys.stderr)
        return err.exit_code
    except (RuntimeError, OSError, ImportError) as err:
        # The compiler's own output was printed above it (or is shown with --verbose).
        print(
            f"repro500: error: building the operators failed ({err}); rerun with --verbose.",
            file=sys.stderr,
        )
        return EXIT_INVALID
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
