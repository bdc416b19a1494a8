"""`positions.Positions` gives exactly libcst's `PositionProvider` ranges, node for node."""

from __future__ import annotations

import libcst as cst
import pytest
from conftest import FIXTURES
from libcst.metadata import MetadataWrapper, PositionProvider

from jaxmigrate.positions import Positions

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
