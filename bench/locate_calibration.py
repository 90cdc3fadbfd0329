"""How often a deterministic run is said to part from itself (aim: never, 0 of 10 runs).

Each round is a real ``repro500 run`` of a small ResNet-20 classification recipe (2 epochs of 4
steps, one thread) with ``--deterministic --same-seed --repeats 3``: three repeats that must be
bitwise alike, so every one of their three pairs must agree at every recorded step.  The round
is then judged twice, as a user would: ``repro500 verify`` (its divergence section must say
NONE) and ``repro500 locate`` (no operator found, records of shape "none").  A false positive
in either is a round that "parted".  make test runs one round (tests/test_locate.py); this is
the calibration proper.

    python bench/locate_calibration.py [--rounds 10]

Exits 1 when any round parted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from repro500.capture.hardware import cpu_info

RECIPE = {
    "schema": "repro500/recipe/v1", "name": "calibration",
    "fixed": {"workload": "classification", "model": "resnet20",
              "dataset": {"name": "synthetic-classification",
                          "params": {"train_samples": 64, "eval_samples": 32, "size": "16x16", "noise": 0.04, "seed": 3}},
              "target": {"metric": "accuracy", "value": 0.99, "direction": "higher"}, "epochs": 2},
    "mutable": {"batch_size": 16, "eval_batch_size": 32, "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
                "lr_schedule": {"name": "cosine", "warmup_epochs": 0.5}, "device": "cpu", "threads": 1},
    "acceptance": {"accuracy": {"target": 0.5, "tolerance": 0.5}}, "repeats": 3, "seed": 7,
}


def repro500(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1"}
    return subprocess.run([sys.executable, "-m", "repro500.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900, check=False)


def one_round(cwd: Path, k: int) -> tuple[bool, str]:
    """(parted, what verify and locate said) for round *k*."""
    ran = repro500("run", "calibration.yaml", "--deterministic", "--same-seed", "--repeats", "3", "--no-tracking",
                   "--run-id", f"r{k}", cwd=cwd)
    if ran.returncode not in (0, 1, 3):
        raise SystemExit(f"round {k}: repro500 run exited {ran.returncode}: {ran.stderr.strip()[-500:]}")
    verified = repro500("verify", f"runs/r{k}", "--json", "--no-write", cwd=cwd)
    divergence = json.loads(verified.stdout)["divergence"]
    located = repro500("locate", f"runs/r{k}", "--json", cwd=cwd)
    if located.returncode != 0:
        raise SystemExit(f"round {k}: repro500 locate exited {located.returncode}: {located.stderr.strip()[-500:]}")
    answer = json.loads(located.stdout)
    parted = divergence["status"] != "NONE" or answer["operator"] is not None or answer["records"]["shape"] != "none"
    pairs = len(divergence.get("pairs") or [])
    return parted, (f"verify {divergence['status']} over {pairs} pair(s); locate: operator "
                    f"{'none' if answer['operator'] is None else answer['operator'].get('op')}, "
                    f"records {answer['records']['shape']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    cpu = cpu_info()
    isa = "AVX-512" if "avx512f" in cpu["flags"] else "AVX2" if "avx2" in cpu["flags"] else "no AVX2"
    print(f"CPU: {cpu['model']} ({isa}), {os.cpu_count()} cores; {args.rounds} rounds")
    started, parted = time.monotonic(), 0
    with tempfile.TemporaryDirectory(prefix="repro500-locate-calibration-") as tmp:
        cwd = Path(tmp)
        (cwd / "calibration.yaml").write_text(yaml.safe_dump(RECIPE, sort_keys=False))
        for k in range(args.rounds):
            bad, said = one_round(cwd, k)
            parted += bad
            print(f"round {k + 1}/{args.rounds}: {'PARTED' if bad else 'alike'} ({said})", flush=True)
    ok = parted == 0
    print(f"{'PASS' if ok else 'MISS'}: {parted} of {args.rounds} deterministic runs said to part (aim 0); "
          f"{time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
