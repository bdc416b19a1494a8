"""Whether a call ran a site's lines: a call of the function around a site proves nothing else.

A function target (`def train(..., parallel=False)` holding `jax.pmap(...)` under an `if`) can
be called without ever running its site: a call that takes another branch agrees on both sides
whatever the rewrite did. `Watch` traces line events in the target's file while a call runs,
only in the frames of code objects that span a site, and notes which sites ran; the tracer is
removed once every site has, so the rest of the call runs untraced. Watches nest (the recorder
watches a method called by a function it watches too): the active ones share one tracer,
`dispatch`, each fed the lines of its own code. Each site is a `Need`: one
or more ranges of lines (its statement, or a compound statement's header; for a module-level
callable a unit uses, the body of the function it maps), running any of which counts.

Lines run where JAX runs them, and each place is watched:

- at trace time, in the calling thread: under `jax.jit` a function's body runs only while it
  is traced, and a later call with the same shapes reuses the trace without running a line.
  The worker clears JAX's caches before a watched attempt and watches its input probe
  (`jax.eval_shape`, whose trace the call then reuses), so every trace the attempt's calls run
  is made, and seen, during the attempt;
- in host callbacks: XLA runs `pure_callback` / `io_callback` / `jax.debug.callback` bodies on
  its own threads, which `sys.settrace` (per thread) never sees. The callbacks lowered while a
  watch is installed (`hook_callbacks`) trace their own thread while they run, if a watch is
  still active then;
- in Python threads the call starts (`threading.settrace`).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any, Self

Span = tuple[int, int]


@dataclass(frozen=True)
class Need:
    """What a call must run to show something about one site: any line of `spans`.

    `name` is set for a module-level callable a unit uses (`step = jax.pmap(f)`, a decorated
    `def step`): the site ran when `step` was called, that is when its function's body ran.
    """

    spans: tuple[Span, ...]
    name: str = ""

    def holds(self, line: int) -> bool:
        return any(a <= line <= b for a, b in self.spans)


def spans_of(raw: Sequence[Any]) -> tuple[Need, ...]:
    """Return the needs of a request's `reach`: `[first, last]` per site, or
    `{"spans": [[first, last], ...], "name": "step"}` for a callable a unit uses."""
    needs = []
    for item in raw:
        if isinstance(item, dict):
            spans = tuple((int(a), int(b)) for a, b in item["spans"])
            needs.append(Need(spans, str(item.get("name", ""))))
        else:
            a, b = item
            needs.append(Need(((int(a), int(b)),)))
    return tuple(needs)


def lines(spans: Sequence[Span]) -> str:
    """Return `line 12` or `lines 12, 30-31`."""
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in spans]
    return ("line " if len(parts) == 1 and "-" not in parts[0] else "lines ") + ", ".join(parts)


def describe(needs: Sequence[Need]) -> str:
    """Return what calls that miss `needs` never did: `never ran the site's line 12`, `never
    called `step` (its function's lines 9-10 never ran)`."""
    plain = [span for need in needs if not need.name for span in need.spans]
    named = [f"`{n.name}` (its function's {lines(n.spans)} never ran)" for n in needs if n.name]
    parts = [f"never ran the site's {lines(plain)}"] if plain else []
    return " and ".join(parts + (["never called " + ", ".join(named)] if named else []))


# The watches entered and tracing, innermost last: what `dispatch` feeds, and what a host
# callback's thread reports to.
ACTIVE: list[Watch] = []
HOOKED: list[bool] = []


def dispatch(frame: FrameType, event: str, arg: Any) -> Any:
    """The one global tracer while watches are active: a new frame's lines go to each active
    watch with a need left in its code. Watches nest (a method watched while the function
    calling it is): each sees its own lines, neither blinds the other."""
    code = frame.f_code
    interested = [w for w in ACTIVE if not w.done and w.wants(code)]
    return following(interested) if interested else None


def following(watches: list[Watch]) -> Callable[..., Any]:
    """Return the local tracer of a frame whose lines `watches` want; it stops tracing the
    frame once they are all done, and new frames once every active watch is."""

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            for watch in watches:
                watch.saw(frame.f_lineno)
            if all(watch.done for watch in watches):
                if not pending() and sys.gettrace() is dispatch:
                    sys.settrace(None)  # every site ran: new frames run untraced
                return None
        return local

    return local


def pending() -> bool:
    """Return True if an active watch has a need left."""
    return any(not watch.done for watch in ACTIVE)


class Watch:
    """Notes which of `needs` (lines of `filename`) run while it is entered: in this thread, in
    the threads it starts, and in the host callbacks lowered meanwhile (see the module's doc).

    Nothing is traced when another tracer (a debugger, coverage) is already installed: `hit`
    then holds every need, as if they ran, since the call cannot be watched without breaking
    that tool; `watched` says whether the answer is known. A watch may be entered again (a
    generator's body, once per `next`): it is known only if every entry could trace. Another
    watch is not another tracer: all trace through `dispatch`.
    """

    def __init__(self, filename: str, needs: Sequence[Need]) -> None:
        self.names = {filename, os.path.realpath(filename)}  # as compiled, and resolved
        self.needs = tuple(needs)
        self.hit: set[Need] = set()
        self.traced = False  # an entry traced
        self.blind = False  # an entry could not
        self.entries: list[bool] = []  # whether each open entry traces, innermost last
        self.codes: dict[CodeType, bool] = {}
        self.previous: list[Any] = []

    @property
    def watched(self) -> bool:
        return self.traced and not self.blind

    def wants(self, code: CodeType) -> bool:
        """Return True if `code` is a function of the file holding a line of a need."""
        if code.co_filename not in self.names:
            return False
        found = self.codes.get(code)
        if found is None:
            held = {line for _, _, line in code.co_lines() if line is not None}
            found = any(need.holds(line) for line in held for need in self.needs)
            self.codes[code] = found
        return found

    def saw(self, line: int) -> None:
        for need in self.needs:
            if need.holds(line):
                self.hit.add(need)

    @property
    def done(self) -> bool:
        return len(self.hit) == len(self.needs)

    def __enter__(self) -> Self:
        traces = bool(self.needs) and sys.gettrace() in (None, dispatch)
        self.entries.append(traces)
        if not traces:
            self.hit, self.blind = set(self.needs), bool(self.needs)
            return self
        self.traced = True
        hook_callbacks()
        ACTIVE.append(self)
        self.previous.append(threading.gettrace())
        if not self.done:
            sys.settrace(dispatch)
            threading.settrace(dispatch)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.entries.pop():
            return
        if self in ACTIVE:
            ACTIVE.remove(self)
        threading.settrace(self.previous.pop())  # type: ignore[arg-type]
        if not pending() and sys.gettrace() is dispatch:
            sys.settrace(None)

    @property
    def missing(self) -> tuple[Need, ...]:
        return tuple(need for need in self.needs if need not in self.hit)


def watched_callback(callback: Callable[..., Any]) -> Callable[..., Any]:
    """Return `callback` (a host callback XLA runs on its own thread) tracing that thread for
    the active watches while it runs."""

    def run(*args: Any) -> Any:
        if not pending() or sys.gettrace() is not None:
            return callback(*args)
        sys.settrace(dispatch)
        try:
            return callback(*args)
        finally:
            sys.settrace(None)

    return run


def hook_callbacks() -> None:
    """Make the host callbacks lowered from now on report to the active watch (once per
    process; nothing when this JAX has no `jax._src.callback.emit_python_callback`)."""
    module = sys.modules.get("jax._src.callback")
    real = getattr(module, "emit_python_callback", None)
    if HOOKED or module is None or real is None:
        return
    HOOKED.append(True)

    def emit_python_callback(ctx: Any, callback: Any, *args: Any, **kwargs: Any) -> Any:
        return real(ctx, watched_callback(callback), *args, **kwargs)

    module.emit_python_callback = emit_python_callback  # type: ignore[attr-defined]
