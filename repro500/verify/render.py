"""The one-screen terminal summary of a verdict (rich).

Every string of the verdict goes through :func:`repro500.untrusted.shown` on its way into rich
markup: a reason, a name or a note may quote what a run or a stored verdict.json chose."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from repro500.statuses import (
    FAIL,
    FOUND,
    INCONCLUSIVE,
    INVALID,
    NOT_REPRODUCED,
    OK,
    PASS,
    REPRODUCED,
    SKIPPED,
    WARN,
)
from repro500.untrusted import SENTENCE_CHARS, record_console, shown

if TYPE_CHECKING:  # the verdict module imports this one
    from repro500.verify.verdict import Verdict

STYLES = {
    PASS: "bold green", REPRODUCED: "bold green", FAIL: "bold red",
    NOT_REPRODUCED: "bold red", INCONCLUSIVE: "bold yellow", INVALID: "bold magenta",
    SKIPPED: "dim", OK: "green", WARN: "bold yellow", "REGRESSION": "bold red", "IMPROVEMENT": "bold green", "EQUIVALENT": "bold green",
}
MAX_STAT_ROWS = 8


def _g(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return shown(value)  # into rich markup, and a stored verdict's "number" may be any string


def _status(text: str) -> str:
    return f"[{STYLES.get(text, 'bold')}]{shown(text, SENTENCE_CHARS)}[/]"


def render(verdict: Verdict, console: Console | None = None) -> None:
    """Print the verdict: status and why, then one short block per section."""
    console = console or record_console()
    headline = _status(verdict.status) + (" [bold green](exact)[/]" if verdict.exact else "")
    if verdict.different_benchmark:  # never a bare REPRODUCED across benchmarks
        headline += f" [bold yellow](different benchmark: {shown(verdict.different_benchmark)})[/]"
    # The verdict's own line comes first, before any string the record chose, and the lines that
    # name the run and the reference are cut at the terminal's width rather than wrapped: whatever a
    # benchmark or a citation holds, it cannot start a line that reads as a verdict.
    console.print(f"{headline}  (exit {verdict.exit_code})", no_wrap=True, overflow="ellipsis")
    head = f"[bold]repro500 verify[/] {shown(verdict.run_dir)}"
    against = verdict.against or {}
    if against:
        head += f"  against {shown(against.get('benchmark') or against.get('label') or against.get('path'))}"
    console.print(f"{head}  (alpha = {verdict.alpha:g})", highlight=False, no_wrap=True, overflow="ellipsis")
    if against.get("source"):
        citation = shown(against["source"].get("citation", ""), 110)
        console.print(f"  [dim]source: {citation}[/]", highlight=False, no_wrap=True, overflow="ellipsis")
    for reason in verdict.reasons[:6]:
        console.print(f"  {shown(reason, SENTENCE_CHARS)}", highlight=False)
    _integrity(verdict, console)
    if verdict.status == INVALID:
        _advice(verdict, console)
        return
    _design(verdict, console)
    _variance(verdict, console)
    _nodes(verdict, console)
    _bands(verdict, console)
    _equivalence(verdict, console)
    _statistics(verdict, console)
    _other_sections(verdict, console)
    _advice(verdict, console)


def _design(verdict: Verdict, console: Console) -> None:
    d = verdict.design
    if not d:
        return
    level = f"nominal level {d['nominal_level']:.3g}" if d.get("nominal_level") is not None else "before the first look"
    stopped = (f"stopped when decided after {_g(d['stopped_at'])}" if d.get("stopped_at") else _g(d.get("look")))
    console.print(f"[bold]Sequential design[/]  {stopped} of up to {_g(d.get('max_repeats'))} repeats; decisions at {level} "
                  f"({_g(d.get('spending'))} spending of alpha {verdict.alpha:g}; docs/verify.md)", highlight=False)
    if d.get("stop_check"):
        console.print(f"  stopping point: {shown(d['stop_check'], SENTENCE_CHARS)}", highlight=False)


def _variance(verdict: Verdict, console: Console) -> None:
    from rich.table import Table

    for result in verdict.variance or []:
        table = Table(title=f"Where the variance of {shown(result.metric)} comes from (factorial run)", title_justify="left",
                      box=None)
        for column in ("source", "n", "sd", "variance [95% CI]", "share [90% CI]", "repeats if only it"):
            table.add_column(column)
        for c in result.components:
            if c.variance is None:
                table.add_row(shown(c.source), str(c.n), "-", "-", "-", "-")
                continue
            ci = f"{c.variance:.3g} [{c.ci[0]:.3g}, {c.ci[1]:.3g}]" if c.ci else f"{c.variance:.3g}"
            share = (f"{c.share:.0%} [{c.share_ci[0]:.0%}, {c.share_ci[1]:.0%}]" if c.share is not None and c.share_ci
                     else "(all together)" if c.source == "seed" else "-")
            table.add_row(shown(c.source), str(c.n), f"{c.sd:.3g}", ci, share,
                          "not reachable" if c.repeats_needed is None else str(c.repeats_needed))
        console.print(table)
        if result.dominant:
            console.print(f"  dominant source: {shown(result.dominant)}", highlight=False)
        for note in result.notes:
            console.print(f"  [dim]{shown(note, SENTENCE_CHARS)}[/]", highlight=False)


def _nodes(verdict: Verdict, console: Console) -> None:
    from rich.table import Table

    for split in verdict.nodes or []:
        p = "no test (two nodes with two repeats each needed)" if split.p_value is None else f"p = {split.p_value:.3g}"
        table = Table(title=f"{shown(split.metric)} by node (one-way ANOVA {p})", title_justify="left", box=None)
        for column in ("node", "n", "mean", "sd"):
            table.add_column(column)
        for g in split.groups:
            table.add_row(shown(g.node, 40), str(g.n), f"{g.mean:.6g}", "-" if g.sd is None else f"{g.sd:.3g}")
        console.print(table)


def _integrity(verdict: Verdict, console: Console) -> None:
    for label, check in (("Integrity", verdict.integrity), ("Reference integrity", verdict.reference_integrity)):
        if check is None:
            continue
        if check.ok:
            line = f"ok: {check.files_checked} files match SHA256SUMS (digest {shown((check.sums_digest or '')[:16])})"
        else:
            line = f"[magenta]{len(check.problems)} problem(s)[/]" + (
                " (listed above)" if verdict.status == INVALID else ": " + "; ".join(map(shown, check.problems[:3])))
        console.print(f"[bold]{label}[/]  {line}", highlight=False)
        for text in (check.warnings[:3] + check.notes[:2]):
            console.print(f"  [dim]{shown(text, SENTENCE_CHARS)}[/]", highlight=False)


def _bands(verdict: Verdict, console: Console) -> None:
    if not verdict.bands:
        return
    table = Table(title="Bands (one-sided bound across repeats)", title_justify="left", box=None, pad_edge=False)
    for col in ("metric", "band", "n", "mean", "bound", "status"):
        table.add_column(col)
    for b in verdict.bands:
        higher = b.direction == "higher"
        sign = ">=" if higher else "<="
        # the bound that decided, as the verdict names it (bands.py): the same number in every record
        decided = f"{b.bound_side} {_g(b.bound)}" if b.bound is not None else "-"
        table.add_row(shown(b.metric), f"{sign} {_g(b.threshold)}", _g(b.n), _g(b.mean), decided, _status(b.status))
    console.print(table)


def _equivalence(verdict: Verdict, console: Console) -> None:
    if not verdict.equivalence:
        return
    history = (verdict.against or {}).get("history")
    console.print("[bold]Against the history[/]" if history else "[bold]Equivalence to the reference[/]")
    if history:
        runs = history.get("runs") or []
        console.print(f"  [dim]{len(runs)} earlier run(s) of this recipe on this system, newest {shown(history.get('latest'))}; "
                      f"{len(history.get('skipped') or [])} other run(s) left out (verdict.json: against.history)[/]",
                      highlight=False)
    for e in verdict.equivalence:
        t = e.tost
        interval = "no interval"
        if t.get("ci_low") is not None:
            interval = f"{100 * t['ci_confidence']:.4g}% CI [{_g(t['ci_low'], 3)}, {_g(t['ci_high'], 3)}]"
        margin = f"margin ±{_g(e.margin)}" if e.test == "equivalence" else f"non-inferiority margin {_g(e.margin)}"
        p = f", p = {_g(e.p_value, 2)}" if e.p_value is not None else ""
        decided = _status(e.change.upper()) if e.change else _status(e.status)
        console.print(f"  {shown(e.metric)}  {decided}  diff {_g(t.get('diff'), 3)}, {interval}, {margin}{p}",
                      highlight=False)
        ref = f"{_g(t.get('mean_b'))} (n={_g(t['n_b'])})" if t.get("n_b") else f"{_g(t.get('mean_b'))} (exact value)"
        if history and (history.get("pooling") or {}).get(e.metric):
            ref += f", {shown(history['pooling'][e.metric])}"
        console.print(f"    [dim]run {_g(t.get('mean_a'))} (n={_g(t.get('n_a'))}) vs reference {ref}; "
                      f"{shown(t.get('method'))}; margin from {shown(e.margin_source)}[/]", highlight=False)
        if t.get("design_reason"):  # which design decided, and why: paired by seed or not
            console.print(f"    [dim]{shown(t['design_reason'], SENTENCE_CHARS)}[/]", highlight=False)


def _statistics(verdict: Verdict, console: Console) -> None:
    if not verdict.statistics:
        return
    decisive = [b.metric for b in verdict.bands] + [e.metric for e in verdict.equivalence or []]
    names = [n for n in verdict.statistics if n in decisive or n == "time_to_quality_s"]
    names = names or list(verdict.statistics)[:MAX_STAT_ROWS]
    conf = f"{1 - verdict.alpha:.0%}"
    # Two narrow tables, not one wide one: at 80 columns a single table wrapped its median
    # interval mid-cell. Cells never wrap (a name too long for the terminal is cut with "...").
    table = Table(title="Statistics across repeats", title_justify="left", box=None, pad_edge=False)
    for col in ("metric", "n", "mean ± std", "cv", f"{conf} t-interval"):
        table.add_column(col, no_wrap=True, overflow="ellipsis")
    medians = Table(title="Medians (order-statistic intervals)", title_justify="left", box=None,
                    pad_edge=False)
    for col in ("metric", "median", "interval", "confidence"):
        medians.add_column(col, no_wrap=True, overflow="ellipsis")
    for name in names:
        s = verdict.statistics[name]
        ci = "-" if s["ci_low"] is None else f"[{_g(s['ci_low'])}, {_g(s['ci_high'])}]"
        mean = _g(s["mean"]) + (f" ± {_g(s['std'], 2)}" if s["std"] is not None else "")
        cv = "-" if s["cv"] is None else f"{s['cv']:.2%}"
        table.add_row(shown(name), str(s["n"]), mean, cv, ci)
        if s.get("median_ci_low") is not None:
            medians.add_row(shown(name), _g(s["median"]), f"[{_g(s['median_ci_low'])}, {_g(s['median_ci_high'])}]",
                            f"{s['median_ci_confidence']:.0%}")
    console.print(table)
    if medians.row_count:
        console.print(medians)
    hidden = len(verdict.statistics) - len(names)
    if hidden > 0:
        console.print(f"  [dim]{hidden} more metric(s) in verdict.json (repro500 verify --json)[/]")


def _other_sections(verdict: Verdict, console: Console) -> None:
    """One block per remaining section the verdict holds, in the order of docs/verify.md."""
    _time_to_train(verdict, console)
    _determinism(verdict, console)
    _divergence(verdict, console)
    _gains(verdict, console)
    _one_line(verdict.sampling, "Sampling", console)
    _one_line(verdict.mlperf, "MLPerf", console)
    _exact_replay(verdict, console)
    _provenance(verdict, console)
    _valid_flops(verdict, console)


def _one_line(section: Any, title: str, console: Console) -> None:
    """A section told by its status and reason alone."""
    if section is not None:
        console.print(f"[bold]{title}[/]  {_status(section.status)} {shown(section.reason, SENTENCE_CHARS)}", highlight=False)


def _time_to_train(verdict: Verdict, console: Console) -> None:
    t = verdict.time_to_train
    if t is None:
        return
    ttq = t.time_to_quality_s
    line = ""
    if ttq.get("n"):
        om = ttq.get("olympic_mean")
        line = f"time_to_quality_s olympic mean {_g(om)}" if om is not None else f"time_to_quality_s mean {_g(ttq.get('mean'))}"
        line += f" (n={_g(ttq['n'])}); "
    console.print(f"[bold]Time-to-train[/]  {line}{_status(t.status)} {shown(t.reason, SENTENCE_CHARS)}", highlight=False)


def _determinism(verdict: Verdict, console: Console) -> None:
    d = verdict.determinism
    if d is None:
        return
    console.print(f"[bold]Determinism[/]  {_status(d.status)} {shown(d.reason, SENTENCE_CHARS)}", highlight=False)
    for text in d.notes[:2]:
        console.print(f"  [dim]{shown(text, SENTENCE_CHARS)}[/]", highlight=False)
    if d.cross_run:
        same = sum(1 for pair in d.cross_run if pair["identical"])
        console.print(f"  {same} of {len(d.cross_run)} repeat(s) sharing a seed with the reference end "
                      "with bitwise-identical parameters", highlight=False)


def _divergence(verdict: Verdict, console: Console) -> None:
    v = verdict.divergence
    if v is None or (v.status == SKIPPED and not v.seeds_differ):
        return
    # where the seeds differ from the reference's the reason says so first: no word before it
    state = ("[yellow]parted[/] " if v.status == FOUND else "" if v.seeds_differ else "[green]no divergence[/] ")
    console.print(f"[bold]Where the runs part[/]  {state}{shown(v.reason, SENTENCE_CHARS)}", highlight=False)
    if v.status == FOUND and v.first is not None and v.first.shape != "final state":  # nothing to replay there
        console.print("  [dim]repro500 locate names the first operator (docs/verify.md, \"Where two runs part\")[/]",
                      highlight=False)


def _gains(verdict: Verdict, console: Console) -> None:
    if not verdict.gains:
        return
    from repro500.verify.gains import describe

    console.print(f"[bold]Against the reference[/]  {shown(describe(verdict.gains))}", highlight=False)


def _exact_replay(verdict: Verdict, console: Console) -> None:
    r = verdict.exact_replay
    if r is None:
        return
    state = ("[bold green]exact[/]" if r.exact else
             "[yellow]not exact[/]" if r.metric_differences else "[dim]not exact[/]")
    console.print(f"[bold]Exact replay[/]  {state} {shown(r.reason, SENTENCE_CHARS)}", highlight=False)


def _provenance(verdict: Verdict, console: Console) -> None:
    p = verdict.provenance
    if p is None:
        return
    if not p.available:
        console.print(f"[bold]Provenance[/]  {shown(p.note, SENTENCE_CHARS)}", highlight=False)
        return
    relevant = f", {p.result_relevant} result-relevant" if p.result_relevant is not None else ""
    console.print(f"[bold]Provenance[/]  {p.total} difference(s) from the reference{relevant}", highlight=False)
    from repro500.verify.diff import relevance

    for row in p.top:
        key = f"{row['facet']}.{row['key']}" if row.get("key") else row["facet"]
        words = relevance(row["impact"]) if isinstance(row.get("impact"), int) else "impact"
        console.print(f"  {shown(key)}: {_g(row['run'])} vs {_g(row['reference'])}  [dim](impact "
                      f"{_g(row['impact'])}, {shown(words)}: {shown(row['reason'], SENTENCE_CHARS)})[/]", highlight=False)


def _valid_flops(verdict: Verdict, console: Console) -> None:
    f = verdict.valid_flops
    if f is None or not f.repeats:
        return
    first = f.repeats[0]
    summary = f.summary or {}
    ratio = (first["target"], first["achieved"]) if first.get("direction") == "lower" else (
        first["achieved"], first["target"])
    console.print(
        f"[bold]Valid FLOPS[/]  mean {_g(summary.get('mean'))} FLOP/s over {_g(summary.get('n', 0))} repeat(s); "
        f"repeat {_g(first['repeat'])}: {_g(first['flops_per_s'])} FLOP/s x ({_g(ratio[0])} / "
        f"{_g(ratio[1])})^{_g(first['exponent'])} = {_g(first['recomputed'])}", highlight=False)
    for text in f.mismatches[:2]:
        console.print(f"  [yellow]{shown(text, SENTENCE_CHARS)}[/]", highlight=False)


def _advice(verdict: Verdict, console: Console) -> None:
    for text in verdict.advice[:5]:
        console.print(f"[cyan]advice[/]  {shown(text, SENTENCE_CHARS)}", highlight=False)
