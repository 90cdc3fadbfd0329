// Small helpers shared by the CUDA kernels.
#pragma once
// Only c10's CUDA headers: ATen/cuda/CUDAContext.h pulls in cuSPARSE/cuBLAS headers, which a
// minimal CUDA toolkit (nvcc + cudart, as here) does not ship.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace repro500 {

constexpr int kThreads = 256;

inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

inline int blocks_for(int64_t n, int threads = kThreads) {
  // Grid-stride loops below cover any n; cap the grid so huge tensors do not launch millions.
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

inline void check_cuda(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.is_cuda(), "repro500::", op, " (CUDA) got a ", t.device(), " tensor");
}

}  // namespace repro500
