"""Node positions from one plain code generation, at a fraction of `PositionProvider`'s cost.

libcst's `PositionProvider` computes a `CodeRange` for every node while tracking line and column
token by token. This records, for every node, only the token indices where its syntactic range
starts and ends (the same hook `PositionProvider` uses), and turns an index into a line and
column only when a pass asks for that node.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import Any

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodePosition, CodeRange

from jaxmigrate.toolkit.names import child_fields, is_node


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


class LazyPositions:
    """`Positions` of a module parsed from `code`, one statement at a time.

    Most queries fall in a few statements (the sites), yet `Positions` generates the code of
    the whole module. Here the unit is a top-level statement, or a statement in the body of a
    top-level class (test files are a few huge classes). Python's own parse of the same code
    (`prefilter.outline`) says on which line each unit's statement starts; a unit's code is
    generated alone with its spans, placed by that line, and checked against `code` character
    for character. Anything that does not fit (a node outside every unit, a unit whose code is
    not where the outline puts it) is answered by a full `Positions`, so the answers are always
    exactly libcst's.
    """

    def __init__(self, module: cst.Module, code: str, outline: Sequence[tuple[int, Any]]) -> None:
        self._module = module
        self._code = code
        self._units: list[tuple[cst.BaseStatement, int, tuple[str, ...]]] = []
        self._planned = self._plan(module, outline)
        self._owner: dict[int, int] = {}
        self._walked = 0
        self._done: dict[int, _Placed | None] = {}
        self._newlines: list[int] | None = None
        self._full: Positions | None = None

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        if self._planned:
            index = self._find(node)
            if index is not None:
                placed = self._place(index)
                if placed is not None and id(node) in placed.spans:
                    return placed[node]
        if self._full is None:
            self._full = Positions(self._module)
        return self._full[node]

    def _plan(self, module: cst.Module, outline: Sequence[tuple[int, Any]]) -> bool:
        default = module.default_indent
        for stmt, (line, members) in _paired(module.body, outline) or ():
            body = stmt.body if isinstance(stmt, cst.ClassDef) else None
            if isinstance(body, cst.IndentedBlock) and members:
                inner = _paired(body.body, [(m, None) for m in members])
                if inner is not None:
                    indent = (default if body.indent is None else body.indent,)
                    self._units.extend((member, at, indent) for member, (at, _) in inner)
                    continue
            self._units.append((stmt, line, ()))
        return bool(self._units)

    def _find(self, node: cst.CSTNode) -> int | None:
        found = self._owner.get(id(node))
        while found is None and self._walked < len(self._units):
            index = self._walked
            self._walked += 1
            for seen in _ids(self._units[index][0]):
                self._owner[seen] = index
            found = self._owner.get(id(node))
        return found

    def _place(self, index: int) -> _Placed | None:
        if index in self._done:
            return self._done[index]
        stmt, line, indent = self._units[index]
        state = _Recorder(self._module)
        state.indent_tokens = list(indent)
        stmt._codegen(state)
        placed = _Placed(state, stmt, line)
        if self._newlines is None:
            self._newlines = [i for i, ch in enumerate(self._code) if ch == "\n"]
        first = placed.first
        fits = 1 <= first <= len(self._newlines) + 1
        if fits:
            start = 0 if first == 1 else self._newlines[first - 2] + 1
            fits = self._code.startswith(placed.text, start)
        self._done[index] = placed if fits else None
        return self._done[index]


class _Placed:
    """The spans of one statement's code generated alone, and the line it starts on."""

    def __init__(self, state: _Recorder, stmt: cst.CSTNode, line: int) -> None:
        self.spans = state.spans
        self.text = "".join(state.tokens)
        self._offsets = [0, *accumulate(map(len, state.tokens))]
        self._newlines = [i for i, ch in enumerate(self.text) if ch == "\n"]
        # `line` is where the statement's own first token is; lines before it in the text
        # (comments, blank lines, decorators) move the text's first line up.
        self.first = line - bisect.bisect_left(
            self._newlines, self._offsets[self.spans[id(stmt)][0]]
        )

    def _position(self, token_index: int) -> CodePosition:
        offset = self._offsets[token_index]
        line = bisect.bisect_left(self._newlines, offset)
        line_start = self._newlines[line - 1] + 1 if line else 0
        return CodePosition(self.first + line, offset - line_start)

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        start, end = self.spans[id(node)]
        return CodeRange(self._position(start), self._position(end))


def _paired(
    statements: Sequence[cst.BaseStatement], outline: Sequence[tuple[int, Any]]
) -> list[tuple[cst.BaseStatement, tuple[int, Any]]] | None:
    """Pair libcst statements with their outline entries (one per `ast` statement: a line of
    `a; b` is two), or None when they do not line up."""
    paired = []
    at = 0
    for stmt in statements:
        if at >= len(outline):
            return None
        paired.append((stmt, outline[at]))
        at += len(stmt.body) if isinstance(stmt, cst.SimpleStatementLine) else 1
    return paired if at == len(outline) else None


def _ids(node: cst.CSTNode) -> Iterator[int]:
    """The ids of `node` and every node below it but whitespace and punctuation (a query for
    one of those is answered by the full `Positions`)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield id(current)
        for name in child_fields(type(current)):
            value = getattr(current, name)
            kind = type(value)
            if kind is tuple or kind is list:
                stack.extend(v for v in value if is_node(type(v)))
            elif is_node(kind):
                stack.append(value)
