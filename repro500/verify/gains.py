"""What a variant gains against its reference: throughput and Valid FLOPS side by side.

HPC AI500's question about mixed precision (its Fig. 1) is two answers at once: whether the
lower precision keeps fp32's quality (the equivalence test decides that) and how much faster it
is, in samples per second and in Valid FLOPS (FLOP/s discounted by the quality reached).  This
module gives the second: the ratio of the run's mean to the reference's, with the training
variant each side ran (precision, micro-batching) so the figure says what it compares.
"""

from __future__ import annotations

import statistics
from typing import Any

from repro500.statuses import REPEAT_COMPLETED

FIGURES = ("throughput_samples_per_s", "valid_flops")
VARIANT_KEYS = ("precision", "micro_batch_size", "batch_size", "sync")


def _means(repeats: dict[Any, dict[str, Any]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name in FIGURES:
        values = [float(v) for doc in repeats.values() if doc.get("status") == REPEAT_COMPLETED
                  for v in [(doc.get("metrics") or {}).get(name)] if isinstance(v, (int, float))]
        out[name] = statistics.fmean(values) if values else None
    return out


def _variant(repeats: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    for doc in repeats.values():
        if doc.get("training"):
            return {k: doc["training"].get(k) for k in VARIANT_KEYS}
    # before repro500 recorded it: the only variant there was
    return {"precision": "fp32", "micro_batch_size": None, "batch_size": None, "sync": {"mode": "allreduce", "every": 1}}


def sync_text(sync: Any) -> str:
    """``{mode: average, every: 8}`` as 'average every 8 step(s)'; gradients all-reduced otherwise."""
    if not isinstance(sync, dict) or sync.get("mode", "allreduce") == "allreduce":
        return "all-reduce of gradients"
    return f"{sync.get('mode')} every {sync.get('every')} step(s)"


def compare_gains(run_repeats: dict[Any, dict[str, Any]], ref_repeats: dict[Any, dict[str, Any]]) -> dict[str, Any] | None:
    """Means and their ratio (run / reference) per figure; None when neither side has them."""
    mine, theirs = _means(run_repeats), _means(ref_repeats)
    figures = {name: {"run": mine[name], "reference": theirs[name],
                      "ratio": mine[name] / theirs[name] if mine[name] and theirs[name] else None}
               for name in FIGURES if mine[name] is not None or theirs[name] is not None}
    if not figures:
        return None
    return {"figures": figures, "run_variant": _variant(run_repeats), "reference_variant": _variant(ref_repeats)}


def describe(gains: dict[str, Any]) -> str:
    """One line: 'throughput 1.83x (353 vs 193 samples/s), Valid FLOPS 0.91x; precision amp-bf16 vs fp32'."""
    parts = []
    labels = {"throughput_samples_per_s": ("throughput", "samples/s"), "valid_flops": ("Valid FLOPS", "FLOP/s")}
    for name, fig in gains["figures"].items():
        label, unit = labels[name]
        if fig["ratio"] is None:
            parts.append(f"{label} not comparable")
        else:
            parts.append(f"{label} {fig['ratio']:.3g}x ({fig['run']:.4g} vs {fig['reference']:.4g} {unit})")
    a, b = gains["run_variant"], gains["reference_variant"]
    shown = {k: (sync_text if k == "sync" else str) for k in VARIANT_KEYS}
    shown["micro_batch_size"] = lambda v: "none (whole batches)" if v is None else str(v)
    # a missing batch size is one that was not recorded; a missing micro-batch size is the whole batch
    changed = [f"{k} {shown[k](a.get(k))} vs {shown[k](b.get(k))}" for k in VARIANT_KEYS
               if a.get(k) != b.get(k) and (b.get(k) is not None or k == "micro_batch_size")]
    return ", ".join(parts) + (f"; {', '.join(changed)}" if changed else "")
