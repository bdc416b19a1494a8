"""Node positions from one plain code generation, at a fraction of `PositionProvider`'s cost.

libcst's `PositionProvider` computes a `CodeRange` for every node while tracking line and column
token by token. This records, for every node, only the token indices where its syntactic range
starts and ends (the same hook `PositionProvider` uses), and turns an index into a line and
column only when a pass asks for that node.
"""

from __future__ import annotations

import bisect
from itertools import accumulate

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodePosition, CodeRange


class _Recorder(CodegenState):
    def __init__(self, module: cst.Module) -> None:
        super().__init__(
            default_indent=module.default_indent, default_newline=module.default_newline
        )
        self.spans: dict[int, tuple[int, int]] = {}
        self._stack: list[int] = []

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._stack.append(len(self.tokens))

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self._stack.pop()
        # A syntactic range, recorded while the node generated its code, wins.
        self.spans.setdefault(id(node), (start, len(self.tokens)))

    def record_syntactic_position(  # type: ignore[override]
        self,
        node: cst.CSTNode,
        *,
        start_node: cst.CSTNode | None = None,
        end_node: cst.CSTNode | None = None,
    ) -> _Span:
        # A plain object, not a @contextmanager generator: this runs for most nodes, and a
        # generator-based context manager costs several times more to enter and leave.
        return _Span(self, node, start_node, end_node)


class _Span:
    __slots__ = ("end_node", "node", "start", "start_node", "state")

    def __init__(
        self,
        state: _Recorder,
        node: cst.CSTNode,
        start_node: cst.CSTNode | None,
        end_node: cst.CSTNode | None,
    ) -> None:
        self.state, self.node, self.start_node, self.end_node = state, node, start_node, end_node
        self.start = 0

    def __enter__(self) -> None:
        self.start = len(self.state.tokens)

    def __exit__(self, *exc: object) -> None:
        spans = self.state.spans
        start, end = self.start, len(self.state.tokens)
        if self.start_node is not None and id(self.start_node) in spans:
            start = spans[id(self.start_node)][0]
        if self.end_node is not None and id(self.end_node) in spans:
            end = spans[id(self.end_node)][1]
        spans[id(self.node)] = (start, end)


class Positions:
    """Maps nodes of one module to their `CodeRange` (1-based lines, 0-based columns)."""

    def __init__(self, module: cst.Module) -> None:
        state = _Recorder(module)
        module._codegen(state)
        self._spans = state.spans
        self._offsets = [0, *accumulate(map(len, state.tokens))]
        code = "".join(state.tokens)
        self._newlines = [i for i, ch in enumerate(code) if ch == "\n"]

    def _position(self, token_index: int) -> CodePosition:
        offset = self._offsets[token_index]
        line = bisect.bisect_left(self._newlines, offset)
        line_start = self._newlines[line - 1] + 1 if line else 0
        return CodePosition(line + 1, offset - line_start)

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        start, end = self._spans[id(node)]
        return CodeRange(self._position(start), self._position(end))
