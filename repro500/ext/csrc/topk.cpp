// Top-k by magnitude through a sampled threshold (the DGC idea), CPU kernel.
//
// torch.topk(|g|, k) partially sorts the whole tensor; for k = 1% of 25.6M elements that
// costs ~100x a read of the tensor.  Here: (1) estimate the threshold from a strided sample,
// (2) one fused pass collects every element at or above it (about 1.2k candidates),
// (3) an exact selection among the candidates returns exactly k.  If the estimate was too
// high (fewer than k candidates) the threshold is lowered and the pass repeated, ending at
// threshold 0, which takes every element.  The result is exact and deterministic:
// the k largest |x|, ties at the k-th magnitude going to the lowest indices, in index order.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

namespace repro500 {
namespace {

// The IEEE bits of |v| read as an unsigned integer order exactly like |v| (and put NaN above
// +inf, as torch.sort does), so every comparison below is an integer comparison.
inline uint32_t magnitude_key(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits & 0x7fffffffu;
}
inline uint64_t magnitude_key(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits & 0x7fffffffffffffffull;
}
inline uint32_t magnitude_key(c10::Half v) { return magnitude_key(static_cast<float>(v)); }
inline uint32_t magnitude_key(c10::BFloat16 v) { return magnitude_key(static_cast<float>(v)); }

constexpr int64_t kChunk = 1 << 16;    // elements per candidate list (parallel unit)
constexpr int64_t kMinSample = 2048;   // sample at least this many elements
constexpr double kSampleHits = 512.0;  // aim for this many sampled elements above the threshold
constexpr double kMarginSigmas = 4.0;  // lower the threshold by this many sampling sigmas
constexpr int kSampledAttempts = 3;    // then fall back to threshold 0 (every element)

template <typename scalar_t>
std::tuple<at::Tensor, at::Tensor> topk_threshold_typed(const at::Tensor& x, int64_t k) {
  using key_t = decltype(magnitude_key(scalar_t{}));
  const scalar_t* data = x.const_data_ptr<scalar_t>();
  const int64_t n = x.numel();

  // (1) Strided sample; its r-th largest key is the threshold, r chosen so that the
  // expected number of elements above it is k plus a margin of a few sampling sigmas.
  const int64_t wanted = static_cast<int64_t>(std::ceil(kSampleHits * static_cast<double>(n) / k));
  const int64_t sample_size = std::min(n, std::max(kMinSample, wanted));
  const bool sampled = sample_size * 4 <= n;  // else selecting over everything is as cheap
  std::vector<key_t> sample;
  if (sampled) {
    sample.resize(sample_size);
    at::parallel_for(0, sample_size, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) sample[j] = magnitude_key(data[j * n / sample_size]);
    });
  }
  const double expected = static_cast<double>(k) * sample_size / n;

  const int64_t num_chunks = (n + kChunk - 1) / kChunk;
  std::vector<std::vector<key_t>> chunk_keys(num_chunks);
  std::vector<std::vector<int32_t>> chunk_index(num_chunks);
  int64_t count = 0;
  for (int attempt = 0;; ++attempt) {
    key_t threshold = 0;
    if (sampled && attempt < kSampledAttempts) {
      const double margin = kMarginSigmas * std::pow(4.0, attempt);
      const int64_t rank =
          static_cast<int64_t>(std::ceil(expected + margin * std::sqrt(expected))) + 1;
      if (rank < sample_size) {
        std::nth_element(sample.begin(), sample.begin() + (rank - 1), sample.end(),
                         std::greater<key_t>());
        threshold = sample[rank - 1];
      }
    }
    // (2) One pass: every element whose key reaches the threshold, per chunk in index order.
    at::parallel_for(0, num_chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        auto& keys = chunk_keys[c];
        auto& index = chunk_index[c];
        keys.clear();
        index.clear();
        const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
        int64_t i = lo;
        // Blocks of 16 are screened branch-free first (vectorizes); most have no candidate.
        for (; i + 16 <= hi; i += 16) {
          bool any = false;
          for (int j = 0; j < 16; ++j) any |= magnitude_key(data[i + j]) >= threshold;
          if (!any) continue;
          for (int j = 0; j < 16; ++j) {
            const key_t key = magnitude_key(data[i + j]);
            if (key >= threshold) {
              keys.push_back(key);
              index.push_back(static_cast<int32_t>(i + j));
            }
          }
        }
        for (; i < hi; ++i) {
          const key_t key = magnitude_key(data[i]);
          if (key >= threshold) {
            keys.push_back(key);
            index.push_back(static_cast<int32_t>(i));
          }
        }
      }
    });
    count = 0;
    for (const auto& keys : chunk_keys) count += static_cast<int64_t>(keys.size());
    if (count >= k || threshold == 0) break;
  }

  // (3) Exact selection: the k-th largest candidate key, then a pass in index order that
  // keeps keys above it and the first (lowest-index) ties at it until k are kept.
  std::vector<key_t> all_keys;
  all_keys.reserve(count);
  for (const auto& keys : chunk_keys) all_keys.insert(all_keys.end(), keys.begin(), keys.end());
  std::nth_element(all_keys.begin(), all_keys.begin() + (k - 1), all_keys.end(),
                   std::greater<key_t>());
  const key_t kth = all_keys[k - 1];
  int64_t above = 0;
  for (const key_t key : all_keys) above += key > kth;
  int64_t ties_left = k - above;

  at::Tensor values = at::empty({k}, x.options());
  at::Tensor indices = at::empty({k}, x.options().dtype(at::kInt));
  scalar_t* out_values = values.mutable_data_ptr<scalar_t>();
  int32_t* out_index = indices.mutable_data_ptr<int32_t>();
  int64_t pos = 0;
  for (int64_t c = 0; c < num_chunks && pos < k; ++c) {
    const auto& keys = chunk_keys[c];
    const auto& index = chunk_index[c];
    for (size_t j = 0; j < keys.size(); ++j) {
      const bool take = keys[j] > kth || (keys[j] == kth && ties_left > 0);
      if (!take) continue;
      if (keys[j] == kth) --ties_left;
      out_values[pos] = data[index[j]];
      out_index[pos] = index[j];
      ++pos;
    }
  }
  TORCH_CHECK(pos == k, "repro500::topk_threshold selected ", pos, " elements instead of ", k);
  return {values, indices};
}

std::tuple<at::Tensor, at::Tensor> topk_threshold_cpu(const at::Tensor& x_in, int64_t k) {
  TORCH_CHECK(x_in.device().is_cpu(), "repro500::topk_threshold (CPU) got a ", x_in.device(),
              " tensor");
  TORCH_CHECK(x_in.is_floating_point(), "repro500::topk_threshold needs a floating tensor, got ",
              x_in.scalar_type());
  const int64_t n = x_in.numel();
  TORCH_CHECK(n <= std::numeric_limits<int32_t>::max(),
              "repro500::topk_threshold: int32 indices hold at most 2^31-1 elements, got ", n);
  TORCH_CHECK(k >= 0 && k <= n, "repro500::topk_threshold: k must be in [0, ", n, "], got ", k);
  const at::Tensor x = x_in.contiguous().view({-1});
  if (k == 0) {
    return {at::empty({0}, x.options()), at::empty({0}, x.options().dtype(at::kInt))};
  }
  std::tuple<at::Tensor, at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "topk_threshold",
                                  [&] { out = topk_threshold_typed<scalar_t>(x, k); });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(repro500, CPU, m) { m.impl("topk_threshold", &topk_threshold_cpu); }

}  // namespace repro500
