"""The pipeline for one file on disk: read it, answer from the result cache or migrate it.

Above the engine (`jaxmigrate.pipeline.engine`, one Python source) and notebooks (`jaxmigrate.pipeline.notebook`,
cells through the engine): `migrate_text` picks one by the file's name, `process_text` turns any
failure into the file's bucket, and `process_file` adds reading and the cache. Never raises for one
bad file.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import libcst as cst

from jaxmigrate.model import Bucket, FileResult, Options, Site
from jaxmigrate.pipeline.cache import ResultCache
from jaxmigrate.pipeline.engine import Located, Migration, describe_syntax_error, migrate_source
from jaxmigrate.pipeline.notebook import NotebookError, migrate_notebook
from jaxmigrate.pipeline.project import Project
from jaxmigrate.registry import chosen_passes
from jaxmigrate.textio import SourceError, decode, read_bytes
from jaxmigrate.toolkit.facts import parse
from jaxmigrate.toolkit.passes import Home


def migrate_text(
    text: str,
    *,
    path: str,
    options: Options,
    accept: Callable[[Sequence[Site]], Sequence[Site]] | None = None,
    home: Located = None,
    project: Project | None = None,
    fallbacks: Mapping[str, str] | None = None,
) -> Migration:
    """Migrate a file's text: a notebook's JSON (by its `.ipynb` name) cell by cell, else Python.

    `fallbacks` are the forms verification chose to write in their fallback form
    (`FileResult.fallbacks`). Raises what `migrate_source` raises, and `NotebookError` for a
    notebook it cannot take.
    """
    if path.endswith(".ipynb"):
        return migrate_notebook(
            text,
            options=options,
            accept=accept,
            path=path,
            project=project,
            fallbacks=fallbacks,
        )
    return migrate_source(
        text,
        options=options,
        accept=accept,
        path=path,
        home=home,
        project=project,
        fallbacks=fallbacks,
    )


def process_text(
    shown: str,
    text: str,
    options: Options,
    accept: Callable[[Sequence[Site]], Sequence[Site]] | None = None,
    home: Located = None,
    project: Project | None = None,
) -> FileResult:
    """Migrate one file's decoded text into its FileResult; never raises for a bad file."""
    try:
        result = migrate_text(
            text, path=shown, options=options, accept=accept, home=home, project=project
        )
    except cst.ParserSyntaxError as exc:
        code = None if shown.endswith(".ipynb") else text
        return FileResult(shown, Bucket.FAILED, reason=describe_syntax_error(exc, code))
    except NotebookError as exc:
        bucket = Bucket.SKIPPED if exc.skipped else Bucket.FAILED
        return FileResult(shown, bucket, reason=str(exc))
    except RecursionError:
        return FileResult(shown, Bucket.FAILED, reason=recursion_reason(shown, text))
    except Exception as exc:  # noqa: BLE001 - one bad file never stops the batch
        return FileResult(
            shown, Bucket.FAILED, reason=f"internal error: {type(exc).__name__}: {exc}"
        )
    bucket = Bucket.CHANGED if result.code != text else Bucket.UNCHANGED
    broken = _unparsable(shown, result) if bucket is Bucket.CHANGED else None
    if broken is not None:  # never write code that does not parse: a bug, reported as one
        return FileResult(shown, Bucket.FAILED, reason=f"internal error: {broken}")
    return FileResult(
        shown,
        bucket,
        sites=result.sites,
        skips=result.skips,
        old_text=text,
        new_text=result.code,
        files=result.files,
    )


def recursion_reason(shown: str, text: str) -> str:
    """Why a file's migration ran out of stack: its code nested deeper than a parser takes,
    or, when Python parses it (`toolkit.facts.parse`), an analysis that recursed without end
    (a defect of ours)."""
    if shown.endswith(".ipynb") or parse(text) is not None:
        return (
            "internal error: RecursionError: the analysis recursed without end on code Python "
            "parses (a jaxmigrate defect: please report it)"
        )
    return "too deeply nested for the parser"


def process_file(
    path: Path,
    options: Options,
    accept: Callable[[Sequence[Site]], Sequence[Site]] | None = None,
    cache: ResultCache | None = None,
    project: Project | None = None,
) -> FileResult:
    """Migrate one file in memory; never raises for a bad file and never writes.

    `cache` answers for bytes it has already seen under the same settings (the project's
    formatter settings and own modules included); it is not consulted when `accept` decides the
    sites (those decisions are not the engine's alone). `project` keeps what was read about the
    file's project for the next file.
    """
    with _collector_paused():
        return _process_file(path, options, accept, cache, project or Project())


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while one file is processed.

    Parsing allocates hundreds of thousands of CST nodes, and the collector, triggered by the
    allocations alone, rescans them again and again: a quarter of the parse time, for nothing,
    since a CST holds no cycles and is freed by reference counting. What cyclic garbage a file
    leaves is collected as usual once the collector runs again.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _process_file(
    path: Path,
    options: Options,
    accept: Callable[[Sequence[Site]], Sequence[Site]] | None,
    cache: ResultCache | None,
    project: Project,
) -> FileResult:
    shown = str(path)
    try:
        data = read_bytes(path)
        text = decode(data).text
    except SourceError as exc:
        return FileResult(shown, Bucket.FAILED, reason=str(exc))

    def home() -> Home | None:  # read from the disk only for a file a pass will rewrite
        return project.home(path, text)

    if cache is None or accept is not None:
        return process_text(shown, text, options, accept, home, project)
    context = cache_context(project, shown, text, options)
    key = cache.key(data, notebook=shown.endswith(".ipynb"), context=context)
    hit = cache.load(key, shown, text)
    if hit is not None:
        return hit
    start = time.perf_counter()
    result = process_text(shown, text, options, home=home, project=project)
    if result.files:  # the result depends on where the file is, which the key does not hold
        return result
    if result.sites or result.skips or time.perf_counter() - start >= WORTH_CACHING:
        cache.store(key, result)
    return result


def cache_context(project: Project, shown: str, text: str, options: Options) -> str:
    """What the result of the file `shown` (holding `text`) depends on besides its bytes and
    the options (`Project.context`): the imported modules' texts, and how the code base uses its
    functions, only when a pass reading them (`READS_IMPORTS`, `READS_CALLERS`) will run on it."""
    passes = [p for p in chosen_passes(options) if p.applies_to(text)]
    imports = any(p.READS_IMPORTS for p in passes)
    return project.context(
        shown, text, imports=imports, callers=any(p.READS_CALLERS for p in passes)
    )


# A file decided faster than this (no text trigger: most files) gets no cache entry: writing
# one (a temporary file renamed into place) costs more than deciding it again.
WORTH_CACHING = 0.002


def _unparsable(shown: str, result: Migration) -> str | None:
    """Return why the migrated code, or a project file it brings, does not parse, or None."""
    texts = [(shown, result.code)] if not shown.endswith(".ipynb") else []
    texts += [(file.path, file.text) for file in result.files]
    for name, code in texts:
        if parse(code) is None:
            return f"the rewrite of {name} does not parse; it was not written (please report it)"
    return None
