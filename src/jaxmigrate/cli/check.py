"""`jaxmigrate check`: for CI and pre-commit; writes nothing, exit 1 if anything would change."""

from __future__ import annotations

from typing import Annotated

import typer

from jaxmigrate.cli.common import (
    ExcludeOpt,
    FormatOpt,
    IgnoreOpt,
    JobsOpt,
    NoCacheOpt,
    PathsArg,
    PmapStyleOpt,
    ReportOpt,
    SelectOpt,
    TargetOpt,
    UsageError,
    report_destination,
    resolve_settings,
    results_console,
    stderr,
    write_report,
)
from jaxmigrate.cli.run import execute
from jaxmigrate.model import Bucket


def check(
    paths: PathsArg,
    diff: Annotated[bool, typer.Option("--diff", help="Also print the diffs.")] = False,
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
    exclude: ExcludeOpt = None,
    jobs: JobsOpt = None,
    target_jax: TargetOpt = None,
    pmap_style: PmapStyleOpt = None,
    report: ReportOpt = None,
    fmt: FormatOpt = None,
    no_cache: NoCacheOpt = False,
) -> None:
    """Report pending migrations in PATHS without writing; exit 1 if any site is found."""
    try:
        report, fmt = report_destination(report, fmt)
        settings = resolve_settings(
            paths,
            select=select,
            ignore=ignore,
            exclude=exclude,
            jobs=jobs,
            target_jax=target_jax,
            pmap_style=pmap_style,
            unsafe_fixes=None,
            no_verify=True,
            no_cache=no_cache,
        )
        console = results_console(report)
        results = execute(settings, console, dry_run=True, allow_dirty=True, show_diff=diff)
        write_report(results, report, fmt, dry_run=True, root=settings.root, show_diff=diff)
    except UsageError as exc:
        stderr().print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from None
    pending = any(r.sites for r in results)
    failed = any(r.bucket is Bucket.FAILED for r in results)
    raise typer.Exit(1 if pending or failed else 0)
