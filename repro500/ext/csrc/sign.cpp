// 1-bit sign compression with a scale (EF-signSGD), CPU kernels.
//
// Layout: bit b (least significant first) of byte j is element 8j+b, 1 = not negative
// (NaN counts as not negative); the padding bits of the last byte are 0.
// scale = mean |x|, accumulated in double over fixed chunks in index order, so it does not
// depend on the number of threads.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

namespace repro500 {
namespace {

constexpr int64_t kSumChunk = 1 << 16;

std::tuple<at::Tensor, at::Tensor> sign_pack_cpu(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.device().is_cpu(), "repro500::sign_pack (CPU) got a ", x_in.device(), " tensor");
  TORCH_CHECK(x_in.is_floating_point(), "repro500::sign_pack needs a floating tensor, got ",
              x_in.scalar_type());
  const at::Tensor x = x_in.contiguous().view({-1}).to(at::kFloat);
  const int64_t n = x.numel();
  const int64_t num_bytes = (n + 7) / 8;
  at::Tensor packed = at::empty({num_bytes}, x.options().dtype(at::kByte));
  at::Tensor scale = at::empty({1}, x.options().dtype(at::kFloat));
  const float* data = x.const_data_ptr<float>();
  uint8_t* out = packed.mutable_data_ptr<uint8_t>();

  const int64_t num_chunks = (n + kSumChunk - 1) / kSumChunk;
  std::vector<double> partial(num_chunks, 0.0);
  at::parallel_for(0, num_chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t lo = c * kSumChunk, hi = std::min(n, lo + kSumChunk);
      double acc = 0.0;
      for (int64_t i = lo; i < hi; ++i) acc += std::fabs(data[i]);
      partial[c] = acc;
      // Bytes of this chunk (kSumChunk is a multiple of 8, so bytes never straddle chunks).
      for (int64_t j = lo / 8; j < (hi + 7) / 8; ++j) {
        uint8_t byte = 0;
        const int64_t base = 8 * j;
        const int64_t bits = std::min<int64_t>(8, n - base);
        for (int64_t b = 0; b < bits; ++b)
          byte |= static_cast<uint8_t>(!(data[base + b] < 0.0f)) << b;
        out[j] = byte;
      }
    }
  });
  double total = 0.0;
  for (const double p : partial) total += p;
  scale.mutable_data_ptr<float>()[0] = n > 0 ? static_cast<float>(total / n) : 0.0f;
  return {packed, scale};
}

at::Tensor sign_unpack_cpu(const at::Tensor& packed_in, const at::Tensor& scale, int64_t numel) {
  TORCH_CHECK(packed_in.device().is_cpu() && scale.device().is_cpu(),
              "repro500::sign_unpack (CPU) got a non-CPU tensor");
  TORCH_CHECK(packed_in.scalar_type() == at::kByte,
              "repro500::sign_unpack needs uint8 packed signs, got ", packed_in.scalar_type());
  TORCH_CHECK(scale.numel() == 1, "repro500::sign_unpack needs a one-element scale, got ",
              scale.numel());
  TORCH_CHECK(numel >= 0 && packed_in.numel() == (numel + 7) / 8, "repro500::sign_unpack: ", numel,
              " elements need ", (numel + 7) / 8, " bytes, got ", packed_in.numel());
  const at::Tensor packed = packed_in.contiguous();
  at::Tensor out = at::empty({numel}, scale.options());
  const uint8_t* p = packed.const_data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES(scale.scalar_type(), "sign_unpack", [&] {
    const scalar_t s = scale.item<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    const int64_t full_bytes = numel / 8;
    // Byte by byte, eight outputs each (a fixed-length inner loop the compiler unrolls).
    at::parallel_for(0, full_bytes, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        const uint8_t byte = p[j];
        scalar_t* out8 = o + 8 * j;
        for (int b = 0; b < 8; ++b) out8[b] = ((byte >> b) & 1) ? s : -s;
      }
    });
    for (int64_t i = 8 * full_bytes; i < numel; ++i) o[i] = ((p[i >> 3] >> (i & 7)) & 1) ? s : -s;
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(repro500, CPU, m) {
  m.impl("sign_pack", &sign_pack_cpu);
  m.impl("sign_unpack", &sign_unpack_cpu);
}

}  // namespace repro500
