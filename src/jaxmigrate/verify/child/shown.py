"""What a unit shows besides what it returns: the lines it prints and the files it writes.

A unit is a call without arguments (a `main()`): the program itself runs, and most programs end
by printing or saving their results rather than returning them. While it runs, file descriptor 1
goes to a temporary file, and the files of the side's tree are listed before and after: a file
it creates or changes is read (`.npy` / `.npz` as arrays, text as lines, anything else as bytes).

Printed lines and text files are compared line by line: the words exactly, the numbers in them
within a tolerance (float32's, or one unit of the last printed digit, whichever is larger), so a
sum taken in another order still agrees; a duration or a rate per second (`in 1.87 sec`) is not
compared at all. Arrays agree as outputs do (`compare`); other files
must have the same bytes. What differs between two runs of the original (a timing, a date) is
left out (`varying`), and said so. Comparing printed lines needs no numpy: jaxmigrate's own
process compares what a `--verify-with` command printed (`verify.groups`).
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w])|\b(?:nan|inf)\b")
# A duration, or a rate per second: how fast this machine ran, not what the program computed
# (`Epoch 0 in 1.87 sec`, `took 12ms`, `350.2 examples/sec`, `4.1 steps per second`). The
# rewrite compiles and runs in another time, and two runs of the original can agree on one by
# chance (an epoch's time, to the 0.01 s printed), so these numbers are never compared; the
# words around them are. Minutes and hours are spelled out (`min 0.3` is a minimum).
DURATION = re.compile(
    r"(?<![\w.])(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s?"
    r"(?:(?:ms|us|µs|ns|s|secs?|seconds?|minutes?|hrs?|hours?)\b"
    r"|(?:[A-Za-z_]+\s?)?/\s?(?:s|sec|second)\b"
    r"|(?:[A-Za-z_]+\s)?per\ssec(?:ond)?\b)"
)
READ_LIMIT = 64 * 2**20  # a file larger than this is compared by its hash only
TEXT_LIMIT = 2**20  # text files up to this size are compared line by line
SKIP_DIRS = {"__pycache__", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
RTOL = 1e-5


@dataclass
class Shown:
    """What one unit call showed: its printed lines and the files it wrote, by path."""

    printed: list[str] = field(default_factory=list)
    files: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    varying_lines: list[int] = field(default_factory=list)  # left out: two runs differ there
    varying_files: list[str] = field(default_factory=list)
    printed_varies: str = ""  # why the printed output as a whole is left out, or ''
    names_vary: bool = False  # two runs wrote files of other names: extra files are not counted

    def compared(self) -> tuple[int, list[str]]:
        """Return how many printed lines and which files are compared."""
        lines = 0 if self.printed_varies else len(self.printed) - len(self.varying_lines)
        return lines, [f for f in sorted(self.files) if f not in self.varying_files]


# Files -----------------------------------------------------------------------------------
def listing(root: str) -> dict[str, tuple[int, int]]:
    """Return (size, mtime) of every file under `root`, by relative path."""
    out: dict[str, tuple[int, int]] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        for name in files:
            if name.endswith(".pyc"):
                continue
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return out


def folders(root: str) -> set[str]:
    out: set[str] = set()
    for folder, dirs, _ in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        out.update(os.path.relpath(os.path.join(folder, d), root) for d in dirs)
    return out


def read_file(path: str) -> tuple[Any, ...]:
    """Return a written file as it is compared: arrays, lines, or its hash and size."""
    size = os.path.getsize(path)
    if size > READ_LIMIT:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        return ("bytes", digest.hexdigest(), size)
    with open(path, "rb") as handle:
        data = handle.read()
    if path.endswith((".npy", ".npz")):
        import numpy as np

        try:
            loaded = np.load(io.BytesIO(data), allow_pickle=False)
            if isinstance(loaded, np.ndarray):
                return ("npy", loaded)
            return ("npz", {k: loaded[k] for k in loaded.files})
        except (ValueError, OSError, EOFError):
            pass
    if size <= TEXT_LIMIT and b"\0" not in data:
        try:
            return ("text", data.decode("utf-8").splitlines())
        except UnicodeDecodeError:
            pass
    return ("bytes", hashlib.sha256(data).hexdigest(), size)


@dataclass
class Changes:
    """The files a call created, changed or removed in a tree."""

    files: dict[str, tuple[Any, ...]] = field(default_factory=dict)


@contextmanager
def files_kept(root: str, pristine: str | None, read: bool) -> Iterator[Changes]:
    """Yield what the block writes under `root` (read when `read`), then undo it.

    Files it created (and folders) are removed; a file it changed or removed is laid again from
    `pristine` (the user's tree, only read) when it is not a source file, so the next unit, or
    the next run of this one, starts from the tree as the program would find it.
    """
    before = listing(root)
    dirs = folders(root)
    changes = Changes()
    try:
        yield changes
    finally:
        after = listing(root)
        for rel, stat in after.items():
            if before.get(rel) != stat and read:
                try:
                    changes.files[rel] = read_file(os.path.join(root, rel))
                except OSError:
                    changes.files[rel] = ("unreadable",)
        for rel in before:
            if rel not in after and read:
                changes.files[rel] = ("removed",)
        undo(root, pristine, before, after, dirs)


def undo(
    root: str,
    pristine: str | None,
    before: dict[str, tuple[int, int]],
    after: dict[str, tuple[int, int]],
    dirs: set[str],
) -> None:
    import shutil

    for rel in after:
        if rel not in before:
            try:
                os.remove(os.path.join(root, rel))
            except OSError:
                pass
    for rel, stat in before.items():
        if after.get(rel) == stat or rel.endswith((".py", ".ipynb")) or pristine is None:
            continue
        source = os.path.join(pristine, rel)
        if os.path.isfile(source):
            try:
                shutil.copy2(source, os.path.join(root, rel))
            except OSError:
                pass
    for rel in sorted(folders(root) - dirs, key=len, reverse=True):
        shutil.rmtree(os.path.join(root, rel), ignore_errors=True)


# Printed lines ---------------------------------------------------------------------------
@contextmanager
def stdout_captured() -> Iterator[list[str]]:
    """Yield a list that receives the lines written to file descriptor 1 during the block."""
    lines: list[str] = []
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield lines
        finally:
            try:
                sys.stdout.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 1)
            os.close(saved)
            sink.seek(0)
            data = sink.read()
            os.write(1, data)  # the worker's log keeps what the program printed
            lines.extend(data.decode("utf-8", errors="replace").splitlines())


# What JAX's runtime prints to standard output, not the program: gloo's log of the connections
# a multi-process job makes at its first collective (on whichever side makes it first), a line
# per local device, `[Gloo] Rank 0 is connected to 7 peer ranks. Expected number of connected
# peer ranks is : 7`. Each device's thread writes its line as the pieces below, the numbers and
# the line's end, one write each (they are the strings in jaxlib's `libjax_common.so`). Under
# load the writes of two threads interleave: a piece of one line lands inside another
# (`[Gloo] Rank [Gloo] Rank 0 is connected to ...`, `... 7 peer ranks. [Gloo] Rank Expected
# ...`), and when both ends of line come last the second is a line of its own, empty. So a
# line made only of those pieces and numbers is the runtime's, and so is an empty line owed by
# a runtime line that holds more than one line's end. A number can also land after another
# thread's end of line, alone on a line (`... peer ranks is : ` then `7` on the next, seen in
# CI): a line of digits alone is the runtime's while the pieces seen since the program's last
# line still owe numbers (each of `Rank `, ` is connected to ` and `is : ` is followed by one),
# and the program's otherwise.
RUNTIME_PIECES = re.compile(
    r"\[Gloo\] Rank | is connected to | peer ranks\. |Expected number of connected peer ranks is : "
)
RUNTIME_END = "Expected number of connected peer ranks is : "
RUNTIME_NUMBERS = re.compile(r"\d+")
RUNTIME_NUMBERED = ("[Gloo] Rank ", " is connected to ", RUNTIME_END)  # each followed by a number


def _runtimes(line: str) -> bool:
    """True for a line of gloo's log, or of pieces of its lines (`RUNTIME_PIECES`)."""
    rest = RUNTIME_PIECES.sub("", line)
    return rest != line and not RUNTIME_NUMBERS.sub("", rest).strip()


def the_programs(lines: list[str]) -> list[str]:
    """Return the lines written to standard output by the program, not by JAX's runtime."""
    kept: list[str] = []
    owed = 0  # line ends written by the runtime beyond one per line of it seen so far
    numbers = 0  # numbers its pieces seen since the program's last line still owe
    for line in lines:
        if _runtimes(line):
            owed += line.count(RUNTIME_END) - 1
            owing = sum(line.count(piece) for piece in RUNTIME_NUMBERED)
            numbers = max(0, numbers + owing - len(RUNTIME_NUMBERS.findall(line)))
        elif not line and owed > 0:
            owed -= 1
        elif numbers > 0 and line.isdigit():
            numbers -= 1
            owed = max(0, owed - 1)
        else:
            kept.append(line)
            owed = numbers = 0
    return kept


def placed(lines: list[str], root: str) -> list[str]:
    """Return `lines` with the side's tree (its own temporary copy) written `<tree>`."""
    roots = sorted({root, os.path.realpath(root)}, key=len, reverse=True)
    out = []
    for line in lines:
        for path in roots:
            line = line.replace(path, "<tree>")
        out.append(line)
    return out


def numbers(line: str) -> tuple[str, list[str]]:
    """Return a line with its durations written `<duration>` (`DURATION`: not compared) and its
    other numbers replaced by `#`, and those numbers."""
    line = DURATION.sub("<duration>", line)
    return NUMBER.sub("#", line), NUMBER.findall(line)


def resolution(text: str) -> float:
    """Return one unit of the last digit `text` was printed with (0 for an integer)."""
    mantissa, _, exponent = text.lower().partition("e")
    if "." not in mantissa:
        return 0.0 if not exponent else 10.0 ** int(exponent)
    decimals = len(mantissa.split(".")[1])
    return 10.0 ** (int(exponent or 0) - decimals)


def same_number(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    if resolution(a) == 0.0 and resolution(b) == 0.0 and "e" not in (a + b).lower():
        return x == y  # integers: exactly
    tol = max(RTOL * max(abs(x), abs(y)), 1e-6, resolution(a), resolution(b)) * (1 + 1e-9)
    return abs(x - y) <= tol


def line_why(ref: str, new: str) -> str:
    """Return why a line differs from the reference line, or ''."""
    (ref_text, ref_nums), (new_text, new_nums) = numbers(ref), numbers(new)
    if ref_text == new_text and all(same_number(a, b) for a, b in zip(ref_nums, new_nums)):
        return ""
    return f"`{clip(new)}`, expected `{clip(ref)}`"


def clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def lines_mismatch(ref: list[str], new: list[str], skip: set[int]) -> tuple[int, str] | None:
    """Return (index, why) of the first line that differs, or None."""
    for i, (a, b) in enumerate(zip(ref, new)):
        if i in skip:
            continue
        why = line_why(a, b)
        if why:
            return i, why
    if len(ref) != len(new):
        i = min(len(ref), len(new))
        extra = (
            f"`{clip(new[i])}`, the original ended there"
            if len(new) > len(ref)
            else f"nothing, expected `{clip(ref[i])}`"
        )
        return i, f"{len(new)} lines, expected {len(ref)}: line {i + 1} is {extra}"
    return None


# Files compared ---------------------------------------------------------------------------
def file_why(ref: tuple[Any, ...], new: tuple[Any, ...] | None) -> str:
    """Return why a written file differs from the reference's, or ''."""
    from .compare import _array_mismatch

    if new is None:
        return "the original wrote it, the rewrite did not"
    if ref[0] != new[0]:
        return f"{describe(new)}, expected {describe(ref)}"
    kind = ref[0]
    if kind == "npy":
        found = _array_mismatch("array", ref[1], new[1])
        return "" if found is None else str(found["why"])
    if kind == "npz":
        if list(ref[1]) != list(new[1]):
            return f"arrays {list(new[1])}, expected {list(ref[1])}"
        for name in ref[1]:
            found = _array_mismatch(name, ref[1][name], new[1][name])
            if found is not None:
                return f"array `{name}`: {found['why']}"
        return ""
    if kind == "text":
        line = lines_mismatch(ref[1], new[1], set())
        return "" if line is None else f"line {line[0] + 1}: {line[1]}"
    if ref != new:
        return f"{describe(new)}, expected {describe(ref)}"
    return ""


def describe(entry: tuple[Any, ...]) -> str:
    kind = entry[0]
    if kind == "bytes":
        return f"{entry[2]} bytes (sha256 {entry[1][:12]})"
    if kind == "npy":
        return f"an array {entry[1].dtype}{list(entry[1].shape)}"
    if kind == "npz":
        return f"arrays {list(entry[1])}"
    if kind == "text":
        return f"{len(entry[1])} lines of text"
    return kind


def shown_mismatch(ref: Shown, new: Shown) -> dict[str, Any] | None:
    """Return where the rewrite's run shows something else than the original's, or None."""
    if not ref.printed_varies:
        found = lines_mismatch(ref.printed, new.printed, set(ref.varying_lines))
        if found is not None:
            where, why = found
            return {"path": f"printed line {where + 1}", "why": why, "shown": True}
    for rel, entry in sorted(ref.files.items()):
        if rel in ref.varying_files:
            continue
        why = file_why(entry, new.files.get(rel))
        if why:
            return {"path": f"file {rel}", "why": why, "shown": True}
    extra = sorted(set(new.files) - set(ref.files))
    if extra and not ref.names_vary:
        why = f"the rewrite wrote it ({describe(new.files[extra[0]])}), the original did not"
        return {"path": f"file {extra[0]}", "why": why, "shown": True}
    return None


def varying(first: Shown, second: Shown) -> Shown:
    """Return `first` with what differs from `second` (another run of the original) left out."""
    out = Shown(first.printed, first.files)
    if len(first.printed) != len(second.printed):
        out.printed_varies = (
            f"the original printed {len(first.printed)} and {len(second.printed)} lines in two runs"
        )
    else:
        out.varying_lines = [
            i for i, (a, b) in enumerate(zip(first.printed, second.printed)) if line_why(a, b)
        ]
    out.names_vary = set(first.files) != set(second.files)
    out.varying_files = sorted(
        rel
        for rel, entry in first.files.items()
        if rel not in second.files or file_why(entry, second.files[rel])
    )
    return out


def left_out(shown: Shown) -> str:
    """Return what was not compared because two runs of the original differ there, or ''."""
    parts = []
    if shown.printed_varies:
        parts.append(f"the printed output ({shown.printed_varies})")
    elif shown.varying_lines:
        numbers_ = ", ".join(str(i + 1) for i in shown.varying_lines[:5])
        parts.append(f"printed line(s) {numbers_}")
    if shown.varying_files:
        parts.append("file(s) " + ", ".join(shown.varying_files[:5]))
    if not parts:
        return ""
    return " and ".join(parts) + " differ between two runs of the original and are not compared"
