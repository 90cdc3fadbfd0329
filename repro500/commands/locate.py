"""``repro500 locate``: the first step and the first operator where two runs part, and why.

Thin: what it does is repro500.locate.locate's; this parses the options and prints the answer
(progress on stderr, a line a step; the answer on stdout).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from repro500.untrusted import record_console


@click.command()
@click.argument("a", metavar="A", type=click.Path(path_type=Path))
@click.argument("b", metavar="[B]", type=click.Path(path_type=Path), required=False)
@click.option("--repeat", "repeat", type=click.IntRange(0), default=None,
              help="A's repeat (default: the first that shares a seed with one of B's).")
@click.option("--other-repeat", "other_repeat", type=click.IntRange(0), default=None,
              help="B's repeat (default: the one sharing A's repeat's seed, the same index first).")
@click.option("--steps", type=click.IntRange(1), default=None,
              help="Replay this many steps (default: up to the first step the records part at).")
@click.option("--rtol", type=click.FloatRange(0.0, 1.0, min_open=True), default=None,
              help="Relative tolerance for the first step whose difference is beyond rounding (default 1e-3).")
@click.option("--python-a", metavar="PYTHON", default=None,
              help="The interpreter A's replay runs in (default: the venv reproduce --env venv built for A, else "
                   "this one).")
@click.option("--python-b", metavar="PYTHON", default=None, help="The interpreter B's replay runs in.")
@click.option("--run-code", is_flag=True,
              help="Let the own experiment code (a plug-in model or data set) of a packed run or a publication "
                   "run in its replay; without it, such a run is refused.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1.0), default=600.0, show_default=True,
              help="Seconds one replay may take.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@click.option("--network", is_flag=True,
              help="With --run-code: give the sandboxed replays the network (they have none by default).")
@click.option("--sandbox-ro", "sandbox_ro", multiple=True, metavar="PATH", type=click.Path(path_type=Path),
              help="With --run-code: also let the sandboxed replays read PATH (read-only; repeatable).")
@click.option("--no-sandbox", is_flag=True,
              help="With --run-code: replay the runs' own code unconfined, with your user's rights (a second "
                   "consent, said in the answer).")
@click.pass_context
def locate(ctx: click.Context, a: Path, b: Path | None, repeat: int | None, other_repeat: int | None,
           steps: int | None, rtol: float | None, python_a: str | None, python_b: str | None, run_code: bool,
           timeout_s: float, as_json: bool, network: bool, sandbox_ro: tuple[Path, ...], no_sandbox: bool) -> None:
    """Say where runs A and B part: the first step, the first operator, and the likely cause.

    A and B are run directories, packed runs or publications (a rerun and its publication);
    with A alone, two of its repeats that share a seed (repro500 run --same-seed). The
    per-step records give the first step where the pair's loss (or any other per-step
    quantity) is not bitwise equal. Both repeats are then replayed from their recorded seeds
    up to that step, each in its own process with its run's recorded thread and kernel
    settings (OMP_*, MKL_*, DNNL_*, ...) and, for a reproduction made with reproduce --env venv,
    in the venv it was built in, under a mode that hashes every operator's output;
    the answer is the first operator whose inputs agree and whose output does not: its name,
    the module it ran in, forward/backward/optimizer, the step, and the largest absolute and
    relative difference. Nothing is claimed past it. The replays run the runs' training
    code: the own code (plug-ins) of a packed run or a publication only with --run-code,
    and then in a sandbox (bubblewrap; docs/trust.md) unless --no-sandbox.

    \b
    Exit codes: 0 located (or the runs do not part), 2 usage error (also: a packed
                run's or publication's own code would run without --run-code),
                3 the replays do not part where the records do (not reproduced here),
                4 invalid input (missing, corrupt or tampered runs, no shared seed; with
                --run-code: bwrap missing or unable to sandbox here).
    """
    from repro500.locate import locate as locating

    found = locating(a, b, repeat=repeat, other_repeat=other_repeat, steps=steps, rtol=rtol, python_a=python_a,
                     python_b=python_b, run_code=run_code, timeout_s=timeout_s, progress=_progress,
                     no_sandbox=no_sandbox, network=network, sandbox_ro=[str(p) for p in sandbox_ro])
    _show(found.answer, as_json, found.plan)
    if found.exit_code:
        ctx.exit(found.exit_code)


def _progress(text: str) -> None:
    """A step as it happens, on stderr: stdout stays the answer."""
    from repro500.untrusted import SENTENCE_CHARS, plain

    click.echo(f"repro500 locate: {plain(text, SENTENCE_CHARS)}", err=True)


def _g(value: Any) -> str:
    return "-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


def _environments(by_side: dict[str, dict[str, str | None]]) -> str:
    """What each replay's environment was set to, the differences first, what both got last."""
    def shown(values: dict[str, str | None]) -> str:
        return ", ".join(f"{k}={'(unset)' if v is None else v}" for k, v in sorted(values.items()))

    sides = list(by_side.values())
    both = {k: v for k, v in sides[0].items() if all(k in s and s[k] == v for s in sides)} if sides else {}
    parts = [f"{side}: {shown({k: v for k, v in values.items() if k not in both})}"
             for side, values in by_side.items() if any(k not in both for k in values)]
    if both:
        parts.append(f"both: {shown(both)}")
    return "; ".join(parts) or "this one, for both"


def _show(answer: dict[str, Any], as_json: bool, plan: Any) -> None:
    if as_json:
        click.echo(json.dumps(answer, indent=2, sort_keys=True, allow_nan=False, default=str))
        return

    from repro500.untrusted import SENTENCE_CHARS, shown

    console = record_console()
    a, b = answer["a"], answer["b"]
    console.print(f"[bold]repro500 locate[/] {shown(a['run'])} repeat {shown(a['repeat'])} vs {shown(b['run'])} repeat "
                  f"{shown(b['repeat'])}", highlight=False)
    console.print(f"[bold]Records[/]  {shown(plan.pair.detail)}", highlight=False)
    if plan.pair.causes and answer.get("operator") is None:  # the one comparison's differences, as verify names them
        console.print(f"[bold]Recorded differences[/]  {len(plan.pair.causes)} result-relevant, first "
                      f"{shown(plan.pair.causes[0]['key'])}", highlight=False)
    if answer.get("operator") is None:
        why = ("nothing to replay: the runs do not part" if not plan.pair.diverged else
               f"they part in what they wrote at the end ({plan.pair.quantity}), every recorded step agreeing: "
               "nothing to replay step by step" if plan.pair.shape == "final state" else
               "the training steps agree: locate replays training steps, and these runs part after them "
               "(give --steps N to replay anyway)")
        console.print(f"  {shown(why, SENTENCE_CHARS)}", highlight=False)  # an output's name is the run's word
        return
    finding = answer["operator"]
    replays = finding["replays"]
    env = _environments(answer["environments"])
    console.print(f"[bold]Replayed[/]  up to step {answer['steps']}, each in its run's environment ({shown(env)}): "
                  f"{len(replays)} replays, {finding['ops_hashed']:,} operators hashed, {finding['seconds']:.1f} s",
                  highlight=False)
    for side, names in (answer.get("environments_not_set") or {}).items():
        console.print(f"  [dim]{side}'s run recorded {shown(', '.join(names))}: not set for its replay (a replay "
                      "takes thread and kernel settings only, never a library or plug-in loader)[/]", highlight=False)
    for side, used in (answer.get("interpreters") or {}).items():
        if used["recorded"] and Path(used["recorded"]) != Path(used["replayed"]):
            console.print(f"  [dim]{side} ran under {shown(used['recorded'])} (Python {shown(used['recorded_version'])}), "
                          f"replayed under {shown(used['replayed'])}: --python-{side.lower()} replays it in its own[/]",
                          highlight=False)
    for r in replays[:2]:
        if r.get("first_record_difference") and r["first_record_difference"]["step"] < (finding.get("step") or 10**9):
            d = r["first_record_difference"]
            console.print(f"  [yellow]the replay of {r['side']} does not reproduce its records from step {shown(d['step'])} "
                          f"(loss {shown(repr(d['replayed']))} replayed, {shown(repr(d['recorded']))} recorded): its environment is not "
                          "the one it ran in[/]", highlight=False)
    if not finding["found"]:
        console.print(f"[bold yellow]Not located[/]  the replays agree at every operator of {answer['steps']} steps: "
                      "the divergence the records show is not reproduced here", highlight=False)
        return
    _show_operator(console, finding, answer.get("cause") or {})


def _show_operator(console: Any, finding: dict[str, Any], cause: dict[str, Any]) -> None:
    from repro500.untrusted import shown

    module = finding["module"] or "(the model itself)" if finding["phase"] != "optimizer" or finding["module"] else ""
    where = f"{finding['op']}  in {module}" if module else finding["op"]
    console.print(f"[bold]First operator[/]  {shown(where)}  ({shown(finding['phase'])}, step {shown(finding['step'])})",
                  highlight=False)
    if finding.get("max_abs") is not None:
        first = finding["outputs"][0]
        console.print(f"  max |Δ| {_g(finding['max_abs'])}, max relative {_g(finding['max_rel'])} (output "
                      f"{shown(first['output'])}: {shown(first['dtype'])} {shown(first['shape'])}, "
                      f"{shown(first.get('differing', '?'))} of {shown(first['elements'])} elements differ)", highlight=False)
    if finding.get("inputs_agree") is True:
        console.print("  its inputs agree bitwise", highlight=False)
    elif finding.get("inputs_agree") is False:
        which = ", ".join(shown(d["input"]) for d in finding["differing_inputs"][:4])
        console.print(f"  its input(s) {which} already differ, though every recorded operator before agrees: the "
                      "difference entered from outside the operators", highlight=False)
    for side, same in finding["self_consistent"].items():
        if same is False:
            console.print(f"  [yellow]{side} gives a different output here in two replays of itself[/]", highlight=False)
    if cause.get("explanation"):
        console.print(f"[bold]Cause[/]  {shown(cause['explanation'])}", highlight=False)
        for c in cause.get("causes", [])[1:4]:
            console.print(f"  also recorded: {shown(c['key'])} ({shown(_g(c['run']))} vs {shown(_g(c['reference']))})",
                          highlight=False)
    console.print("[dim]Nothing is claimed past this operator: after it, everything may differ.[/]", highlight=False)
