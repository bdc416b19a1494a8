"""`jaxmigrate verify --against REV`: check a migration made by hand against git revision REV."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from jaxmigrate.cli.common import (
    DevicesOpt,
    FormatOpt,
    JobsOpt,
    ProcessesOpt,
    ProjectTestsOpt,
    PythonOpt,
    ReferenceJaxOpt,
    ReferencePythonOpt,
    ReportOpt,
    TimeoutOpt,
    UsageError,
    VerifyWithOpt,
    check_processes,
    choose,
    project_root,
    reference_interpreter,
    stderr,
    stdout,
    write_report,
)
from jaxmigrate.config import ConfigError, find_pyproject, load_config
from jaxmigrate.model import Bucket, FileResult, Status
from jaxmigrate.ui.summary import site_line, verify_with_problem

AgainstOpt = Annotated[
    str, typer.Option("--against", help="Git revision holding the code before the migration.")
]
PathsOpt = Annotated[
    list[Path] | None, typer.Argument(help="Files or directories (default: the whole project).")
]


def print_results(console: Console, results: list[FileResult]) -> None:
    """Print one line per changed definition, with the verdict's reason under it."""
    for result in results:
        for site in result.sites:
            console.print(site_line(result.path, site, dry_run=True))  # the reason below it
    counts = {s: sum(x.status is s for r in results for x in r.sites) for s in Status}
    shown = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    console.print(f"{sum(len(r.sites) for r in results)} changed definition(s): {shown or 'none'}")


def verify(
    paths: PathsOpt = None,
    against: AgainstOpt = "HEAD",
    verify_with: VerifyWithOpt = None,
    verify_project_tests: ProjectTestsOpt = None,
    devices: DevicesOpt = None,
    processes: ProcessesOpt = None,
    python: PythonOpt = None,
    reference_jax: ReferenceJaxOpt = None,
    reference_python: ReferencePythonOpt = None,
    jobs: JobsOpt = None,
    timeout: TimeoutOpt = 120.0,
    report: ReportOpt = None,
    fmt: FormatOpt = "json",
) -> None:
    """Verify, by running old and new code, the functions changed since git revision REV."""
    from jaxmigrate.verify import VerifyConfig, annotate
    from jaxmigrate.verify.against import GitError, requests_against
    from jaxmigrate.verify.config import default_jobs
    from jaxmigrate.verify.notebooks import located
    from jaxmigrate.verify.session import verify as run_verification

    chosen = list(paths or [])
    try:
        config = load_config(find_pyproject(chosen))
        root = project_root(chosen, config)
        chosen_devices = devices or config.devices or 8
        chosen_python = python or config.python or sys.executable
        reference = reference_interpreter(
            reference_jax or config.reference_jax,
            reference_python or config.reference_python,
            chosen_python,
        )
        settings = VerifyConfig(
            root=root,
            devices=chosen_devices,
            processes=check_processes(chosen_devices, processes or config.processes or 1),
            python=chosen_python,
            reference_python=reference,
            verify_with=verify_with or config.verify_with,
            timeout=timeout or config.timeout or 120.0,
            jobs=jobs or config.jobs or default_jobs(),
            workdir=Path.cwd(),
            project_tests=choose(verify_project_tests, config.verify_project_tests, True),
        )
        requests = requests_against(root, against, [str(p.resolve()) for p in chosen])
        verdicts = run_verification(requests, settings)
        results = [
            FileResult(
                r.label or r.path,
                Bucket.UNCHANGED,
                sites=located(annotate(r.path, r.sites, verdicts), r.cells)
                if r.cells
                else annotate(r.path, r.sites, verdicts),
            )
            for r in requests
        ]
        problem = verify_with_problem(results)
        if problem is not None:
            stderr().print(problem)
        print_results(stdout(), results)
        write_report(results, report, fmt, dry_run=True)
    except (ConfigError, GitError, UsageError) as exc:
        stderr().print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from None
    failed = any(s.status is Status.FAILED for r in results for s in r.sites)
    raise typer.Exit(1 if failed else 0)
