"""Gradient compression and custom operators (docs/compression.md).

compressors  the Compressor classes and ``get(spec)``      memory       error feedback
communicator compress -> collective -> decompress, bytes     ddp_hook     DDP adapter
horovod      Horovod adapter (optional dependency)           ops          operator entry points
reference    pure-PyTorch references of the operators        build        JIT compile + cache
gradcheck    analytic vs numerical gradients (float64)      specs        names, parameters, resolve(spec)
indexcode    Elias-Fano code of top-k's positions (wire)

Nothing here imports torch at package import time; each module imports what it needs.
"""
