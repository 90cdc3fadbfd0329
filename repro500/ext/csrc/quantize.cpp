// Stochastic quantization (QSGD; TernGrad is the levels = 1, max-norm case), CPU kernels.
//
// Per bucket of `bucket_size` elements: scale = ||x||_2 (or max |x|), l = |x|*(levels/scale),
// code = sign(x) * (floor(l) + Bernoulli(frac(l))), so E[code * scale / levels] = x.
// The Bernoulli draw of element i uses the counter-based RNG in rng.h, keyed by (seed, i):
// results do not depend on the number of threads or on the device.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "rng.h"

namespace repro500 {
namespace {

void check_quantize_args(int64_t levels, int64_t bucket_size) {
  TORCH_CHECK(levels >= 1 && levels <= 127,
              "repro500: levels must be in [1, 127] (int8 codes), got ", levels);
  TORCH_CHECK(bucket_size >= 1, "repro500: bucket_size must be positive, got ", bucket_size);
}

std::tuple<at::Tensor, at::Tensor> stochastic_quantize_cpu(const at::Tensor& x_in, int64_t levels,
                                                           int64_t bucket_size, bool max_norm,
                                                           int64_t seed) {
  TORCH_CHECK(x_in.device().is_cpu(), "repro500::stochastic_quantize (CPU) got a ", x_in.device(),
              " tensor");
  TORCH_CHECK(x_in.is_floating_point(),
              "repro500::stochastic_quantize needs a floating tensor, got ", x_in.scalar_type());
  check_quantize_args(levels, bucket_size);
  // Quantization works in float32 whatever the input: the codes carry ~7 bits anyway.
  const at::Tensor x = x_in.contiguous().view({-1}).to(at::kFloat);
  const int64_t n = x.numel();
  const int64_t num_buckets = (n + bucket_size - 1) / bucket_size;
  at::Tensor codes = at::empty({n}, x.options().dtype(at::kChar));
  at::Tensor scales = at::empty({num_buckets}, x.options().dtype(at::kFloat));
  const float* data = x.const_data_ptr<float>();
  int8_t* out_codes = codes.mutable_data_ptr<int8_t>();
  float* out_scales = scales.mutable_data_ptr<float>();
  const uint64_t seed_key = mix64(static_cast<uint64_t>(seed));
  const int lv = static_cast<int>(levels);
  const int64_t grain = std::max<int64_t>(1, 32768 / bucket_size);
  at::parallel_for(0, num_buckets, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lo = b * bucket_size, hi = std::min(n, lo + bucket_size);
      float scale;
      if (max_norm) {
        float m = 0.0f;
        for (int64_t i = lo; i < hi; ++i) {
          const float a = std::fabs(data[i]);
          m = (a > m || std::isnan(a)) ? a : m;  // NaN wins, so it reaches the scale
        }
        scale = m;
      } else {
        double acc = 0.0;  // double: a bucket's norm must not depend on summation order
        for (int64_t i = lo; i < hi; ++i) acc += static_cast<double>(data[i]) * data[i];
        scale = static_cast<float>(std::sqrt(acc));
      }
      out_scales[b] = scale;
      if (scale == 0.0f) {
        std::fill(out_codes + lo, out_codes + hi, static_cast<int8_t>(0));
        continue;
      }
      const float factor = static_cast<float>(lv) / scale;
      for (int64_t i = lo; i < hi; ++i) {
        const int q = stochastic_level(std::fabs(data[i]), factor, lv,
                                       uniform01(seed_key, static_cast<uint64_t>(i)));
        // Branch-free sign (a branch on random signs mispredicts half the time): -q if negative.
        const int negative = data[i] < 0.0f;
        out_codes[i] = static_cast<int8_t>((q ^ -negative) + negative);
      }
    }
  });
  return {codes, scales};
}

at::Tensor stochastic_dequantize_cpu(const at::Tensor& codes_in, const at::Tensor& scales_in,
                                     int64_t levels, int64_t bucket_size) {
  TORCH_CHECK(codes_in.device().is_cpu() && scales_in.device().is_cpu(),
              "repro500::stochastic_dequantize (CPU) got a non-CPU tensor");
  TORCH_CHECK(codes_in.scalar_type() == at::kChar,
              "repro500::stochastic_dequantize needs int8 codes, got ", codes_in.scalar_type());
  TORCH_CHECK(scales_in.scalar_type() == at::kFloat || scales_in.scalar_type() == at::kDouble,
              "repro500::stochastic_dequantize needs float32 or float64 scales, got ",
              scales_in.scalar_type());
  check_quantize_args(levels, bucket_size);
  const at::Tensor codes = codes_in.contiguous();
  const at::Tensor scales = scales_in.contiguous();
  const int64_t n = codes.numel();
  TORCH_CHECK(scales.numel() == (n + bucket_size - 1) / bucket_size,
              "repro500::stochastic_dequantize: ", n, " codes in buckets of ", bucket_size,
              " need ", (n + bucket_size - 1) / bucket_size, " scales, got ", scales.numel());
  at::Tensor out = at::empty(codes.sizes(), scales.options());
  const int8_t* c = codes.const_data_ptr<int8_t>();
  const int64_t num_buckets = scales.numel();
  AT_DISPATCH_FLOATING_TYPES(scales.scalar_type(), "stochastic_dequantize", [&] {
    const scalar_t* s = scales.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    const scalar_t lv = static_cast<scalar_t>(levels);
    // Bucket by bucket: no integer division per element, and the inner loop vectorizes.
    at::parallel_for(0, num_buckets, std::max<int64_t>(1, 32768 / bucket_size),
                     [&](int64_t b0, int64_t b1) {
                       for (int64_t b = b0; b < b1; ++b) {
                         const scalar_t scale = s[b];
                         const int64_t lo = b * bucket_size, hi = std::min(n, lo + bucket_size);
                         for (int64_t i = lo; i < hi; ++i)
                           o[i] = static_cast<scalar_t>(c[i]) * scale / lv;
                       }
                     });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(repro500, CPU, m) {
  m.impl("stochastic_quantize", &stochastic_quantize_cpu);
  m.impl("stochastic_dequantize", &stochastic_dequantize_cpu);
}

}  // namespace repro500
