"""A rich progress bar on stderr for long data jobs, or nothing when it is not wanted."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def progress_bar(enabled: bool, label: str, total: int) -> Iterator[Callable[[], None]]:
    """Yield a function that advances the bar by one step (a no-op when disabled)."""
    if not enabled:
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(emoji=False, stderr=True), transient=False) as bar:
        task = bar.add_task(label, total=total)
        yield lambda: bar.advance(task)
