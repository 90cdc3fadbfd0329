"""``repro500 locate``'s answer as the terminal shows it (``--json`` prints the answer itself)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repro500.untrusted import SENTENCE_CHARS, shown


def _g(value: Any) -> str:
    return "-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


def _environments(by_side: dict[str, dict[str, str | None]]) -> str:
    """What each replay's environment was set to, the differences first, what both got last."""
    def listed(values: dict[str, str | None]) -> str:
        return ", ".join(f"{k}={'(unset)' if v is None else v}" for k, v in sorted(values.items()))

    sides = list(by_side.values())
    both = {k: v for k, v in sides[0].items() if all(k in s and s[k] == v for s in sides)} if sides else {}
    parts = [f"{side}: {listed({k: v for k, v in values.items() if k not in both})}"
             for side, values in by_side.items() if any(k not in both for k in values)]
    if both:
        parts.append(f"both: {listed(both)}")
    return "; ".join(parts) or "this one, for both"


def show(answer: dict[str, Any], plan: Any, console: Any) -> None:
    """The answer of :func:`repro500.locate.locate` for the terminal: the records' first step, the
    replays, the first operator and its likely cause.  Every name in it (runs, operators, modules,
    variables) is a record's text, shown escaped."""
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
