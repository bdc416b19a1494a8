"""What a run prints about its results, on a console or, without colour, as the text report."""

from __future__ import annotations

import io
from collections.abc import Sequence

from rich.console import Console

from jaxmigrate.model import Bucket, FileResult
from jaxmigrate.ui.diff import print_diff
from jaxmigrate.ui.summary import file_problem_line, print_summary, site_line, skip_line


def print_results(
    console: Console, results: Sequence[FileResult], *, dry_run: bool, show_diff: bool
) -> None:
    """Print diffs (dry run), the site and skip lines, file problems and the summary."""
    for result in results:
        if dry_run and show_diff and result.old_text is not None and result.new_text is not None:
            print_diff(console, result.old_text, result.new_text, result.path)
        for site in result.sites:
            console.print(site_line(result.path, site, dry_run=dry_run))
        for skip in result.skips:
            console.print(skip_line(result.path, skip))
        if result.bucket in (Bucket.FAILED, Bucket.SKIPPED):
            console.print(file_problem_line(result))
    print_summary(console, results, dry_run=dry_run)


def text_report(results: Sequence[FileResult], *, dry_run: bool, show_diff: bool) -> str:
    """Return what `print_results` shows, as plain text (no colour, 100 columns)."""
    buffer = io.StringIO()
    console = Console(
        file=buffer, width=100, color_system=None, highlight=False, soft_wrap=True, emoji=False
    )
    print_results(console, results, dry_run=dry_run, show_diff=show_diff)
    return buffer.getvalue()
