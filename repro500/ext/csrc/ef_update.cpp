// Fused error-feedback update, CPU kernel: residual = compensated - decompressed, in place,
// one pass and no temporary (the unfused torch expression allocates the difference).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace repro500 {
namespace {

void ef_update_cpu(at::Tensor& residual, const at::Tensor& compensated_in,
                   const at::Tensor& decompressed_in) {
  TORCH_CHECK(residual.device().is_cpu() && compensated_in.device().is_cpu() &&
                  decompressed_in.device().is_cpu(),
              "repro500::ef_update_ (CPU) got a non-CPU tensor");
  TORCH_CHECK(residual.is_contiguous(), "repro500::ef_update_ needs a contiguous residual");
  TORCH_CHECK(
      residual.numel() == compensated_in.numel() && residual.numel() == decompressed_in.numel(),
      "repro500::ef_update_: sizes differ (", residual.numel(), ", ", compensated_in.numel(), ", ",
      decompressed_in.numel(), ")");
  TORCH_CHECK(residual.scalar_type() == compensated_in.scalar_type() &&
                  residual.scalar_type() == decompressed_in.scalar_type(),
              "repro500::ef_update_: all three tensors need the same dtype");
  const at::Tensor compensated = compensated_in.contiguous();
  const at::Tensor decompressed = decompressed_in.contiguous();
  const int64_t n = residual.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, residual.scalar_type(), "ef_update_",
                                  [&] {
                                    scalar_t* r = residual.mutable_data_ptr<scalar_t>();
                                    const scalar_t* c = compensated.const_data_ptr<scalar_t>();
                                    const scalar_t* d = decompressed.const_data_ptr<scalar_t>();
                                    at::parallel_for(0, n, 32768, [&](int64_t begin, int64_t end) {
                                      for (int64_t i = begin; i < end; ++i) r[i] = c[i] - d[i];
                                    });
                                  });
}

}  // namespace

TORCH_LIBRARY_IMPL(repro500, CPU, m) { m.impl("ef_update_", &ef_update_cpu); }

}  // namespace repro500
