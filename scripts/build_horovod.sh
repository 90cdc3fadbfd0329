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
# NCCL:    automatic when torch sees a CUDA device and NCCL is found (HOROVOD_NCCL_HOME /
#          HOROVOD_NCCL_INCLUDE + HOROVOD_NCCL_LIB, the CUDA toolkit or /usr, or the nvidia-nccl
#          wheel that CUDA builds of torch install into the venv): HOROVOD_GPU_OPERATIONS=NCCL.
#          Otherwise (no GPU, e.g. nvcc alone; or no NCCL) Gloo on the CPU.  To choose yourself,
#          export HOROVOD_GPU_OPERATIONS=NCCL (e.g. on a GPU-less build node) or
#          HOROVOD_GPU_OPERATIONS= (empty: never NCCL) before running the script.
# Cache:   <repro500 cache>/wheels/horovod-0.28.1-torch<version>[-nccl]/ (delete it to rebuild).
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
cuda_home="${CUDA_HOME:-/usr/local/cuda}"

# NCCL: headers and a library Horovod's FindNCCL accepts.  Prints "include-dir lib-dir" or nothing.
find_nccl() {
    if [[ -n "${HOROVOD_NCCL_HOME:-}" ]]; then
        local d
        for d in lib lib64; do
            compgen -G "$HOROVOD_NCCL_HOME/$d/libnccl*" >/dev/null && { echo "$HOROVOD_NCCL_HOME/include $HOROVOD_NCCL_HOME/$d"; return; }
        done
        echo "$HOROVOD_NCCL_HOME/include $HOROVOD_NCCL_HOME/lib"; return
    fi
    if [[ -n "${HOROVOD_NCCL_INCLUDE:-}" && -n "${HOROVOD_NCCL_LIB:-}" ]]; then
        echo "$HOROVOD_NCCL_INCLUDE $HOROVOD_NCCL_LIB"; return
    fi
    local inc lib
    for inc in "$cuda_home/include" /usr/include /usr/local/include; do
        [[ -f "$inc/nccl.h" ]] || continue
        for lib in "$cuda_home/lib64" "$cuda_home/lib" /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib; do
            if compgen -G "$lib/libnccl.so*" >/dev/null || [[ -f "$lib/libnccl_static.a" ]]; then
                echo "$inc $lib"; return
            fi
        done
    done
    # The nvidia-nccl-cu* wheel that CUDA builds of torch depend on (headers + libnccl.so.2).
    "$PYTHON" - <<'PY' 2>/dev/null || true
import glob, importlib.util, os
spec = importlib.util.find_spec("nvidia.nccl")
for root in (spec.submodule_search_locations or []) if spec else []:
    if os.path.isfile(os.path.join(root, "include", "nccl.h")) and glob.glob(os.path.join(root, "lib", "libnccl.so*")):
        print(os.path.join(root, "include"), os.path.join(root, "lib"))
        break
PY
}

# Decide GPU operations unless the caller did (set, even to empty, means "as given").
nccl_env=()
if [[ -z "${HOROVOD_GPU_OPERATIONS+set}" ]]; then
    has_gpu=$("$PYTHON" -c 'import torch; print(int(torch.cuda.is_available() and torch.cuda.device_count() > 0))' 2>/dev/null || echo 0)
    if [[ "$has_gpu" == 1 ]]; then
        read -r nccl_inc nccl_lib <<<"$(find_nccl)" || true
        if [[ -n "${nccl_inc:-}" && -n "${nccl_lib:-}" ]]; then
            echo "build_horovod: CUDA device found; building with NCCL (${nccl_inc}, ${nccl_lib})" >&2
            export HOROVOD_GPU_OPERATIONS=NCCL
            nccl_env=(HOROVOD_NCCL_INCLUDE="$nccl_inc" HOROVOD_NCCL_LIB="$nccl_lib")
        else
            echo "build_horovod: warning: CUDA device found but no NCCL (nccl.h + libnccl); building Gloo only." >&2
            echo "build_horovod: set HOROVOD_NCCL_HOME (or HOROVOD_NCCL_INCLUDE and HOROVOD_NCCL_LIB) to use NCCL." >&2
        fi
    fi
elif [[ "${HOROVOD_GPU_OPERATIONS}" == NCCL ]]; then
    read -r nccl_inc nccl_lib <<<"$(find_nccl)" || true
    if [[ -n "${nccl_inc:-}" && -n "${nccl_lib:-}" ]]; then
        nccl_env=(HOROVOD_NCCL_INCLUDE="$nccl_inc" HOROVOD_NCCL_LIB="$nccl_lib")
    fi
fi
if [[ -z "${HOROVOD_GPU_OPERATIONS:-}" ]]; then
    unset HOROVOD_GPU_OPERATIONS  # empty: CMake must not see it at all
fi

flavour=""
[[ "${HOROVOD_GPU_OPERATIONS:-}" == NCCL ]] && flavour="-nccl"
WHEEL_DIR=$("$PYTHON" -c "from repro500.capture.cache import cache_dir; print(cache_dir('wheels', 'horovod-${HOROVOD_VERSION}-torch${TORCH_VERSION}${flavour}'))")

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
    cuda_env=()
    if [[ -x "$cuda_home/bin/nvcc" ]]; then
        cuda_env=(CUDA_HOME="$cuda_home" CUDACXX="$cuda_home/bin/nvcc" CUDAToolkit_ROOT="$cuda_home")
    fi
    if (( ${#nccl_env[@]} )); then
        # FindNCCL looks for libnccl.so or libnccl_static.a; the pip wheel ships only
        # libnccl.so.2, so give it an unversioned link.  At run time the soname libnccl.so.2
        # is the one torch has already loaded.
        nccl_lib_dir=${nccl_env[1]#HOROVOD_NCCL_LIB=}
        if ! compgen -G "$nccl_lib_dir/libnccl.so" >/dev/null && ! [[ -f "$nccl_lib_dir/libnccl_static.a" ]]; then
            mkdir -p "$work/nccl-lib"
            ln -s "$(ls "$nccl_lib_dir"/libnccl.so.* | head -n 1)" "$work/nccl-lib/libnccl.so"
            nccl_env[1]=HOROVOD_NCCL_LIB="$work/nccl-lib"
        fi
        compgen -G "${nccl_env[1]#HOROVOD_NCCL_LIB=}/libnccl.so" >/dev/null && nccl_env+=(HOROVOD_NCCL_LINK=SHARED)
    fi
    echo "build_horovod: GPU operations: ${HOROVOD_GPU_OPERATIONS:-none (Gloo on the CPU)}" >&2
    env "${cuda_env[@]}" "${nccl_env[@]}" \
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
"$PYTHON" -c 'import horovod.torch as hvd; print("build_horovod: horovod", __import__("horovod").__version__, "ready; gloo built:", hvd.gloo_built(), "nccl built:", bool(hvd.nccl_built()))'
