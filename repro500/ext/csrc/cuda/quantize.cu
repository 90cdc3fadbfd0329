// Stochastic quantization (QSGD / TernGrad), CUDA kernels: one block per bucket reduces the
// bucket's norm, then quantizes it with the counter-based RNG of csrc/rng.h, so the draws
// are the same as on the CPU for the same seed.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "cuda_common.h"
#include "rng.h"

namespace repro500 {
namespace {

__global__ void quantize_buckets(const float* __restrict__ x, int64_t n, int64_t bucket_size,
                                 int levels, bool max_norm, uint64_t seed_key,
                                 int8_t* __restrict__ codes, float* __restrict__ scales) {
  __shared__ double partial[kThreads];
  __shared__ float scale_shared;
  const int64_t b = blockIdx.x;
  const int64_t lo = b * bucket_size;
  const int64_t hi = min(n, lo + bucket_size);
  double acc = 0.0;
  float m = 0.0f;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const float a = fabsf(x[i]);
    if (max_norm) {
      m = (a > m || isnan(a)) ? a : m;
    } else {
      acc += static_cast<double>(x[i]) * x[i];
    }
  }
  partial[threadIdx.x] = max_norm ? static_cast<double>(m) : acc;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) {
      const double other = partial[threadIdx.x + stride];
      if (max_norm) {
        const double mine = partial[threadIdx.x];
        partial[threadIdx.x] = (other > mine || isnan(other)) ? other : mine;
      } else {
        partial[threadIdx.x] += other;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    scale_shared = max_norm ? static_cast<float>(partial[0]) : static_cast<float>(sqrt(partial[0]));
    scales[b] = scale_shared;
  }
  __syncthreads();
  const float scale = scale_shared;
  const float factor = static_cast<float>(levels) / scale;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    int q = 0;
    if (scale != 0.0f)
      q = stochastic_level(fabsf(x[i]), factor, levels,
                           uniform01(seed_key, static_cast<uint64_t>(i)));
    codes[i] = static_cast<int8_t>(x[i] < 0.0f ? -q : q);
  }
}

template <typename scalar_t>
__global__ void dequantize_kernel(const int8_t* __restrict__ codes,
                                  const scalar_t* __restrict__ scales, int64_t n,
                                  int64_t bucket_size, scalar_t levels,
                                  scalar_t* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += gridDim.x * static_cast<int64_t>(blockDim.x)) {
    out[i] = static_cast<scalar_t>(codes[i]) * scales[i / bucket_size] / levels;
  }
}

void check_args(int64_t levels, int64_t bucket_size) {
  TORCH_CHECK(levels >= 1 && levels <= 127,
              "repro500: levels must be in [1, 127] (int8 codes), got ", levels);
  TORCH_CHECK(bucket_size >= 1, "repro500: bucket_size must be positive, got ", bucket_size);
}

std::tuple<at::Tensor, at::Tensor> stochastic_quantize_cuda(const at::Tensor& x_in, int64_t levels,
                                                            int64_t bucket_size, bool max_norm,
                                                            int64_t seed) {
  check_cuda(x_in, "stochastic_quantize");
  TORCH_CHECK(x_in.is_floating_point(),
              "repro500::stochastic_quantize needs a floating tensor, got ", x_in.scalar_type());
  check_args(levels, bucket_size);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous().view({-1}).to(at::kFloat);
  const int64_t n = x.numel();
  const int64_t num_buckets = (n + bucket_size - 1) / bucket_size;
  at::Tensor codes = at::empty({n}, x.options().dtype(at::kChar));
  at::Tensor scales = at::empty({num_buckets}, x.options().dtype(at::kFloat));
  if (num_buckets > 0) {
    quantize_buckets<<<num_buckets, kThreads, 0, current_stream()>>>(
        x.const_data_ptr<float>(), n, bucket_size, static_cast<int>(levels), max_norm,
        mix64(static_cast<uint64_t>(seed)), codes.mutable_data_ptr<int8_t>(),
        scales.mutable_data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {codes, scales};
}

at::Tensor stochastic_dequantize_cuda(const at::Tensor& codes_in, const at::Tensor& scales_in,
                                      int64_t levels, int64_t bucket_size) {
  check_cuda(codes_in, "stochastic_dequantize");
  check_cuda(scales_in, "stochastic_dequantize");
  TORCH_CHECK(codes_in.scalar_type() == at::kChar,
              "repro500::stochastic_dequantize needs int8 codes, got ", codes_in.scalar_type());
  TORCH_CHECK(scales_in.scalar_type() == at::kFloat || scales_in.scalar_type() == at::kDouble,
              "repro500::stochastic_dequantize needs float32 or float64 scales, got ",
              scales_in.scalar_type());
  check_args(levels, bucket_size);
  const c10::cuda::CUDAGuard guard(codes_in.device());
  const at::Tensor codes = codes_in.contiguous();
  const at::Tensor scales = scales_in.contiguous();
  const int64_t n = codes.numel();
  TORCH_CHECK(scales.numel() == (n + bucket_size - 1) / bucket_size,
              "repro500::stochastic_dequantize: ", n, " codes in buckets of ", bucket_size,
              " need ", (n + bucket_size - 1) / bucket_size, " scales, got ", scales.numel());
  at::Tensor out = at::empty(codes.sizes(), scales.options());
  AT_DISPATCH_FLOATING_TYPES(scales.scalar_type(), "stochastic_dequantize_cuda", [&] {
    dequantize_kernel<scalar_t><<<blocks_for(n), kThreads, 0, current_stream()>>>(
        codes.const_data_ptr<int8_t>(), scales.const_data_ptr<scalar_t>(), n, bucket_size,
        static_cast<scalar_t>(levels), out.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(repro500, CUDA, m) {
  m.impl("stochastic_quantize", &stochastic_quantize_cuda);
  m.impl("stochastic_dequantize", &stochastic_dequantize_cuda);
}

}  // namespace repro500
