"""What a person watching ``repro500 run`` sees: progress bars on a terminal, plain lines
elsewhere (CI logs, ``| tee``: a bar that redraws in place prints nothing there until it
ends), and the table of repeats at the end."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from repro500.untrusted import SENTENCE_CHARS, shown, terminal_safe
from repro500.workloads.workload import Progress as Hooks


class Display:
    def __init__(self, console: Console, planned: int, done: int) -> None:
        self.console = console
        self.live = console.is_terminal
        self.planned = planned
        self.done = done
        self._bars: Progress | None = None
        self._repeats_task: Any = None
        self._states: dict[int, Any] = {}  # repeat -> its line, when repeats run side by side

    @contextmanager
    def running(self) -> Iterator[Display]:
        if not self.live:
            yield self
            return
        self._bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), console=self.console, transient=True)
        with self._bars:
            self._repeats_task = self._bars.add_task("repeats", total=self.planned, completed=self.done)
            yield self

    def say(self, text: str) -> None:
        self.console.print(text)

    @contextmanager
    def repeat(self, k: int, epochs: int | None) -> Iterator[Hooks]:
        """Progress hooks for repeat k: a bar per epoch on a terminal, a line per epoch elsewhere."""
        bars = self._bars
        task = bars.add_task(f"repeat {k}", total=None) if bars else None
        if not self.live:
            self.say(f"repeat {k} ({k + 1} of {self.planned}): started")

        def on_epoch_start(epoch: int, steps: int) -> None:
            if bars is not None:
                bars.reset(task, total=steps, description=f"repeat {k} epoch {epoch}/{epochs}")

        def on_step(record: dict[str, Any]) -> None:
            if bars is not None:
                bars.advance(task)

        def on_epoch_end(record: dict[str, Any], steps: list[dict[str, Any]]) -> None:
            if not self.live:
                said = ", ".join(f"{shown(name)} {shown(_fmt(v))}" for name, v in list((record.get("metrics") or {}).items())[:3])
                self.say(f"repeat {k} epoch {shown(record.get('epoch'))}/{epochs}: {said or 'no evaluation'} "
                         f"({shown(_fmt(record.get('wall_s')))} s)")

        def on_line(stream: str, line: str) -> None:
            # A command's own output, passed through as it came: never re-wrapped at the console's
            # width (an :::MLLOG record split in two is no record), only made terminal-safe.
            text = terminal_safe(line.rstrip("\n"))
            if not self.live:
                self.console.file.write(text + "\n")
                self.console.file.flush()
                return
            # above the progress bars: through rich, as text (a script's "[red]" is no markup), unwrapped
            self.console.print(Text(text, style="dim" if stream == "stderr" else ""), soft_wrap=True, highlight=False)

        try:
            yield Hooks(on_epoch_start, on_step, on_epoch_end, on_line)
        finally:
            if bars is not None:
                bars.remove_task(task)
                bars.advance(self._repeats_task)

    # ----- repeats side by side (runner/fanout.py): a line per repeat with its state and time --
    def queued(self, ks: list[int]) -> None:
        if self._bars is None:
            self.say(f"repeats {', '.join(map(str, ks))}: queued")
            return
        self._states = {k: self._bars.add_task(f"repeat {k}: queued", total=None, start=False) for k in ks}

    def waiting(self, k: int, state: str) -> None:
        """A repeat handed to a scheduler that has not started it yet (queued as SLURM job ...)."""
        if self._bars is None:
            self.say(f"repeat {k} ({k + 1} of {self.planned}): {state}")
            return
        self._bars.update(self._states[k], description=f"repeat {k}: {state}")

    def started(self, k: int, where: str) -> None:
        if self._bars is None:
            self.say(f"repeat {k} ({k + 1} of {self.planned}): running on {where}")
            return
        self._bars.start_task(self._states[k])
        self._bars.update(self._states[k], description=f"repeat {k}: running on {where}")

    def ended(self, k: int, summary: dict[str, Any], elapsed_s: float) -> None:
        status = shown(summary.get("status"))
        if self._bars is None:
            error = f": {shown(summary['error'])}" if summary.get("error") else ""
            self.say(f"repeat {k} ({k + 1} of {self.planned}): {status} after {elapsed_s:.1f} s{error}")
            return
        self._bars.stop_task(self._states[k])
        self._bars.update(self._states[k], description=f"repeat {k}: {status}", total=1, completed=1)
        self._bars.advance(self._repeats_task)

    def finished(self, k: int, summary: dict[str, Any]) -> None:
        if not self.live:
            error = f": {shown(summary['error'], SENTENCE_CHARS)}" if summary.get("error") else ""
            self.say(f"repeat {k} ({k + 1} of {self.planned}): {shown(summary.get('status'))}{error}")

    def table(self, name: str, summaries: dict[int, dict[str, Any]], metrics: list[str], *, trained: bool) -> None:
        """One row per repeat: status, the metrics that decide it, and (trained) the time to
        quality, throughput and final parameter digest, or (command) wall time and exit status."""
        # the recipe's name and metric names may be a publication's (reproduce): shown, never markup
        table = Table(title=f"{shown(name)}: {len(summaries)} repeats")
        extra = (["epochs", *metrics, "time_to_quality_s", "throughput_samples_per_s", "params"] if trained
                 else [*metrics, "total_time_s", "exit", "digest"])
        for col in ("repeat", "status", *extra):
            table.add_column(shown(col))
        for k in sorted(summaries):
            s = summaries[k]
            m = s.get("metrics") or {}
            values = [_fmt(m.get(name)) for name in metrics]
            if trained:
                row = [str(s.get("epochs_run", "")), *values, _fmt(s.get("time_to_quality_s")),
                       _fmt(m.get("throughput_samples_per_s")), (s.get("final_param_digest") or "")[:12]]
            else:
                row = [*values, _fmt(s.get("total_time_s")), _fmt(s.get("exit_status")),
                       (s.get("final_param_digest") or "")[:12]]
            table.add_row(str(k), shown(s.get("status", "?")), *map(shown, row))
        self.console.print(table)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
