// Fused error-feedback update, CUDA kernel: residual = compensated - decompressed, in place.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "cuda_common.h"

namespace repro500 {
namespace {

template <typename scalar_t>
__global__ void ef_update_kernel(scalar_t* __restrict__ residual,
                                 const scalar_t* __restrict__ compensated,
                                 const scalar_t* __restrict__ decompressed, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += gridDim.x * static_cast<int64_t>(blockDim.x)) {
    residual[i] = compensated[i] - decompressed[i];
  }
}

void ef_update_cuda(at::Tensor& residual, const at::Tensor& compensated_in,
                    const at::Tensor& decompressed_in) {
  check_cuda(residual, "ef_update_");
  check_cuda(compensated_in, "ef_update_");
  check_cuda(decompressed_in, "ef_update_");
  TORCH_CHECK(residual.is_contiguous(), "repro500::ef_update_ needs a contiguous residual");
  TORCH_CHECK(
      residual.numel() == compensated_in.numel() && residual.numel() == decompressed_in.numel(),
      "repro500::ef_update_: sizes differ");
  TORCH_CHECK(residual.scalar_type() == compensated_in.scalar_type() &&
                  residual.scalar_type() == decompressed_in.scalar_type(),
              "repro500::ef_update_: all three tensors need the same dtype");
  const c10::cuda::CUDAGuard guard(residual.device());
  const at::Tensor compensated = compensated_in.contiguous();
  const at::Tensor decompressed = decompressed_in.contiguous();
  const int64_t n = residual.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, residual.scalar_type(), "ef_update_cuda", [&] {
        ef_update_kernel<scalar_t><<<blocks_for(n), kThreads, 0, current_stream()>>>(
            residual.mutable_data_ptr<scalar_t>(), compensated.const_data_ptr<scalar_t>(),
            decompressed.const_data_ptr<scalar_t>(), n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace

TORCH_LIBRARY_IMPL(repro500, CUDA, m) { m.impl("ef_update_", &ef_update_cuda); }

}  // namespace repro500
