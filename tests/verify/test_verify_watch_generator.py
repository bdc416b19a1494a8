"""A generator's lines run while its caller iterates it, after the call returned: the recorder's
watch follows each resumption (`recorder.watching`), passes every value both ways, and settles
what the call ran once the generator ends, however it ends."""

from __future__ import annotations

import runpy
import sys
from collections.abc import Generator
from pathlib import Path

import pytest

from jaxmigrate.verify.child.reach import Need, Watch
from jaxmigrate.verify.child.recorder import watching

SOURCE = """\
def counter(limit):
    total = 0
    while total < limit:
        sent = yield total
        total += sent if sent is not None else 1
    return "done"


def guarded():
    try:
        yield 1
    except ValueError:
        yield "caught"


def consume(items):
    drawn = list(items)
    return drawn
"""


@pytest.fixture
def module(tmp_path: Path) -> dict[str, object]:
    path = tmp_path / "gen.py"
    path.write_text(SOURCE)
    return runpy.run_path(str(path))


def watched(module: dict[str, object], name: str, lines: tuple[int, ...], *args: object):
    """Return the watched generator of `module[name](*args)`, its watch, and the settle log."""
    watch = Watch(str(module["__file__"]), [Need(((line, line),)) for line in lines])
    settled: list[tuple[int, ...]] = []

    def settle() -> None:
        settled.append(tuple(sorted(n.spans[0][0] for n in watch.hit)))

    gen = module[name](*args)  # type: ignore[operator]
    return watching(gen, watch, settle), watch, settled


def test_values_pass_both_ways_and_the_lines_run_while_iterated_are_seen(module) -> None:
    gen, watch, settled = watched(module, "counter", (2, 5), 3)
    assert isinstance(gen, Generator)
    assert next(gen) == 0 and not settled  # line 5 has not run yet
    assert gen.send(2) == 2
    with pytest.raises(StopIteration) as stop:
        gen.send(5)
    assert stop.value.value == "done"  # the generator's return value comes through
    assert settled == [(2, 5)] and watch.watched and not watch.missing


def test_a_generator_closed_early_settles_what_it_ran(module) -> None:
    gen, watch, settled = watched(module, "counter", (2, 5), 3)
    assert next(gen) == 0
    gen.close()
    assert settled == [(2,)]  # line 5 never ran: the call missed it
    assert [n.spans[0][0] for n in watch.missing] == [5]


def test_an_exception_thrown_in_reaches_the_generator(module) -> None:
    gen, _, settled = watched(module, "guarded", (11, 13))
    assert next(gen) == 1
    assert gen.throw(ValueError("x")) == "caught"
    assert list(gen) == [] and settled == [(11, 13)]


def test_under_another_tracer_a_generator_is_not_watched(module) -> None:
    """A resumption that cannot trace (a debugger installed meanwhile) makes the whole watch
    unknown: it never claims that lines ran which it did not see."""
    gen, watch, settled = watched(module, "counter", (2, 5), 3)
    assert next(gen) == 0
    previous = sys.gettrace()
    sys.settrace(lambda *args: None)
    try:
        assert gen.send(1) == 1
    finally:
        sys.settrace(previous)
    gen.close()
    assert settled and not watch.watched


def test_a_watch_inside_another_blinds_neither(module) -> None:
    """big_vision's `main` (watched until its last site runs) iterates `Evaluator.run`
    (watched too): both trace, each its own lines; before, the inner watch took the outer's
    tracer for another tool's, and was blind on every call made before `main`'s last site."""
    outer = Watch(str(module["__file__"]), [Need(((18, 18),))])  # `return drawn`
    gen, inner, settled = watched(module, "counter", (2, 5), 3)
    with outer:
        assert module["consume"](gen) == [0, 1, 2]  # type: ignore[operator]
    assert settled == [(2, 5)] and inner.watched and not inner.missing
    assert outer.watched and not outer.missing
    assert sys.gettrace() is None  # nothing left tracing
