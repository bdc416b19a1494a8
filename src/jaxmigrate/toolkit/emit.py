"""The one code emitter of every pass: the file's style, one call layout engine, small helpers.

A pass builds new code as CST nodes and hands calls to this module to be laid out the way the
file's own formatter would lay them out (black, ruff-format, pyink): on one line when they fit
`Style.width`, else with the arguments hugged on one line of their own, else one argument per
line with a trailing comma, continuation lines indented by the file's continuation unit. Every
continuation line is written with its absolute indentation, so a call is laid out relative to
the column it really starts at: inside a lambda, a tuple or a list element as well as at the
start of a statement.

`Style` says how a file is written: its indentation unit, its continuation indentation, its line
width (the project's configuration wins, which the engine reads: see `config.line_width`; else
it is inferred from the file; else `DEFAULT_WIDTH`) and its quotes. Passes get it from
`FileState.style` and never read files themselves.
"""

from __future__ import annotations

import functools
import itertools
import re
import textwrap
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import libcst as cst

from jaxmigrate.toolkit.names import dotted

# black's and ruff's default, and pmap's layout width before the emitter: a project that says
# nothing and a file too short to tell get the width most Python formatters use.
DEFAULT_WIDTH = 88
# Widths a formatter or linter is commonly set to (pycodestyle, Google/pyink, black/ruff,
# and the two wide settings); an inferred width is always one of these.
COMMON_WIDTHS = (79, 80, 88, 100, 120)
# A narrow width is inferred only from this many lines within NEAR columns of it.
EVIDENCE = 3
NEAR = 6


def code(node: cst.CSTNode) -> str:
    """Return the source of `node` on its own (the one `code_for_node` of the passes)."""
    return _EMPTY.code_for_node(node)


_EMPTY = cst.Module(body=[])


# The file's style -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Style:
    """How a file is written: new code follows it.

    `indent` is one level of block indentation, `continuation` the extra indentation of the lines
    of a call broken over several lines (4 in black's and in Google's 2-space style, the block
    unit in ruff's), `width` the line length new code fits in, `quote` the quote of new strings.
    """

    indent: str = "    "
    continuation: str = "    "
    width: int = DEFAULT_WIDTH
    quote: str = '"'

    def string(self, value: str) -> cst.SimpleString:
        """Return a string literal of `value` (plain text: no quote or backslash) in the file's
        quotes."""
        quote = self.quote if self.quote not in value else ('"' if self.quote == "'" else "'")
        return cst.SimpleString(f"{quote}{value}{quote}")

    def reindent(self, source: str) -> str:
        """Return `source`, written with 4-space indentation, in this style's indentation."""
        if self.indent == "    ":
            return source
        return re.sub(r"(?m)^((?:    )+)", lambda m: self.indent * (len(m.group(1)) // 4), source)


def infer_style(
    source: str,
    *,
    width: int | None = None,
    indent: str | None = None,
) -> Style:
    """Return the style `source` is written in; `width` and `indent` (from the project's
    configuration) win over what the file suggests for those."""
    lines = source.splitlines()
    unit = _indent_unit(lines) or indent or "    "
    # Without evidence, 2-space code is Google style (pyink, yapf's google): 4-space
    # continuation lines; otherwise the continuation is the block unit (black, ruff).
    default = "    " if unit == "  " else unit
    return Style(
        indent=unit,
        continuation=_continuation(lines) or default,
        width=width or infer_width(lines) or DEFAULT_WIDTH,
        quote=_quote(source),
    )


def infer_width(lines: Sequence[str]) -> int | None:
    """Return the line width the file was evidently wrapped at, or None when it does not say.

    Only lines a formatter could have broken count (not comments, URLs, nor lines holding a
    long string, which formatters leave long); a couple of long lines (one in a hundred) are
    forgiven, and so are more when more lines come near the width than go past it (code a
    formatter wrapped, with a few lines it was told to leave alone). A file that fits 80 columns is taken for an 80-column file (79: pycodestyle's)
    only when several of its lines come within a few columns of that limit: a short file says
    nothing. Wider files get the narrowest common width they fit.
    """
    lengths = [len(line.rstrip()) for line in lines if _breakable(line)]
    allowed = max(2, len(lengths) // 100)

    def over(width: int) -> int:
        return sum(1 for n in lengths if n > width)

    def near(width: int) -> int:
        return sum(1 for n in lengths if width - NEAR < n <= width)

    def fits(width: int) -> bool:  # the long lines are outliers, or fewer than those near it
        return over(width) <= allowed or EVIDENCE <= near(width) > over(width)

    if over(79) == 0 and near(79) >= EVIDENCE:
        return 79
    if fits(80):
        return 80 if near(80) >= EVIDENCE else None
    return next((w for w in COMMON_WIDTHS[2:] if fits(w)), None)


_LONG_STRING = re.compile(r"""(['"]).{30,}?\1""")


def _breakable(line: str) -> bool:
    """Return True unless a formatter would leave the line long: a comment, a long string."""
    return not (line.lstrip().startswith("#") or "http" in line or _LONG_STRING.search(line))


_TRAILING_COMMENT = re.compile(r"""\s+#[^'"]*$""")
_OPENS = re.compile(r"[(\[{]\s*$")


def _indent_unit(lines: Sequence[str]) -> str | None:
    """Return the indentation of the first indented block (after a line ending in `:`)."""
    for i, line in enumerate(lines[:-1]):
        stripped = _TRAILING_COMMENT.sub("", line.rstrip())
        if not stripped.endswith(":") or stripped.lstrip().startswith("#"):
            continue
        body = next((n for n in lines[i + 1 :] if n.strip() and not n.lstrip().startswith("#")), "")
        base, deeper = _leading(stripped), _leading(body)
        if len(deeper) > len(base) and deeper.startswith(base):
            step = deeper[len(base) :]
            if step in ("\t", "  ", "    ", "   ", "        "):
                return step
    return None


def _continuation(lines: Sequence[str]) -> str | None:
    """Return the most common extra indentation after a line ending in an opening bracket."""
    steps: Counter[str] = Counter()
    for line, following in itertools.pairwise(lines):
        if _OPENS.search(line) and following.strip():
            base, deeper = _leading(line), _leading(following)
            if len(deeper) > len(base) and deeper.startswith(base):
                steps[deeper[len(base) :]] += 1
    return steps.most_common(1)[0][0] if steps else None


_STRING_START = re.compile(r"""(?<![\w'"])[rRbBuUfF]{0,2}('|")""")


def _quote(source: str) -> str:
    """Return the quote most string literals start with (double when tied or unknown)."""
    counts = Counter(m.group(1) for m in _STRING_START.finditer(source[:20000]))
    return "'" if counts["'"] > counts['"'] else '"'


def _leading(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


# Small helpers --------------------------------------------------------------------------------
def with_keyword(arg: cst.Arg, keyword: str) -> cst.Arg:
    """Return `arg` passed as `keyword=value`, keeping its value, comma and comments."""
    equal = arg.equal
    if not isinstance(equal, cst.AssignEqual):
        equal = cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        )
    return arg.with_changes(keyword=cst.Name(keyword), equal=equal)


def fresh_name(candidates: Sequence[str], taken: set[str]) -> str:
    """Return the first of `candidates` not in `taken` (or the last one with underscores)."""
    for name in candidates:
        if name not in taken:
            return name
    name = candidates[-1]
    while name in taken:
        name += "_"
    return name


_TARGETS = (cst.AnnAssign, cst.For, cst.CompFor, cst.NamedExpr)
_DEFINES = (cst.FunctionDef, cst.ClassDef, cst.NameItem, cst.AssignTarget, cst.ImportAlias)


def is_read(node: cst.Name | cst.Attribute, parent: cst.CSTNode | None) -> bool:
    """Return True if `node`, a child of `parent`, reads a variable: not an attribute name, a
    keyword, a parameter, a definition's name, a `global` name or an assignment target (an
    augmented assignment's target is read as well as written)."""
    if isinstance(parent, cst.Attribute):
        return node is parent.value
    if isinstance(parent, cst.Arg):
        return node is not parent.keyword
    if isinstance(parent, cst.Param):
        return node is not parent.name
    if isinstance(parent, _TARGETS):
        return node is not parent.target
    if isinstance(parent, cst.AsName):
        return False
    return not isinstance(parent, _DEFINES)


def is_plain_reusable(node: cst.BaseExpression) -> bool:
    """Return True for a string literal or a dotted name: writing it twice means the same."""
    return isinstance(node, (cst.SimpleString, cst.ConcatenatedString)) or dotted(node) is not None


# The call layout engine -----------------------------------------------------------------------
@dataclass(frozen=True)
class Room:
    """Where a call is written: the indentation of the line it starts on, the column it starts
    at and how many characters follow it on its last line (a closing bracket, a comma)."""

    indent: str
    column: int
    tail: int = 0

    @classmethod
    def of_line(cls, line: str, column: int, tail: int = 0) -> Room:
        """Return the room of a call starting at `column` of `line`."""
        return cls(_leading(line), column, tail)


@dataclass(frozen=True)
class Item:
    """One argument to emit, with the comments that went with it where it came from."""

    arg: cst.Arg
    call: Call | None = None  # a call to lay out as the argument's value (or inside it)
    above: tuple[cst.EmptyLine, ...] = ()  # comment lines above it
    after: cst.TrailingWhitespace | None = None  # the comment ending its line
    # For a call inside the value (`lambda v: f(v)`): the value around the laid-out call, and
    # how many columns of it come before the call.
    wrap: Callable[[cst.Call], cst.BaseExpression] | None = None
    head: int = 0

    @property
    def commented(self) -> bool:
        """Return True if a comment needs the item on a line of its own."""
        nested = self.call is not None and self.call.commented
        return nested or self.after is not None or any(line.comment for line in self.above)

    def keyword(self, keyword: str, value: cst.BaseExpression | None = None) -> Item:
        """Return the item passed as `keyword=value` (its own value by default)."""
        equal = cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        )
        value = self.arg.value if value is None else value
        arg = self.arg.with_changes(keyword=cst.Name(keyword), equal=equal, value=value)
        return replace(self, arg=arg)

    def value(self, render: Callable[[Call], cst.Call]) -> cst.Arg:
        """Return the argument, its call (if any) rendered by `render`."""
        if self.call is None:
            return self.arg
        laid = render(self.call)
        return self.arg.with_changes(value=self.wrap(laid) if self.wrap else laid)


def new_item(keyword: str, value: cst.BaseExpression) -> Item:
    """Return a fresh `keyword=value` argument."""
    return Item(cst.Arg(value)).keyword(keyword)


def items_of(call: cst.Call) -> list[Item]:
    """Return the arguments of `call` with the comments above and after each."""
    gaps: list[cst.BaseParenthesizableWhitespace] = [call.whitespace_before_args]
    for arg in call.args:
        comma = arg.comma
        gaps.append(
            comma.whitespace_after if isinstance(comma, cst.Comma) else arg.whitespace_after_arg
        )
    items = []
    for arg, before, after in zip(call.args, gaps, gaps[1:]):
        above = tuple(before.empty_lines) if isinstance(before, cst.ParenthesizedWhitespace) else ()
        line = after.first_line if isinstance(after, cst.ParenthesizedWhitespace) else None
        items.append(Item(arg, None, above, line if line and line.comment else None))
    return items


def _break(
    indent: str,
    after: cst.TrailingWhitespace | None = None,
    above: Sequence[cst.EmptyLine] = (),
) -> cst.ParenthesizedWhitespace:
    """Return a line break (after `after`'s comment) and comment lines, then `indent` (the
    whole indentation of the next line: code generation adds nothing to it)."""
    lines = [
        cst.EmptyLine(indent=False, whitespace=cst.SimpleWhitespace(indent), comment=line.comment)
        if line.comment
        else cst.EmptyLine(indent=False)
        for line in above
    ]
    return cst.ParenthesizedWhitespace(
        first_line=after or cst.TrailingWhitespace(),
        empty_lines=lines,
        indent=False,
        last_line=cst.SimpleWhitespace(indent),
    )


def joined(args: Sequence[cst.Arg]) -> list[cst.Arg]:
    """Return `args` on one line: `a, b, c`."""
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    last = len(args) - 1
    return [
        a.with_changes(
            comma=comma if i < last else cst.MaybeSentinel.DEFAULT,
            whitespace_after_arg=cst.SimpleWhitespace(""),
        )
        for i, a in enumerate(args)
    ]


@dataclass(frozen=True)
class Call:
    """A call to emit: its function and argument items, nested calls laid out in turn."""

    func: cst.BaseExpression
    items: list[Item]
    opening: cst.TrailingWhitespace | None = None  # a comment right after `(`
    # The call it replaces ended its last argument with a comma over several lines: black's
    # "magic trailing comma" keeps one argument per line.
    magic: bool = False

    @classmethod
    def of(cls, call: cst.Call) -> Call:
        """Return `call` to lay out; arguments that are calls are laid out in turn."""
        items = []
        for item in items_of(call):
            value = item.arg.value
            if isinstance(value, cst.Call) and not value.lpar and not comments_in(value):
                item = replace(item, call=Call.of(value))
            elif "\n" in code(value):
                item = replace(item, arg=item.arg.with_changes(value=flattened(value)))
            items.append(item)
        return cls(call.func, items, _opening(call))

    @property
    def commented(self) -> bool:
        """Return True if a comment forces the call onto several lines."""
        return self.opening is not None or any(item.commented for item in self.items)

    def flat(self) -> cst.Call:
        """Return the call on one line."""
        return cst.Call(self.func, joined([i.value(Call.flat) for i in self.items]))

    def laid_out(self, room: Room, style: Style) -> cst.Call:
        """Return the call laid out as black lays it out, starting where `room` says."""
        inner = room.indent + style.continuation
        if not self.commented and not self.magic:
            flat = self.flat()
            if room.column + len(code(flat)) + room.tail <= style.width:
                return flat
            if not self.items or self._head_too_long(room, style):
                # `f(x).flatten()`, or `f(x).reshape(` past the width: black omits the
                # trailer and splits the call it is a method of
                return self._receiver_split(flat, room, style)
            hugged = joined([i.value(Call.flat) for i in self.items])
            if len(inner) + len(code(cst.Call(cst.Name("f"), hugged))) - 3 <= style.width:
                return self._hugged(hugged, inner, room.indent)
            sole = self.items[0] if len(self.items) == 1 else None
            if sole is not None and sole.call is not None:  # black's right-hand split
                start = _start(sole, inner)
                nested = sole.value(lambda c: c.laid_out(Room(inner, start), style))
                return self._hugged([nested], inner, room.indent)
        return self._exploded(room.indent, inner, style)

    def _head_too_long(self, room: Room, style: Style) -> bool:
        """`f(x).m(` (a method of a call's result) does not fit the line up to its `(`."""
        func = self.func
        if not isinstance(func, cst.Attribute) or not isinstance(func.value, cst.Call):
            return False
        return room.column + len(code(func)) + 1 > style.width

    def _receiver_split(self, flat: cst.Call, room: Room, style: Style) -> cst.Call:
        """A call with no arguments too long for its line: `f(x).flatten()` with `f(x)` laid
        out (black's split), else as it is."""
        func = self.func
        if not isinstance(func, cst.Attribute) or not isinstance(func.value, cst.Call):
            return flat
        after = len(code(flat)) - len(code(func.value))  # `.flatten()`
        receiver = Call.of(func.value).laid_out(replace(room, tail=room.tail + after), style)
        return flat.with_changes(func=func.with_changes(value=receiver))

    def _exploded(self, outer: str, inner: str, style: Style) -> cst.Call:
        """Return the call with one argument per line and a trailing comma."""
        args = []
        for i, item in enumerate(self.items):
            nxt = self.items[i + 1] if i + 1 < len(self.items) else None
            gap = _break(inner if nxt else outer, item.after, nxt.above if nxt else ())
            room = Room(inner, _start(item, inner), 1)
            arg = item.value(functools.partial(Call.laid_out, room=room, style=style))
            keyword = len(arg.keyword.value) + 1 if arg.keyword is not None else 0
            if item.call is None and len(inner) + keyword + len(code(arg.value)) + 1 > style.width:
                value = split_operation(arg.value, inner, keyword, style)
                if value is arg.value:
                    value = exploded_sequence(value, inner, inner + style.continuation, style.width)
                arg = arg.with_changes(value=value)
            args.append(
                arg.with_changes(
                    comma=cst.Comma(whitespace_after=gap),
                    whitespace_after_arg=cst.SimpleWhitespace(""),
                )
            )
        opening = _break(inner, self.opening, self.items[0].above if self.items else ())
        return cst.Call(self.func, args, whitespace_before_args=opening)

    def _hugged(self, args: list[cst.Arg], inner: str, outer: str) -> cst.Call:
        """Return the call with `args` on their own line, the parentheses hugging them."""
        last = args[-1].with_changes(
            comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=_break(outer)
        )
        return cst.Call(self.func, [*args[:-1], last], whitespace_before_args=_break(inner))


def exploded_sequence(
    node: cst.BaseExpression, outer: str, inner: str, width: int | None = None
) -> cst.BaseExpression:
    """Return a parenthesized tuple or a list too long for its line with one element per line
    and a trailing comma, as black writes it (`in_specs=(None, P("batch"), ...)` of a pmap with
    many arguments); anything else, or a sequence with comments, as it is. Given the `width`,
    an element still too long for its own line is exploded in turn (a nested in_axes tuple)."""
    if comments_in(node):
        return node
    if not isinstance(node, (cst.List, cst.Tuple)) or isinstance(node, cst.Tuple) and not node.lpar:
        return node
    elements = node.elements
    if len(elements) < 2:
        return node
    last = len(elements) - 1
    step = inner[len(outer) :] or "    "
    laid = []
    for i, e in enumerate(elements):
        if width is not None and len(inner) + len(code(e.value)) + 1 > width:
            e = e.with_changes(value=exploded_sequence(e.value, inner, inner + step, width))
        laid.append(
            e.with_changes(comma=cst.Comma(whitespace_after=_break(outer if i == last else inner)))
        )
    opening = _break(inner)
    if isinstance(node, cst.List):
        return node.with_changes(elements=laid, lbracket=cst.LeftSquareBracket(opening))
    lpar = [*node.lpar[:-1], cst.LeftParen(whitespace_after=opening)]
    return node.with_changes(elements=laid, lpar=lpar)


def broken_comprehension(
    node: cst.ListComp | cst.SetComp | cst.DictComp, outer: str, inner: str, width: int
) -> cst.BaseExpression:
    """Return a comprehension too long for its line broken inside its own brackets, as black
    writes it (`x = [\n    f(y) for y in ys\n]`), each `for` and `if` on a line of its own
    where the comprehension does not fit on one line of its own either; a comprehension in
    parentheses or with comments as it is."""
    if node.lpar or comments_in(node):
        return node
    long = len(inner) + len(" ".join(code(node)[1:-1].split())) > width

    def laid(clause: cst.CompFor | None) -> cst.CompFor | None:
        def space() -> cst.BaseParenthesizableWhitespace:
            return _break(inner) if long else cst.SimpleWhitespace(" ")

        return clause and clause.with_changes(
            whitespace_before=space(),
            ifs=[i.with_changes(whitespace_before=space()) for i in clause.ifs],
            inner_for_in=laid(clause.inner_for_in),
        )

    if isinstance(node, cst.ListComp):
        return node.with_changes(
            for_in=laid(node.for_in),
            lbracket=cst.LeftSquareBracket(whitespace_after=_break(inner)),
            rbracket=cst.RightSquareBracket(whitespace_before=_break(outer)),
        )
    return node.with_changes(
        for_in=laid(node.for_in),
        lbrace=cst.LeftCurlyBrace(whitespace_after=_break(inner)),
        rbrace=cst.RightCurlyBrace(whitespace_before=_break(outer)),
    )


# Operators of one precedence: black breaks before each of a chain of them (`a + b - c`).
_RANKS: dict[type[cst.BaseBinaryOp], int] = {
    cst.Add: 0,
    cst.Subtract: 0,
    cst.Multiply: 1,
    cst.Divide: 1,
    cst.FloorDivide: 1,
    cst.Modulo: 1,
    cst.MatrixMultiply: 1,
}


def split_operation(
    node: cst.BaseExpression, indent: str, head: int, style: Style
) -> cst.BaseExpression:
    """Return an unparenthesized `a + b * n`, too long for its line inside brackets, broken
    before each operator of its outermost chain as black breaks it (`in_specs=(...)` on one
    line, `+ (None,) * len(names)` on the next, both at `indent`; `head` columns, a keyword,
    precede the first operand); the first operand, still too long, exploded in turn. Anything
    else, or an operation with comments, is returned as it is."""
    if not isinstance(node, cst.BinaryOperation) or node.lpar or comments_in(node):
        return node
    rank = _RANKS.get(type(node.operator))
    chain: list[cst.BinaryOperation] = [node]
    while isinstance(chain[-1].left, cst.BinaryOperation) and not chain[-1].left.lpar:
        if rank is None or _RANKS.get(type(chain[-1].left.operator)) != rank:
            break
        chain.append(chain[-1].left)
    first = chain[-1].left
    if len(indent) + head + len(code(first)) > style.width:
        first = exploded_sequence(first, indent, indent + style.continuation, style.width)
    laid: cst.BaseExpression = first
    for op in reversed(chain):
        operator = op.operator.with_changes(whitespace_before=_break(indent))
        laid = op.with_changes(left=laid, operator=operator)
    return laid


def _start(item: Item, inner: str) -> int:
    """Return the column the call of `item`, written on a line of its own, starts at."""
    keyword = item.arg.keyword
    star = len(item.arg.star) if isinstance(item.arg.star, str) else 0
    return len(inner) + (len(keyword.value) + 1 if keyword is not None else 0) + star + item.head


def with_lambda_calls(call: Call) -> Call:
    """Return `call` with the call a lambda argument makes (`lambda a: jnp.stack([a] * n)`)
    laid out as a call too, after the lambda's head, as black lays it out."""
    items = []
    for item in call.items:
        value = item.arg.value
        if item.call is not None:
            item = replace(item, call=with_lambda_calls(item.call))
        elif (
            isinstance(value, cst.Lambda)
            and isinstance(value.body, cst.Call)
            and not value.lpar
            and not value.body.lpar
            and not comments_in(value)
        ):
            head = len(code(value)) - len(code(value.body))
            wrap = functools.partial(_lambda_body, value)
            item = replace(item, call=with_lambda_calls(Call.of(value.body)), wrap=wrap, head=head)
        items.append(item)
    return replace(call, items=items)


def _lambda_body(lam: cst.Lambda, body: cst.Call) -> cst.BaseExpression:
    return lam.with_changes(body=body)


def has_magic_comma(call: cst.Call) -> bool:
    """Return True if `call` is written over several lines with a comma after its last
    argument: black keeps such a call one argument per line."""
    return bool(call.args) and isinstance(call.args[-1].comma, cst.Comma) and "\n" in code(call)


def _opening(call: cst.Call) -> cst.TrailingWhitespace | None:
    ws = call.whitespace_before_args
    if isinstance(ws, cst.ParenthesizedWhitespace) and ws.first_line.comment is not None:
        return ws.first_line
    return None


def comments_in(node: cst.CSTNode) -> list[cst.Comment]:
    """Return the comments written inside `node`."""
    found: list[cst.Comment] = []

    class _Find(cst.CSTVisitor):
        def visit_Comment(self, comment: cst.Comment) -> None:
            found.append(comment)

    node.visit(_Find())
    return found


class _Flatten(cst.CSTTransformer):
    """Put an expression written over several lines (without comments) back on one line."""

    def leave_ParenthesizedWhitespace(
        self,
        original_node: cst.ParenthesizedWhitespace,
        updated_node: cst.ParenthesizedWhitespace,
    ) -> cst.SimpleWhitespace:
        return cst.SimpleWhitespace("")

    def leave_Comma(self, original_node: cst.Comma, updated_node: cst.Comma) -> cst.Comma:
        return updated_node.with_changes(
            whitespace_before=cst.SimpleWhitespace(""),
            whitespace_after=cst.SimpleWhitespace(" "),
        )


def flattened(node: cst.BaseExpression) -> cst.BaseExpression:
    """Return `node` on one line (trailing commas of a call's arguments dropped); `node` itself
    when it holds a comment or is already on one line."""
    if "\n" not in code(node) or comments_in(node):
        return node
    flat = node.visit(_Flatten())
    assert isinstance(flat, cst.BaseExpression)
    return _drop_trailing_commas(flat)


def _drop_trailing_commas(node: cst.BaseExpression) -> cst.BaseExpression:
    class _Drop(cst.CSTTransformer):
        def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
            if not updated_node.args:
                return updated_node
            args = list(updated_node.args)
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return updated_node.with_changes(args=args)

    out = node.visit(_Drop())
    assert isinstance(out, cst.BaseExpression)
    return out


def fit_call(
    old: cst.Call, new: cst.Call, room: Room, style: Style, *, rearranged: bool = False
) -> cst.Call:
    """Return `new`, the rewrite of `old` (which starts where `room` says), laid out.

    A new call that fits the line is returned as it is. One written over several lines is
    laid out anew when `rearranged` (its arguments moved, so the old line breaks no longer
    match them) or when a line of it grew past the width where none of the old call's did, and
    it holds no comment; else it keeps the lines it was written with (continuation lines
    aligned with the opening parenthesis moved with it: `realigned`).
    """
    old_code, new_code = code(old), code(new)
    if "\n" in new_code or "\n" in old_code:
        if not rearranged:
            aligned = realigned(old, new, room)
            if not _too_long(aligned, room, style, than=old):
                return aligned
            rearranged = True  # grown past the width: laid out anew (unless commented)
        if comments_in(new):
            return new
        new = new.with_changes(args=[a.with_changes(value=flattened(a.value)) for a in new.args])
        if comments_in(new):
            return new
        new = new.with_changes(
            args=joined(new.args), whitespace_before_args=cst.SimpleWhitespace("")
        )
    elif room.column + len(new_code) + room.tail <= style.width:
        return new
    return Call.of(new).laid_out(room, style)


def realigned(old: cst.Call, new: cst.Call, room: Room) -> cst.Call:
    """Return `new`, the rewrite of `old` under another name (`pjit(` -> `jax.jit(`), with the
    continuation lines that were aligned with `old`'s opening parenthesis moved with it.

    `old` starts where `room` says, its callee and `(` on its first line; only a call whose
    every argument starting a line starts in the column after `(` is realigned, and then every
    line inside its parentheses moves by the same number of columns, keeping their layout."""
    shift = len(code(new.func)) - len(code(old.func))
    if shift == 0 or "\n" in code(old.func) or len(old.args) != len(new.args):
        return new
    column = room.column + len(code(old.func)) + 1
    starts = [old.whitespace_before_args] + [
        a.comma.whitespace_after if isinstance(a.comma, cst.Comma) else a.whitespace_after_arg
        for a in old.args[:-1]
    ]
    broken = [w for w in starts if isinstance(w, cst.ParenthesizedWhitespace)]
    if not broken or any(_column_of(w, room.indent) != column for w in broken):
        return new
    moved = new.with_changes(args=[a.visit(_Shift(shift)) for a in new.args])
    assert isinstance(moved, cst.Call)
    if isinstance(new.whitespace_before_args, cst.ParenthesizedWhitespace):
        ws = new.whitespace_before_args.visit(_Shift(shift))
        moved = moved.with_changes(whitespace_before_args=ws)
    return moved


def _column_of(ws: cst.ParenthesizedWhitespace, indent: str) -> int:
    return (len(indent) if ws.indent else 0) + len(ws.last_line.value)


class _Shift(cst.CSTTransformer):
    """Move every line started inside a call by `shift` columns (never left of column 0)."""

    def __init__(self, shift: int) -> None:
        super().__init__()
        self.shift = shift

    def _moved(self, whitespace: str) -> str:
        return " " * max(0, len(whitespace) + self.shift)

    def leave_ParenthesizedWhitespace(
        self, original_node: cst.ParenthesizedWhitespace, updated_node: cst.ParenthesizedWhitespace
    ) -> cst.ParenthesizedWhitespace:
        if "\t" in updated_node.last_line.value:
            return updated_node
        lines = [
            line.with_changes(whitespace=cst.SimpleWhitespace(self._moved(line.whitespace.value)))
            if line.comment is not None and "\t" not in line.whitespace.value
            else line
            for line in updated_node.empty_lines
        ]
        last = cst.SimpleWhitespace(self._moved(updated_node.last_line.value))
        return updated_node.with_changes(empty_lines=lines, last_line=last)


def _too_long(new: cst.Call, room: Room, style: Style, *, than: cst.Call) -> bool:
    """Return True if a line of `new` goes past the width where no line of `than` did."""

    def longest(call: cst.Call) -> int:
        lines = code(call).split("\n")
        first = room.column + len(lines[0])
        # (a continuation line's code leaves out the block's indentation, its usual start)
        rest = [len(room.indent) + len(line) for line in lines[1:]]
        return max([first, *rest])

    return longest(new) > style.width >= longest(than)


# Statements a rewrite broke over several lines -------------------------------------------------
def keep_trailing_comment(original: cst.SimpleStatementLine, new: object) -> object:
    """Return `new`, the rewrite of the statement `original`, with the comment that ended
    `original` kept on the line it described, never left alone on a closing parenthesis.

    When the statement ends in a call the rewrite now closes on a line of its own: the comment
    of a call written over several lines goes after its last argument (whose line it ended:
    `donate_argnums=(0,))  # pytype: disable=...`), that of a call written on one line (or
    whose arguments now share one line) after the opening parenthesis, on the statement's
    first line."""
    if original.trailing_whitespace.comment is None or not isinstance(new, cst.SimpleStatementLine):
        return new
    comment = new.trailing_whitespace.comment
    if comment is None:
        return new
    old_call, call = _ending_call(original), _ending_call(new)
    if old_call is None or call is None or not call.args or _closes_alone(old_call):
        return new
    last = call.args[-1]
    after = last.comma.whitespace_after if isinstance(last.comma, cst.Comma) else None
    after = after if after is not None else last.whitespace_after_arg
    if not isinstance(after, cst.ParenthesizedWhitespace) or after.first_line.comment:
        return new  # the call closes on its last argument's line: the comment stays there
    ending = cst.TrailingWhitespace(whitespace=cst.SimpleWhitespace("  "), comment=comment)
    opening = call.whitespace_before_args
    hugged = all(  # the arguments on one line of their own: the comment goes on the first
        not isinstance(a.comma, cst.Comma)
        or not isinstance(a.comma.whitespace_after, cst.ParenthesizedWhitespace)
        for a in call.args[:-1]
    )
    first = "\n" not in code(old_call) or hugged
    if first and isinstance(opening, cst.ParenthesizedWhitespace):
        if opening.first_line.comment is not None:
            return new
        call_new = call.with_changes(whitespace_before_args=opening.with_changes(first_line=ending))
    else:
        gap = after.with_changes(first_line=ending)
        if isinstance(last.comma, cst.Comma) and last.comma.whitespace_after is after:
            last = last.with_changes(comma=last.comma.with_changes(whitespace_after=gap))
        else:
            last = last.with_changes(whitespace_after_arg=gap)
        call_new = call.with_changes(args=[*call.args[:-1], last])
    return new.deep_replace(call, call_new).with_changes(
        trailing_whitespace=new.trailing_whitespace.with_changes(
            whitespace=cst.SimpleWhitespace(""), comment=None
        )
    )


def _ending_call(statement: cst.SimpleStatementLine) -> cst.Call | None:
    """Return the call the statement ends with (`x = f(...)`, `return f(...)`, `f(...)`)."""
    if not statement.body:
        return None
    value = getattr(statement.body[-1], "value", None)
    if not isinstance(value, cst.Call) or value.rpar or isinstance(value.func, cst.Call):
        return None
    return value


def _closes_alone(call: cst.Call) -> bool:
    """Return True if `call` is written with its `)` on a line of its own."""
    if not call.args:
        return isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace)
    last = call.args[-1]
    after = last.comma.whitespace_after if isinstance(last.comma, cst.Comma) else None
    after = after if after is not None else last.whitespace_after_arg
    return isinstance(after, cst.ParenthesizedWhitespace)


# Whole lines of generated code ----------------------------------------------------------------
def fit_lines(source: str, style: Style) -> str:
    """Return generated `source` (a template written with one statement per line) with each
    line longer than `style.width` broken as a formatter would break it.

    A trailing comment moves above its line, long comments and one-line docstrings are wrapped
    at words, a `def` header's parameters are hugged (or put one per line), and a statement
    ending in a call has that call laid out by the engine (a call followed by another argument
    list, `f(...)(x)`, is split in its first list, as black does).
    """
    out: list[str] = []
    for line in source.splitlines():
        out.extend(_fit_line(line, style))
    return "\n".join(out) + ("\n" if source.endswith("\n") else "")


def _fit_line(line: str, style: Style) -> list[str]:
    if len(line) <= style.width:
        return [line]
    indent, body = _leading(line), line.strip()
    room = style.width - len(indent)
    if body.startswith("#"):
        return [f"{indent}# {part}" for part in _words(body[1:].strip(), room - 2)]
    if body.startswith('"""') and body.endswith('"""') and len(body) > 6:
        return _docstring_lines(indent, body[3:-3], room)
    if "  # " in body:
        statement, comment = body.split("  # ", 1)
        return [*_fit_line(f"{indent}# {comment}", style), *_fit_line(indent + statement, style)]
    if body.startswith("def ") and body.endswith(":") and "(" in body:
        return _def_lines(indent, body, style)
    return _statement_lines(indent, body, style)


def _words(text: str, room: int) -> list[str]:
    return textwrap.wrap(text, max(room, 20), break_long_words=False) or [text]


def _docstring_lines(indent: str, text: str, room: int) -> list[str]:
    parts = _words(text, room - 3)
    lines = [f'{indent}"""{parts[0]}', *(indent + p for p in parts[1:])]
    if len(lines[-1]) + 3 <= len(indent) + room:
        return [*lines[:-1], lines[-1] + '"""']
    return [*lines, f'{indent}"""']


def _def_lines(indent: str, header: str, style: Style) -> list[str]:
    opening = header.index("(")
    params = header[opening + 1 : header.rindex(")")]
    inner = indent + style.continuation
    if len(inner) + len(params) <= style.width:
        return [f"{indent}{header[: opening + 1]}", inner + params, f"{indent}):"]
    return [
        f"{indent}{header[: opening + 1]}",
        *(f"{inner}{p.strip()}," for p in params.split(",")),
        f"{indent}):",
    ]


def _statement_lines(indent: str, body: str, style: Style) -> list[str]:
    statement = cst.parse_statement(body)
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
    value = getattr(small, "value", None)
    if not isinstance(value, cst.Call):
        return [indent + body]
    target, tail = value, 0
    if isinstance(value.func, cst.Call):  # `f(...)(x)`: split the first argument list
        target, tail = value.func, len(code(value)) - len(code(value.func))
    start = len(indent) + len(body) - len(code(value))
    laid = Call.of(target).laid_out(Room(indent, start, tail), style)
    new_value = laid if target is value else value.with_changes(func=laid)
    text = code(statement.deep_replace(value, new_value))
    return (indent + text).rstrip("\n").split("\n")
