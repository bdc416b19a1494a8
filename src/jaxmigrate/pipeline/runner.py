"""Running the engine over many files (in worker processes) and writing the results back."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import replace
from functools import partial
from pathlib import Path

from jaxmigrate.model import Bucket, FileResult, Options, ProjectFile, Site
from jaxmigrate.pipeline.cache import ResultCache
from jaxmigrate.pipeline.discovery import Found
from jaxmigrate.pipeline.files import process_file
from jaxmigrate.pipeline.project import Project
from jaxmigrate.textio import SourceError, atomic_write, read_source

Accept = Callable[[Sequence[Site]], Sequence[Site]]
PR_SET_PDEATHSIG = 1


def _skipped(found: Found) -> FileResult:
    bucket = Bucket.FAILED if "no such file" in found.problem else Bucket.SKIPPED
    return FileResult(str(found.path), bucket, reason=found.problem)


def migrate_files(
    found: Sequence[Found],
    options: Options,
    jobs: int = 1,
    accept: Accept | None = None,
    cache: ResultCache | None = None,
) -> Iterator[FileResult]:
    """Yield one FileResult per discovered path; files run in `jobs` processes.

    With one process the results come in discovery order. With more they come as the files
    finish, the largest files started first (`in_order` restores the order): a file costs from
    microseconds (no trigger) to seconds (a large module with sites), and a big file started
    last would keep one worker busy long after the others ran out of work.
    `cache` (shared by the workers) answers for files already seen under the same settings.
    """
    files = [f.path for f in found if not f.problem]
    work = partial(process_file, options=options, accept=accept, cache=cache, project=Project())
    if accept is None:  # `accept` may ask the user: it stays on the main thread
        work = partial(_on_fresh_stack, work)
    if jobs > 1 and len(files) > 1 and accept is None:
        yield from (_skipped(f) for f in found if f.problem)
        work = partial(_in_worker, options=options, cache=cache)
        context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        with ProcessPoolExecutor(
            max_workers=jobs,
            mp_context=context,
            initializer=_die_with_parent,
            initargs=(os.getpid(),),
        ) as pool:
            futures = [pool.submit(work, path) for path in sorted(files, key=_size, reverse=True)]
            for future in as_completed(futures):
                yield future.result()
    else:
        yield from _merge(found, map(work, files))


_PROJECT: list[tuple[Project, int]] = []  # (a worker's Project, its process), made on first use


def _in_worker(path: Path, options: Options, cache: ResultCache | None) -> FileResult:
    """Migrate one file in a worker process, with the worker's one `Project` for every file it
    takes: a Project sent with each task would arrive empty, and read the code base around the
    file again for every file (the legacy mesh reads of a package: all its modules)."""
    if not _PROJECT or _PROJECT[0][1] != os.getpid():
        _PROJECT[:] = [(Project(), os.getpid())]
    work = partial(process_file, options=options, cache=cache, project=_PROJECT[0][0])
    return _on_fresh_stack(work, path)


_THREAD: list[tuple[ThreadPoolExecutor, int]] = []  # (the thread, its process), made on first use
# More C stack than a main thread's usual 8 MiB: libcst's native parser recurses in C, and a
# thread's default (glibc: 2 MiB under an unlimited `ulimit -s`) can be far less.
_THREAD_STACK = 32 * 1024 * 1024


def _on_fresh_stack(work: Callable[[Path], FileResult], path: Path) -> FileResult:
    """Run `work` on a thread of its own, whose Python frame stack starts empty.

    CPython 3.11 keeps frames in 16 KiB chunks and maps and unmaps a chunk each time recursion
    crosses into it. The CLI calls the engine some 30 frames deep (typer, click), and a worker
    forked there starts that deep: the walks and code generation of every file then kept
    crossing a chunk boundary, half of all page faults (measured with `perf record -e
    page-faults`) and about 1.5 s of CPU over JAX's sources.
    """
    if not _THREAD or _THREAD[0][1] != os.getpid():
        previous = threading.stack_size(_THREAD_STACK)
        try:
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jaxmigrate")
            executor.submit(int).result()  # the thread starts now, with that stack size
        finally:
            threading.stack_size(previous)
        _THREAD[:] = [(executor, os.getpid())]
    return _THREAD[0][0].submit(work, path).result()


def in_order(found: Sequence[Found], results: Iterable[FileResult]) -> list[FileResult]:
    """Return `results` (one per file of `found`) in the order the files were found."""
    index = {str(f.path): n for n, f in enumerate(found)}
    return sorted(results, key=lambda r: index.get(r.path, len(index)))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _die_with_parent(parent: int) -> None:
    """Worker initializer: end with the run that started it, however that run ends.

    A run killed by SIGKILL (the OOM killer, `kill -9`) cannot stop its pool, and its workers
    would wait for work forever. Linux ends them with the parent; elsewhere a watcher does.
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    else:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # died before the signal was armed
        os._exit(1)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)


def _merge(found: Sequence[Found], results: Iterator[FileResult]) -> Iterator[FileResult]:
    for f in found:
        yield _skipped(f) if f.problem else next(results)


def dirty_files(paths: Sequence[Path]) -> set[Path]:
    """Return the files among `paths` that have uncommitted changes in their git work tree."""
    dirty: set[Path] = set()
    by_dir: dict[Path, list[Path]] = {}
    for path in paths:
        by_dir.setdefault(path.absolute().parent, []).append(path.absolute())
    for directory, members in by_dir.items():
        try:
            proc = subprocess.run(
                ["git", "status", "--porcelain", "-z", "--", *map(str, members)],
                cwd=directory,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if proc.returncode != 0:
            continue  # not a git work tree
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=directory,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        for entry in filter(None, proc.stdout.split("\0")):
            name = entry[3:]
            if top:  # untracked files count too: git could not restore them
                dirty.add((Path(top) / name).resolve())
    return dirty


def write_result(result: FileResult) -> FileResult:
    """Write a changed file atomically; return the result, failed if the write could not be made.

    The file is re-read first: if it changed since it was migrated, nothing is written.
    """
    if result.bucket is not Bucket.CHANGED or result.new_text is None:
        return result
    path = Path(result.path)
    try:
        current = read_source(path)
    except SourceError as exc:
        return _write_failed(result, str(exc))
    if current.text != result.old_text:
        return _write_failed(result, "changed on disk while it was being migrated; not written")
    if _read_only(path):
        return _write_failed(result, "read-only file; not written")
    try:
        atomic_write(path, current.encode(result.new_text))
    except OSError as exc:
        return _write_failed(result, f"could not be written: {exc.strerror or exc}")
    return replace(result, written=True)


def _read_only(path: Path) -> bool:
    """True for a file we may not write, or that has no write bit at all: that is how a user
    marks a file read-only, and root, who may write anything, must respect it too."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False  # the write itself reports it
    return not os.access(path, os.W_OK) or not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)


def _write_failed(result: FileResult, reason: str) -> FileResult:
    sites = tuple(
        replace(s, applied=False, reason="file not written") if s.applied else s
        for s in result.sites
    )
    return replace(result, bucket=Bucket.FAILED, reason=reason, sites=sites)


# Project files: modules of the user's project that rewritten files import ---------------------
OURS = "jaxmigrate"  # a project file whose first line names us was written by us: may be updated


def with_project_files(results: Sequence[FileResult]) -> list[FileResult]:
    """Return `results` and, first, one result per project file the changed files import.

    Such a file is created, or updated when an earlier run wrote it; a file of the same name
    that jaxmigrate did not write is left alone, and the files that import it are not written.
    Dry runs show the new file's diff; the summary counts it as a changed file.
    """
    wanted: dict[str, ProjectFile] = {}
    for result in results:
        if result.bucket is Bucket.CHANGED:
            for file in result.files:
                wanted.setdefault(os.path.normpath(file.path), file)
    made = [_project_result(path, file.text) for path, file in sorted(wanted.items())]
    failed = {r.path: r.reason for r in made if r.bucket is Bucket.FAILED}
    out = [_needing(r, failed) for r in results]
    return [*made, *out]


def _project_result(path: str, text: str) -> FileResult:
    try:
        current = read_source(Path(path)).text if os.path.lexists(path) else ""
    except SourceError as exc:
        return FileResult(path, Bucket.FAILED, reason=str(exc))
    if current and current != text and OURS not in current.partition("\n")[0]:
        return FileResult(path, Bucket.FAILED, reason="a module of that name is not jaxmigrate's")
    bucket = Bucket.CHANGED if current != text else Bucket.UNCHANGED
    return FileResult(path, bucket, old_text=current, new_text=text)


def _needing(result: FileResult, failed: dict[str, str]) -> FileResult:
    """Return `result`, failed when a project file its new text imports cannot be written."""
    for file in result.files:
        why = failed.get(os.path.normpath(file.path))
        if why is not None and result.bucket is Bucket.CHANGED:
            return _write_failed(result, f"imports {file.path}, which is not written: {why}")
    return result


def write_project_files(results: Sequence[FileResult]) -> list[FileResult]:
    """Write the project files of `results` (`with_project_files`) before the files needing
    them; a file whose project file could not be written is not written either."""
    project = {os.path.normpath(f.path) for r in results for f in r.files}
    needed = {
        os.path.normpath(f.path) for r in results if r.bucket is Bucket.CHANGED for f in r.files
    }
    out = [
        (_create_or_write(r) if r.path in needed else replace(r, bucket=Bucket.UNCHANGED))
        if r.path in project
        else r
        for r in results
    ]
    failed = {r.path: r.reason for r in out if r.path in project and r.bucket is Bucket.FAILED}
    return [r if r.path in project else _needing(r, failed) for r in out]


class OneByOne:
    """Write files one at a time (as an interactive review decides them), each after the project
    files its new text imports, so that no written file imports a module that is not there.

    `modules` holds the results of those project files, the write that made each, for the
    report.
    """

    def __init__(self) -> None:
        self.modules: dict[str, FileResult] = {}

    def __call__(self, result: FileResult) -> FileResult:
        *made, result = write_project_files(with_project_files([result]))
        for module in made:
            if module.path not in self.modules or module.bucket is not Bucket.UNCHANGED:
                self.modules[module.path] = module
        return write_result(result)


def _create_or_write(result: FileResult) -> FileResult:
    if result.old_text or result.bucket is not Bucket.CHANGED or result.new_text is None:
        return write_result(result)
    path = Path(result.path)
    if os.path.lexists(path):
        return _write_failed(result, "created on disk while being migrated; not written")
    try:
        _create(path, result.new_text.encode("utf-8"))
    except OSError as exc:
        return _write_failed(result, f"could not be written: {exc.strerror or exc}")
    return replace(result, written=True)


def _create(path: Path, data: bytes) -> None:
    """Create `path` with `data` in one rename (as `atomic_write` replaces a file)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".jaxmigrate", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
