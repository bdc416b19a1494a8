"""`jaxmigrate run`: migrate files in place, or show the diffs with `--dry-run`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from jaxmigrate.cli.common import (
    DevicesOpt,
    ExcludeOpt,
    FormatOpt,
    IgnoreOpt,
    JobsOpt,
    NoCacheOpt,
    NoVerifyOpt,
    PathsArg,
    PmapStyleOpt,
    ProcessesOpt,
    ProjectTestsOpt,
    PythonOpt,
    ReferenceJaxOpt,
    ReferencePythonOpt,
    ReportOpt,
    SelectOpt,
    Settings,
    TargetOpt,
    TimeoutOpt,
    UsageError,
    VerifyWithOpt,
    discover,
    exit_code,
    report_destination,
    resolve_settings,
    results_console,
    stderr,
    write_report,
)
from jaxmigrate.model import Bucket, FileResult, Safety
from jaxmigrate.pipeline.runner import (
    dirty_files,
    in_order,
    migrate_files,
    with_project_files,
    write_project_files,
    write_result,
)
from jaxmigrate.ui.progress import track
from jaxmigrate.ui.report import print_results
from jaxmigrate.ui.review import review_interactively
from jaxmigrate.ui.summary import notebooks_note, verify_with_problem


def run(
    paths: PathsArg,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Write nothing; print the diffs.")
    ] = False,
    unsafe_fixes: Annotated[
        bool | None,
        typer.Option("--unsafe-fixes", help="Also apply unsafe sites that were not verified."),
    ] = None,
    allow_dirty: Annotated[
        bool,
        typer.Option("--allow-dirty", help="Write files that have uncommitted git changes."),
    ] = False,
    interactive: Annotated[
        bool,
        typer.Option(
            "--interactive",
            "-i",
            help="Review each site (y/n/a/d/A/q/e/?) before writing; resumes an unfinished review.",
        ),
    ] = False,
    no_verify: NoVerifyOpt = False,
    verify_with: VerifyWithOpt = None,
    verify_project_tests: ProjectTestsOpt = None,
    devices: DevicesOpt = None,
    processes: ProcessesOpt = None,
    python: PythonOpt = None,
    reference_jax: ReferenceJaxOpt = None,
    reference_python: ReferencePythonOpt = None,
    timeout: TimeoutOpt = None,
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
    """Migrate the legacy JAX APIs in PATHS (in place; `--dry-run` only shows the diffs)."""
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
            unsafe_fixes=unsafe_fixes,
            no_verify=no_verify,
            devices=devices,
            processes=processes,
            python=python,
            verify_with=verify_with,
            timeout=timeout,
            no_cache=no_cache,
            project_tests=verify_project_tests,
            reference_jax=reference_jax,
            reference_python=reference_python,
        )
        results = execute(
            settings,
            results_console(report),
            dry_run=dry_run,
            allow_dirty=allow_dirty,
            interactive=interactive,
        )
        write_report(results, report, fmt, dry_run=dry_run, root=settings.root, show_diff=dry_run)
    except UsageError as exc:
        stderr().print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from None
    raise typer.Exit(exit_code(results))


def execute(
    settings: Settings,
    console: Console,
    *,
    dry_run: bool,
    allow_dirty: bool,
    show_diff: bool = True,
    interactive: bool = False,
) -> list[FileResult]:
    """Migrate, write (unless `dry_run`), print diffs, site lines and the summary.

    `interactive` asks about every site first (`jaxmigrate.ui.review`) and writes what is accepted.
    """
    found = discover(settings)
    if not found:
        raise UsageError("no Python files or notebooks found under the given paths")
    migrated = migrate_files(
        found, settings.options, jobs=settings.jobs, cache=settings.open_cache(dry_run=dry_run)
    )
    results = in_order(found, track(migrated, len(found), stderr()))
    if settings.verify:
        results = verify_unsafe(results, settings)
    if interactive:
        results = review_interactively(
            results,
            console,
            options=settings.options,
            root=settings.root,
            dry_run=dry_run,
            allow_dirty=allow_dirty,
            verification_ran=settings.verify,
        )
    else:
        results = with_project_files(results)
        if not dry_run:
            results = write_all(results, allow_dirty=allow_dirty)
    report_results(console, results, dry_run=dry_run, show_diff=show_diff)
    return results


def verify_unsafe(results: list[FileResult], settings: Settings) -> list[FileResult]:
    """Run the unsafe sites on the simulated mesh and re-decide every file by the verdicts."""
    if not any(s.safety is Safety.UNSAFE for r in results for s in r.sites):
        return results
    from jaxmigrate.verify import verify_results
    from jaxmigrate.verify.results import needs_verifying

    verifiable = [r for r in results if needs_verifying(r)]
    unsafe = sum(s.safety is Safety.UNSAFE for r in verifiable for s in r.sites)
    if not unsafe:
        return results
    files = len(verifiable)
    message = (
        f"verifying {unsafe} unsafe site(s) in {files} file(s) on {settings.devices} "
        f"simulated CPU devices"
        + (f" in {settings.processes} processes" if settings.processes > 1 else "")
        + (f", inputs from `{settings.verify_with}`" if settings.verify_with else "")
        + (f", the original on JAX {settings.reference_jax}" if settings.reference_jax else "")
    )
    notebooks = notebooks_note(verifiable)
    if notebooks is not None:
        stderr().print(notebooks)
    with stderr().status(message):
        verified = verify_results(results, settings.options, settings.verify_config())
    problem = verify_with_problem(verified)
    if problem is not None:
        stderr().print(problem)
    return verified


def write_all(results: Sequence[FileResult], *, allow_dirty: bool) -> list[FileResult]:
    """Write every changed file, refusing files with uncommitted changes unless allowed.

    The project files the changed files import (`with_project_files`) are written first.
    """
    changed = [Path(r.path) for r in results if r.bucket is Bucket.CHANGED]
    dirty = set() if allow_dirty or not changed else dirty_files(changed)
    out = []
    for result in results:
        if result.bucket is Bucket.CHANGED and Path(result.path).resolve() in dirty:
            result = replace(
                result,
                bucket=Bucket.FAILED,
                reason="has uncommitted changes; commit or stash them, or pass --allow-dirty",
                sites=tuple(
                    replace(s, applied=False, reason="file not written") if s.applied else s
                    for s in result.sites
                ),
            )
        out.append(result)
    return [r if r.written else write_result(r) for r in write_project_files(out)]


def report_results(
    console: Console, results: Sequence[FileResult], *, dry_run: bool, show_diff: bool
) -> None:
    """Print diffs (dry run), the site and skip lines, file problems and the summary."""
    print_results(console, results, dry_run=dry_run, show_diff=show_diff)
