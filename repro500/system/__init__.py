"""Measuring the system under the model (docs/system.md).

Deep500's level 0 and HPC AI500's roofline view: what the machine itself can do, measured the
way a run is (a run directory, its manifest, MLflow, ``repro500 verify``), so that two systems
can be compared on it and a training run can be placed against it.

- ``ops``/``operators``/``kernels``/``allreduce``: operator benchmarks (time, FLOP/s, bytes/s)
  with their error against a float64 reference, decided against a stated tolerance;
- ``roofline``: the machine's ceilings (peak FLOP/s per dtype, memory bandwidth, the
  interconnect's alpha/beta), cross-checked against independent tools;
- ``inference``: latency distributions and throughput of a recipe's model;
- joules and utilization per epoch, arithmetic intensity and the share of each epoch spent
  waiting for data are the trainer's own records (``repro500.workloads.trainer.epochs``);
- ``dataio``: read throughput of repro500's data formats against a raw read of the same bytes;
- ``workload``/``recipes``: the ``system`` workload the runner runs, and the recipes the
  ``repro500 ops``, ``roofline`` and ``io`` commands write.

This module imports nothing heavy: the command line validates names against it before torch
is loaded.
"""

from __future__ import annotations

MEASURES = ("ops", "roofline", "inference", "io")
DTYPES = ("fp32", "bf16", "fp16")
# the operators of `repro500 ops`: torch's own, the engine's all-reduce, and repro500's C++/CUDA kernels
TORCH_OPERATORS = ("matmul", "conv2d", "conv2d_backward", "batchnorm")
KERNEL_OPERATORS = ("topk", "quantize", "dequantize", "sign_pack", "sign_unpack", "ef_update")
OPERATORS = (*TORCH_OPERATORS, "allreduce", *KERNEL_OPERATORS)
SIZE_PRESETS = ("tiny", "default", "large")
