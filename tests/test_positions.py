"""`Positions` and `LazyPositions` give exactly libcst's `PositionProvider` ranges, node for node."""

from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst
import pytest
from conftest import FIXTURES
from libcst.metadata import MetadataWrapper, PositionProvider

from jaxmigrate.toolkit.positions import LazyPositions, Positions

CASES = sorted(FIXTURES.glob("*/*.py"))
TRICKY = """\
# a header comment

@decorator(  # a comment in the decorator
    arg,
)
@other
async def f(a, /, b=(1,
                     2), *, c: "int" = 3) -> None:
    x = (yield)  ;  y = [i for i in range(3) if i]
    with (open(a) as h,
          open(b) as g):
        pass
    match x:
        case [1, *rest] if rest:
            return f"{x!r:>{y}}"
    return lambda q=1: (q,
        q)


class C(Base, metaclass=M):  # trailing
    '''doc'''

    def g(self): return self.h[1:2, ...]
# a footer comment
"""


def every_node(module: cst.Module) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []

    class Collect(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            found.append(node)
            return True

    module.visit(Collect())
    return found


@pytest.mark.parametrize(
    "source",
    [TRICKY, *(p.read_text() for p in CASES)],
    ids=["tricky", *(f"{p.parent.name}/{p.name}" for p in CASES)],
)
def test_positions_are_libcst_positions(source: str) -> None:
    wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
    expected = wrapper.resolve(PositionProvider)
    ours = Positions(wrapper.module)
    nodes = every_node(wrapper.module)
    assert nodes
    for node in nodes:
        assert ours[node] == expected[node], cst.Module([]).code_for_node(node)[:80]


def outlined(source: str) -> list:
    from jaxmigrate.toolkit.facts import outline

    return outline(ast.parse(source))


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_lazy_positions_are_libcst_positions(case: Path) -> None:
    source = case.read_text()
    wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
    expected = wrapper.resolve(PositionProvider)
    lazy = LazyPositions(wrapper.module, source, outlined(source))
    for node in every_node(wrapper.module):
        assert lazy[node] == expected[node], cst.Module([]).code_for_node(node)[:80]


LAZY = """\
import jax


class Test:
    x = 1; y = 2

    @jax.jit
    def first(self, a):
        return a + 1

    # a comment before the second
    def second(self, a):
        return jax.pmap(abs)(a)


def after():
    return 3
"""


def test_lazy_positions_generate_only_the_statement_asked_about() -> None:
    module = cst.parse_module(LAZY)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    call = next(
        n
        for n in every_node(module)
        if isinstance(n, cst.Call) and "pmap" in cst.Module([]).code_for_node(n)
    )
    lazy = LazyPositions(module, LAZY, outlined(LAZY))
    assert lazy[call] == expected[call]
    assert lazy._full is None  # no code generation of the whole module
    assert len([p for p in lazy._done.values() if p is not None]) == 1  # `second` alone


def test_a_wrong_outline_is_caught_and_answered_in_full() -> None:
    module = cst.parse_module(LAZY)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    shifted = [
        (line + 1, None if members is None else [m + 1 for m in members])
        for line, members in outlined(LAZY)
    ]
    lazy = LazyPositions(module, LAZY, shifted)
    for node in every_node(module):
        assert lazy[node] == expected[node]
    assert lazy._full is not None and all(p is None for p in lazy._done.values())
