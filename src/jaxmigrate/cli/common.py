"""What `run` and `check` share: option declarations, settings resolution, the batch itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from jaxmigrate.config import ConfigError, FileConfig, find_pyproject, jax_pin, load_config
from jaxmigrate.model import LATEST_JAX, PMAP_STYLES, Bucket, FileResult, Options, Status
from jaxmigrate.pipeline.discovery import Discovery
from jaxmigrate.registry import UnknownRule, chosen_passes, select_passes
from jaxmigrate.report.json import json_report

if TYPE_CHECKING:
    from jaxmigrate.pipeline.cache import ResultCache
    from jaxmigrate.verify import VerifyConfig

PathsArg = Annotated[list[Path], typer.Argument(help="Files or directories to migrate.")]
SelectOpt = Annotated[
    str | None, typer.Option("--select", help="Comma-separated rule codes or names to run.")
]
IgnoreOpt = Annotated[
    str | None, typer.Option("--ignore", help="Comma-separated rule codes or names to skip.")
]
ExcludeOpt = Annotated[
    list[str] | None, typer.Option("--exclude", help="Glob of paths to leave out (repeatable).")
]
JobsOpt = Annotated[
    int | None,
    typer.Option(
        "--jobs",
        "-j",
        min=1,
        help=(
            "Worker processes (default: run and check, a file worker per usable core, at most "
            "8; verify, a worker pair per two cores)."
        ),
    ),
]
TargetOpt = Annotated[
    str | None,
    typer.Option(
        "--target-jax",
        help=(
            "Oldest JAX the output must run on (default: target-jax in [tool.jaxmigrate], else "
            "the project's own `jax>=X` pin, else the installed JAX)."
        ),
    ),
]
PmapStyleOpt = Annotated[
    str | None,
    typer.Option(
        "--pmap-style",
        help="pmap rewrites: idiomatic (program-level where the data flow is visible, the "
        "default) or faithful (the per-device form everywhere).",
    ),
]
ReportOpt = Annotated[
    Path | None,
    typer.Option("--report", help="Write the report to this file (`-`: standard output)."),
]
FormatOpt = Annotated[
    str | None,
    typer.Option(
        "--format",
        help=(
            "Report format: text, json, sarif or markdown (default: from the --report file's "
            "extension, else json). Without --report, a format other than text goes to "
            "standard output and the usual output to standard error."
        ),
    ),
]
NoCacheOpt = Annotated[
    bool, typer.Option("--no-cache", help="Neither read nor write the result cache.")
]
FORMATS = ("text", "json", "sarif", "markdown")
_SUFFIX_FORMATS = {".json": "json", ".sarif": "sarif", ".md": "markdown", ".txt": "text"}
NoVerifyOpt = Annotated[
    bool, typer.Option("--no-verify", help="Do not execute rewrites to verify them.")
]

VerifyWithOpt = Annotated[
    str | None,
    typer.Option("--verify-with", help="Command whose calls are recorded as inputs (e.g. tests)."),
]
DevicesOpt = Annotated[
    int | None, typer.Option("--devices", min=1, help="Simulated CPU devices (default 8).")
]
PythonOpt = Annotated[
    str | None, typer.Option("--python", help="Interpreter that runs the project's code.")
]
ProcessesOpt = Annotated[
    int | None,
    typer.Option(
        "--processes",
        min=1,
        help=(
            "Verify as an N-process JAX job on this machine (jax.distributed on localhost, "
            "the --devices split evenly between the processes; default 1)."
        ),
    ),
]
ProjectTestsOpt = Annotated[
    bool | None,
    typer.Option(
        "--verify-project-tests/--no-verify-project-tests",
        help=(
            "With --verify-with: also record, through the project's own tests that name it (at "
            "most 40), a function the command never called (default: on)."
        ),
    ),
]
ReferenceJaxOpt = Annotated[
    str | None,
    typer.Option(
        "--reference-jax",
        help=(
            "Run the original side of verification on this JAX release (e.g. 0.4.30): a venv "
            "of the same Python with it, built once with pip in ~/.cache/jaxmigrate."
        ),
    ),
]
ReferencePythonOpt = Annotated[
    str | None,
    typer.Option(
        "--reference-python",
        help="Interpreter (with the JAX the code was written for) that runs the original side.",
    ),
]
TimeoutOpt = Annotated[
    float | None, typer.Option("--timeout", min=1, help="Seconds allowed per site (default 120).")
]


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


@dataclass(frozen=True)
class Settings:
    """Flags merged over `[tool.jaxmigrate]`: everything one batch needs."""

    paths: tuple[Path, ...]
    options: Options
    excludes: tuple[str, ...]
    jobs: int
    verify: bool
    root: Path = Path()
    devices: int = 8
    python: str = sys.executable
    verify_with: str | None = None
    timeout: float = 120.0
    timeout_given: bool = False  # `--timeout` or `timeout =` set: it bounds notebook runs too
    cache: bool = True
    processes: int = 1
    project_tests: bool = True
    reference_jax: str | None = None
    reference_python: str | None = None

    def open_cache(self, *, dry_run: bool = False) -> ResultCache | None:
        """Return the result cache under the project root, or None with `--no-cache`; a dry run
        writes nothing in the user's tree: its cache is in the user's cache directory."""
        from jaxmigrate.pipeline.cache import ResultCache

        if not self.cache:
            return None
        return ResultCache.open(self.root, self.options, self.runtime(), in_tree=not dry_run)

    def runtime(self) -> dict[str, str | None]:
        """Return what verification runs on: the interpreters (and the reference JAX) of both
        sides; the result cache keys on it."""
        return {
            "python": self.python,
            "reference_jax": self.reference_jax,
            "reference_python": self.reference_python,
        }

    def verify_config(self) -> VerifyConfig:
        """Return the verifier's configuration for this run."""
        from jaxmigrate.verify import VerifyConfig

        return VerifyConfig(
            root=self.root,
            devices=self.devices,
            python=self.python,
            verify_with=self.verify_with,
            timeout=self.timeout,
            notebook_timeout=self.timeout if self.timeout_given else None,
            passes=chosen_passes(self.options),
            workdir=Path.cwd(),
            processes=self.processes,
            project_tests=self.project_tests,
            reference_python=self.reference_interpreter(),
        )

    def reference_interpreter(self) -> str | None:
        """Return the interpreter of the original side (`reference_interpreter`)."""
        return reference_interpreter(self.reference_jax, self.reference_python, self.python)


def default_file_jobs() -> int:
    """The file workers of `run` and `check` without `--jobs`: one per usable core (at most 8,
    each holds a module's trees). One file, or an interactive review, runs in this process."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 1
    return max(1, min(usable, 8))


def split_codes(value: str | None) -> tuple[str, ...] | None:
    """Return `("JM1", "pmap")` for `"JM1,pmap"`; None when not given."""
    if value is None:
        return None
    return tuple(part.strip() for part in value.split(",") if part.strip())


def parse_pmap_style(text: str) -> str:
    """Return `text` if it names a pmap style (`PMAP_STYLES`); raise UsageError otherwise."""
    if text not in PMAP_STYLES:
        raise UsageError(f"pmap-style is one of {', '.join(PMAP_STYLES)}, got {text!r}")
    return text


def parse_version(text: str) -> tuple[int, int]:
    """Return `(0, 6)` for `"0.6"` or `"0.6.1"`; raise UsageError otherwise."""
    parts = text.strip().split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise UsageError(f"--target-jax expects a version like 0.6, got {text!r}") from None


def choose_target(flag: str | None, config: FileConfig, root: Path) -> tuple[tuple[int, int], str]:
    """Return the target JAX and where it came from: `--target-jax`, else `target-jax` in
    `[tool.jaxmigrate]`, else the lower bound of the project's own `jax` pin (`jax>=0.4.30` in
    its dependencies or requirements), else the JAX installed beside jaxmigrate, else the
    newest the rules know."""
    change = "--target-jax or target-jax in [tool.jaxmigrate] sets another"
    if flag:
        return parse_version(flag), f"--target-jax {flag}"
    if config.target_jax:
        return parse_version(config.target_jax), f"target-jax in {config.path}"
    pin = jax_pin(root)
    if pin is not None:
        return parse_version(pin.version), f"the project's `{pin.spec}` in {pin.where}; {change}"
    return installed_jax(), ""


def installed_jax() -> tuple[int, int]:
    """Return the JAX version installed here (read from metadata, JAX is never imported)."""
    try:
        return parse_version(metadata.version("jax"))
    except (metadata.PackageNotFoundError, UsageError):
        return LATEST_JAX


def resolve_settings(
    paths: Sequence[Path],
    *,
    select: str | None,
    ignore: str | None,
    exclude: Sequence[str] | None,
    jobs: int | None,
    target_jax: str | None,
    unsafe_fixes: bool | None,
    no_verify: bool,
    devices: int | None = None,
    python: str | None = None,
    verify_with: str | None = None,
    timeout: float | None = None,
    no_cache: bool = False,
    processes: int | None = None,
    pmap_style: str | None = None,
    project_tests: bool | None = None,
    reference_jax: str | None = None,
    reference_python: str | None = None,
) -> Settings:
    """Merge command-line flags over the nearest pyproject's `[tool.jaxmigrate]`."""
    try:
        config = load_config(find_pyproject(paths))
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    chosen_select = split_codes(select) or config.select or ()
    chosen_ignore = split_codes(ignore) or config.ignore or ()
    try:
        select_passes(chosen_select, chosen_ignore)
    except UnknownRule as exc:
        raise UsageError(str(exc)) from None
    root = project_root(list(paths), config)
    target, source = choose_target(target_jax, config, root)
    options = Options(
        select=chosen_select,
        ignore=chosen_ignore,
        unsafe_fixes=bool(unsafe_fixes if unsafe_fixes is not None else config.unsafe_fixes),
        target_jax=target,
        target_source=source,
        pmap_style=parse_pmap_style(pmap_style or config.pmap_style or "idiomatic"),
        pmap_replicated=config.pmap_replicated or (),
    )
    chosen_devices = devices or config.devices or 8
    chosen_processes = check_processes(chosen_devices, processes or config.processes or 1)
    return Settings(
        paths=tuple(paths),
        options=options,
        excludes=(*config.exclude, *(exclude or ())),
        jobs=jobs or config.jobs or default_file_jobs(),
        verify=not no_verify,
        root=root,
        devices=chosen_devices,
        processes=chosen_processes,
        python=python or config.python or sys.executable,
        verify_with=verify_with or config.verify_with,
        timeout=timeout or config.timeout or 120.0,
        timeout_given=bool(timeout or config.timeout),
        cache=not no_cache,
        project_tests=choose(project_tests, config.verify_project_tests, True),
        reference_jax=reference_version(reference_jax or config.reference_jax),
        reference_python=reference_python or config.reference_python,
    )


def reference_interpreter(jax: str | None, python: str | None, base: str) -> str | None:
    """Return the interpreter of the original side (`--reference-python`, else the
    `--reference-jax` environment, built now if needed), or None; UsageError if neither can be
    had."""
    from jaxmigrate.verify.reference import ReferenceError, resolve_reference

    try:
        return resolve_reference(
            reference_version(jax), python, base, say=lambda line: stderr().print(line)
        )
    except ReferenceError as exc:
        raise UsageError(str(exc)) from None


def reference_version(text: str | None) -> str | None:
    """Return a `--reference-jax` release as given; raise UsageError if it is not one."""
    from jaxmigrate.verify.reference import ReferenceError, requirements

    if text is None:
        return None
    try:
        requirements(text)
    except ReferenceError as exc:
        raise UsageError(str(exc)) from None
    return text


def choose(flag: bool | None, configured: bool | None, default: bool) -> bool:
    """Return a boolean setting: the flag if given, else the configuration's, else `default`."""
    if flag is not None:
        return flag
    return default if configured is None else configured


def check_processes(devices: int, processes: int) -> int:
    """Return `processes` if the devices split evenly between them; raise UsageError if not."""
    from jaxmigrate.verify.processes import DeviceSplitError, devices_per_process

    try:
        devices_per_process(devices, processes)
    except DeviceSplitError as exc:
        raise UsageError(str(exc)) from None
    return processes


def project_root(paths: list[Path], config: FileConfig) -> Path:
    """Return the tree to copy: the pyproject's folder, else the git top level, else the
    nearest folder above the paths with a `setup.py` / `setup.cfg`, else the deepest folder
    holding every given path and the packages they are in (`pkg/train.py` given: the folder
    holding `pkg`, so `import pkg...` works in the copy, as a rewrite importing a helper module
    written beside it does)."""
    if config.path is not None:
        return config.path.parent.resolve()
    folders = [(p if p.is_dir() else p.parent).resolve() for p in paths if p.exists()]
    if not folders:
        return Path.cwd().resolve()
    common = Path(os.path.commonpath(folders))
    while (common / "__init__.py").is_file() and common.parent != common:
        common = common.parent
    marked = next(
        (
            f
            for f in (common, *common.parents)
            if (f / "setup.py").is_file() or (f / "setup.cfg").is_file()
        ),
        None,
    )
    proc = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"],
        cwd=common,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode == 0:
        return Path(proc.stdout.strip()).resolve()
    return marked or common


def discover(settings: Settings) -> list:
    """Return the discovered files for the settings."""
    return list(Discovery(excludes=settings.excludes).find(settings.paths))


def exit_code(results: Sequence[FileResult]) -> int:
    """1 when a file failed or a site failed verification, else 0."""
    failed = any(r.bucket is Bucket.FAILED for r in results)
    bad_site = any(s.status is Status.FAILED for r in results for s in r.sites)
    return 1 if failed or bad_site else 0


def report_format(report: Path | None, fmt: str | None) -> str:
    """Return the format asked for, else the one the report's file name suggests, else json."""
    if fmt is None:
        name = "" if report is None else report.name.lower()
        return next((f for s, f in _SUFFIX_FORMATS.items() if name.endswith(s)), "json")
    if fmt.lower() not in FORMATS:
        raise UsageError(f"unknown report format {fmt!r} (available: {', '.join(FORMATS)})")
    return fmt.lower()


def report_destination(report: Path | None, fmt: str | None) -> tuple[Path | None, str]:
    """Return where the report goes and its format: `--format json` alone means stdout."""
    if report is None and fmt is None:
        return None, "text"
    chosen = report_format(report, fmt)
    if report is None:
        report = None if chosen == "text" else Path("-")
    elif str(report) == "-" and chosen == "text":
        report = None  # the usual output is the text report, on standard output already
    return report, chosen


def results_console(report: Path | None) -> Console:
    """The console for the usual output: standard error when the report takes stdout."""
    return stderr() if report is not None and str(report) == "-" else stdout()


def render_report(
    results: Sequence[FileResult],
    fmt: str,
    *,
    dry_run: bool,
    root: Path | None = None,
    show_diff: bool = False,
) -> str:
    """Return the report of `results` in format `fmt` (text, json, sarif or markdown)."""
    if fmt == "json":
        return json.dumps(json_report(results, dry_run=dry_run), indent=2) + "\n"
    if fmt == "sarif":
        from jaxmigrate.registry import all_passes
        from jaxmigrate.report.sarif import sarif_report

        log = sarif_report(results, all_passes(), root=root or Path.cwd(), dry_run=dry_run)
        return json.dumps(log, indent=2) + "\n"
    if fmt == "markdown":
        from jaxmigrate.report.markdown import markdown_report
        from jaxmigrate.ui.summary import apply_hint

        return markdown_report(results, dry_run=dry_run, hint=apply_hint)
    from jaxmigrate.ui.report import text_report

    return text_report(results, dry_run=dry_run, show_diff=show_diff)


def write_report(
    results: Sequence[FileResult],
    report: Path | None,
    fmt: str | None,
    *,
    dry_run: bool,
    root: Path | None = None,
    show_diff: bool = False,
) -> None:
    """Write the report where asked (`-` is standard output); nothing when `report` is None."""
    if report is None:
        return
    chosen = report_format(report, fmt)
    text = render_report(results, chosen, dry_run=dry_run, root=root, show_diff=show_diff)
    if str(report) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        report.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write the report to {report}: {exc.strerror or exc}") from None


def stdout() -> Console:
    """The console for results (diffs, site lines, tables)."""
    return Console(highlight=False, soft_wrap=True)


def stderr() -> Console:
    """The console for progress and problems."""
    return Console(stderr=True, highlight=False)
