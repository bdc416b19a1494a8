"""Reading and writing source files without changing a byte the user did not ask to change."""

from __future__ import annotations

import io
import os
import stat
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path


class SourceError(Exception):
    """A file that cannot be read as Python source; the message is one line for the user."""


@dataclass(frozen=True)
class SourceText:
    """Decoded source and how to encode it back (encoding, BOM)."""

    text: str
    encoding: str

    def encode(self, text: str) -> bytes:
        """Return `text` encoded exactly as the original was (BOM included)."""
        return text.encode(self.encoding)


def source_lines(text: str, keepends: bool = False) -> list[str]:
    """Return the lines of source `text` as Python and libcst count them.

    Only `\n`, `\r\n` and `\r` end a line; `str.splitlines` also splits at form feeds and
    other control characters, and every line number after one would point at the wrong line.
    """
    lines = io.StringIO(text, newline="").readlines()
    return lines if keepends else [line.rstrip("\r\n") for line in lines]


def decode(data: bytes) -> SourceText:
    """Decode Python source bytes, honouring a BOM and a coding cookie."""
    if b"\x00" in data:
        raise SourceError("contains a NUL byte; not a Python source file")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        raise SourceError(f"unknown source encoding: {exc.msg}") from None
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise SourceError(f"cannot be decoded as {encoding}: {exc.reason}") from None
    except LookupError:
        raise SourceError(f"unknown source encoding {encoding!r}") from None
    return SourceText(text=text, encoding=encoding)


def read_bytes(path: Path) -> bytes:
    """Return the bytes of `path`; raise SourceError with a one-line reason."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SourceError(f"cannot be read: {exc.strerror or exc}") from None


def read_source(path: Path) -> SourceText:
    """Read and decode `path`; raise SourceError with a one-line reason."""
    return decode(read_bytes(path))


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` in one rename, keeping its permission bits.

    A reader (or a crash) sees either the whole old file or the whole new one.
    """
    target = path.resolve()
    mode = stat.S_IMODE(target.stat().st_mode)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".jaxmigrate", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
