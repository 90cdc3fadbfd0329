"""Run directories fabricated exactly by the contract (docs/contracts.md).

``make_run`` is the helper every verify test uses: it writes run.json, manifest.json (with a
valid canonical digest), recipe.yaml, per-repeat metrics.jsonl / summary.json / params.jsonl,
the aggregate summary.json and SHA256SUMS (via repro500.rundir.sums.write_sums).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from repro500.capture import seeds as seedlib
from repro500.digest import canonical_digest
from repro500.rundir import sums as bundle

TENSORS = ["conv1.weight", "layer1.0.conv1.weight", "layer1.0.bn1.weight", "fc.weight", "fc.bias"]
DEFAULT_ACCEPTANCE = {"accuracy": {"target": 0.9, "direction": "higher", "tolerance": 0.02}}


def _h(*parts: Any) -> str:
    return hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()


def make_manifest(**facet_overrides: Any) -> dict[str, Any]:
    facets = {
        "code": {"commit": "0" * 40, "dirty": False},
        "environment": {"python": "3.11.7", "packages": {"torch": "2.14.1", "numpy": "2.4.0"}},
        "seeds": {"master_seed": 500},
        "data": {"entries": []},
        "hardware": {"cpu": {"model": "test cpu"}, "gpus": []},
    }
    facets.update(facet_overrides)
    doc = {
        "schema": "repro500/manifest/v1", "tool": {"name": "repro500", "version": "0.1.0"},
        "created_utc": "2026-11-22T06:15:00Z", "facets": facets, "facet_errors": {}, "artifacts": {},
    }
    doc["digest"] = {"algorithm": "sha256", "canonicalization": "repro500-c14n/v1", "value": canonical_digest(doc)}
    return doc


def make_run(
    parent: Path,
    name: str = "run-a",
    *,
    values: dict[str, list[float]] | None = None,
    acceptance: dict[str, Any] | None = DEFAULT_ACCEPTANCE,
    statuses: list[str] | None = None,
    torch_seeds: list[int] | None = None,
    diverge: dict[str, Any] | None = None,
    epochs_to_quality: list[int] | None = None,
    time_to_quality_s: list[float] | None = None,
    manifest: dict[str, Any] | None = None,
    epochs: int = 3,
) -> Path:
    """Write a complete run directory under ``parent/name``; returns its path.

    ``values`` maps metric -> one value per repeat.  ``torch_seeds`` (default: derived per
    repeat) decides which repeats share a seed; repeats that share one get identical
    parameter digests unless ``diverge={"repeat": k, "epoch": e, "tensor": name}`` makes
    repeat k differ from epoch e on, starting at that tensor.
    """
    values = values if values is not None else {"accuracy": [0.93, 0.94, 0.935]}
    n = len(next(iter(values.values())))
    statuses = statuses or ["completed"] * n
    root = parent / name
    (root / "repeats").mkdir(parents=True)
    # parameters follow from the seed *and* the results: two fabricated runs end bitwise identical
    # only when their seeds and every value agree (as real training would), so a rerun with other
    # values is never mistaken for an exact replay
    salt = json.dumps(values, sort_keys=True)
    seeds = [seedlib.derive(500, k).as_dict() for k in range(n)]
    if torch_seeds is not None:
        first: dict[int, int] = {}
        for k, s in enumerate(torch_seeds):
            # repeats that share a seed share every seed, as --same-seed gives them (the
            # determinism check groups by all of them)
            j = first.setdefault(s, k)
            seeds[k].update({name: seeds[j][name] for name in ("python", "numpy", "loader")}, torch=s)
    etq = epochs_to_quality or [2] * n
    ttq = time_to_quality_s or [20.0 + k for k in range(n)]
    repeat_states = {}
    agg_metrics: dict[str, dict[str, list]] = {}
    digests = {}
    for k in range(n):
        rdir = bundle.repeat_dir(root, k)
        rdir.mkdir(parents=True)
        metrics = {m: vals[k] for m, vals in values.items()}
        accuracy = metrics.get("accuracy", 0.93)
        metrics.update({
            "throughput_samples_per_s": 180.0 + k, "train_flops": 1.2e12, "flops_per_s": 4.0e10,
            "time_to_quality_s": ttq[k], "epochs_to_quality": etq[k],
        })
        metrics["valid_flops"] = 4.0e10 * (accuracy / 0.9) ** 5
        # params.jsonl: digests depend on (torch seed, epoch, tensor) so shared seeds agree
        lines, epoch_digests = [], []
        for epoch in [*range(1, epochs + 1), "final"]:
            e_num = epochs if epoch == "final" else epoch
            tensors = {}
            for t in TENSORS:
                bad = (diverge and diverge["repeat"] == k and e_num >= diverge["epoch"]
                       and TENSORS.index(t) >= TENSORS.index(diverge["tensor"]))
                tensors[t] = _h(seeds[k]["torch"], e_num, t, "x" if bad else "", salt)
            whole = _h(*tensors.values())
            lines.append(json.dumps({"epoch": epoch, "digest": whole, "tensors": tensors}))
            if epoch != "final":
                epoch_digests.append(whole)
        (rdir / "params.jsonl").write_text("\n".join(lines) + "\n")
        final = json.loads(lines[-1])["digest"]
        records = []
        for epoch in range(1, epochs + 1):
            records.append(json.dumps({"kind": "step", "repeat": k, "epoch": epoch, "step": epoch * 10,
                                       "loss": 1.0 / epoch, "lr": 0.1, "samples": 64}))
            eval_metrics = {m: (metrics[m] if epoch == epochs else metrics[m] * 0.9)
                            for m in values if m in ("accuracy", "loss", "map_50")}
            records.append(json.dumps({"kind": "epoch", "repeat": k, "epoch": epoch, "metrics": eval_metrics,
                                       "param_digest": epoch_digests[epoch - 1]}))
        (rdir / "metrics.jsonl").write_text("\n".join(records) + "\n")
        summary = {
            "schema": "repro500/repeat-summary/v1", "repeat": k, "status": statuses[k], "seeds": seeds[k],
            "epochs_run": epochs, "target": {"metric": "accuracy", "value": 0.9, "direction": "higher"},
            "reached_target": statuses[k] == "completed", "epochs_to_quality": etq[k],
            "time_to_quality_s": ttq[k], "train_time_s": 30.0, "metrics": metrics,
            "valid_flops": {"flops_per_s": 4.0e10, "achieved": accuracy, "target": 0.9, "exponent": 5},
            "final_param_digest": final, "epoch_param_digests": epoch_digests, "error": None,
        }
        (rdir / "summary.json").write_text(json.dumps(summary, indent=2))
        repeat_states[str(k)] = statuses[k]
        digests[str(k)] = final
        if statuses[k] == "completed":
            for m, v in metrics.items():
                entry = agg_metrics.setdefault(m, {"repeats": [], "values": []})
                entry["repeats"].append(k)
                entry["values"].append(v)
    (root / "summary.json").write_text(json.dumps({
        "schema": "repro500/summary/v1", "run_id": name, "recipe_name": "quickstart",
        "workload": "classification", "repeats_planned": n, "repeats": repeat_states,
        "acceptance": acceptance, "metrics": agg_metrics, "final_param_digests": digests,
        "seeds": {str(k): seeds[k]["torch"] for k in range(n)},
    }, indent=2))
    (root / "run.json").write_text(json.dumps({
        "schema": "repro500/run/v1", "run_id": name, "status": "completed",
        "created_utc": "2026-11-22T06:15:00Z", "finished_utc": "2026-11-22T06:16:10Z",
        "argv": ["repro500", "run", "experiments/quickstart.yaml"], "recipe_path": "experiments/quickstart.yaml",
        "recipe_name": "quickstart", "repeats": n, "same_seed": False, "deterministic": False,
        "open_division": False, "overrides": {}, "engine": "local", "world_size": 1,
    }, indent=2))
    (root / "recipe.yaml").write_text(yaml.safe_dump({
        "name": "quickstart", "fixed": {"model": "resnet20"}, "mutable": {"batch_size": 64},
        "acceptance": acceptance, "repeats": n, "seed": 500,
    }))
    (root / "manifest.json").write_text(json.dumps(manifest or make_manifest(), indent=2))
    bundle.write_sums(root)
    return root


def edit_json(path: Path, fn) -> None:
    """Apply ``fn`` to a JSON file's object in place (a user or forger editing a number)."""
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc, indent=2))


THIS_CPU = {"cpu": {"model": "test cpu", "cores": 8, "sockets": 1}, "gpus": [], "memory": {"total_bytes": 2**34}}


def history_run(parent: Path, name: str, created: str, accuracy: list[float], *, throughput: float = 180.0,
                hardware: dict | None = None, torch: str = "2.14.1", batch_size: int = 64,
                finished: str | None = None) -> Path:
    """A sealed run made at ``created`` on a system given by its hardware facet and torch version."""
    manifest = make_manifest(hardware=hardware or THIS_CPU,
                             environment={"python": {"version": "3.11.7"}, "torch_build": {"version": torch},
                                          "packages": {"torch": torch}})
    root = make_run(parent, name, values={"accuracy": accuracy}, manifest=manifest,
                    time_to_quality_s=[20.0 + 0.05 * k for k in range(len(accuracy))])
    for k in range(len(accuracy)):  # the throughput a repeat measured
        path = root / "repeats" / str(k) / "summary.json"
        doc = json.loads(path.read_text())
        doc["metrics"]["throughput_samples_per_s"] = throughput + k
        path.write_text(json.dumps(doc))
    summary = json.loads((root / "summary.json").read_text())
    summary["metrics"]["throughput_samples_per_s"]["values"] = [throughput + k for k in range(len(accuracy))]
    (root / "summary.json").write_text(json.dumps(summary))
    run = json.loads((root / "run.json").read_text())
    run["created_utc"] = created
    run["finished_utc"] = finished or created.replace("T10:", "T11:")
    (root / "run.json").write_text(json.dumps(run))
    recipe = yaml.safe_load((root / "recipe.yaml").read_text())
    recipe["mutable"]["batch_size"] = batch_size
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    bundle.write_sums(root)
    return root


# a run whose step records carry exact alpha-beta timings (repro500 model's tests)
LATENCY_S, GAMMA = 50e-6, 1e-9
STEP = {"time_data_s": 0.004, "time_forward_s": 0.02, "time_backward_s": 0.05, "time_optimizer_s": 0.006,
        "step_time_s": 0.082, "time_comm_s": 0.012, "time_compress_s": 0.001, "time_decompress_s": 0.0005,
        "bytes_sent": 1_078_888, "bytes_received": 1_078_888, "dense_bytes_sent": 1_078_888, "tensors": 2}


def craft_run(parent: Path, name: str = "run-2", *, world_size: int = 2, compressor="none",
              with_timings: bool = True, step: dict | None = None) -> Path:
    """A sealed run directory whose step records carry the timings above (first step: warm-up)."""
    root = make_run(parent, name, values={"accuracy": [0.93, 0.94]})
    for rdir in sorted((root / "repeats").iterdir()):
        k = int(rdir.name)
        epochs = [line for line in (rdir / "metrics.jsonl").read_text().splitlines() if '"epoch"' in line
                  and json.loads(line)["kind"] == "epoch"]
        steps = []
        for i in range(6):
            record = {"kind": "step", "repeat": k, "epoch": 1, "step": i + 1, "loss": 1.0, "lr": 0.1, "samples": 64}
            if with_timings:
                record.update(STEP, **(step or {}))
                if i == 0:  # warm-up: left out by the model
                    record.update(step_time_s=5.0, time_forward_s=4.0)
                if world_size == 1:
                    record.update(time_comm_s=None, time_compress_s=None, time_decompress_s=None,
                                  bytes_sent=None, bytes_received=None, dense_bytes_sent=None)
            steps.append(json.dumps(record))
        (rdir / "metrics.jsonl").write_text("\n".join(steps + epochs) + "\n")
    run = json.loads((root / "run.json").read_text())
    run.update(world_size=world_size, engine="ddp" if world_size > 1 else "local")
    (root / "run.json").write_text(json.dumps(run))
    recipe = yaml.safe_load((root / "recipe.yaml").read_text())
    recipe["mutable"].update(compressor=compressor, nproc=world_size)
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    bundle.write_sums(root)
    return root
