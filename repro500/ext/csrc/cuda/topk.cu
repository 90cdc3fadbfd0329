// Top-k by magnitude through a sampled threshold, CUDA kernel: the same algorithm and the
// same exact result as csrc/topk.cpp (k largest |x|, ties to the lower index, index order).
// Sampling, counting and compaction are kernels; ordering the ~1.2k candidates uses ATen's
// sort (radix sort), which is as fast as anything hand-written for that size.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

#include "cuda_common.h"

namespace repro500 {
namespace {

__device__ __forceinline__ int64_t magnitude_key(float v) {
  return static_cast<int64_t>(__float_as_uint(v) & 0x7fffffffu);
}
__device__ __forceinline__ int64_t magnitude_key(double v) {
  return __double_as_longlong(v) & 0x7fffffffffffffffll;
}
__device__ __forceinline__ int64_t magnitude_key(c10::Half v) {
  return magnitude_key(static_cast<float>(v));
}
__device__ __forceinline__ int64_t magnitude_key(c10::BFloat16 v) {
  return magnitude_key(static_cast<float>(v));
}

template <typename scalar_t>
__global__ void sample_keys(const scalar_t* __restrict__ x, int64_t n, int64_t s,
                            int64_t* __restrict__ out) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < s;
       j += gridDim.x * static_cast<int64_t>(blockDim.x)) {
    out[j] = magnitude_key(x[j * n / s]);
  }
}

template <typename scalar_t>
__global__ void collect(const scalar_t* __restrict__ x, int64_t n, int64_t threshold,
                        int64_t capacity, unsigned long long* __restrict__ count,
                        int64_t* __restrict__ keys, int32_t* __restrict__ index) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += gridDim.x * static_cast<int64_t>(blockDim.x)) {
    const int64_t key = magnitude_key(x[i]);
    if (key >= threshold) {
      const unsigned long long pos = atomicAdd(count, 1ull);
      if (static_cast<int64_t>(pos) < capacity) {
        keys[pos] = key;
        index[pos] = static_cast<int32_t>(i);
      }
    }
  }
}

constexpr int64_t kMinSample = 2048;
constexpr double kSampleHits = 512.0;
constexpr double kMarginSigmas = 4.0;
constexpr int kSampledAttempts = 3;

template <typename scalar_t>
std::tuple<at::Tensor, at::Tensor> topk_threshold_typed(const at::Tensor& x, int64_t k) {
  const int64_t n = x.numel();
  const scalar_t* data = x.const_data_ptr<scalar_t>();
  auto stream = current_stream();
  const auto long_opts = x.options().dtype(at::kLong);

  const int64_t wanted = static_cast<int64_t>(std::ceil(kSampleHits * static_cast<double>(n) / k));
  const int64_t sample_size = std::min(n, std::max(kMinSample, wanted));
  const bool sampled = sample_size * 4 <= n;
  at::Tensor sorted_sample;
  if (sampled) {
    at::Tensor sample = at::empty({sample_size}, long_opts);
    sample_keys<scalar_t><<<blocks_for(sample_size), kThreads, 0, stream>>>(
        data, n, sample_size, sample.mutable_data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    sorted_sample = std::get<0>(at::sort(sample, 0, /*descending=*/true));
  }
  const double expected = static_cast<double>(k) * sample_size / n;

  at::Tensor counter = at::zeros({1}, long_opts);
  at::Tensor keys, index;
  int64_t count = 0;
  int64_t capacity = std::min<int64_t>(n, static_cast<int64_t>(1.5 * k) + 1024);
  for (int attempt = 0;; ++attempt) {
    int64_t threshold = 0;
    if (sampled && attempt < kSampledAttempts) {
      const double margin = kMarginSigmas * std::pow(4.0, attempt);
      const int64_t rank =
          static_cast<int64_t>(std::ceil(expected + margin * std::sqrt(expected))) + 1;
      if (rank < sample_size) threshold = sorted_sample[rank - 1].item<int64_t>();
    }
    for (;;) {  // at most twice: the second time with the exact capacity
      counter.zero_();
      keys = at::empty({capacity}, long_opts);
      index = at::empty({capacity}, x.options().dtype(at::kInt));
      collect<scalar_t><<<blocks_for(n), kThreads, 0, stream>>>(
          data, n, threshold, capacity,
          reinterpret_cast<unsigned long long*>(counter.mutable_data_ptr<int64_t>()),
          keys.mutable_data_ptr<int64_t>(), index.mutable_data_ptr<int32_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      count = counter.item<int64_t>();
      if (count <= capacity) break;
      capacity = count;
    }
    if (count >= k || threshold == 0) break;
  }
  keys = keys.narrow(0, 0, count);
  index = index.narrow(0, 0, count);
  // Order candidates by (key descending, index ascending): sort by index, then a stable
  // sort by key keeps equal keys in index order.  The first k are the answer.
  auto by_index = at::sort(index, 0, /*descending=*/false);
  at::Tensor index_sorted = std::get<0>(by_index);
  at::Tensor keys_by_index = at::index_select(keys, 0, std::get<1>(by_index));
  auto by_key = at::sort(keys_by_index, /*stable=*/true, 0, /*descending=*/true);
  at::Tensor chosen = at::index_select(index_sorted, 0, std::get<1>(by_key).narrow(0, 0, k));
  at::Tensor indices = std::get<0>(at::sort(chosen, 0, /*descending=*/false));
  at::Tensor values = at::index_select(x, 0, indices);
  return {values, indices};
}

std::tuple<at::Tensor, at::Tensor> topk_threshold_cuda(const at::Tensor& x_in, int64_t k) {
  check_cuda(x_in, "topk_threshold");
  TORCH_CHECK(x_in.is_floating_point(), "repro500::topk_threshold needs a floating tensor, got ",
              x_in.scalar_type());
  const int64_t n = x_in.numel();
  TORCH_CHECK(n <= std::numeric_limits<int32_t>::max(),
              "repro500::topk_threshold: int32 indices hold at most 2^31-1 elements, got ", n);
  TORCH_CHECK(k >= 0 && k <= n, "repro500::topk_threshold: k must be in [0, ", n, "], got ", k);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous().view({-1});
  if (k == 0) return {at::empty({0}, x.options()), at::empty({0}, x.options().dtype(at::kInt))};
  std::tuple<at::Tensor, at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "topk_threshold_cuda",
                                  [&] { out = topk_threshold_typed<scalar_t>(x, k); });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(repro500, CUDA, m) { m.impl("topk_threshold", &topk_threshold_cuda); }

}  // namespace repro500
