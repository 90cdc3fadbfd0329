// Elias-Fano coding of ascending positions (top-k's indices on the wire), CPU kernels.
//
// The layout and the pure-PyTorch reference are in repro500/ext/indexcode.py: with
// L = floor(log2(n/k)), k fields of L low bits (little-endian bit order), then, from the
// next byte boundary, a bit array of ((n-1) >> L) + k bits with bit (p_i >> L) + i set.
// The size depends on (n, k) only.  The torch reference needs ~20 whole-tensor passes
// (and nonzero); here encoding is one pass over the positions and decoding one over the
// code, about 1 ns per position.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstring>
#include <limits>

namespace repro500 {
namespace {

struct Layout {
  int low = 0;             // L
  int64_t low_bytes = 0;   // ceil(k*L / 8)
  int64_t high_bits = 0;   // ((n-1) >> L) + k
  int64_t total_bytes() const { return low_bytes + (high_bits + 7) / 8; }
};

Layout layout_of(int64_t n, int64_t k) {
  TORCH_CHECK(n >= 0 && n <= std::numeric_limits<int32_t>::max(),
              "repro500 positions code: n must be in [0, 2^31 - 1] (int32 indices), got ", n);
  TORCH_CHECK(k >= 0 && k <= n, "repro500 positions code: k must be in [0, ", n, "], got ", k);
  Layout out;
  if (k == 0) return out;
  for (int64_t q = n / k; q > 1; q >>= 1) ++out.low;
  out.low_bytes = (k * out.low + 7) / 8;
  out.high_bits = ((n - 1) >> out.low) + k;
  return out;
}

template <typename index_t>
void encode_typed(const index_t* p, int64_t k, int64_t n, const Layout& lay, uint8_t* out) {
  const uint64_t low_mask = (uint64_t{1} << lay.low) - 1;
  uint64_t acc = 0;  // bits not yet written, least significant first
  int filled = 0;
  int64_t byte = 0;
  int64_t previous = -1;
  uint8_t* high = out + lay.low_bytes;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t pos = static_cast<int64_t>(p[i]);
    TORCH_CHECK(pos > previous && pos < n, "repro500::positions_encode: positions must be ",
                "ascending, distinct and in [0, ", n, "); position ", i, " is ", pos,
                " after ", previous);
    previous = pos;
    acc |= (static_cast<uint64_t>(pos) & low_mask) << filled;
    filled += lay.low;
    while (filled >= 8) {
      out[byte++] = static_cast<uint8_t>(acc);
      acc >>= 8;
      filled -= 8;
    }
    const int64_t bit = (pos >> lay.low) + i;
    high[bit >> 3] |= static_cast<uint8_t>(1u << (bit & 7));
  }
  if (filled > 0) out[byte] = static_cast<uint8_t>(acc);
}

at::Tensor positions_encode_cpu(const at::Tensor& positions_in, int64_t n) {
  TORCH_CHECK(positions_in.device().is_cpu(), "repro500::positions_encode (CPU) got a ",
              positions_in.device(), " tensor");
  TORCH_CHECK(positions_in.scalar_type() == at::kInt || positions_in.scalar_type() == at::kLong,
              "repro500::positions_encode needs int32 or int64 positions, got ",
              positions_in.scalar_type());
  const at::Tensor positions = positions_in.contiguous().view({-1});
  const int64_t k = positions.numel();
  const Layout lay = layout_of(n, k);
  at::Tensor code = at::empty({lay.total_bytes()}, positions.options().dtype(at::kByte));
  uint8_t* out = code.mutable_data_ptr<uint8_t>();
  // Zeroed here, not by at::zeros: a few hundred kB do not pay for waking the thread pool.
  std::memset(out, 0, static_cast<size_t>(lay.total_bytes()));
  if (positions.scalar_type() == at::kInt) {
    encode_typed(positions.const_data_ptr<int32_t>(), k, n, lay, out);
  } else {
    encode_typed(positions.const_data_ptr<int64_t>(), k, n, lay, out);
  }
  return code;
}

at::Tensor positions_decode_cpu(const at::Tensor& code_in, int64_t n, int64_t k) {
  TORCH_CHECK(code_in.device().is_cpu(), "repro500::positions_decode (CPU) got a ",
              code_in.device(), " tensor");
  TORCH_CHECK(code_in.scalar_type() == at::kByte, "repro500::positions_decode needs uint8, got ",
              code_in.scalar_type());
  const Layout lay = layout_of(n, k);
  TORCH_CHECK(code_in.numel() == lay.total_bytes(), "repro500::positions_decode: a code of ", k,
              " positions out of ", n, " has ", lay.total_bytes(), " bytes, got ",
              code_in.numel());
  const at::Tensor code = code_in.contiguous();
  const uint8_t* in = code.const_data_ptr<uint8_t>();
  at::Tensor positions = at::empty({k}, code.options().dtype(at::kLong));
  int64_t* out = positions.mutable_data_ptr<int64_t>();

  // Low part of position j: bits [j*L, j*L + L) of the low section, read with one 8-byte
  // load at its first byte (L + 7 <= 37 bits fit) while 8 bytes remain, else byte by byte.
  const uint64_t low_mask = (uint64_t{1} << lay.low) - 1;
  const auto low_field = [&](int64_t j) -> int64_t {
    if (lay.low == 0) return 0;
    const int64_t start = j * lay.low;
    const int64_t first = start >> 3;
    uint64_t bytes = 0;
    if (first + 8 <= lay.low_bytes) {
      std::memcpy(&bytes, in + first, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
      bytes = __builtin_bswap64(bytes);
#endif
    } else {
      for (int64_t b = 0; first + b < lay.low_bytes; ++b) {
        bytes |= static_cast<uint64_t>(in[first + b]) << (8 * b);
      }
    }
    return static_cast<int64_t>((bytes >> (start & 7)) & low_mask);
  };

  // High parts: the i-th set bit of the high section is at (p_i >> L) + i.  Read 8 bytes at
  // a time (little-endian words, so bit order matches); each position is written once.
  const uint8_t* high = in + lay.low_bytes;
  const int64_t high_bytes = (lay.high_bits + 7) / 8;
  int64_t i = 0;
  for (int64_t base = 0; base < high_bytes; base += 8) {
    uint64_t word = 0;
    if (base + 8 <= high_bytes) {
      std::memcpy(&word, high + base, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
      word = __builtin_bswap64(word);
#endif
    } else {
      for (int64_t b = 0; base + b < high_bytes; ++b) {
        word |= static_cast<uint64_t>(high[base + b]) << (8 * b);
      }
    }
    TORCH_CHECK(i + __builtin_popcountll(word) <= k, "repro500::positions_decode: the code has ",
                "more than ", k, " positions");
    while (word) {
      const int64_t bit = 8 * base + __builtin_ctzll(word);
      word &= word - 1;
      out[i] = ((bit - i) << lay.low) | low_field(i);
      ++i;
    }
  }
  TORCH_CHECK(i == k, "repro500::positions_decode: the code has ", i, " positions, not ", k);
  return positions;
}

}  // namespace

TORCH_LIBRARY_IMPL(repro500, CPU, m) {
  m.impl("positions_encode", &positions_encode_cpu);
  m.impl("positions_decode", &positions_decode_cpu);
}

}  // namespace repro500
