"""A node other than 0 of a multi-node run: it only hosts ranks; node 0 captures, logs and writes."""

from __future__ import annotations

import tempfile
from pathlib import Path

from rich.console import Console

from repro500.runner import multinode
from repro500.runner.plan import RunOptions, design_repeats, load_recipe, make_plan
from repro500.runner.session import RunOutcome


def follow_node(options: RunOptions, console: Console) -> RunOutcome:
    options = design_repeats(options)  # a factorial run's repeats, as node 0 plans them
    recipe = load_recipe(options)
    if recipe.is_command:
        from repro500.errors import UsageError

        raise UsageError("--node-rank is for trained workloads on a multi-node engine")
    plan = make_plan(recipe, options)
    assert options.run_id is not None
    # node 0 says which repeats (a resume runs the missing ones)
    todo = multinode.agree(plan, options.run_id, sequential=options.until_decided)
    with tempfile.TemporaryDirectory(prefix="repro500-node-") as scratch:
        for k in todo:
            console.print(f"node {options.node_rank}: repeat {k} of run {options.run_id}")
            multinode.follow_repeat(plan, k, Path(scratch))
    return RunOutcome(Path(options.out_dir) / options.run_id, 0)
