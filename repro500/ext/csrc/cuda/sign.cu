// 1-bit sign pack/unpack with a scale, CUDA kernels; same layout as csrc/sign.cpp.
// mean |x| is summed in double: per-block partial sums, then one block adds them in a fixed
// order, so the scale is deterministic (no floating-point atomics).
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "cuda_common.h"

namespace repro500 {
namespace {

__global__ void pack_kernel(const float* __restrict__ x, int64_t n, int64_t num_bytes,
                            uint8_t* __restrict__ packed, double* __restrict__ block_sums) {
  __shared__ double partial[kThreads];
  double acc = 0.0;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < num_bytes;
       j += gridDim.x * static_cast<int64_t>(blockDim.x)) {
    uint8_t byte = 0;
    const int64_t base = 8 * j;
    for (int b = 0; b < 8 && base + b < n; ++b) {
      const float v = x[base + b];
      byte |= static_cast<uint8_t>(!(v < 0.0f)) << b;
      acc += fabs(static_cast<double>(v));
    }
    packed[j] = byte;
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) block_sums[blockIdx.x] = partial[0];
}

__global__ void mean_kernel(const double* __restrict__ block_sums, int num_blocks, int64_t n,
                            float* __restrict__ scale) {
  __shared__ double partial[kThreads];
  double acc = 0.0;
  for (int i = threadIdx.x; i < num_blocks; i += blockDim.x) acc += block_sums[i];
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) scale[0] = n > 0 ? static_cast<float>(partial[0] / n) : 0.0f;
}

template <typename scalar_t>
__global__ void unpack_kernel(const uint8_t* __restrict__ packed,
                              const scalar_t* __restrict__ scale, int64_t n,
                              scalar_t* __restrict__ out) {
  const scalar_t s = scale[0];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += gridDim.x * static_cast<int64_t>(blockDim.x)) {
    out[i] = ((packed[i >> 3] >> (i & 7)) & 1) ? s : -s;
  }
}

std::tuple<at::Tensor, at::Tensor> sign_pack_cuda(const at::Tensor& x_in) {
  check_cuda(x_in, "sign_pack");
  TORCH_CHECK(x_in.is_floating_point(), "repro500::sign_pack needs a floating tensor, got ",
              x_in.scalar_type());
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous().view({-1}).to(at::kFloat);
  const int64_t n = x.numel();
  const int64_t num_bytes = (n + 7) / 8;
  at::Tensor packed = at::empty({num_bytes}, x.options().dtype(at::kByte));
  at::Tensor scale = at::empty({1}, x.options().dtype(at::kFloat));
  const int blocks = blocks_for(num_bytes);
  at::Tensor block_sums = at::empty({blocks}, x.options().dtype(at::kDouble));
  auto stream = current_stream();
  pack_kernel<<<blocks, kThreads, 0, stream>>>(x.const_data_ptr<float>(), n, num_bytes,
                                               packed.mutable_data_ptr<uint8_t>(),
                                               block_sums.mutable_data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  mean_kernel<<<1, kThreads, 0, stream>>>(block_sums.const_data_ptr<double>(), blocks, n,
                                          scale.mutable_data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {packed, scale};
}

at::Tensor sign_unpack_cuda(const at::Tensor& packed_in, const at::Tensor& scale_in,
                            int64_t numel) {
  check_cuda(packed_in, "sign_unpack");
  check_cuda(scale_in, "sign_unpack");
  TORCH_CHECK(packed_in.scalar_type() == at::kByte,
              "repro500::sign_unpack needs uint8 packed signs, got ", packed_in.scalar_type());
  TORCH_CHECK(scale_in.numel() == 1, "repro500::sign_unpack needs a one-element scale, got ",
              scale_in.numel());
  TORCH_CHECK(numel >= 0 && packed_in.numel() == (numel + 7) / 8, "repro500::sign_unpack: ", numel,
              " elements need ", (numel + 7) / 8, " bytes, got ", packed_in.numel());
  const c10::cuda::CUDAGuard guard(packed_in.device());
  const at::Tensor packed = packed_in.contiguous();
  const at::Tensor scale = scale_in.contiguous();
  at::Tensor out = at::empty({numel}, scale.options());
  AT_DISPATCH_FLOATING_TYPES(scale.scalar_type(), "sign_unpack_cuda", [&] {
    unpack_kernel<scalar_t><<<blocks_for(numel), kThreads, 0, current_stream()>>>(
        packed.const_data_ptr<uint8_t>(), scale.const_data_ptr<scalar_t>(), numel,
        out.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(repro500, CUDA, m) {
  m.impl("sign_pack", &sign_pack_cuda);
  m.impl("sign_unpack", &sign_unpack_cuda);
}

}  // namespace repro500
