"""Determinism: repeats that share a seed must end with identical parameters.

Repeats are grouped by the torch seed in their summaries (``seeds.torch``; ``repro500 run
--same-seed`` gives every repeat repeat 0's seeds).  Within a group every
``final_param_digest`` must be equal.  Where two differ, ``repeats/<k>/params.jsonl``
(one line per epoch end: whole-model digest and one digest per tensor) locates the first
epoch at which they diverge and the first tensor, in state_dict order, that differs; without
params.jsonl the summaries' ``epoch_param_digests`` give the epoch only.  A repeat whose
summary records no ``final_param_digest`` cannot be compared: it is left out with a note, and
when that leaves no pair to compare the check is SKIPPED (never a FAIL).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from repro500.verify.rundir import RunData


@dataclass
class Divergence:
    repeats: list[int]
    seed: int | str | None
    first_epoch: int | str | None
    first_tensor: str | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DeterminismResult:
    status: str  # PASS | FAIL | SKIPPED
    reason: str
    groups: list[dict[str, Any]] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    # information only (other hardware may legitimately differ): run repeats whose seed a
    # reference repeat shares, and whether their final parameters are bitwise identical
    cross_run: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["divergences"] = [d.to_dict() for d in self.divergences]
        return out


def read_params(path: Path) -> list[dict[str, Any]]:
    """The epoch records of a params.jsonl, in file order (unreadable lines skipped)."""
    records = []
    if not path.is_file():
        return records
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "epoch" in record:
                records.append(record)
    return records


def locate_divergence(params_a: list[dict[str, Any]], params_b: list[dict[str, Any]]) -> tuple[Any, str | None]:
    """(first epoch whose digest differs, first differing tensor name) or (None, None)."""
    by_epoch_b = {str(r["epoch"]): r for r in params_b}
    for rec_a in params_a:
        rec_b = by_epoch_b.get(str(rec_a["epoch"]))
        if rec_b is None:
            continue
        if rec_a.get("digest") == rec_b.get("digest"):
            continue
        tensors_a = rec_a.get("tensors") or {}
        tensors_b = rec_b.get("tensors") or {}
        for name, digest in tensors_a.items():  # JSON objects keep state_dict order
            if tensors_b.get(name) != digest:
                return rec_a["epoch"], name
        extra = [name for name in tensors_b if name not in tensors_a]
        return rec_a["epoch"], (extra[0] if extra else None)
    return None, None


def _diverge(run: RunData, a: int, b: int, seed: Any) -> Divergence:
    epoch, tensor = locate_divergence(read_params(run.repeat_file(a, "params.jsonl")),
                                      read_params(run.repeat_file(b, "params.jsonl")))
    source = "params.jsonl"
    if epoch is None:
        source = "epoch_param_digests"
        da = run.repeats[a].get("epoch_param_digests") or []
        db = run.repeats[b].get("epoch_param_digests") or []
        for i, (x, y) in enumerate(zip(da, db, strict=False)):
            if x != y:
                epoch = i + 1
                break
    if epoch is None:
        detail = f"repeats {a} and {b} share seed {seed} but end with different parameters; no per-epoch digests locate where"
    else:
        where = f"epoch {epoch}" + (f", first at tensor {tensor}" if tensor else "")
        detail = f"repeats {a} and {b} share seed {seed} but diverge at {where} (from {source})"
    return Divergence(repeats=[a, b], seed=seed, first_epoch=epoch, first_tensor=tensor, detail=detail)


def check_determinism(run: RunData) -> DeterminismResult:
    groups: dict[Any, list[int]] = {}
    unseeded = []
    for k in run.completed:
        seed = (run.repeats[k].get("seeds") or {}).get("torch")
        if seed is None:
            unseeded.append(k)
        else:
            groups.setdefault(seed, []).append(k)
    res = DeterminismResult(status="SKIPPED", reason="")
    if unseeded:
        res.notes.append(f"repeats {unseeded} record no torch seed: not grouped")
    shared = {seed: ks for seed, ks in groups.items() if len(ks) > 1}
    if not shared:
        res.reason = "no two completed repeats share a seed (use repro500 run --same-seed to check determinism)"
        return res
    unrecorded: list[int] = []
    for seed, ks in shared.items():
        digests = {k: run.repeats[k].get("final_param_digest") for k in ks}
        unrecorded += [k for k in ks if digests[k] is None]
        recorded = [k for k in ks if digests[k] is not None]
        if len(recorded) < 2:  # nothing to compare: not evidence either way
            continue
        first = recorded[0]
        identical = all(digests[k] == digests[first] for k in recorded)
        res.groups.append({"seed": seed, "repeats": recorded, "identical": identical})
        res.divergences += [_diverge(run, first, k, seed) for k in recorded[1:] if digests[k] != digests[first]]
    if unrecorded:
        res.notes.append(f"repeats {sorted(unrecorded)} share a seed but record no final_param_digest: "
                         "their parameters were not digested, so they are left out of the check")
    if res.divergences:
        res.status = "FAIL"
        res.reason = res.divergences[0].detail
    elif res.groups:
        res.status = "PASS"
        n = sum(len(g["repeats"]) for g in res.groups)
        res.reason = f"{n} repeats sharing a seed have identical final parameter digests"
    else:
        res.reason = ("repeats share a seed but their final parameter digests were not recorded "
                      "(no final_param_digest in repeats/<k>/summary.json): determinism cannot be checked")
    return res


def compare_with_reference(run: RunData, reference: RunData) -> list[dict[str, Any]]:
    """Pairs of (run repeat, reference repeat) with the same torch seed, and digest equality."""
    by_seed: dict[Any, int] = {}
    for j in reference.completed:
        seed = (reference.repeats[j].get("seeds") or {}).get("torch")
        if seed is not None:
            by_seed.setdefault(seed, j)
    pairs = []
    for k in run.completed:
        seed = (run.repeats[k].get("seeds") or {}).get("torch")
        j = by_seed.get(seed) if seed is not None else None
        if j is None:
            continue
        mine, theirs = run.repeats[k].get("final_param_digest"), reference.repeats[j].get("final_param_digest")
        pairs.append({"repeat": k, "reference_repeat": j, "seed": seed,
                      "identical": mine is not None and mine == theirs})
    return pairs


@dataclass
class ExactReplay:
    """Whether every rerun repeat ends bit for bit where the reference repeat of its seed ended.

    Decided only against a reference run: every planned repeat of the rerun completed, records
    a torch seed and a ``final_param_digest``, and a completed reference repeat shares the seed
    (the one of the same index when several do).  Independent of the number of repeats."""

    exact: bool
    reason: str
    pairs: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def exact_replay(run: RunData, reference: RunData) -> ExactReplay:
    if run.unsuccessful:
        shown = ", ".join(f"{k} ({state})" for k, state in run.unsuccessful.items())
        return ExactReplay(False, f"not every repeat completed: {shown}")
    by_seed: dict[Any, list[int]] = {}
    for j in reference.completed:
        seed = (reference.repeats[j].get("seeds") or {}).get("torch")
        if seed is not None and reference.repeats[j].get("final_param_digest"):
            by_seed.setdefault(seed, []).append(j)
    pairs, gaps = [], []
    for k in run.completed:
        doc = run.repeats[k]
        seed, digest = (doc.get("seeds") or {}).get("torch"), doc.get("final_param_digest")
        if seed is None or not digest:
            gaps.append(f"repeat {k} records no {'torch seed' if seed is None else 'final parameter digest'}")
            continue
        candidates = by_seed.get(seed)
        if not candidates:
            gaps.append(f"no reference repeat shares repeat {k}'s seed {seed}")
            continue
        j = k if k in candidates else candidates[0]
        pairs.append({"repeat": k, "reference_repeat": j, "seed": seed,
                      "identical": digest == reference.repeats[j]["final_param_digest"]})
    if gaps:
        return ExactReplay(False, "; ".join(gaps), pairs)
    differing = [p["repeat"] for p in pairs if not p["identical"]]
    if differing or not pairs:
        return ExactReplay(False, f"repeat(s) {differing} end with parameters that differ from the reference "
                                  "repeat of the same seed", pairs)
    return ExactReplay(True, f"all {len(pairs)} repeat(s) end with final parameters bitwise identical to the "
                             "reference repeat of the same seed", pairs)
