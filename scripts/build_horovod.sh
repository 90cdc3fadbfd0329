#!/usr/bin/env bash
# Build Horovod 0.28.1 (its last release) against the installed torch, cache the wheel, install it.
#
# Why a script: 0.28.1 asks CMake for C++14, but torch >= 2.1's headers need C++17 and
# torch 2.14's need C++20, so `pip install horovod` fails.  The fix (horovod PR #3998) was
# merged to master but never released.  We download the sdist, raise the standard to 20 in
# the two CMakeLists.txt files and build with Gloo (CPU) and PyTorch only.  About 4.5 minutes
# on 2 cores; afterwards the wheel is reused from the cache in seconds.
#
# Usage:   scripts/build_horovod.sh            (uses the `python` on PATH, e.g. .venv/bin/python)
#          PYTHON=/path/to/python scripts/build_horovod.sh
# NCCL:    export HOROVOD_GPU_OPERATIONS=NCCL (and HOROVOD_NCCL_HOME if NCCL is not in a
#          system path) before running it on a machine with CUDA; the default is CPU/Gloo.
# Cache:   <repro500 cache>/wheels/horovod-0.28.1-torch<version>/ (delete it to rebuild).
set -euo pipefail

HOROVOD_VERSION=0.28.1
PYTHON=${PYTHON:-python}

if ! command -v cmake >/dev/null 2>&1; then
    echo "build_horovod: cmake is not on PATH; install it (apt-get install cmake or pip install cmake) and rerun." >&2
    exit 4
fi
if ! command -v g++ >/dev/null 2>&1; then
    echo "build_horovod: g++ is not on PATH; install a C++20 compiler (apt-get install g++) and rerun." >&2
    exit 4
fi

TORCH_VERSION=$("$PYTHON" -c 'import torch; print(torch.__version__)')
WHEEL_DIR=$("$PYTHON" -c "from repro500.cache import cache_dir; print(cache_dir('wheels', 'horovod-${HOROVOD_VERSION}-torch${TORCH_VERSION}'))")

wheel=$(ls "$WHEEL_DIR"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n 1 || true)
if [[ -z "$wheel" ]]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    echo "build_horovod: downloading the horovod ${HOROVOD_VERSION} sdist" >&2
    "$PYTHON" -m pip download --quiet --no-binary :all: --no-deps "horovod==${HOROVOD_VERSION}" -d "$work"
    tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    for cml in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
        grep -q 'set(CMAKE_CXX_STANDARD 14)' "$cml" || {
            echo "build_horovod: $cml has no 'set(CMAKE_CXX_STANDARD 14)'; the sdist changed, patch it by hand." >&2
            exit 4
        }
        sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 20)/' "$cml"
    done
    echo "build_horovod: compiling horovod ${HOROVOD_VERSION} for torch ${TORCH_VERSION} (about 5 minutes)" >&2
    # MAKEFLAGS keeps the build to the machine's cores; HOROVOD_* select what gets built.
    # A CUDA build of torch makes Horovod compile its CUDA glue; CMake must find the real
    # toolkit, not a wrapper script on PATH (that hides the include and lib directories).
    cuda_home="${CUDA_HOME:-/usr/local/cuda}"
    cuda_env=()
    if [[ -x "$cuda_home/bin/nvcc" ]]; then
        cuda_env=(CUDA_HOME="$cuda_home" CUDACXX="$cuda_home/bin/nvcc" CUDAToolkit_ROOT="$cuda_home")
    fi
    env "${cuda_env[@]}" \
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}" \
        "$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$work/dist" "$src"
    built=$(ls "$work"/dist/horovod-"$HOROVOD_VERSION"-*.whl | head -n 1)
    # Copy then rename so an interrupted copy never looks like a finished wheel.
    cp "$built" "$WHEEL_DIR/.partial.whl"
    mv "$WHEEL_DIR/.partial.whl" "$WHEEL_DIR/$(basename "$built")"
    wheel="$WHEEL_DIR/$(basename "$built")"
else
    echo "build_horovod: using the cached wheel $wheel" >&2
fi

"$PYTHON" -m pip install --quiet --force-reinstall --no-deps "$wheel"
# Horovod's own run-time dependencies (small, pure Python).
"$PYTHON" -m pip install --quiet cloudpickle psutil pyyaml packaging cffi
"$PYTHON" -c 'import horovod.torch as hvd; print("build_horovod: horovod", __import__("horovod").__version__, "ready; gloo built:", hvd.gloo_built())'
