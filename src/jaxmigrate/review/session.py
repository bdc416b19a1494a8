"""Interactive review: one decision per site, in file and line order, resumable.

The session asks about every *unit* (a site, or all the sites of one group, which are applied
together or not at all), keeps the answers, and re-renders each file with the engine from exactly
the accepted sites (never by patching diff hunks). Answers are remembered in
`.jaxmigrate_cache/review.json` under the project root, keyed by path, content hash and site key,
so an interrupted review resumes where it stopped and a file that changed since forgets its
answers. What the user sees is drawn by a `Presenter` (the rich one is `jaxmigrate.ui.review`);
keys come from a `KeySource` (a terminal, one key at a time, or a piped stream).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Protocol

import libcst as cst

from jaxmigrate.model import Bucket, FileResult, Options, ProjectFile, Safety, Site, Status
from jaxmigrate.pipeline.engine import enforce_groups, line_map_between
from jaxmigrate.pipeline.files import migrate_text
from jaxmigrate.pipeline.project import Project
from jaxmigrate.registry import skip_codes
from jaxmigrate.textio import source_lines

PROGRESS_FILE = Path(".jaxmigrate_cache") / "review.json"
PROGRESS_VERSION = 1

#: Every key the prompt understands, with what it does (the `?` help).
KEYS: tuple[tuple[str, str], ...] = (
    ("y", "apply this site"),
    ("n", "skip this site"),
    ("a", "apply this site and the rest of this file"),
    ("d", "skip this site and the rest of this file"),
    ("A", "apply this site and everything remaining, in every file"),
    ("q", "quit: write the sites accepted so far, nothing else (resume later)"),
    ("e", "explain the rule"),
    ("?", "this help"),
)
DECIDING = frozenset("ynadAq")
REJECTED = "rejected in review"
NOT_REVIEWED = "not reviewed"


class KeySource(Protocol):
    """Where answers come from: one key per call; `""` is Enter, None is end of input."""

    def read(self) -> str | None: ...


@dataclass(frozen=True)
class Unit:
    """What one prompt decides: a site, or every site of its group (all or nothing)."""

    path: str
    sites: tuple[Site, ...]

    @property
    def keys(self) -> frozenset[str]:
        """The keys of every site of the unit."""
        return frozenset(s.key for s in self.sites)

    @property
    def failed(self) -> tuple[Site, ...]:
        """The sites that failed verification (which makes the whole unit inapplicable)."""
        return tuple(s for s in self.sites if s.status is Status.FAILED)

    @property
    def applicable(self) -> bool:
        """True unless a site of the unit failed verification: failed sites are never written."""
        return not self.failed

    @property
    def default(self) -> str:
        """What Enter answers: `y` when every site is safe or verified, else `n`."""
        trusted = all(s.safety is Safety.SAFE or s.status is Status.VERIFIED for s in self.sites)
        return "y" if self.applicable and trusted else "n"

    @property
    def choices(self) -> str:
        """The keys offered at this prompt (`y` is not offered for a failed unit)."""
        return "".join(k for k, _ in KEYS if k != "y" or self.applicable)


def units_of(sites: Sequence[Site], path: str) -> tuple[Unit, ...]:
    """Return the units of one file's sites, ordered by the line and column of their first site."""
    by_group: dict[str, list[Site]] = {}
    units: list[list[Site]] = []
    for site in sorted(sites, key=place_of):
        if site.group is None:
            units.append([site])
        elif site.group in by_group:
            by_group[site.group].append(site)
        else:
            by_group[site.group] = [site]
            units.append(by_group[site.group])
    return tuple(Unit(path, tuple(members)) for members in units)


def place_of(site: Site) -> tuple[int, int, int]:
    """Return where a site sorts in its file: (notebook cell, line, column)."""
    return (site.cell or 0, site.line, site.col)


def render(
    result: FileResult, keys: frozenset[str], options: Options, project: Project | None = None
) -> str:
    """Return the file's original text re-rendered by the engine with exactly `keys` applied
    (in the fallback forms verification chose for it)."""
    return rendered(result, keys, options, project or Project())[0]


def rendered(
    result: FileResult, keys: frozenset[str], options: Options, project: Project
) -> tuple[str, tuple[ProjectFile, ...]]:
    """Return `render`'s text and the project files it imports (the code base's shared pmap
    helper module): the reading of the code base the run and its verification made, so that a
    reviewed file imports the helper where the dry run showed it, not a pasted copy."""
    old = result.old_text or ""
    if not keys:
        return old, ()
    migration = migrate_text(
        old,
        path=result.path,
        options=options,
        accept=lambda sites: [replace(s, applied=s.key in keys) for s in sites],
        home=lambda: project.home(Path(result.path), old),
        project=project,
        fallbacks=result.fallbacks,
    )
    return migration.code, migration.files


def content_hash(text: str) -> str:
    """Return the SHA-256 of `text` (UTF-8), the identity of a file's content in the progress."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# Remembered answers --------------------------------------------------------------------------
@dataclass
class Progress:
    """Answers remembered across sessions, per file: `{path: {sha256, written, decisions}}`.

    An entry only counts for a file whose content still has that hash: a changed file forgets
    its answers. `written` marks content that the review itself wrote (so its uncommitted change
    is ours and does not block the resumed review).
    """

    path: Path
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    problem: str = ""

    @classmethod
    def load(cls, root: Path) -> Progress:
        """Read the progress under `root`; a missing or unreadable file is an empty progress."""
        path = root / PROGRESS_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError) as exc:
            return cls(path, problem=f"ignored unreadable {path}: {exc}")
        if not isinstance(data, dict) or data.get("version") != PROGRESS_VERSION:
            return cls(path, problem=f"ignored {path}: not a version {PROGRESS_VERSION} file")
        files = data.get("files")
        if not isinstance(files, dict):
            return cls(path, problem=f"ignored {path}: not a version {PROGRESS_VERSION} file")
        return cls(path, {k: v for k, v in files.items() if _valid_entry(v)})

    def recall(self, name: str, text: str) -> dict[str, bool] | None:
        """Return the answers for `name` with content `text`; None when the file changed since."""
        entry = self.files.get(name)
        if entry is None:
            return {}
        if entry["sha256"] != content_hash(text):
            return None
        return {key: answer == "y" for key, answer in entry["decisions"].items()}

    def written_by_review(self, name: str, text: str) -> bool:
        """True when `text` is exactly what the review wrote into `name`."""
        entry = self.files.get(name)
        return bool(entry and entry.get("written") and entry["sha256"] == content_hash(text))

    def remember(
        self, name: str, text: str, decisions: Mapping[str, bool], *, written: bool = False
    ) -> None:
        """Set the answers for `name` with content `text` (replacing any older entry)."""
        self.files[name] = {
            "sha256": content_hash(text),
            "written": written or self.written_by_review(name, text),
            "decisions": {key: "y" if ok else "n" for key, ok in sorted(decisions.items())},
        }

    def forget(self, name: str) -> None:
        """Drop the entry of `name`."""
        self.files.pop(name, None)

    def save(self) -> None:
        """Write the progress atomically (an interrupted save leaves the previous one whole)."""
        folder = self.path.parent
        fresh = not folder.exists()
        folder.mkdir(parents=True, exist_ok=True)
        if fresh:  # like ruff's cache folder: ignored by git wherever it is created
            (folder / ".gitignore").write_text("*\n", encoding="utf-8")
        if not self.files:
            self.path.unlink(missing_ok=True)
            return
        text = json.dumps({"version": PROGRESS_VERSION, "files": self.files}, indent=1)
        fd, tmp = tempfile.mkstemp(prefix=".review.", suffix=".json", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _valid_entry(entry: object) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("sha256"), str)
        and isinstance(entry.get("decisions"), dict)
        and all(v in ("y", "n") for v in entry["decisions"].values())
    )


def carry_over(
    result: FileResult, decisions: Mapping[str, bool], new_text: str, options: Options
) -> dict[str, bool]:
    """Return the answers of the sites still in `new_text` after writing `result` partially.

    The sites left in the written file are the original's unapplied ones. Each is matched to
    the original site of the same rule on the same original line (of the same notebook cell),
    in column order, so that a resumed review does not ask again about a rejected site.
    """
    try:
        left = migrate_text(new_text, path=result.path, options=options).sites
        old_sources = _sources(result.old_text or "", result.path)
        new_sources = _sources(new_text, result.path)
    except Exception:  # noqa: BLE001 - nothing carried over is always safe: it is asked again
        return {}
    to_old = {
        cell: line_map_between(source_lines(old_sources.get(cell, ""), keepends=True), source)
        for cell, source in new_sources.items()
    }
    old_by_place: dict[tuple[int | None, str, int], list[Site]] = {}
    for site in sorted(result.sites, key=place_of):
        if not decisions.get(site.key, False):
            old_by_place.setdefault((site.cell, site.code, site.line), []).append(site)
    new_by_place: dict[tuple[int | None, str, int], list[Site]] = {}
    for site in sorted(left, key=place_of):
        line = to_old[site.cell](site.line) if site.cell in to_old else -1
        new_by_place.setdefault((site.cell, site.code, line), []).append(site)
    carried: dict[str, bool] = {}
    for where, new_sites in new_by_place.items():
        old_sites = old_by_place.get(where, [])
        if len(old_sites) != len(new_sites):
            continue  # ambiguous: ask again rather than guess
        for old, new in zip(old_sites, new_sites, strict=True):
            if old.key in decisions:
                carried[new.key] = decisions[old.key]
    return carried


def _sources(text: str, path: str) -> dict[int | None, str]:
    """Return a file's text by notebook cell number (one entry, None, for a Python file)."""
    if not path.endswith(".ipynb"):
        return {None: text}
    from jaxmigrate.pipeline.notebook import cell_sources

    return dict(cell_sources(text))


# The session -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prompt:
    """One question: the unit, where it stands in the review, and the file without and with it."""

    unit: Unit
    index: int
    total: int
    before: str
    after: str


class Presenter(Protocol):
    """Everything the session shows; `jaxmigrate.ui.review.RichPresenter` draws it with rich."""

    def resuming(self, remembered: int, left: int) -> None: ...
    def forgotten(self, stale: Sequence[str]) -> None: ...
    def show(self, prompt: Prompt) -> None: ...
    def ask(self, prompt: Prompt) -> None: ...
    def answered(self, key: str, prompt: Prompt) -> None: ...
    def explain(self, codes: Sequence[str]) -> None: ...
    def help(self, prompt: Prompt, unknown: str | None) -> None: ...
    def refuse(self, prompt: Prompt) -> None: ...
    def note(self, text: str) -> None: ...
    def file_done(self, result: FileResult) -> None: ...


class Quit(Exception):
    """The user pressed `q` (or the input ended)."""


@dataclass
class _File:
    at: int  # index in the run's results
    result: FileResult
    name: str
    units: tuple[Unit, ...]
    decisions: dict[str, bool] = field(default_factory=dict)

    def undecided(self) -> list[Unit]:
        return [u for u in self.units if not u.keys <= self.decisions.keys()]


DIRTY = "has uncommitted changes; commit or stash them, or pass --allow-dirty"


@dataclass
class Review:
    """One review over the results of a run; `run()` returns the results as decided.

    Without `write` (a dry run) nothing is written, not even the remembered answers.
    """

    results: Sequence[FileResult]
    options: Options
    presenter: Presenter
    keys: KeySource
    root: Path
    progress: Progress | None = None
    write: Callable[[FileResult], FileResult] | None = None
    dirty: Callable[[Sequence[Path]], set[Path]] | None = None
    project: Project = field(default_factory=Project)
    apply_all: bool = field(default=False, init=False)

    @property
    def persist(self) -> bool:
        """True when answers are saved for resume (never in a dry run)."""
        return self.progress is not None and self.write is not None

    def run(self) -> list[FileResult]:
        """Ask about every undecided unit, write each file once it is decided, return results.

        `q` (or the end of the input) writes what was accepted and keeps the answers for resume;
        KeyboardInterrupt propagates with the current file unwritten and the answers kept.
        """
        out = list(self.results)
        files = self._files(out)
        total = sum(len(f.undecided()) for f in files)
        if not total:
            self.presenter.note("nothing to review")
        index = 0
        done = 0
        try:
            for file in files:
                for unit in file.undecided():
                    if unit.keys <= file.decisions.keys():
                        continue  # settled by an `a`, `d` or `A` on an earlier unit
                    index += 1
                    self._decide(file, unit, index, total)
                out[file.at] = self._finish(file, complete=True)
                done += 1
        except Quit:
            self.presenter.note("quit: writing the sites accepted so far; the rest is left as is")
            for file in files[done:]:
                out[file.at] = self._finish(file, complete=False)
            return out
        if self.persist and self.progress is not None:
            for file in files:
                self.progress.forget(file.name)
            self.progress.save()
        return out

    def _files(self, results: list[FileResult]) -> list[_File]:
        """Return the files to review with their remembered answers; refuse dirty ones."""
        files = [
            _File(at, r, self._name(r.path), units_of(r.sites, r.path))
            for at, r in enumerate(results)
            if r.sites and r.old_text is not None and r.bucket is not Bucket.FAILED
        ]
        stale = []
        resumed = False
        for file in files:
            known = (
                self.progress.recall(file.name, file.result.old_text or "") if self.progress else {}
            )
            if known is None:
                stale.append(file.name)
                known = {}
            elif self.progress is not None and file.name in self.progress.files:
                resumed = True  # even with no answer left: the file was written by the review
            for unit in file.units:
                if unit.keys <= known.keys():
                    answer = unit.applicable and all(known[k] for k in unit.keys)
                    file.decisions.update(dict.fromkeys(unit.keys, answer))
        files = self._refuse_dirty(files, results)
        left = sum(len(f.undecided()) for f in files)
        remembered = sum(len(f.units) for f in files) - left
        if stale:
            self.presenter.forgotten(stale)
        if resumed:
            self.presenter.resuming(remembered, left)
        return files

    def _refuse_dirty(self, files: list[_File], results: list[FileResult]) -> list[_File]:
        """Leave out (as failed, like `run`) files with uncommitted changes not made by us."""
        if self.dirty is None or self.write is None or not files:
            return files
        progress = self.progress
        ours = {
            f.name
            for f in files
            if progress is not None and progress.written_by_review(f.name, f.result.old_text or "")
        }
        dirty = self.dirty([Path(f.result.path) for f in files if f.name not in ours])
        kept = []
        for file in files:
            if Path(file.result.path).resolve() not in dirty:
                kept.append(file)
                continue
            results[file.at] = replace(
                file.result,
                bucket=Bucket.FAILED,
                reason=DIRTY,
                sites=tuple(
                    replace(s, applied=False, reason="file not written") for s in file.result.sites
                ),
            )
        if len(kept) != len(files):
            self.presenter.note(
                f"not reviewing {len(files) - len(kept)} file(s) with uncommitted changes "
                "(commit or stash them, or pass --allow-dirty)"
            )
        return kept

    def _name(self, path: str) -> str:
        absolute = Path(path).resolve()
        try:
            return absolute.relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return absolute.as_posix()

    def _decide(self, file: _File, unit: Unit, index: int, total: int) -> None:
        """Settle one unit: by an earlier `A`, else by asking."""
        if self.apply_all:
            self._set(file, [unit], True)
            return
        accepted = frozenset(k for k, ok in file.decisions.items() if ok)
        before = render(file.result, accepted, self.options, self.project)
        after = render(file.result, accepted | unit.keys, self.options, self.project)
        prompt = Prompt(unit, index, total, before, after)
        self.presenter.show(prompt)
        key = self._ask(prompt)
        if key in ("y", "n"):
            self._set(file, [unit], key == "y")
        elif key == "d":
            self._set(file, file.undecided(), False)
        elif key in ("a", "A"):
            self._set(file, file.undecided(), True)
            self.apply_all = key == "A"
            where = "every file" if key == "A" else file.name
            self.presenter.note(f"applying the remaining applicable sites of {where}")
        else:
            raise Quit

    def _ask(self, prompt: Prompt) -> str:
        """Return a deciding key; explain, help and refuse until one comes."""
        while True:
            self.presenter.ask(prompt)
            key = self.keys.read()
            if key is None:
                self.presenter.answered("q", prompt)
                return "q"
            key = key or prompt.unit.default
            self.presenter.answered(key, prompt)
            if key == "e":
                codes = {s.code for s in prompt.unit.sites}
                codes |= {c for s in prompt.unit.sites for c in skip_codes(s.message)}
                self.presenter.explain(sorted(codes))
            elif key == "?" or key not in DECIDING:
                self.presenter.help(prompt, None if key == "?" else key)
            elif key == "y" and not prompt.unit.applicable:
                self.presenter.refuse(prompt)
            else:
                return key

    def _set(self, file: _File, units: Sequence[Unit], accepted: bool) -> None:
        """Record the answer for `units` (a failed unit is never accepted) and save it."""
        for unit in units:
            file.decisions.update(dict.fromkeys(unit.keys, accepted and unit.applicable))
        if self.persist and self.progress is not None and not self.apply_all:
            self.progress.remember(file.name, file.result.old_text or "", file.decisions)
            self.progress.save()

    def _finish(self, file: _File, *, complete: bool) -> FileResult:
        """Re-render the file from its accepted sites, write it, and carry answers forward."""
        result = decided(file.result, file.decisions, self.options, self.project)
        if self.write is not None and result.bucket is Bucket.CHANGED:
            carried = carry_over(file.result, file.decisions, result.new_text or "", self.options)
            with interrupts_deferred():  # the file and the answers about it change together
                result = self.write(result)
                if result.written and self.persist and self.progress is not None:
                    self.progress.remember(file.name, result.new_text or "", carried, written=True)
                    self.progress.save()
        if complete or result.written:
            self.presenter.file_done(result)
        return result


@contextmanager
def interrupts_enabled() -> Iterator[None]:
    """Make Ctrl-C raise KeyboardInterrupt in the block even if SIGINT came in ignored.

    A process started with SIGINT ignored (a background job of a shell without job control, as
    `cmd &` in a script, some CI runners) keeps it ignored: Python installs its handler only
    over the default disposition. A review at the terminal must stop on Ctrl-C all the same.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C until the block is done (then raise KeyboardInterrupt), in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: received.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            raise KeyboardInterrupt


def decided(
    result: FileResult,
    decisions: Mapping[str, bool],
    options: Options,
    project: Project | None = None,
) -> FileResult:
    """Return `result` with exactly the accepted sites applied and its text re-rendered (with
    the project files that text imports).

    A rendering that no longer parses (an engine bug) fails the file instead of being written.
    """
    sites = []
    for site in result.sites:
        if site.status is Status.FAILED:
            sites.append(replace(site, applied=False, reason="failed verification"))
        elif site.key not in decisions:
            sites.append(replace(site, applied=False, reason=NOT_REVIEWED))
        elif decisions[site.key]:
            sites.append(replace(site, applied=True, reason=""))
        else:
            sites.append(replace(site, applied=False, reason=REJECTED))
    final = enforce_groups(sites)
    old = result.old_text or ""
    keys = frozenset(s.key for s in final if s.applied)
    new, files = rendered(result, keys, options, project or Project())
    try:
        cst.parse_module(new)
    except cst.ParserSyntaxError as exc:
        return replace(
            result,
            bucket=Bucket.FAILED,
            reason=f"internal error: the reviewed rendering does not parse: {exc.message}",
            sites=tuple(replace(s, applied=False, reason="file not written") for s in final),
            new_text=old,
        )
    bucket = Bucket.CHANGED if new != old else Bucket.UNCHANGED
    return replace(result, sites=final, new_text=new, bucket=bucket, files=files)


# Key sources --------------------------------------------------------------------------------
class StreamKeys:
    """Keys from a text stream: one key per line, or several characters on a line.

    An empty line is Enter (the default); blanks are ignored; the end of the stream is None.
    """

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.pending: list[str] = []

    def read(self) -> str | None:
        """Return the next key, `""` for an empty line, None at the end of the input."""
        if not self.pending:
            line = self.stream.readline()
            if not line:
                return None
            self.pending = [c for c in line if not c.isspace()] or [""]
        return self.pending.pop(0)


class TerminalKeys:
    """Single keystrokes from a terminal, without Enter (cbreak mode, restored after each key).

    Ctrl-C still raises KeyboardInterrupt; Ctrl-D is the end of the input; Enter is `""`;
    escape sequences (arrow keys) are read whole and ignored.
    """

    # How long a wait for a key sleeps in the kernel at most before Python runs the signal
    # handlers: a SIGINT the kernel hands to another thread (the engine's) interrupts no
    # system call of the main thread, which Python alone runs the handlers on.
    POLL_SECONDS = 0.1

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def read(self) -> str | None:
        """Return the next key, `""` for Enter, None for Ctrl-D."""
        import termios
        import tty

        saved = termios.tcgetattr(self.fd)
        try:
            # TCSANOW, not tty's default TCSAFLUSH, which discards the input not read yet: a key
            # pressed as soon as the prompt shows, before this line runs, was lost.
            tty.setcbreak(self.fd, termios.TCSANOW)
            while True:
                self._wait()
                char = os.read(self.fd, 1)
                if char == b"\x1b":
                    self._drain()
                    continue
                break
        finally:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, saved)
        if char in (b"", b"\x04"):
            return None
        if char in (b"\r", b"\n"):
            return ""
        return char.decode("utf-8", "replace")

    def _wait(self) -> None:
        """Return once a key can be read; signal handlers run between the polls."""
        while not select.select([self.fd], [], [], self.POLL_SECONDS)[0]:
            pass

    def _drain(self) -> None:
        while select.select([self.fd], [], [], 0.05)[0]:
            os.read(self.fd, 16)


def stdin_keys() -> KeySource:
    """Return the key source for this process: the terminal when stdin is one, else the pipe."""
    if sys.stdin.isatty() and os.name == "posix":
        return TerminalKeys(sys.stdin.fileno())
    return StreamKeys(sys.stdin)
