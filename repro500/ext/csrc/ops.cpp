// The schema of every repro500 operator.  Kernels are registered per device in the other
// files (TORCH_LIBRARY_IMPL(repro500, CPU, ...) here, CUDA ones in cuda/*.cu), so one
// Python call dispatches to whichever device the tensors live on.
#include <torch/library.h>

TORCH_LIBRARY(repro500, m) {
  // Exactly k elements of largest |x|, ties at the k-th magnitude broken by lower index;
  // indices (int32) ascending, values are x at those indices (signed).
  m.def("topk_threshold(Tensor x, int k) -> (Tensor values, Tensor indices)");
  // QSGD-style stochastic rounding to `levels` magnitudes per bucket; codes int8 in
  // [-levels, levels], one float32 scale per bucket (L2 norm, or max |x| when max_norm).
  // The random draw of element i is a pure function of (seed, i): counter-based RNG.
  m.def(
      "stochastic_quantize(Tensor x, int levels, int bucket_size, bool max_norm, int seed)"
      " -> (Tensor codes, Tensor scales)");
  // codes * scale(bucket) / levels, in the dtype of `scales`.
  m.def(
      "stochastic_dequantize(Tensor codes, Tensor scales, int levels, int bucket_size)"
      " -> Tensor");
  // 8 signs per uint8 (bit b of byte j is element 8j+b; 1 = not negative) and
  // scale = mean |x| as a float32 tensor of shape (1,).
  m.def("sign_pack(Tensor x) -> (Tensor packed, Tensor scale)");
  // +scale where the bit is 1, -scale where it is 0, numel elements, dtype of `scale`.
  m.def("sign_unpack(Tensor packed, Tensor scale, int numel) -> Tensor");
  // Elias-Fano code of ascending, distinct positions in [0, n) (layout: ext/indexcode.py):
  // uint8, a size that depends on (n, k) only; decode returns the k positions as int64.
  m.def("positions_encode(Tensor positions, int n) -> Tensor");
  m.def("positions_decode(Tensor code, int n, int k) -> Tensor");
  // Error feedback: residual = compensated - decompressed, written into residual.
  m.def("ef_update_(Tensor(a!) residual, Tensor compensated, Tensor decompressed) -> ()");
}
