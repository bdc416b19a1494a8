"""Progress of a batch, on standard error: a live bar on a terminal, plain lines elsewhere.

On a terminal, rich draws files done out of the total, the sites found so far, the time spent
and the time left, and clears the bar when the batch ends (the summary follows). Elsewhere (CI
logs, pre-commit, a pipe) a plain line is printed every `every` files but at most one per
`gap` seconds, or after `seconds` without one when files are slow, and once at the end if any
was printed: a log gets a heartbeat, not a flood (a warm cache answers 2000 files in 0.1 s).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from jaxmigrate.model import FileResult


def track(
    results: Iterable[FileResult],
    total: int,
    console: Console,
    *,
    every: int = 100,
    gap: float = 1.0,
    seconds: float = 10.0,
) -> Iterator[FileResult]:
    """Yield `results` unchanged while showing how far the batch of `total` files has got."""
    if console.is_terminal:
        yield from _bar(results, total, console)
    else:
        yield from _lines(results, total, console, every, gap, seconds)


def _bar(results: Iterable[FileResult], total: int, console: Console) -> Iterator[FileResult]:
    columns = (
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("files, [bold]{task.fields[sites]}[/] sites found"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("migrating", total=total, sites=0)
        sites = 0
        for result in results:
            sites += len(result.sites)
            progress.update(task, advance=1, sites=sites)
            yield result


def line(done: int, total: int, sites: int, elapsed: float) -> str:
    """Return the plain progress line: files done, sites found, time spent and left."""
    text = f"jaxmigrate: {done}/{total} files, {sites} sites found, {elapsed:.1f}s"
    if 0 < done < total:
        text += f", about {elapsed / done * (total - done):.0f}s left"
    return text


def _lines(
    results: Iterable[FileResult],
    total: int,
    console: Console,
    every: int,
    gap: float,
    seconds: float,
) -> Iterator[FileResult]:
    start = time.monotonic()
    last: float | None = None  # when the last line was printed
    done = sites = 0
    for result in results:
        done += 1
        sites += len(result.sites)
        now = time.monotonic()
        due = done % every == 0 and (last is None or now - last >= gap)
        slow = now - (start if last is None else last) >= seconds
        if done < total and (due or slow):
            console.print(line(done, total, sites, now - start), highlight=False)
            last = now
        yield result
    if last is not None:
        console.print(line(done, total, sites, time.monotonic() - start), highlight=False)
