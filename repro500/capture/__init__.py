"""Provenance capture: one small registered function per facet, joined into a manifest.

``code`` (git), ``environment`` (Python, OS, packages, torch build, env vars),
``toolchain`` (compilers, CUDA toolkit), ``seeds``,
``data`` (DVC-compatible digests) and ``hardware`` (CPU, NUMA, cgroups, GPUs, links, NICs);
``runtime`` (torch's live state) on request.  Start at :mod:`repro500.capture.manifest`.
Nothing here imports torch at import time.
"""
