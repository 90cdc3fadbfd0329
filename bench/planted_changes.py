"""Planted changes: does every command name the one thing a rerun changed, first?

A reference (the quickstart recipe on 256 samples, 1 epoch, 2 repeats, ``--same-seed
--deterministic``) and one rerun per kind of change, each changing one thing; a second reference
with a plug-in model, data set and evaluator for the changes that need one.  For each rerun the
script asks ``verify RERUN --against REF`` (its Provenance section and "where the runs part"),
``diff REF RERUN`` and ``history`` (the two runs as a history) what they name first, and prints one
row per change.  Target: every planted change named first by all three; the controls (identical
reruns, and one whose training file was copied to another name that the recipe then names) 0
result-relevant, the moved file listed once, as moved.

All runs use one frozen copy of repro500's source (other work on the checkout must not show up as
"repro500's own source differs").  The package version is planted as an installed distribution's
metadata (a ``numpy-<version>.dist-info`` first on PYTHONPATH): the metadata is what a run
records; the code that runs is the same.  The instruction-set change is skipped, and says so,
on a CPU without AVX-512, where ``ATEN_CPU_CAPABILITY=avx2`` is what torch picks anyway.

    python bench/planted_changes.py [--keep DIR]      (about 15-25 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
QUICK = ROOT / "experiments" / "quickstart.yaml"

PLUGIN = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset

SCALE = 1.0  # a model code constant


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, width), nn.ReLU(), nn.Linear(width, 2))

    def forward(self, x):
        return self.body(x * SCALE)


def build(*, num_classes=2, in_channels=3, width=16):
    return Net(width)


def make(split, *, path=None, seed=0, samples=256):
    g = torch.Generator().manual_seed(seed + (0 if split == "train" else 1))
    y = torch.randint(0, 2, (samples,), generator=g)
    x = torch.randn(samples, 3, 8, 8, generator=g) * 0.3 + y.view(-1, 1, 1, 1).float()
    data = TensorDataset(x, y)
    data.info = {"task": "classification", "num_classes": 2, "in_channels": 3}
    return data


class Hits:
    def __init__(self, *, num_classes):
        self.right, self.seen = 0, 0

    def update(self, outputs, targets):
        self.right += int((outputs.argmax(1) == targets).sum())
        self.seen += len(targets)

    def compute(self):
        return {"hits": self.right / self.seen if self.seen else None}


class HitsTop(Hits):
    def compute(self):  # another evaluator: the same score, counted over the top half of the logits
        return {"hits": self.right / self.seen if self.seen else None}
'''
PLUGIN_RECIPE = {
    "schema": "repro500/recipe/v1", "name": "mine",
    "fixed": {"workload": "classification", "model": "mylab.nets:build", "model_options": {"width": 16},
              "dataset": {"entry": "mylab.nets:make", "params": {"samples": 256, "seed": 1}},
              "evaluate": "mylab.nets:Hits", "target": {"metric": "hits", "value": 0.999}, "epochs": 1},
    "mutable": {"batch_size": 32, "eval_batch_size": 64, "optimizer": {"name": "sgd", "lr": 0.1}},
    "acceptance": {"hits": {"target": 0.6, "tolerance": 0.05}},
    "repeats": 2, "seed": 5,
}

# name -> (reference, what to plant, the keys that count as naming it)
CHANGES: list[tuple[str, str, list[str]]] = [
    ("learning rate", "quick", ["recipe.mutable.optimizer.lr"]),
    ("batch size", "quick", ["recipe.mutable.batch_size"]),
    ("epochs", "quick", ["recipe.fixed.epochs"]),
    ("one data value", "quick", ["data.entries.data/quickstart-train.h5*"]),
    ("rows shuffled", "quick", ["data.entries.data/quickstart-train.h5*"]),
    ("data file replaced", "quick", ["data.entries.data/quickstart-train.h5*"]),
    ("model code constant", "plugin", ["experiment.source.*"]),
    ("seed", "quick", ["seeds.*"]),
    ("thread count", "quick", ["runtime.torch.num_threads", "environment.env.values.OMP_NUM_THREADS",
                               "recipe.mutable.threads"]),
    ("instruction set", "quick", ["environment.env.values.ATEN_CPU_CAPABILITY"]),
    ("package version", "quick", ["environment.distributions.numpy*"]),
    ("evaluator", "plugin", ["recipe.fixed.evaluate", "experiment.workload.evaluate"]),
    ("control (quickstart)", "quick", []),
    ("control (plug-in)", "plugin", []),
    # the training file copied to another name and the recipe pointed at it: the same bytes, so the
    # same data (one moved row, below the threshold), not a change of the result
    ("control (data moved)", "quick", []),
]
MOVED = "control (data moved)"


def cli(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "repro500.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def base_env(src: Path, work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "MKL_", "ATEN_", "REPRO500_"))}
    env.update(PYTHONPATH=str(src), MLFLOW_DISABLE_TELEMETRY="true", DVC_NO_ANALYTICS="1", PYTHONUNBUFFERED="1",
               REPRO500_CACHE_DIR=str(work / "cache"))
    return env


def quick_dir(work: Path, name: str, src_env: dict[str, str], data_seed: int = 500, seed: int = 500) -> Path:
    where = work / name
    (where / "data").mkdir(parents=True)
    recipe = yaml.safe_load(QUICK.read_text())
    recipe["fixed"]["epochs"], recipe["seed"] = 1, seed
    (where / "quickstart.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    for split, samples in (("train", 256), ("eval", 128)):
        out = cli(["data", "generate", "classification", "--out", f"data/quickstart-{split}.h5", "--samples",
                   str(samples), "--seed", str(data_seed if split == "train" else 500), "--noise", "0.04",
                   *(["--split", "eval"] if split == "eval" else [])], where, src_env)
        assert out.returncode == 0, out.stderr
    return where


def plugin_dir(work: Path, name: str, scale: str = "1.0", evaluate: str = "mylab.nets:Hits") -> Path:
    where = work / name
    (where / "mylab").mkdir(parents=True)
    (where / "mylab" / "__init__.py").write_text("")
    (where / "mylab" / "nets.py").write_text(PLUGIN.replace("SCALE = 1.0", f"SCALE = {scale}"))
    recipe = json.loads(json.dumps(PLUGIN_RECIPE))
    recipe["fixed"]["evaluate"] = evaluate
    (where / "mine.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return where


def change_one_value(path: Path) -> None:
    import h5py

    with h5py.File(path, "r+") as f:
        name = next(k for k in f if getattr(f[k], "ndim", 0) >= 2)
        data = f[name]
        index = (5,) + (0,) * (data.ndim - 1)  # one value of the sixth sample
        value = data[index]
        data[index] = (int(value) + 1) % 256 if data.dtype.kind in "iu" else value + 0.5  # images are uint8


def shuffle_rows(path: Path) -> None:
    """The same samples in another order: every per-sample data set of the file permuted alike."""
    import h5py
    import numpy

    with h5py.File(path, "r+") as f:
        n = len(f["labels"])
        order = numpy.random.default_rng(7).permutation(n)
        for name in [k for k in f if getattr(f[k], "shape", ())[:1] == (n,)]:
            f[name][...] = f[name][...][order]


def shadow_numpy(work: Path) -> Path:
    """A numpy-<version>.dist-info first on the path: what a run records of numpy's version."""
    import numpy

    where = work / "shadow"
    info = where / "numpy-9.9.9.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: numpy\nVersion: 9.9.9\n")
    (info / "RECORD").write_text("")
    assert numpy.__version__ != "9.9.9"
    return where


def has_avx512() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def named(keys: list[str], patterns: list[str]) -> bool:
    return bool(keys) and any(fnmatch.fnmatchcase(keys[0], p) for p in patterns)


def ask(ref: Path, rerun: Path, cwd: Path, env: dict[str, str], work: Path) -> dict:
    """What verify, diff and history name first, and their counts."""
    out: dict = {}
    verified = cli(["verify", str(rerun), "--against", str(ref), "--across-benchmarks", "--json"], cwd, env)
    doc = json.loads(verified.stdout) if verified.stdout.strip().startswith("{") else {}
    prov = doc.get("provenance") or {}
    top = prov.get("top") or []
    out["verify"] = [f"{r['facet']}.{r['key']}" if r.get("key") else r["facet"] for r in top]
    out["verify_relevant"] = prov.get("result_relevant")
    out["status"] = doc.get("status")
    div = doc.get("divergence") or {}
    parted = [p for p in div.get("pairs") or [] if p.get("shape") not in ("none", "unrecorded")]
    first = min(parted, key=lambda p: p.get("first_step") or 10**9) if parted else None
    out["parts"] = (f"step {first['first_step']}" if first and first.get("first_step") else
                    (first["shape"] if first else "no"))
    out["divergence"] = [c["key"] for c in (first or {}).get("causes") or []]
    out["explanation"] = (first or {}).get("explanation") or ""
    diffed = cli(["diff", str(ref), str(rerun), "--json"], cwd, env)
    d = json.loads(diffed.stdout) if diffed.stdout.strip().startswith("{") else {"differences": []}
    rows = d["differences"]
    out["diff"] = [f"{r['facet']}.{r['key']}" if r.get("key") else r["facet"] for r in rows]
    out["diff_relevant"] = sum(1 for r in rows if r["result_relevant"])
    out["diff_moved"] = sum(1 for r in rows if str(r.get("reason", "")).startswith("moved"))
    hist = work / "hist" / rerun.name
    hist.mkdir(parents=True, exist_ok=True)
    for run in (ref, rerun):
        link = hist / run.name
        if not link.exists():
            link.symlink_to(run.resolve())
    metric = "hits" if "plugin" in str(ref) else "accuracy"
    shown = cli(["history", str(hist), metric, "--json"], cwd, env)
    h = json.loads(shown.stdout) if shown.stdout.strip().startswith("{") else {"runs": []}
    last = next((r for r in h["runs"] if r["run_id"] == json.loads((rerun / "run.json").read_text())["run_id"]), {})
    out["history"] = [c["key"] for c in last.get("changes") or [] if not c.get("moved")]  # moved data: listed, not a change
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, default=None, help="Work here and keep the runs.")
    parser.add_argument("--only", default=None, help="A regex over the change names to run.")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="repro500-planted-"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "src"
    if not src.exists():
        shutil.copytree(ROOT / "repro500", src / "repro500", ignore=shutil.ignore_patterns("__pycache__"))
    env = base_env(src, work)
    runs = work / "runs"
    flags = ["-n", "2", "--same-seed", "--deterministic", "--no-tracking", "--out", str(runs)]
    started = time.perf_counter()

    def run(where: Path, recipe: str, run_id: str, *extra: str, extra_env: dict | None = None) -> Path:
        if (runs / run_id / "SHA256SUMS").is_file():
            return runs / run_id
        done = cli(["run", recipe, *flags, "--run-id", run_id, *extra], where, {**env, **(extra_env or {})})
        if done.returncode not in (0, 1, 3):
            raise SystemExit(f"{run_id}: exit {done.returncode}: {done.stderr[-2000:]}")
        return runs / run_id

    quick = work / "quick" if (work / "quick").exists() else quick_dir(work, "quick", env)
    ref_q = run(quick, "quickstart.yaml", "ref-quick")
    plug = work / "plug" if (work / "plug").exists() else plugin_dir(work, "plug")
    ref_p = run(plug, "mine.yaml", "ref-plugin")
    rows = []
    for name, which, patterns in CHANGES:
        if args.only and not re.search(args.only, name):
            continue
        slug = re.sub(r"[^a-z0-9]+", "-", name).strip("-")
        ref, cwd = (ref_q, quick) if which == "quick" else (ref_p, plug)
        note = ""
        if name == "learning rate":
            rerun = run(quick, "quickstart.yaml", slug, "--set", "optimizer.lr=0.1001")
        elif name == "batch size":
            rerun = run(quick, "quickstart.yaml", slug, "--set", "batch_size=32")
        elif name == "epochs":
            rerun = run(quick, "quickstart.yaml", slug, "--open-division", "--set", "epochs=2")
        elif name == "one data value":
            where = work / slug
            if not where.exists():
                shutil.copytree(quick, where)
                change_one_value(where / "data" / "quickstart-train.h5")
            rerun = run(where, "quickstart.yaml", slug)
            cwd = where
        elif name == "rows shuffled":
            where = work / slug
            if not where.exists():
                shutil.copytree(quick, where)
                shuffle_rows(where / "data" / "quickstart-train.h5")
            rerun = run(where, "quickstart.yaml", slug)
            cwd = where
        elif name == MOVED:
            if not (quick / "data" / "renamed.h5").exists():
                shutil.copyfile(quick / "data" / "quickstart-train.h5", quick / "data" / "renamed.h5")
            rerun = run(quick, "quickstart.yaml", slug, "--open-division", "--set", "fixed.dataset.path=data/renamed.h5")
        elif name == "data file replaced":
            where = work / slug if (work / slug).exists() else quick_dir(work, slug, env, data_seed=501)
            rerun = run(where, "quickstart.yaml", slug)
            cwd = where
        elif name == "seed":
            where = work / slug if (work / slug).exists() else quick_dir(work, slug, env, seed=501)
            rerun = run(where, "quickstart.yaml", slug)
            cwd = where
        elif name == "thread count":
            rerun = run(quick, "quickstart.yaml", slug, extra_env={"OMP_NUM_THREADS": "1"})
        elif name == "instruction set":
            if not has_avx512():
                rows.append((name, "skipped: this CPU has no AVX-512, so ATEN_CPU_CAPABILITY=avx2 is what torch "
                                   "picks anyway and changes no result", None))
                continue
            rerun = run(quick, "quickstart.yaml", slug, extra_env={"ATEN_CPU_CAPABILITY": "avx2"})
        elif name == "package version":
            shadow = shadow_numpy(work) if not (work / "shadow").exists() else work / "shadow"
            rerun = run(quick, "quickstart.yaml", slug, extra_env={"PYTHONPATH": f"{src}{os.pathsep}{shadow}"})
            note = "planted as numpy's installed metadata; the code is the same"
        elif name == "model code constant":
            where = work / slug if (work / slug).exists() else plugin_dir(work, slug, scale="1.001")
            rerun = run(where, "mine.yaml", slug)
        elif name == "evaluator":
            where = work / slug if (work / slug).exists() else plugin_dir(work, slug, evaluate="mylab.nets:HitsTop")
            rerun = run(where, "mine.yaml", slug)
        else:  # the controls
            rerun = run(cwd, "quickstart.yaml" if which == "quick" else "mine.yaml", slug)
        # the runs ran the frozen copy; the questions are asked of the checkout's code (both runs
        # recorded the same repro500, so which one asks changes no difference)
        got = ask(ref, rerun, cwd, {**env, "PYTHONPATH": str(ROOT)}, work)
        if patterns:
            ok = {cmd: named(got[cmd], patterns) for cmd in ("verify", "diff", "history")}
            ok["divergence"] = (got["parts"] == "no") or named(got["divergence"], patterns)
        else:
            ok = {"verify": got["verify_relevant"] == 0, "diff": got["diff_relevant"] == 0,
                  "history": not got["history"], "divergence": got["parts"] == "no"}
            if name == MOVED:  # listed once, as moved
                ok["diff"] = ok["diff"] and got["diff_moved"] == 1
                note = f"{got['diff_moved']} moved row(s)"
        rows.append((name, note, (got, ok)))
    print(f"{'change':22} {'verify names first':44} {'ok':4} {'diff':5} {'hist':5} {'parts':8} {'why':5}  "
          "relevant v/d")
    passed = 0
    for name, note, result in rows:
        if result is None:
            print(f"{name:22} {note}")
            continue
        got, ok = result
        first = (got["verify"] or ["-"])[0]
        marks = {k: "yes" if v else "NO" for k, v in ok.items()}
        print(f"{name:22} {first[:44]:44} {marks['verify']:4} {marks['diff']:5} {marks['history']:5} {got['parts'][:8]:8} "
              f"{marks['divergence']:5}  {got['verify_relevant']}/{got['diff_relevant']}"
              + (f"  ({note})" if note else ""))
        passed += all(ok.values())
    counted = sum(1 for r in rows if r[2] is not None)
    print(f"{passed} of {counted} named first by verify, diff, history and the divergence explanation "
          f"(controls: 0 result-relevant); {time.perf_counter() - started:.0f} s; runs in {work}")
    return 0 if passed == counted else 1


if __name__ == "__main__":
    sys.exit(main())
