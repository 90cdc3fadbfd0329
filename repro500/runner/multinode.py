"""A run on several nodes: what the nodes must agree on, and what a resume must keep.

Every node starts its own ``repro500 run``; nothing but the rendezvous makes them one run.  So
before the first step each node states what it is about to run and node 0 compares
(:mod:`repro500.workloads.engines.nodes`): a different ``--set`` on one node, another version of
repro500 or of a plug-in, or other data stop every node with one sentence naming the key and the
nodes.  A resume keeps the run's own topology: the world size a repeat ran with is part of its
result.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import repro500
from repro500 import redact
from repro500.capture.data import digest_paths
from repro500.capture.source import package_digest
from repro500.digest import file_digest, tree_digest
from repro500.errors import UsageError
from repro500.runner.plan import Plan, RunOptions
from repro500.workloads.engines import nodes


def fingerprint(plan: Plan, run_id: str, sequential: bool = False, with_torch: bool = True) -> dict[str, str]:
    """What a node is about to run, key by key (values scrubbed of secrets, as they are shown):
    the recipe with every override, the topology, the study design (a factorial run's sources and
    cells, whether it is sequential; --max-repeats shows as the repeats it plans), the code
    (repro500's, the experiment's plug-in modules, the plug-in distributions' versions, torch's) and
    the data digests.  *with_torch* false: torch is left out (a command's repeat never imports it,
    and importing it costs each of a job array's tasks seconds)."""
    recipe = plan.recipe
    out = {"run_id": run_id, "engine": plan.engine, "nproc": str(plan.nproc), "nnodes": str(plan.nnodes),
           "device": plan.device, "same_seed": str(plan.same_seed).lower(),
           "design.vary": ",".join(plan.vary or []) or "-", "design.repeats_per_cell": str(plan.per_cell or "-"),
           "design.until_decided": str(sequential).lower(),
           "code.repro500": f"{repro500.__version__}+{package_digest(Path(repro500.__file__).parent)[:16]}"}
    if with_torch:
        import torch

        out["code.torch"] = f"{torch.__version__} (cuda {torch.version.cuda})"
    describe = getattr(plan.workload, "describe", None)
    plugins = (describe() if callable(describe) else {}).get("plugins") or {}
    out.update({f"code.plugin.{name}": str(version) for name, version in plugins.items()})
    # Two different secrets both read "<redacted>": a recipe that keeps secrets in its values is
    # compared on everything else.
    out.update({key: str(value) for key, value in redact.scrub(recipe.flat_params()).items()})
    described = plan.workload.source([])
    if described is not None:
        root, files = described
        out["code.experiment"] = tree_digest((file_digest(root / rel), rel) for rel in sorted(files)
                                             if (root / rel).is_file())[:16]

    for entry in digest_paths(plan.workload.data_paths()):
        out[f"data:{entry['path']}"] = entry["md5"]
    return out


def agree(plan: Plan, run_id: str, todo: list[int] | None = None, run_dir: str | None = None,
          sequential: bool = False) -> list[int]:
    """Compare this node with the others (node 0 gives the repeats to run); a no-op on one node."""
    if plan.rendezvous is None:
        return list(todo or [])

    return nodes.link(plan.rendezvous).agree(fingerprint(plan, run_id, sequential), todo, run_dir)


def check_resume(run: Any, meta: dict[str, Any], options: RunOptions, plan: Plan) -> None:
    """A resume runs the missing repeats on the run's own topology, or says how to relaunch it."""
    nnodes = int(meta.get("nnodes") or 1)
    world = meta.get("world_size")
    tasks = meta.get("launcher") or {}
    if nnodes > 1 and tasks.get("kind") == "slurm" and options.launcher != "slurm":
        raise UsageError(f"run {run} ran each repeat as a SLURM task of {nnodes} nodes (world size {world}); resume "
                         f"it with `repro500 run --resume {run} --launcher slurm`, whose tasks keep {nnodes} nodes")
    if nnodes > 1 and options.nnodes != nnodes:
        given = "on one node" if options.nnodes == 1 else f"on {options.nnodes} nodes"
        raise UsageError(
            f"run {run} ran on {nnodes} nodes (world size {world}); resuming it {given} would change its world "
            f"size. Resume it on all {nnodes} nodes: on node 0 `repro500 run --resume {run} --nnodes {nnodes} "
            f"--node-rank 0 --rdzv-endpoint HOST:PORT`, and on every other node the command that started it "
            f"there, with the same --rdzv-endpoint")
    if nnodes == 1 and options.nnodes > 1:
        raise UsageError(f"run {run} ran on one node; resume it without --nnodes")
    if world is not None and plan.world_size != int(world):
        # --resume takes no --nproc (a resume reruns the run as recorded): the records disagree, and
        # what ran cannot be completed as it was
        recipe = meta.get("recipe_path") or "RECIPE"
        raise UsageError(f"run {run} ran with world size {world} ({meta.get('engine') or plan.engine}), but its "
                         f"recipe.yaml plans {plan.world_size} rank(s) (mutable.nproc {plan.nproc} on {nnodes} "
                         f"node(s)): its records disagree, so it cannot be resumed as it ran; start a new run with "
                         f"`repro500 run {recipe} --nproc {max(1, int(world) // nnodes)}`")


def follow_repeat(plan: Plan, k: int, scratch: Path) -> None:
    """Host this node's ranks of repeat *k* (a node other than 0): they train with the others, and
    what they write goes to *scratch*, since node 0 alone writes the run directory."""
    # the trainer imports torch: not before a node has to train (a refused run never pays for it)
    from repro500.workloads.engines import launch

    out = scratch / str(k)
    out.mkdir()
    spec = plan.workload.spec()  # type: ignore[attr-defined]
    at_k = dataclasses.replace(spec, deterministic=plan.deterministic_at(k))  # a factorial run's kernels cell
    launch.run_distributed(plan.engine, plan.nproc, at_k, k, plan.seeds(k), out, rendezvous=plan.rendezvous,
                           varied=plan.varied(k), expect_summary=False)
