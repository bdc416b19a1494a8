"""Whether a call ran a site's lines: a call of the function around a site proves nothing else.

A function target (`def train(..., parallel=False)` holding `jax.pmap(...)` under an `if`) can
be called without ever running its site: a call that takes another branch agrees on both sides
whatever the rewrite did. `Watch` traces line events in the target's file while a call runs,
only in the frames of code objects that span a site, and notes which sites ran; the tracer is
removed once every site has, so the rest of the call runs untraced. Each site is a range of
lines (its statement, or a compound statement's header): running any of them counts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from types import CodeType, FrameType
from typing import Any, Self

Span = tuple[int, int]


def spans_of(raw: Sequence[Sequence[int]]) -> tuple[Span, ...]:
    return tuple((int(a), int(b)) for a, b in raw)


def describe(spans: Sequence[Span]) -> str:
    """Return `line 12` or `lines 12, 30-31` for the sites' spans."""
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in spans]
    return ("line " if len(parts) == 1 and "-" not in parts[0] else "lines ") + ", ".join(parts)


class Watch:
    """Notes which of `spans` (lines of `filename`) run while it is entered, in this thread.

    Nothing is traced when another tracer (a debugger, coverage) is already installed: `hit`
    then holds every span, as if they ran, since the call cannot be watched without breaking
    that tool; `watched` says whether the answer is known.
    """

    def __init__(self, filename: str, spans: Sequence[Span]) -> None:
        self.names = {filename, os.path.realpath(filename)}  # as compiled, and resolved
        self.spans = tuple(spans)
        self.hit: set[Span] = set()
        self.watched = False
        self.codes: dict[CodeType, bool] = {}

    def covers(self, code: CodeType) -> bool:
        """Return True if `code` (a function of the file) holds a line of a missing span."""
        found = self.codes.get(code)
        if found is None:
            lines = {line for _, _, line in code.co_lines() if line is not None}
            found = any(a <= line <= b for line in lines for a, b in self.spans)
            self.codes[code] = found
        return found

    def on_call(self, frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if code.co_filename not in self.names:
            return None
        return self.on_line if self.covers(code) else None

    def on_line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            line = frame.f_lineno
            for span in self.spans:
                if span[0] <= line <= span[1]:
                    self.hit.add(span)
            if len(self.hit) == len(self.spans):
                sys.settrace(None)  # every site ran: new frames run untraced
                return None
        return self.on_line

    def __enter__(self) -> Self:
        if not self.spans or sys.gettrace() is not None:
            self.hit = set(self.spans)
            return self
        self.watched = True
        if len(self.hit) < len(self.spans):
            sys.settrace(self.on_call)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.watched and sys.gettrace() in (self.on_call, None):
            sys.settrace(None)

    @property
    def missing(self) -> tuple[Span, ...]:
        return tuple(s for s in self.spans if s not in self.hit)
