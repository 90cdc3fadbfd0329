"""Determinism: repeats that share a seed must end with identical parameters.

Repeats are grouped by the seeds in their summaries (``seeds``: python, numpy, torch, loader;
``repro500 run --same-seed`` gives every repeat repeat 0's seeds).  Within a group every
``final_param_digest`` must be equal.  Where two differ, ``repeats/<k>/params.jsonl``
(one line per epoch end: whole-model digest and one digest per tensor) locates the first
epoch at which they diverge and the first tensor, in state_dict order, that differs; without
params.jsonl the summaries' ``epoch_param_digests`` give the epoch only.  A repeat whose
summary records no ``final_param_digest`` cannot be compared: it is left out with a note, and
when that leaves no pair to compare the check is SKIPPED (never a FAIL).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from repro500 import untrusted
from repro500.capture.seeds import SEED_NAMES, pair_repeats
from repro500.rundir import layout
from repro500.statuses import FAIL, PASS, SKIPPED
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
    for line in untrusted.log_lines(path, "a repeat's params log"):
        record = untrusted.json_record(line) if line.strip() else None
        if record is not None and "epoch" in record:
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
    epoch, tensor = locate_divergence(read_params(run.repeat_file(a, layout.PARAMS)),
                                      read_params(run.repeat_file(b, layout.PARAMS)))
    source = layout.PARAMS
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


def seed_groups(run: RunData) -> tuple[dict[Any, list[int]], list[int], list[int]]:
    """(completed repeats grouped by every seed they record, repeats that record no torch seed,
    the repeats compared at all).  The determinism check and the divergence location
    (verify/divergence.py) compare the same pairs."""
    groups: dict[Any, list[int]] = {}
    unseeded = []
    design = (run.run or {}).get("design") or {}
    # a factorial run's kernels cell lets torch choose non-deterministic algorithms on purpose:
    # its spread is measured by the variance decomposition, not judged here
    cells = design.get("cells") if design.get("kind") == "factorial" else None
    chosen = [k for k in run.completed if not (cells and k < len(cells) and cells[k] == "kernels")]
    for k in chosen:
        seeds = run.repeats[k].get("seeds") or {}
        if seeds.get("torch") is None:
            unseeded.append(k)
        else:  # every seed the repeat records: a factorial run holds some and varies others
            groups.setdefault(tuple(seeds.get(n) for n in SEED_NAMES), []).append(k)
    return groups, unseeded, chosen


def check_determinism(run: RunData) -> DeterminismResult:
    groups, unseeded, chosen = seed_groups(run)
    res = DeterminismResult(status=SKIPPED, reason="")
    if unseeded:
        res.notes.append(f"repeats {unseeded} record no torch seed: not grouped")
    if len(chosen) < len(run.completed):
        res.notes.append("the kernels cell of the factorial run is left out: it varies the algorithms on purpose")
    shared = {key: ks for key, ks in groups.items() if len(ks) > 1}
    if not shared:
        res.reason = "no two completed repeats share a seed (use repro500 run --same-seed to check determinism)"
        return res
    unrecorded: list[int] = []
    for key, ks in shared.items():
        seed = key[2]  # shown by its torch seed
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
        res.status = FAIL
        res.reason = res.divergences[0].detail
    elif res.groups:
        res.status = PASS
        n = sum(len(g["repeats"]) for g in res.groups)
        res.reason = f"{n} repeats sharing a seed have identical final parameter digests"
    else:
        res.reason = ("repeats share a seed but their final parameter digests were not recorded "
                      "(no final_param_digest in repeats/<k>/summary.json): determinism cannot be checked")
    return res


def compare_with_reference(run: RunData, reference: RunData) -> list[dict[str, Any]]:
    """Pairs of (run repeat, reference repeat) that received the same seeds
    (:func:`~repro500.capture.seeds.pair_repeats`), and whether their final parameters are identical."""
    found, _ = pair_repeats(run, reference)
    pairs = []
    for k, j in found:
        mine, theirs = run.repeats[k].get("final_param_digest"), reference.repeats[j].get("final_param_digest")
        pairs.append({"repeat": k, "reference_repeat": j, "seed": (run.repeats[k].get("seeds") or {}).get("torch"),
                      "identical": mine is not None and mine == theirs})
    return pairs


# Metrics that measure the machine, not the computation: wall-clock times, rates and what is
# derived from them (flops_per_s and valid_flops divide by a time), and bytes the kernel counted
# on the sockets (headers, retransmits).  A bitwise replay on other hardware, or on the same one
# under other load, legitimately changes them, so they never break an exact replay.  Besides
# these names, any metric named as a time or a rate by the project's unit-in-the-name rule
# (``*_time_s``, ``time_*_s``, ``*_per_s``) counts as one: a user's own ``epoch_time_s`` too.
# Every other recorded metric (accuracy, loss, epochs_to_quality, train_flops, bytes counted by
# the compressor, ...) follows from the parameters and the evaluation and must be identical.
MACHINE_METRICS = frozenset({
    "throughput_samples_per_s", "flops_per_s", "valid_flops", "time_to_quality_s", "train_time_s",
    "total_time_s", "time_compress_per_step_s", "time_decompress_per_step_s", "time_comm_per_step_s",
    "wire_bytes_sent_per_step", "wire_bytes_received_per_step",
    # joules, utilization and waiting for data (repro500.workloads.trainer.epochs): the machine's, not the model's
    "energy_j", "energy_j_per_sample", "flops_per_j", "cpu_utilization_pct", "gpu_utilization_pct",
    "data_wait_fraction",
})
CAUSES = "a non-deterministic evaluation, a different evaluation set or data, or edited records"
_SHOWN = 4  # metric differences named in a reason; all of them are in verdict.json


def machine_dependent(metric: str) -> bool:
    """True for a metric an exact replay may change (a time, a rate, bytes on the wire)."""
    return (metric in MACHINE_METRICS or metric.endswith(("_time_s", "_per_s"))
            or (metric.startswith("time_") and metric.endswith("_s")))


@dataclass
class ExactReplay:
    """Whether every rerun repeat ends bit for bit where the reference repeat of its seed ended,
    and scored exactly what it scored.

    Decided only against a reference run: every planned repeat of the rerun completed, records
    a torch seed and a ``final_param_digest``, and a completed reference repeat shares the seed
    (the one of the same index when several do).  Exact when every pair's final parameters are
    identical *and* so is every recorded metric of the pair except the machine-dependent ones
    (:data:`MACHINE_METRICS`).  Independent of the number of repeats.

    ``params_identical`` is what ``exact`` meant before metrics were compared; a pair whose
    parameters are identical but whose metrics differ is listed in ``metric_differences``
    (``{repeat, reference_repeat, metric, value, reference_value}``, a metric one side did not
    record has the value None)."""

    exact: bool
    reason: str
    pairs: list[dict[str, Any]] = field(default_factory=list)
    params_identical: bool = False
    metric_differences: list[dict[str, Any]] = field(default_factory=list)
    ignored_metrics: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _differences(mine: dict[str, Any], theirs: dict[str, Any], ignored: set[str]) -> list[tuple[str, Any, Any]]:
    """(metric, value, reference value) for every compared metric whose values are not identical;
    a metric recorded as null counts as not recorded."""
    out = []
    for name in dict.fromkeys([*mine, *theirs]):
        if machine_dependent(name):
            ignored.add(name)
            continue
        a, b = mine.get(name), theirs.get(name)
        if a != b:  # numbers as JSON gives them: 1 and 1.0 are the same value
            out.append((name, a, b))
    return out


def _shown(value: Any) -> str:
    return "not recorded" if value is None else repr(value)


def _name_differences(differences: list[dict[str, Any]]) -> str:
    parts = [f"repeat {d['repeat']} {d['metric']} {_shown(d['value'])} vs reference repeat "
             f"{d['reference_repeat']} {_shown(d['reference_value'])}" for d in differences[:_SHOWN]]
    more = len(differences) - _SHOWN
    if more > 0:
        parts.append(f"and {more} more (exact_replay.metric_differences in verdict.json)")
    return "; ".join(parts)


def replay_by_seed(run: RunData, reference: RunData) -> ExactReplay:
    """Whether the rerun replays the reference exactly, pair by pair (:func:`~repro500.capture.seeds.pair_repeats`): a
    :class:`ExactReplay`.

    Exact when every rerun repeat completed and has a partner, and in every pair the recorded
    metrics are identical (times and rates aside: :func:`machine_dependent`), the final
    parameters are bitwise identical where both record a digest, and so are the declared outputs
    where both declare some.  A wrapped command that records no parameter digest is replayed
    exactly by its metrics alone; a pair where one side has a digest and the other none is not
    compared (their records differ), and identical parameters with different metrics are named
    (``metric_differences``): they point at the evaluation."""
    if run.unsuccessful:
        shown = ", ".join(f"{k} ({state})" for k, state in run.unsuccessful.items())
        return ExactReplay(False, f"not every repeat completed: {shown}")
    found, gaps = pair_repeats(run, reference)
    pairs, differences, compared, ignored = _compare_pairs(run, reference, found, gaps)
    result = ExactReplay(False, "", pairs, metric_differences=differences, ignored_metrics=sorted(ignored))
    result.params_identical, result.exact, result.reason = _replay_words(run, pairs, gaps, differences, compared,
                                                                          ignored)
    return result


def _compare_pairs(run: RunData, reference: RunData, found: list[tuple[int, int]], gaps: list[str]
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], set[str], set[str]]:
    """(pairs, metric differences of pairs with identical parameters, metrics compared, metrics
    ignored as machine-dependent) of the seed pairs *found*; a pair that cannot be compared adds
    to *gaps*."""
    pairs: list[dict[str, Any]] = []
    differences: list[dict[str, Any]] = []
    compared: set[str] = set()
    ignored: set[str] = set()
    for k, j in found:
        mine, theirs = run.repeats[k], reference.repeats[j]
        digests = mine.get("final_param_digest"), theirs.get("final_param_digest")
        if bool(digests[0]) != bool(digests[1]):
            side = f"repeat {k}" if not digests[0] else f"reference repeat {j}"
            gaps.append(f"{side} records no final parameter digest")
            continue
        identical = digests[0] == digests[1] if digests[0] else None  # None: no digests to compare
        outputs = [doc.get("outputs") if isinstance(doc.get("outputs"), dict) else {} for doc in (mine, theirs)]
        same_outputs = outputs[0] == outputs[1] if outputs[0] and outputs[1] else None
        metrics = [doc.get("metrics") or {} for doc in (mine, theirs)]
        found_diff = _differences(metrics[0], metrics[1], ignored)
        compared |= {m for m in (*metrics[0], *metrics[1]) if m not in ignored}
        if identical:  # identical parameters that score differently say something about the evaluation
            differences += [{"repeat": k, "reference_repeat": j, "metric": m, "value": a, "reference_value": b}
                            for m, a, b in found_diff]
        pairs.append({"repeat": k, "reference_repeat": j, "seed": (mine.get("seeds") or {}).get("torch"),
                      "identical": identical, "metrics_identical": not found_diff})
        if same_outputs is not None:  # both sides declared outputs
            pairs[-1]["outputs_identical"] = same_outputs
    return pairs, differences, compared, ignored


def _replay_words(run: RunData, pairs: list[dict[str, Any]], gaps: list[str], differences: list[dict[str, Any]],
                  compared: set[str], ignored: set[str]) -> tuple[bool, bool, str]:
    """(parameters identical, exact, reason) of an exact replay's compared pairs."""
    digested = bool(pairs) and all(p["identical"] is not None for p in pairs)
    named = (f"; repeats with bitwise-identical final parameters recorded different metrics: "
             f"{_name_differences(differences)} (likely {CAUSES})") if differences else ""
    if gaps:
        return False, False, "; ".join(gaps) + named
    if not pairs:
        return False, False, "no completed repeat to compare"
    differing = [p["repeat"] for p in pairs if p["identical"] is False]
    if differing:
        return False, False, (f"repeat(s) {differing} end with parameters that differ from the reference repeat "
                              f"of the same seed{named}")
    other_outputs = [p["repeat"] for p in pairs if p.get("outputs_identical") is False]
    if other_outputs:
        return False, False, (f"repeat(s) {other_outputs} wrote declared outputs that differ from the reference "
                              "repeat's")
    n = len(pairs)
    if digested:
        same = f"all {n} repeat(s) end with final parameters bitwise identical to the reference repeat of the same seed"
    else:
        same = f"all {n} repeat(s) recorded the same values as the reference repeat of the same seed"
    if differences:
        return digested, False, (f"{same}, but recorded different metrics: {_name_differences(differences)}; "
                                 f"identical parameters that score differently point at {CAUSES}")
    differ = [p["repeat"] for p in pairs if not p["metrics_identical"]]
    if differ:  # no digests: the metrics are all there is, and they differ
        return digested, False, (f"repeat(s) {differ} recorded metrics that differ from the reference repeat of "
                                 "the same seed")
    if not compared:
        return digested, False, (f"the repeats record no metric but times and rates ({', '.join(sorted(ignored))}): "
                                 "nothing to replay")
    left_out = f"; {', '.join(sorted(ignored))} (times and rates) may differ" if ignored else ""
    declared = sorted({name for p in pairs if p.get("outputs_identical") for name in (run.repeats[p["repeat"]].get("outputs") or {})})
    outputs_said = f", and identical declared outputs ({', '.join(declared)})" if declared else ""
    if digested:
        return True, True, f"{same}, with identical recorded metrics{outputs_said}{left_out}"
    return False, True, (f"{same}: identical recorded metrics ({', '.join(sorted(compared))}){outputs_said}; no final "
                         f"parameter digests to compare, so the replay is exact in what was recorded{left_out}")
