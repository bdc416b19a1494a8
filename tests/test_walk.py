"""The fast read-only walks (`toolkit.names`) against libcst's own `visit`.

`walk_in_order` must meet the same nodes as `node.visit(visitor)`, punctuation and whitespace
aside, in the same order: the pmap pass's `Flow` lists the names it meets in that order (the
reads of a name, in the order of the text), and reads whole modules with it (libcst's `visit` rebuilds every node it
passes, half of all the time a dry run spent over JAX's sources).
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import libcst as cst
import pytest
from conftest import FIXTURES

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.toolkit.names import walk_in_order

# Whitespace, punctuation and operator tokens: `walk_in_order` does not enter the fields
# holding them; every other node must be met as libcst's `visit` meets it.
TRIVIA = (
    cst.BaseParenthesizableWhitespace,
    cst.TrailingWhitespace,
    cst.EmptyLine,
    cst.Newline,
    cst.Comment,
    cst.Comma,
    cst.Dot,
    cst.Colon,
    cst.Semicolon,
    cst.AssignEqual,
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
    cst.Asynchronous,
    cst.BaseUnaryOp,
    cst.BaseBinaryOp,
    cst.BaseBooleanOp,
    cst.BaseCompOp,
    cst.BaseAugOp,
    cst.ImportStar,
)

EVERY_FORM = textwrap.dedent(
    """\
    from . import a
    from .b import (c as d, e)
    import f.g as h, i

    @deco(x, k=y)
    @other
    async def fn[T: int = str](p, /, q: int = 1, *args: T, r=lambda z=2: z, **kw) -> T:
        global G
        v = yield from w
        u: list[int] = [t for t in range(3) if t if not t for s in t]
        u[1:2:3], u[::], u[a:] = {k: v for k, v in w}, {*s}, (*s,)
        m = body if test else orelse
        f"{v!r:>{width}} {w=}"
        async with a as (b, c), d:
            await e
        async for x in y:
            pass
        else:
            x += 1
        try:
            pass
        except* ValueError as err:
            raise X from err
        return (n := -m ** 2) and not n or n < 3 <= 4 is not None

    class C(Base, metaclass=M, **extra):
        attr: int
        def method(self, *, kw): ...

    match command:
        case [x, *rest] if x > 0:
            pass
        case {"k": v, **kw} | P(a, b=c) as whole:
            pass
        case _:
            pass
    try:
        pass
    except (A, B) as e:
        del e
    finally:
        assert x, "message"
    type Alias[K] = dict[K, int]
    print(*args, sep="", **kw); lambda: (yield)
    """
)


class _Met(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.met: list[tuple[str, int]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if not isinstance(node, TRIVIA):
            self.met.append(("visit", id(node)))
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if not isinstance(original_node, TRIVIA):
            self.met.append(("leave", id(original_node)))


def _both(module: cst.Module) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    theirs, ours = _Met(), _Met()
    module.visit(theirs)
    walk_in_order(ours, module)
    return theirs.met, ours.met


def test_walk_in_order_meets_every_form_as_libcst_visit_does() -> None:
    module = cst.parse_module(EVERY_FORM)
    theirs, ours = _both(module)
    assert len(ours) > 400
    assert ours == theirs


@pytest.mark.parametrize(
    "case",
    sorted(p for p in FIXTURES.glob("pmap/program_*.py") if not p.name.endswith(".expected.py")),
    ids=lambda p: f"{p.parent.name}/{p.stem}",
)
def test_walk_in_order_meets_the_fixtures_as_libcst_visit_does(case: Path) -> None:
    theirs, ours = _both(cst.parse_module(case.read_text(encoding="utf-8")))
    assert ours == theirs


def test_walk_in_order_skips_the_children_of_a_refused_node() -> None:
    module = cst.parse_module("def f(a):\n    b = a\nx = f(1)\n")

    class NoDefs(_Met):
        def on_visit(self, node: cst.CSTNode) -> bool:
            super().on_visit(node)
            return not isinstance(node, cst.FunctionDef)

    theirs, ours = NoDefs(), NoDefs()
    module.visit(theirs)
    walk_in_order(ours, module)
    assert ours.met == theirs.met
    names = {id(n) for n in module.body[0].body.body[0].body[0].targets}  # type: ignore[attr-defined]
    assert not names & {i for _, i in ours.met}


def _rebuilt_under(function: str, run: Callable[[], object]) -> int:
    """Return how many nodes libcst rebuilt (`_visit_and_replace_children` calls) while
    `function` was on the stack during `run()`."""
    count = 0

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        nonlocal count
        if event != "call" or frame.f_code.co_name != "_visit_and_replace_children":
            return
        up: FrameType | None = frame.f_back
        while up is not None:
            if up.f_code.co_name == function:
                count += 1
                return
            up = up.f_back

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return count


def test_the_program_level_pmap_analysis_rebuilds_no_node_outside_the_step() -> None:
    """The pmap pass reads the whole module to follow a step's data flow; it used to read it
    with libcst's `visit`, rebuilding every node of the module (and every def's body once more
    for its locals): 1.8x the CPU of a dry run over JAX's sources. Code far from any step must
    cost no rebuilt node."""
    step = (FIXTURES / "pmap" / "program_batch_stats.py").read_text(encoding="utf-8")
    filler = "".join(
        f"\n\ndef helper_{i}(a, b):\n    c = [a * {i} for a in b if a]\n    return c, b[1:2]\n"
        for i in range(150)
    )
    module = cst.parse_module(filler)
    nodes = _Met()
    walk_in_order(nodes, module)
    options = Options(unsafe_fixes=True)
    result = migrate_source(step + filler, options=options)
    assert any(s.code == "JM202" and s.applied for s in result.sites)
    assert "make_array_from_process_local_data" in result.code  # the program-level form ran
    alone = _rebuilt_under("_find_programs", lambda: migrate_source(step, options=options))
    rebuilt = _rebuilt_under(
        "_find_programs", lambda: migrate_source(step + filler, options=options)
    )
    assert len(nodes.met) // 2 > 4000
    assert rebuilt == alone, f"{rebuilt - alone} nodes of the filler rebuilt by the analysis"
